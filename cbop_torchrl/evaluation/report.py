"""Run summaries and the analysis report: tables, learning curves, the paper's figures.

A *summary* is a small JSON dict describing one finished run (CBOP, one of
its ablations, or a baseline), built by :func:`summarize_run` from the run
directory (``results.json``, ``config.json``, the CSV logs and, for CBOP
runs, :func:`~cbop_torchrl.evaluation.analysis.analyze_cbop_run` on the
checkpoint). The learning benchmark stores one per run in
``benchmarks/results/<dataset>/<variant>/seed<k>.json``; the report reads
summaries or run directories alike, so every table and figure is rebuilt from
either:

==============================  =============================================
output                          from
==============================  =============================================
``results.md`` / ``.csv``       final and best normalized score per run
``curves_<dataset>.png``        ``curve`` of the current variants (:data:`CURRENT`)
``curves_all_<dataset>.png``    ``curve`` of every variant (earlier ones too)
``horizon_<dataset>.png``       ``train_curves["cbop/expected_horizon"]``
``targets_<dataset>.png``       ``train_curves``: target mean, critic loss
``rh_<dataset>_<variant>.png``  ``analysis.rh_sample`` (checkpoint needed once)
``share_<dataset>_<variant>``   ``analysis.value_var_share`` (idem)
``conservatism.md`` / ``.csv``  ``analysis.conservatism`` (idem)
``rliable.md`` / ``.png``       final scores; only when ``rliable`` imports
==============================  =============================================

Figures that need the checkpoint are computed once when the summary is made
(the benchmark driver does it right after a run) and then drawn from the
summary; a summary made with ``analysis=False`` simply has none of them.
A run trained with ``eval.actor_average`` also has ``actor_average`` (the averaged
actor's ``curve``, ``final_normalized_score`` and ``best_normalized_score``).
"""

from __future__ import annotations

import csv
import json
import math
import re
import statistics
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from cbop_torchrl.utils import atomic_write

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
"""The variants of the headline table and curves: CBOP as the preset makes it and the
baselines; a labelled variant (``cbop-c2x256``, ``cbop-psi5``, ...) is an earlier
configuration or an experiment and appears in the full tables and ``curves_all_*`` only."""
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
        for path in root.rglob("*.csv"):
            files.setdefault(path.relative_to(root).with_suffix("").as_posix(), []).append(path)
    curves: dict[str, list[list[float]]] = {}
    for name in sorted(files):
        points: dict[int, float] = {}
        for path in sorted(files[name], key=lambda p: (p.stat().st_mtime, str(p))):
            with open(path, newline="") as handle:
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
    results = _read_json(run_dir / "results.json")
    config_path = run_dir / "config.json"
    config = _read_json(config_path) if config_path.is_file() else {}
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


def _read_json(path: Path) -> dict[str, Any]:
    try:
        value = json.loads(Path(path).read_text())
    except (OSError, ValueError) as error:
        raise ReportError(f"cannot read {str(path)!r} ({type(error).__name__}: {error})") from None
    if not isinstance(value, dict):
        raise ReportError(f"{str(path)!r} holds a {type(value).__name__}, not a JSON object")
    return value


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
    try:
        value = json.loads(file.read_text())
    except (OSError, ValueError) as error:
        raise ReportError(
            f"cannot read {str(file)!r} ({type(error).__name__}: {error}); a truncated or "
            "damaged file may be a run's summary, and leaving it out would show fewer seeds. "
            "Restore the file (e.g. from git or the run that wrote it), or move it out of "
            "the folders given in paths="
        ) from None
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


def load_summaries(paths: Iterable[str | Path], analysis: bool = True) -> list[dict[str, Any]]:
    """Summaries from any mix of summary files, summary folders, run dirs and sweep dirs.

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
    for raw in paths:
        path = Path(raw)
        if not path.exists():
            raise ReportError(
                f"{str(path)!r} does not exist; paths= takes run directories (holding "
                "results.json), sweep directories or results folders such as benchmarks/results"
            )
        files = [path] if path.is_file() else sorted(path.rglob("*.json"))
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
    return name_earlier_files(summaries)


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


def name_earlier_files(summaries: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The summaries, those made on an earlier file of their set renamed ``VARIANT (file SHA)``.

    Scores made on two versions of a set's data are not one row: a rerun on a new file then
    starts a row of its own, and the earlier file's runs stay visible beside it (the
    headline's current variants are the current file's only). Renames in place and returns
    the list.
    """
    current = current_files(summaries)
    for summary in summaries:
        file = _file_of(summary)
        if file and file != current.get(summary["dataset"]):
            summary["variant"] = f"{summary['variant']} (file {file})"
    return summaries


