"""Run summaries: one small JSON dict per finished run, and how runs are grouped.

A *summary* describes one finished run (CBOP, one of its ablations, or a baseline). It is
built by :func:`summarize_run` from the run directory (``results.json``, ``config.json``,
the CSV logs and, for CBOP runs, :func:`~cbop_torchrl.evaluation.analysis.analyze_cbop_run`
on the checkpoint). The learning benchmark stores one per run in
``benchmarks/results/<dataset>/<variant>/seed<k>.json``; :func:`load_summaries` reads
summaries or run directories alike, so the report (:mod:`cbop_torchrl.evaluation.report`)
and its figures (:mod:`cbop_torchrl.evaluation.figures`) are rebuilt from either.

Numbers that need the checkpoint are computed once when the summary is made (the benchmark
driver does it right after a run) and then read from the summary; a summary made with
``analysis=False`` simply has none of them. A run trained with ``eval.actor_average`` also
has ``actor_average`` (the averaged actor's ``curve``, ``final_normalized_score`` and
``best_normalized_score``).

Torch-free (the benchmark tools and the docs' tables import it); the checkpoint analysis
imports torch only when it runs.
"""

from __future__ import annotations

import csv
import io
import math
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from cbop_torchrl.io import read_json, read_json_object, read_regular_text
from cbop_torchrl.io.walking import find_regular_files
from cbop_torchrl.sweeps import SweepError, check_search_root

SUMMARY_FORMAT = "cbop-torchrl-summary/1"
FINAL_EVALUATIONS = 3
"""A run's final score is the mean of its last this many evaluations (the final one included)."""


def final_window_score(curve: Sequence[Sequence[float]], fallback: float) -> float:
    """Mean score of the last :data:`FINAL_EVALUATIONS` points of ``[[step, score], ...]``.

    A single evaluation says little about a policy whose score can change
    several-fold within a hundred gradient steps (docs/learning.md), so runs
    are compared on the mean of their last evaluations. ``fallback`` (the
    final evaluation) is used when the run logged no curve.
    """
    points = sorted(curve, key=lambda point: point[0])[-FINAL_EVALUATIONS:]
    return statistics.fmean(float(score) for _, score in points) if points else float(fallback)


TRAIN_CURVE_KEYS = (
    "cbop/expected_horizon",
    "cbop/target_mean",
    "cbop/posterior_std",
    "loss_qvalue",
    "alpha",
)
"""Training metrics kept in a summary (CSV log names under ``train/``), when logged."""
MAX_CURVE_POINTS = 200

ALGO_ORDER = (
    "cbop",
    "cbop-map",
    "cbop-fixed-uniform",
    "cbop-fixed-lambda",
    "cbop-quantile",
    "bc",
    "td3bc",
    "iql",
    "cql",
)
BASELINES = ("bc", "td3bc", "iql", "cql")
"""The baseline algorithms (``cbop_torchrl.baselines.ALGOS``, named here too because the
reports and benchmark tools read this light module without importing torch)."""
CURRENT = ("cbop", *BASELINES)
"""Each algorithm's variant under its own name: CBOP as the preset makes it and the baselines,
listed first and given the first colours in the report. The headline table and curves of a
benchmark results folder take each set's rows from :mod:`cbop_torchrl.evaluation.headline`
(CBOP's offline psi choice, ``cbop-psi5``, ...); elsewhere (a user's runs) these names."""
BAR_MARGIN = 5.0
"""The bar CBOP is held to: its final at least the best baseline's + this on
:data:`BAR_MARGIN_SETS` sets (and at least every baseline's on every set)."""
BAR_MARGIN_SETS = 2
BAR_KEEP = 0.8
"""The bar: every seed's final at least this share of its own best evaluation."""
ALGO_NAMES = {"cbop": "CBOP", "bc": "BC", "td3bc": "TD3+BC", "iql": "IQL", "cql": "CQL"}


class ReportError(ValueError):
    """A path given to the report holds no runs or summaries, or a file is unreadable."""


# ----------------------------------------------------------------------------- summaries
def variant_name(results: dict[str, Any], config: dict[str, Any]) -> str:
    """``cbop``, ``cbop-map``, ``cbop-fixed-uniform|lambda``, ``cbop-quantile`` or the baseline."""
    if results.get("algo"):
        return str(results["algo"])
    estimator = config.get("estimator", {})
    mode = estimator.get("mode", results.get("settings", {}).get("mode", "lcb"))
    if mode == "lcb":
        return "cbop"
    if mode == "fixed":
        return f"cbop-fixed-{estimator.get('fixed_weighting', 'uniform')}"
    return f"cbop-{mode}"


def read_scalar_curves(run_dir: Path, prefix: str = "train/") -> dict[str, list[list[float]]]:
    """Every CSV scalar log under ``run_dir/logs/*/scalars/<prefix>`` as ``[[step, value], ...]``.

    Keys drop the prefix (``cbop/expected_horizon``); a step logged twice (a
    resumed run) keeps its last value. A run directory that was moved or copied
    and then resumed logs under a second name (the logger is named after the
    directory): its files are merged into one curve, the most recently written
    file winning where steps overlap. Empty when the run logged elsewhere.
    """
    files: dict[str, list[Path]] = {}
    for scalars in Path(run_dir).glob("logs/*/scalars"):
        root = scalars / prefix
        for path in find_regular_files(root, "*.csv") if root.is_dir() else ():
            files.setdefault(path.relative_to(root).with_suffix("").as_posix(), []).append(path)
    curves: dict[str, list[list[float]]] = {}
    for name in sorted(files):
        points: dict[int, float] = {}
        for path in sorted(files[name], key=lambda p: (p.stat().st_mtime, str(p))):
            with io.StringIO(read_regular_text(path), newline="") as handle:
                for row in csv.reader(handle):
                    if len(row) >= 2:
                        try:
                            points[int(float(row[0]))] = float(row[1])
                        except ValueError:
                            continue  # a header or a partial last line
        curves[name] = [[step, points[step]] for step in sorted(points)]
    return curves


def _thin(points: list[list[float]], limit: int = MAX_CURVE_POINTS) -> list[list[float]]:
    if len(points) <= limit:
        return points
    stride = math.ceil(len(points) / limit)
    kept = points[::stride]
    return kept if kept[-1] == points[-1] else [*kept, points[-1]]


RESULTS_KEYS = ("dataset", "seed", "gradient_steps", "normalized_score_mean")
"""What every run's ``results.json`` holds (the score may be null: no reference scores)."""


def summarize_run(run_dir: str | Path, analysis: bool = True) -> dict[str, Any]:
    """The summary of one finished run directory (see the module doc).

    Args:
        run_dir: a ``scripts/cbop.py`` or ``scripts/baseline.py`` run directory
            holding ``results.json``.
        analysis: for CBOP runs, also compute the checkpoint-based numbers
            (R_h sample, A/(A+B) histograms, MC conservatism; tens of seconds).

    Raises:
        ReportError: the directory has no (readable) ``results.json``.
    """
    run_dir = Path(run_dir)
    results = read_json_object(run_dir / "results.json", ReportError)
    config_path = run_dir / "config.json"
    config = read_json_object(config_path, ReportError) if config_path.is_file() else {}
    missing = [key for key in RESULTS_KEYS if key not in results]
    if missing:
        raise ReportError(
            f"{str(run_dir / 'results.json')!r} lacks {', '.join(missing)} (damaged or edited); "
            "run the run's command again to rewrite it, or leave the run out of paths="
        )
    if results.get("normalized_score_mean") is None:
        raise ReportError(
            f"{str(run_dir)!r} has no normalized score (its task {results.get('gym_id')} has "
            "no reference scores) and the report compares normalized scores across runs. "
            "Leave it out of the report, or train it with task.ref_min_score=<return of a "
            "random policy> task.ref_max_score=<return of an expert> on the command line."
        )
    history = sorted(results.get("eval_history", []), key=lambda r: r["step"])
    curve = _score_curve(history, "normalized_score_mean")
    final = float(results["normalized_score_mean"])
    best_step, best = max(
        ((s, v) for s, v in curve), key=lambda item: item[1], default=(None, final)
    )
    variant = variant_name(results, config)
    train = read_scalar_curves(run_dir)
    summary: dict[str, Any] = {
        "summary_format": SUMMARY_FORMAT,
        "variant": variant,
        "algo": "cbop" if variant.startswith("cbop") else variant,
        "dataset": results["dataset"],
        "env_family": results.get("env_family"),
        "seed": int(results["seed"]),
        "preset": results.get("preset"),
        "device": results.get("device"),  # None: a run from before results.json recorded it
        "final_normalized_score": final_window_score(curve, final),
        "last_normalized_score": final,
        "final_normalized_score_std": float(results.get("normalized_score_std", 0.0)),
        "final_return": results.get("return_mean"),
        "best_normalized_score": float(best),
        "best_step": best_step,
        "gradient_steps": int(results["gradient_steps"]),
        "wall_time_s": results.get("wall_time_s"),
        "curve": curve,
        "train_curves": {k: _thin(train[k]) for k in TRAIN_CURVE_KEYS if k in train},
        "diagnostics": {
            "expected_horizon_start": results.get("expected_horizon_start"),
            "expected_horizon_end": results.get("expected_horizon_end"),
            "grad_steps_per_s": results.get("grad_steps_per_s"),
            "stage_times": results.get("stage_times"),
            "stages": results.get("stages"),
            "settings": results.get("settings"),
        },
        "run_dir": str(run_dir.resolve()),
    }
    average_curve = _score_curve(history, "average_normalized_score_mean")
    if average_curve:  # eval.actor_average (beyond the paper): the averaged actor's scores
        summary["actor_average"] = {
            "decay": config.get("eval", {}).get("actor_average"),
            "curve": average_curve,
            "final_normalized_score": final_window_score(average_curve, average_curve[-1][1]),
            "best_normalized_score": max(score for _, score in average_curve),
        }
    if analysis and (run_dir / "checkpoint.pt").is_file():
        from cbop_torchrl.evaluation.analysis import analyze_baseline_run, analyze_cbop_run

        if summary["algo"] == "cbop":
            summary["analysis"] = analyze_cbop_run(run_dir)
        elif summary["algo"] in ("td3bc", "iql", "cql"):
            summary["analysis"] = analyze_baseline_run(run_dir)
    return summary