# ----------------------------------------------------------------------------- tables
def _order(variant: str) -> tuple[int, str]:
    return (ALGO_ORDER.index(variant) if variant in ALGO_ORDER else len(ALGO_ORDER), variant)


def group_runs(summaries: Sequence[dict[str, Any]]) -> dict[tuple[str, str], list[dict]]:
    """``(dataset, variant) -> summaries sorted by seed`` in the table's order."""
    groups: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for summary in summaries:
        groups[(summary["dataset"], summary["variant"])].append(summary)
    keys = sorted(groups, key=lambda k: (k[0], *_order(k[1])))
    return {k: sorted(groups[k], key=lambda s: s["seed"]) for k in keys}


def _mean_std(values: Sequence[float]) -> tuple[float, float]:
    values = [float(v) for v in values]
    std = statistics.pstdev(values) if len(values) > 1 else 0.0
    return statistics.fmean(values), std


def score_rows(summaries: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per (dataset, variant): seeds, final and best score mean/std over seeds."""
    rows = []
    for (dataset, variant), runs in group_runs(summaries).items():
        final = _mean_std([r["final_normalized_score"] for r in runs])
        best = _mean_std([r["best_normalized_score"] for r in runs])
        horizon = [
            r["diagnostics"].get("expected_horizon_end")
            for r in runs
            if r.get("diagnostics", {}).get("expected_horizon_end") is not None
        ]
        rows.append(
            {
                "dataset": dataset,
                "variant": variant,
                "seeds": " ".join(str(r["seed"]) for r in runs),
                "num_seeds": len(runs),
                "gradient_steps": " ".join(sorted({str(r["gradient_steps"]) for r in runs})),
                "final_mean": final[0],
                "final_std": final[1],
                "best_mean": best[0],
                "best_std": best[1],
                "expected_horizon_end": statistics.fmean(horizon) if horizon else None,
            }
        )
    return rows


def markdown_table(rows: Sequence[dict[str, Any]]) -> str:
    """The results table in Markdown (normalized score, mean +- std over seeds)."""
    lines = [
        "| dataset | algorithm | seeds | gradient steps | final score | best score | E[h] (end) |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        horizon = row["expected_horizon_end"]
        lines.append(
            f"| {row['dataset']} | {row['variant']} | {row['num_seeds']} ({row['seeds']}) | "
            f"{row['gradient_steps']} | {row['final_mean']:.1f} ± {row['final_std']:.1f} | "
            f"{row['best_mean']:.1f} ± {row['best_std']:.1f} | "
            f"{'' if horizon is None else f'{horizon:.2f}'} |"
        )
    return "\n".join(lines) + "\n"


def _write_text(path: Path, text: str) -> Path:
    return atomic_write(path, lambda tmp: tmp.write_text(text))


def _write_csv(path: Path, rows: Sequence[dict[str, Any]]) -> Path:
    def write(tmp: Path) -> None:
        with open(tmp, "w", newline="") as handle:
            if rows:
                writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
                writer.writeheader()
                writer.writerows(rows)

    return atomic_write(path, write)


def file_versions(provenances: Sequence[dict[str, Any]]) -> str:
    """The sha256 of the dataset file the runs read, and whether they read one version.

    Files written by the generator with the same settings (one ``data_key``) hold the same
    data, but their bytes may differ (a copy regenerated elsewhere); that is said, not
    flagged. Different settings are flagged: the runs did not train on the same data.
    """
    shas = sorted({str(p.get("sha256"))[:12] for p in provenances})
    data_keys = {p.get("data_key") for p in provenances}
    if len(shas) == 1:
        return shas[0]
    if len(data_keys) == 1 and None not in data_keys:
        return f"{', '.join(shas)} (files of the same generator settings {data_keys.pop()})"
    return f"{', '.join(shas)} (several versions!)"


def dataset_markdown(summaries: Sequence[dict[str, Any]]) -> str:
    """Where each dataset came from (the generator's provenance stored in the summaries)."""
    lines = []
    for dataset in sorted({s["dataset"] for s in summaries}):
        found = [
            s["dataset_provenance"]
            for s in summaries
            if s["dataset"] == dataset and s.get("dataset_provenance")
        ]
        if not found:
            continue
        p = found[0]
        lines.append(
            f"| {dataset} | {p.get('transitions')} | {p.get('episodes')} | "
            f"{_fmt(p.get('episode_normalized_score_mean'))} | "
            f"{_fmt(p.get('policy_normalized_score'))} | `{p.get('command')}` | "
            f"{file_versions(found)} |"
        )
    if not lines:
        return ""
    header = [
        "| dataset | transitions | episodes | mean episode score | behaviour policy score | "
        "generated by | sha256 |",
        "|---|---|---|---|---|---|---|",
    ]
    return "\n".join(header + lines) + "\n"


def headline_markdown(summaries: Sequence[dict[str, Any]]) -> str:
    """Algorithm x dataset: each current variant's final score, the behaviour policy's.

    A cell is the mean over seeds of the runs' final scores (each the mean of its last
    :data:`FINAL_EVALUATIONS` evaluations; the highest of a column in bold), the lowest and
    highest seed's in brackets and the number of seeds; the last rows are the data's
    behaviour policy and its size.
    Deterministic: the same summaries give the same text (the docs are checked against it).
    """
    groups = group_runs(summaries)
    datasets = sorted({d for d, _ in groups})
    variants = [v for v in CURRENT if any((d, v) in groups for d in datasets)]
    if not datasets or not variants:
        return ""
    lines = [
        "| algorithm | " + " | ".join(datasets) + " |",
        "|---|" + "---|" * len(datasets),
    ]
    best = {
        d: max(
            statistics.fmean(float(r["final_normalized_score"]) for r in groups[(d, v)])
            for v in variants
            if (d, v) in groups
        )
        for d in datasets
        if any((d, v) in groups for v in variants)
    }
    for variant in variants:
        cells, steps = [], set()
        for dataset in datasets:
            runs = groups.get((dataset, variant))
            if not runs:
                cells.append("not run")
                continue
            scores = [float(r["final_normalized_score"]) for r in runs]
            steps |= {int(r["gradient_steps"]) for r in runs}
            mean = statistics.fmean(scores)
            cell = f"**{mean:.1f}**" if mean == best[dataset] else f"{mean:.1f}"
            if len(scores) > 1:
                cell += f" [{min(scores):.1f}, {max(scores):.1f}]"
            cells.append(f"{cell}, {len(scores)} seed{'s' if len(scores) > 1 else ''}")
        budget = "/".join(f"{s:,}" for s in sorted(steps))
        name = f"{ALGO_NAMES.get(variant, variant)} ({budget} steps)"
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    behaviour, sizes = [], []
    for dataset in datasets:
        found = [
            s.get("dataset_provenance") or {}
            for s in summaries
            if s["dataset"] == dataset and s["variant"] in variants
        ]
        p = next((p for p in found if p), {})
        score = p.get("policy_normalized_score")
        behaviour.append("" if score is None else f"{float(score):.1f}")
        n, episodes = p.get("transitions"), p.get("episodes")
        sizes.append(
            "" if n is None else f"{int(n):,} transitions, {int(episodes or 0):,} episodes"
        )
    lines.append("| *behaviour policy (medium)* | " + " | ".join(behaviour) + " |")
    lines.append("| *data* | " + " | ".join(sizes) + " |")
    return "\n".join(lines) + "\n"


def _fmt(value: Any) -> str:
    return "" if value is None else f"{float(value):.1f}"


def _signed(value: float | None) -> str:
    return "-" if value is None else f"{float(value):+.1f}"


def goal_check(
    rows: Sequence[dict[str, Any]], behaviour: dict[str, float] | None = None
) -> list[str]:
    """Per dataset, the results goal: is CBOP's final score (mean over seeds)

    - at least the best baseline's final score + 5 points,
    - at least the behaviour policy's score + 10 points (``behaviour``:
      dataset -> normalized score of the data's behaviour policy, when known),
    - at least 0.8 x CBOP's own best evaluation (it keeps what it finds)?
    """
    lines = []
    behaviour = behaviour or {}
    for dataset in sorted({r["dataset"] for r in rows}):
        by_variant = {r["variant"]: r for r in rows if r["dataset"] == dataset}
        baselines = {v: r["final_mean"] for v, r in by_variant.items() if not v.startswith("cbop")}
        if "cbop" not in by_variant or not baselines:
            continue
        best = max(baselines, key=baselines.get)
        cbop = by_variant["cbop"]["final_mean"]
        checks = [
            f"CBOP {cbop:.1f} vs best baseline {best} {baselines[best]:.1f} "
            f"({cbop - baselines[best]:+.1f}, {'met' if cbop >= baselines[best] + 5 else 'NOT met'}"
            " >= +5)"
        ]
        if dataset in behaviour:
            margin = cbop - behaviour[dataset]
            checks.append(
                f"vs behaviour policy {behaviour[dataset]:.1f} ({margin:+.1f}, "
                f"{'met' if margin >= 10 else 'NOT met'} >= +10)"
            )
        own_best = by_variant["cbop"]["best_mean"]
        kept = cbop / own_best if own_best > 0 else float("nan")
        checks.append(
            f"keeps {kept:.2f} of its best {own_best:.1f} ({'met' if kept >= 0.8 else 'NOT met'}"
            " >= 0.8)"
        )
        lines.append(f"- {dataset}: " + "; ".join(checks))
    return lines


def behaviour_scores(summaries: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Dataset -> its behaviour policy's normalized score, from the generator's provenance."""
    scores = {}
    for summary in summaries:
        score = (summary.get("dataset_provenance") or {}).get("policy_normalized_score")
        if score is not None:
            scores[summary["dataset"]] = float(score)
    return scores


PAPER_CONSERVATISM: dict[tuple[str, str], dict[str, float]] = {
    ("hopper", "medium"): {"cbop": -55.83, "cql": -61.84},
    ("hopper", "medium-replay"): {"cbop": -172.45, "cql": -142.89},
    ("hopper", "medium-expert"): {"cbop": -114.39, "cql": -79.67},
    ("halfcheetah", "medium"): {"cbop": -106.24, "cql": -222.43},
    ("halfcheetah", "medium-replay"): {"cbop": -84.42, "cql": -363.00},
    ("halfcheetah", "medium-expert"): {"cbop": -210.51, "cql": -310.95},
    ("walker2d", "medium"): {"cbop": -84.70, "cql": -167.36},
    ("walker2d", "medium-replay"): {"cbop": -80.31, "cql": -285.02},
    ("walker2d", "medium-expert"): {"cbop": -75.89, "cql": -156.71},
}
"""The paper's conservatism table (appendix, ``tab:pe-full``): mean of ``Q - MC`` at the end
of training on the D4RL v2 set of this family and kind, for CBOP and CQL."""


def paper_conservatism(dataset: str, variant: str) -> float | None:
    """The paper's mean ``Q - MC`` for the D4RL set of ``dataset``'s family and kind, or None.

    ``variant`` ``cbop*`` reads CBOP's column, ``cql*`` CQL's; generated look-alikes
    (``hopper-medium-replay-gen``) are compared with the D4RL set of the same name.
    """
    family = dataset.split("-", 1)[0]
    kind = next(
        (k for k in ("medium-replay", "medium-expert", "medium") if f"-{k}" in dataset), None
    )
    algorithm = variant.split("-", 1)[0]
    return PAPER_CONSERVATISM.get((family, kind or ""), {}).get(algorithm)


def conservatism_rows(summaries: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Table 2: learned Q(s, pi(s)) at dataset states vs the real discounted MC return, per run.

    ``overestimation`` is the raw difference (the paper's quantity);
    ``overestimation_no_entropy`` removes a soft critic's entropy part (None in summaries made
    before it was measured); ``paper`` is the paper's mean for the matching D4RL set.
    """
    rows = []
    for (dataset, variant), runs in group_runs(summaries).items():
        for run in runs:
            numbers = run.get("analysis", {}).get("conservatism")
            if numbers:
                rows.append(
                    {
                        "dataset": dataset,
                        "variant": variant,
                        "seed": run["seed"],
                        "predicted_q_mean": numbers["predicted_q_mean"],
                        "predicted_q_min": numbers["predicted_q_min"],
                        "mc_return_mean": numbers["mc_return_mean"],
                        "mc_return_std": numbers["mc_return_std"],
                        "overestimation": numbers["overestimation"],
                        "overestimation_max": numbers.get("overestimation_max"),
                        "overestimation_no_entropy": numbers.get("overestimation_no_entropy"),
                        "states": numbers.get("states", numbers.get("episodes")),
                        "paper": paper_conservatism(dataset, variant),
                    }
                )
    return rows


def conservatism_markdown(rows: Sequence[dict[str, Any]]) -> str:
    lines = [
        "| dataset | algorithm | seed | states | predicted Q(s, pi(s)) | min over Q-members | "
        "MC discounted return | predicted - MC (mean, max) | without the entropy part | "
        "paper (D4RL set) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        no_entropy, paper = row.get("overestimation_no_entropy"), row.get("paper")
        states = "" if row["states"] is None else row["states"]
        lines.append(
            f"| {row['dataset']} | {row['variant']} | {row['seed']} | {states} | "
            f"{row['predicted_q_mean']:.1f} | {row['predicted_q_min']:.1f} | "
            f"{row['mc_return_mean']:.1f} ± {row['mc_return_std']:.1f} | "
            f"{row['overestimation']:+.1f}, {_fmt(row['overestimation_max'])} | "
            f"{_signed(no_entropy)} | {_signed(paper)} |"
        )
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- rliable
def rliable_aggregates(
    summaries: Sequence[dict[str, Any]], reps: int = 2000
) -> dict[str, dict[str, list[float]]] | None:
    """IQM, optimality gap (to 100) and P(variant > others) with bootstrap 95% CIs.

    Scores are final normalized scores divided by 100, a ``[runs, datasets]``
    matrix per variant that has runs on every dataset (its lowest seeds, as many on
    each dataset as it has on its least-run one; ``runs`` says how many);
    P(cbop > other) only where the two matrices have the same shape. Returns None
    when ``rliable`` is not installed.
    """
    try:
        import numpy as np
        from rliable import library as rly
        from rliable import metrics
    except ImportError:
        return None
    datasets = sorted({s["dataset"] for s in summaries})
    by_variant: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for s in sorted(summaries, key=lambda s: s["seed"]):
        by_variant[s["variant"]][s["dataset"]].append(s["final_normalized_score"] / 100.0)
    matrices = {}
    for variant, per_dataset in by_variant.items():
        runs = min(len(per_dataset.get(d, [])) for d in datasets)
        if runs:  # on every dataset: its lowest seeds, as many on each
            matrices[variant] = np.array([per_dataset[d][:runs] for d in datasets]).T
    if not matrices:
        return {}

    def aggregate(x):
        return np.array([metrics.aggregate_iqm(x), metrics.aggregate_optimality_gap(x, 1.0)])

    points, intervals = rly.get_interval_estimates(matrices, aggregate, reps=reps)
    out: dict[str, dict[str, list[float]]] = {}
    for variant in sorted(matrices, key=_order):
        out[variant] = {
            "runs": [float(matrices[variant].shape[0])],
            "iqm": [float(points[variant][0]), *map(float, intervals[variant][:, 0])],
            "optimality_gap": [float(points[variant][1]), *map(float, intervals[variant][:, 1])],
        }
    if "cbop" in matrices:
        pairs = {
            f"cbop,{other}": (matrices["cbop"], matrices[other])
            for other in matrices
            if other != "cbop" and matrices[other].shape == matrices["cbop"].shape
        }
        if pairs:
            prob, prob_ci = rly.get_interval_estimates(
                pairs, metrics.probability_of_improvement, reps=reps
            )
            for pair in pairs:
                out.setdefault("probability_of_improvement", {})[pair] = [
                    float(prob[pair]),
                    *map(float, prob_ci[pair][:, 0]),
                ]
    return out


def rliable_markdown(aggregates: dict[str, dict[str, list[float]]]) -> str:
    lines = [
        "Scores are final normalized scores / 100 pooled over datasets and seeds; "
        "[95% stratified bootstrap CI].",
        "",
        "| algorithm | runs per dataset | IQM | optimality gap |",
        "|---|---|---|---|",
    ]
    for variant, values in aggregates.items():
        if variant == "probability_of_improvement":
            continue
        iqm, gap = values["iqm"], values["optimality_gap"]
        runs = int(values.get("runs", [0])[0])
        lines.append(
            f"| {variant} | {runs} | {iqm[0]:.3f} [{iqm[1]:.3f}, {iqm[2]:.3f}] | "
            f"{gap[0]:.3f} [{gap[1]:.3f}, {gap[2]:.3f}] |"
        )
    improvement = aggregates.get("probability_of_improvement", {})
    if improvement:
        lines += ["", "| P(X > Y) | estimate |", "|---|---|"]
        for pair, (point, low, high) in improvement.items():
            x, y = pair.split(",")
            lines.append(f"| P({x} > {y}) | {point:.2f} [{low:.2f}, {high:.2f}] |")
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- figures
def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save_figure(fig: Any, path: Path) -> Path:
    """Lays out, writes (atomically: never a half-written PNG) and closes ``fig``."""
    fig.tight_layout()
    atomic_write(path, lambda tmp: fig.savefig(tmp, dpi=120, format="png"))
    _pyplot().close(fig)
    return path


def _mean_curve(runs: Sequence[dict[str, Any]], points_of) -> tuple[list, list, list]:
    """Steps present in every run, and the mean/std across runs at those steps."""
    per_run = [dict((int(s), v) for s, v in points_of(run)) for run in runs]
    steps = sorted(set.intersection(*(set(p) for p in per_run))) if per_run else []
    means, stds = [], []
    for step in steps:
        mean, std = _mean_std([p[step] for p in per_run])
        means.append(mean)
        stds.append(std)
    return steps, means, stds


def _band(ax: Any, steps: list, mean: list, std: list, color: Any = None) -> None:
    """Shades mean +- std."""
    low = [m - s for m, s in zip(mean, std, strict=True)]
    high = [m + s for m, s in zip(mean, std, strict=True)]
    ax.fill_between(steps, low, high, alpha=0.15, color=color, linewidth=0)


def _file_name_part(variant: str) -> str:
    """``variant`` in a file name: ``cbop (file 724cd4675714)`` -> ``cbop-file-724cd4675714``."""
    return re.sub(r"[^\w.-]+", "-", variant).strip("-")


def variant_colours(variants: Iterable[str]) -> dict[str, Any]:
    """One distinct colour per variant, the same in every figure of a report.

    The current variants (:data:`CURRENT`) get the first colours of ``tab10`` in their
    order; the others follow (``tab10`` then ``tab20``'s lighter shades, then a colour
    wheel), so no two series of a figure share a colour however many there are.
    """
    import matplotlib

    ordered = sorted(set(variants), key=lambda v: (v not in CURRENT, *_order(v)))
    palette = list(matplotlib.colormaps["tab10"].colors)
    palette += [c for i, c in enumerate(matplotlib.colormaps["tab20"].colors) if i % 2]
    if len(ordered) > len(palette):
        wheel = matplotlib.colormaps["hsv"]
        extra = len(ordered) - len(palette)
        palette += [wheel(i / extra) for i in range(extra)]
    return {variant: palette[i] for i, variant in enumerate(ordered)}


def _legend_outside(ax: Any) -> None:
    """The legend to the right of the axes, never over the data."""
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0)


def plot_learning_curves(
    summaries: Sequence[dict[str, Any]], out_dir: Path, current_only: bool = True
) -> list[Path]:
    """Normalized score vs gradient step per dataset, mean +- std over seeds.

    ``current_only``: the :data:`CURRENT` variants into ``curves_<dataset>.png``; else every
    variant into ``curves_all_<dataset>.png``.
    """
    plt = _pyplot()
    written = []
    colours = variant_colours(s["variant"] for s in summaries)
    groups = group_runs(summaries)
    for dataset in sorted({d for d, _ in groups}):
        fig, ax = plt.subplots(figsize=(8, 4))
        drawn = 0
        for (d, variant), runs in groups.items():
            if d != dataset or (current_only and variant not in CURRENT):
                continue
            steps, mean, std = _mean_curve(runs, lambda r: r["curve"])
            if not steps:
                continue
            colour = colours[variant]
            label = f"{ALGO_NAMES.get(variant, variant)} (n={len(runs)})"
            ax.plot(steps, mean, marker="o", ms=2.5, lw=1.5, color=colour, label=label)
            _band(ax, steps, mean, std, colour)
            drawn += 1
        if not drawn:
            plt.close(fig)
            continue
        ax.set(xlabel="gradient step", ylabel="normalized score (mean ± std over seeds)")
        ax.set_title(dataset, fontsize=10)
        ax.grid(alpha=0.3)
        _legend_outside(ax)
        name = f"curves_{dataset}.png" if current_only else f"curves_all_{dataset}.png"
        written.append(_save_figure(fig, out_dir / name))
    return written


def plot_expected_horizon(summaries: Sequence[dict[str, Any]], out_dir: Path) -> list[Path]:
    """Paper Fig. 1 (right): E[h] of the CBOP posterior over training, per dataset."""
    plt = _pyplot()
    written = []
    key = "cbop/expected_horizon"
    groups = group_runs([s for s in summaries if key in s.get("train_curves", {})])
    colours = variant_colours(s["variant"] for s in summaries)
    for dataset in sorted({d for d, _ in groups}):
        fig, ax = plt.subplots(figsize=(8, 4))
        for (d, variant), runs in groups.items():
            if d != dataset:
                continue
            steps, mean, std = _mean_curve(runs, lambda r: r["train_curves"][key])
            colour = colours[variant]
            ax.plot(steps, mean, color=colour, label=f"{variant} (n={len(runs)})")
            _band(ax, steps, mean, std, colour)
        ax.set(xlabel="gradient step", ylabel="E[h] (posterior weights)", title=dataset)
        ax.grid(alpha=0.3)
        _legend_outside(ax)
        written.append(_save_figure(fig, out_dir / f"horizon_{dataset}.png"))
    return written


def plot_target_diagnostics(summaries: Sequence[dict[str, Any]], out_dir: Path) -> list[Path]:
    """CBOP's target scale and critic loss over training (watching for Q divergence)."""
    plt = _pyplot()
    written = []
    keys = ("cbop/target_mean", "loss_qvalue")
    groups = group_runs([s for s in summaries if keys[0] in s.get("train_curves", {})])
    colours = variant_colours(s["variant"] for s in summaries)
    for dataset in sorted({d for d, _ in groups}):
        fig, axes = plt.subplots(1, 2, figsize=(11, 3.5))
        for (d, variant), runs in groups.items():
            if d != dataset:
                continue
            for ax, key in zip(axes, keys, strict=True):
                if not all(key in r["train_curves"] for r in runs):
                    continue
                steps, mean, std = _mean_curve(runs, lambda r, k=key: r["train_curves"][k])
                colour = colours[variant]
                ax.plot(steps, mean, color=colour, label=f"{variant} (n={len(runs)})")
                _band(ax, steps, mean, std, colour)
        for ax, key in zip(axes, ("mean CBOP target y", "critic loss"), strict=True):
            ax.set(xlabel="gradient step")
            ax.set_title(f"{dataset}: {key}", fontsize=9)
            ax.grid(alpha=0.3)
        _legend_outside(axes[1])
        written.append(_save_figure(fig, out_dir / f"targets_{dataset}.png"))
    return written


def _first_with_analysis(runs: Sequence[dict[str, Any]], key: str) -> dict[str, Any] | None:
    for run in runs:  # sorted by seed: the lowest seed that has it
        if run.get("analysis", {}).get(key):
            return run
    return None


def plot_rh_histograms(summaries: Sequence[dict[str, Any]], out_dir: Path) -> list[Path]:
    """Paper Fig. 5: the K*M samples of R_h per h for one dataset state, with N(mu_h, std_h)."""
    plt = _pyplot()
    written = []
    for (dataset, variant), runs in group_runs(summaries).items():
        run = _first_with_analysis(runs, "rh_sample")
        if run is None:
            continue
        sample = run["analysis"]["rh_sample"]
        horizons = len(sample["returns"])
        fig, axes = plt.subplots(1, horizons, figsize=(max(2.2 * horizons, 6.5), 2.8), sharey=True)
        axes = axes if horizons > 1 else [axes]
        for h, ax in enumerate(axes):
            ax.hist(sample["returns"][h], bins=15, color="C0" if sample["valid"][h] else "C7")
            ax.set_title(f"h={h}  w={sample['weights'][h]:.2f}", fontsize=8)
            ax.tick_params(labelsize=6)
        fig.suptitle(
            f"R_h at one state: {dataset}, {variant}, seed {run['seed']} (posterior "
            f"{sample['posterior_mean']:.1f} ± {sample['posterior_std']:.1f})",
            fontsize=8,
        )
        written.append(_save_figure(fig, out_dir / f"rh_{dataset}_{_file_name_part(variant)}.png"))
    return written


def plot_share_histograms(summaries: Sequence[dict[str, Any]], out_dir: Path) -> list[Path]:
    """Paper Fig. 8: histograms over states of A/(A+B) (value share of R_h's variance) per h."""
    plt = _pyplot()
    written = []
    for (dataset, variant), runs in group_runs(summaries).items():
        run = _first_with_analysis(runs, "value_var_share")
        if run is None:
            continue
        share = run["analysis"]["value_var_share"]
        counts = share["counts"][1:]  # h = 0 has no model variance: always 1
        if not counts:
            continue
        bins = share["bins"]
        edges = [i / bins for i in range(bins + 1)]
        fig, axes = plt.subplots(
            1, len(counts), figsize=(max(2.2 * len(counts), 6.5), 2.8), sharey=True
        )
        axes = axes if len(counts) > 1 else [axes]
        for h, (ax, row) in enumerate(zip(axes, counts, strict=True), start=1):
            ax.stairs(row, edges, fill=True)
            ax.set_title(f"h={h}", fontsize=8)
            ax.set_xlabel("A/(A+B)", fontsize=7)
            ax.tick_params(labelsize=6)
        fig.suptitle(
            f"value share of Var(R_h) over {share['num_states']} states: {dataset}, "
            f"{variant}, seed {run['seed']}",
            fontsize=8,
        )
        name = f"share_{dataset}_{_file_name_part(variant)}.png"
        written.append(_save_figure(fig, out_dir / name))
    return written


def plot_rliable(aggregates: dict[str, dict[str, list[float]]], out_dir: Path) -> Path | None:
    variants = [v for v in aggregates if v != "probability_of_improvement"]
    if not variants:
        return None
    plt = _pyplot()
    colours = variant_colours(variants)
    labels = [
        f"{ALGO_NAMES.get(v, v)} ({int(aggregates[v].get('runs', [0])[0])} per set)"
        for v in variants
    ]
    fig, axes = plt.subplots(1, 2, figsize=(9, 0.5 * len(variants) + 1.5))
    for ax, metric in zip(axes, ("iqm", "optimality_gap"), strict=True):
        for row, variant in enumerate(variants):
            point, low, high = aggregates[variant][metric]
            ax.plot([low, high], [row, row], color=colours[variant], lw=6, alpha=0.6)
            ax.plot([point], [row], "k|", ms=12)
        ax.set_yticks(range(len(variants)), labels, fontsize=8)
        ax.set_title(metric.replace("_", " "), fontsize=9)
        ax.grid(alpha=0.3, axis="x")
    return _save_figure(fig, out_dir / "rliable.png")


# ----------------------------------------------------------------------------- report
def write_report(
    summaries: Sequence[dict[str, Any]], out_dir: str | Path, figure_prefix: str = ""
) -> dict[str, Any]:
    """Writes every table and figure into ``out_dir``; returns ``{"files": [...], ...}``.

    Args:
        summaries: from :func:`load_summaries`.
        out_dir: created if needed.
        figure_prefix: path prefix of the figures in ``README_results.md`` (the
            report directory as seen from the file that shows them); a prefix naming
            ``out_dir`` itself is dropped, so the file's links work where it sits.
    """
    out_dir = Path(out_dir)
    if figure_prefix and Path(figure_prefix).resolve() == out_dir.resolve():
        figure_prefix = ""
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = score_rows(summaries)
    files: list[Path] = []
    table = markdown_table(rows)
    _write_text(out_dir / "results.md", table)
    files += [out_dir / "results.md", _write_csv(out_dir / "results.csv", rows)]
    runs = [
        {k: s.get(k) for k in ("dataset", "variant", "seed", "gradient_steps", "wall_time_s")}
        | {
            "final_normalized_score": s["final_normalized_score"],
            "best_normalized_score": s["best_normalized_score"],
            "best_step": s.get("best_step"),
            "expected_horizon_end": s.get("diagnostics", {}).get("expected_horizon_end"),
            "commit": s.get("commit"),
        }
        for variant_runs in group_runs(summaries).values()
        for s in variant_runs
    ]
    files.append(_write_csv(out_dir / "runs.csv", runs))
    figures = plot_learning_curves(summaries, out_dir)
    figures += plot_learning_curves(summaries, out_dir, current_only=False)
    figures += plot_expected_horizon(summaries, out_dir)
    figures += plot_target_diagnostics(summaries, out_dir)
    figures += plot_rh_histograms(summaries, out_dir)
    figures += plot_share_histograms(summaries, out_dir)
    conservatism = conservatism_rows(summaries)
    headline = headline_markdown(summaries)
    _write_text(out_dir / "headline.md", headline)
    files.append(out_dir / "headline.md")
    sections = [
        "## Results\n",
        f"Final normalized score (mean over seeds of each run's last {FINAL_EVALUATIONS} "
        "evaluations; [lowest, highest seed]):\n",
        headline,
        "\nEvery variant:\n",
        table,
    ]
    goals = goal_check(rows, behaviour_scores(summaries))
    if goals:
        sections += [
            f"\nGoal (final score = mean of the last {FINAL_EVALUATIONS} evaluations, mean over "
            "seeds):\n",
            "\n".join(goals) + "\n",
        ]
    datasets = dataset_markdown(summaries)
    if datasets:
        sections += ["\n### Datasets\n", datasets]
    if conservatism:
        _write_text(out_dir / "conservatism.md", conservatism_markdown(conservatism))
        files += [out_dir / "conservatism.md"]
        files.append(_write_csv(out_dir / "conservatism.csv", conservatism))
        sections += ["\n### Conservatism (paper Table 2)\n", conservatism_markdown(conservatism)]
    aggregates = rliable_aggregates(summaries)
    if aggregates:
        _write_text(out_dir / "rliable.md", rliable_markdown(aggregates))
        files.append(out_dir / "rliable.md")
        _write_text(out_dir / "rliable.json", json.dumps(aggregates, indent=1))
        files.append(out_dir / "rliable.json")
        plot = plot_rliable(aggregates, out_dir)
        if plot is not None:
            figures.append(plot)
        sections += ["\n### Aggregate metrics (rliable)\n", rliable_markdown(aggregates)]
    files += figures
    sections.append("\n### Figures\n")
    sections += [f"![{p.stem}]({figure_prefix}{p.name})\n" for p in figures]
    _write_text(out_dir / "README_results.md", "\n".join(sections))
    files.append(out_dir / "README_results.md")
    return {"files": files, "rows": rows, "rliable": aggregates, "conservatism": conservatism}


__all__ = [
    "SUMMARY_FORMAT",
    "ReportError",
    "conservatism_rows",
    "current_files",
    "file_versions",
    "goal_check",
    "group_runs",
    "headline_markdown",
    "load_summaries",
    "markdown_table",
    "name_earlier_files",
    "read_scalar_curves",
    "rliable_aggregates",
    "score_rows",
    "summarize_run",
    "variant_colours",
    "variant_name",
    "write_report",
]