def _score_curve(history: list[dict[str, Any]], key: str) -> list[list[float]]:
    """``[[step, score], ...]`` of the evaluation records that hold ``key``."""
    return [[int(r["step"]), float(r[key])] for r in history if key in r]


FOREIGN_JSON_DIRS = frozenset((".hydra", "wandb", "selection_fqe"))
"""Folders whose JSON files other tools write (Hydra, W&B, the psi selection's cache):
never summaries, so not read."""

SUMMARY_KEYS = {
    "variant": str,
    "dataset": str,
    "seed": int,
    "final_normalized_score": (int, float),
    "best_normalized_score": (int, float),
    "gradient_steps": int,
}
"""What every summary holds (and its type), checked before a summary enters the table."""


def _read_summary_file(file: Path) -> dict[str, Any] | None:
    """The summary in ``file``, or None when it is another program's JSON.

    Raises:
        ReportError: ``file`` cannot be read or parsed (truncated, damaged), or it says it
            is a summary but lacks a field; silently skipping it would drop a run from the
            table.
    """
    value = read_json(
        file,
        ReportError,
        "a truncated or damaged file may be a run's summary, and leaving it out would show "
        "fewer seeds. Restore the file (e.g. from git or the run that wrote it), or move it "
        "out of the folders given in paths=",
    )
    if not isinstance(value, dict) or not str(value.get("summary_format", "")).startswith(
        "cbop-torchrl-summary"
    ):
        return None
    if value["summary_format"] != SUMMARY_FORMAT:
        raise ReportError(
            f"{str(file)!r} is a summary of format {value['summary_format']!r}; this version "
            f"reads {SUMMARY_FORMAT!r}. Make it again with this version, or move it out of paths="
        )
    wrong = [
        key
        for key, kind in SUMMARY_KEYS.items()
        if not isinstance(value.get(key), kind) or isinstance(value.get(key), bool)
    ]
    if wrong:
        raise ReportError(
            f"the summary {str(file)!r} lacks valid {', '.join(wrong)} (damaged or edited); "
            "restore it or make it again, or move it out of paths="
        )
    return value


def check_report_paths(paths: Sequence[str | Path]) -> None:
    """Refuses (:class:`ReportError`) a ``paths=`` entry that does not exist or is a folder
    no program searches (:func:`cbop_torchrl.sweeps.check_search_root`); checked before any
    summary is read."""
    for raw in paths:
        path = Path(raw)
        if not path.exists():
            raise ReportError(
                f"{str(path)!r} does not exist; paths= takes run directories (holding "
                "results.json), sweep directories or results folders such as benchmarks/results"
            )
        try:
            check_search_root(path, "paths")
        except SweepError as error:
            raise ReportError(str(error)) from None


def load_summaries(
    paths: Iterable[str | Path],
    analysis: bool = True,
    current: Mapping[str, str] | None = None,
) -> list[dict[str, Any]]:
    """Summaries from any mix of summary files, summary folders, run dirs and sweep dirs.

    ``current``: each set's current file where the caller knows it (see
    :func:`name_earlier_files`).

    A directory is searched recursively: every ``*.json`` whose
    ``summary_format`` is ours is a summary; every ``results.json`` is a run
    summarized with :func:`summarize_run` (a run that also has a stored
    summary with the same ``run_dir`` is taken once).

    Raises:
        ReportError: a path does not exist, or nothing was found in all of them.
    """
    summaries: list[dict[str, Any]] = []
    seen_runs: set[str] = set()
    run_dirs: list[Path] = []
    check_report_paths(paths)
    for raw in paths:
        path = Path(raw)
        files = [path] if path.is_file() else find_regular_files(path, "*.json")
        for file in files:
            if file.name == "results.json":
                run_dirs.append(file.parent)
                continue
            if file.name == "config.json" or FOREIGN_JSON_DIRS & set(file.parts):
                continue
            value = _read_summary_file(file)
            if value is not None:
                # Summaries written before the final score became a window mean.
                value["final_normalized_score"] = final_window_score(
                    value.get("curve", []), value["final_normalized_score"]
                )
                summaries.append(value)
                seen_runs.add(str(value.get("run_dir")))
    for run_dir in run_dirs:
        if str(run_dir.resolve()) not in seen_runs:
            summaries.append(summarize_run(run_dir, analysis=analysis))
    if not summaries:
        raise ReportError(
            f"no finished runs or summaries under {', '.join(map(str, paths))}: a run counts "
            "once it has written results.json; a summary is a benchmarks/results/**/seed*.json"
        )
    return name_earlier_files(summaries, current)


def _file_of(summary: dict[str, Any]) -> str | None:
    sha = (summary.get("dataset_provenance") or {}).get("sha256")
    return str(sha)[:12] if sha else None


def current_files(summaries: Sequence[dict[str, Any]]) -> dict[str, str]:
    """``dataset -> the first 12 characters of its current file's sha256``.

    A set's current file is the one its most recently finished summary was made on
    (``finished_utc``, which the benchmark driver records), else the one most of its summaries
    were made on; sets whose summaries name no file are left out.
    """
    by_dataset: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for summary in summaries:
        if _file_of(summary):
            by_dataset[summary["dataset"]].append(summary)
    current = {}
    for dataset, found in by_dataset.items():
        dated = [s for s in found if s.get("finished_utc")]
        if dated:
            current[dataset] = _file_of(max(dated, key=lambda s: str(s["finished_utc"])))
        else:
            counts = Counter(_file_of(s) for s in found)
            current[dataset] = max(sorted(counts), key=counts.__getitem__)
    return current


def name_earlier_files(
    summaries: list[dict[str, Any]], current: Mapping[str, str] | None = None
) -> list[dict[str, Any]]:
    """The summaries, those made on an earlier file of their set renamed ``VARIANT (file SHA)``.

    Scores made on two versions of a set's data are not one row: a rerun on a new file then
    starts a row of its own, and the earlier file's runs stay visible beside it (the
    headline's current variants are the current file's only). ``current``: ``dataset -> the
    sha256 (or its first 12 characters) of the set's current file`` where the caller knows
    it (the benchmark's ``rows.json``); other sets' current file is :func:`current_files`'.
    Renames in place and returns the list.
    """
    current = {**current_files(summaries), **{k: v[:12] for k, v in (current or {}).items()}}
    for summary in summaries:
        file = _file_of(summary)
        if file and file != current.get(summary["dataset"]):
            summary["variant"] = f"{summary['variant']} (file {file})"
    return summaries


# ----------------------------------------------------------------------------- grouping
def variant_order(variant: str) -> tuple[int, str]:
    """Sort key: the variants of :data:`ALGO_ORDER` in that order, then the rest by name."""
    return (ALGO_ORDER.index(variant) if variant in ALGO_ORDER else len(ALGO_ORDER), variant)


def group_runs(summaries: Sequence[dict[str, Any]]) -> dict[tuple[str, str], list[dict]]:
    """``(dataset, variant) -> summaries sorted by seed`` in the table's order."""
    groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for summary in summaries:
        groups[(summary["dataset"], summary["variant"])].append(summary)
    keys = sorted(groups, key=lambda k: (k[0], *variant_order(k[1])))
    return {k: sorted(groups[k], key=lambda s: s["seed"]) for k in keys}


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """Mean and population standard deviation (0 for a single value)."""
    values = [float(v) for v in values]
    std = statistics.pstdev(values) if len(values) > 1 else 0.0
    return statistics.fmean(values), std


__all__ = [
    "ALGO_NAMES",
    "ALGO_ORDER",
    "BAR_KEEP",
    "BAR_MARGIN",
    "BAR_MARGIN_SETS",
    "BASELINES",
    "CURRENT",
    "FINAL_EVALUATIONS",
    "SUMMARY_FORMAT",
    "ReportError",
    "current_files",
    "final_window_score",
    "group_runs",
    "load_summaries",
    "mean_std",
    "name_earlier_files",
    "read_scalar_curves",
    "summarize_run",
    "variant_name",
    "variant_order",
]
