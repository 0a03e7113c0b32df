"""The paper's psi grid on the generated sets, and its offline choice by FQE.

    python benchmarks/psi_grid.py                 # the grid's table, from the committed files
    python benchmarks/psi_grid.py --select        # + FQE of every grid run whose directory is here
    python benchmarks/psi_grid.py --select --datasets halfcheetah-medium-replay-gen

The paper tunes one setting per task, the LCB coefficient psi, over {0.5, 2, 3, 5}
(appendix, "Hyperparameters"), and shows that fitted Q evaluation (FQE) of the trained
policies, on the dataset alone, ranks the candidates like their online scores (appendix C).
The grid's runs are the benchmark's variants ``cbop-psi<value>`` (``benchmarks/learning.py
--algos cbop-psi0.5 cbop-psi2 cbop-psi3 cbop-psi5``); a set's plain ``cbop`` row counts as the
grid's row at the set's default psi (the paper's D4RL table), and so does ``cbop-starts``
(hopper's rerun of the preset, independent of the runs that chose its sizes). Per psi the row
is the variant with the most seeds on the set's current file (ties go to ``cbop-psi<value>``,
then ``cbop-starts``, then ``cbop``).

A set's choice is made only once every grid value has a scored run (until then the file
keeps the scores, ``selected_psi`` is null and ``missing_psi`` names the values without one).

``--select`` fits FQE (:func:`cbop_torchrl.evaluation.selection.score_runs`: the run's own
FQE settings, scored at the dataset's initial states) to each grid policy whose run directory
(the summary's ``run_dir``, or that of an identical rerun under another grid variant: the same
curve to the last digit) is on this machine; where neither is, another grid variant's run of
the same psi and seed (the same settings, a different curve) stands for it and is scored as
itself, its own online finals beside its FQE score (``fqe_runs`` names the run scored per
seed). It writes ``<results>/<set>/psi_selection.json``:

- ``selected_psi`` and ``variant``: the candidate with the highest mean FQE score over the
  ``compared_seeds``, those every candidate has scored (FQE's value moves with the seed, so
  the candidates are compared on the same seeds; offline: no episode is used);
- ``candidates``: per psi its variant, its FQE score (over the compared seeds, over all its
  scored seeds and per seed) and its online finals on both measures (mean of the last 3
  evaluations; reset and start-state measures) over the compared seeds and over all its seeds;
- ``spearman``: Spearman's rho between the FQE order and the online order of the candidates,
  on each measure (the paper's table reports it on the online score).

Per-seed FQE scores are kept in the file with the FQE settings they were fitted with, so
seeds scored on another machine (whose run directories are gone) still count; a seed is scored
again when its summary changed, and a score whose entry names no settings is not used (such
entries were fitted at the critic's target rate, ``agent.tau``, instead of the FQE stage's
``fqe.target_tau``: about 25 value-iteration sweeps at the CPU preset's 5,000 steps), nor one
whose settings differ from those FQE takes for the run today where its directory is here; the
table calls a stored choice resting on such scores provisional.

The table (``psi_grid.json`` per set keeps what only a run directory holds: the Q-ensemble's
spread at the policy's and at the data's actions at the end of training) gives per set and psi
the finals on both measures, Q - MC at the end, E[h] and the spreads.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # `python benchmarks/psi_grid.py` puts benchmarks/, not the root

from benchmarks.cbop_row import (  # noqa: E402
    DEFAULT_PSI_ROWS,
    GRID,
    SELECTION_NAME,
    SETS,
    current_file,
    grid_rows,
    grid_variant,
    load_rows,
    summaries_on,
    summary_psi,
)
from cbop_torchrl.io import atomic_json_dump  # noqa: E402

SELECTION_FORMAT = "cbop-torchrl-psi-selection/1"
GRID_NAME = "psi_grid.json"
GRID_FORMAT = "cbop-torchrl-psi-grid/1"
SPREAD_KEYS = ("q_std_pi", "q_std_data")
"""Diagnostics (``diag/`` logs): the Q-ensemble's spread at the policy's and the data's actions."""
PROVISIONAL = (
    "; provisional: some of its FQE scores name no settings (fitted at the critic's target "
    "rate) or not those FQE takes for the run today, and --select fits them again where the "
    "runs are on the machine"
)
"""The table's note on a choice resting on such scores."""


def grid_variant_of(psi: float, preset: str) -> str:
    """The grid's row of ``psi`` at ``preset``: ``cbop-psi<P>`` (the CPU preset's),
    ``cbop-<preset>-psi<P>`` otherwise (``cbop-score``'s rows of a GPU job's snapshots)."""
    return grid_variant(psi) if preset == "cpu" else f"cbop-{preset}-psi{psi:g}"


def stand_ins(psi: float, preset: str) -> tuple[str, ...]:
    """The variants whose runs of the same psi and seed can stand for a row's run: the CPU
    preset's grid and default rows; none at another preset (its sizes are its own)."""
    return (grid_variant(psi), *DEFAULT_PSI_ROWS) if preset == "cpu" else ()


def preset_grid_rows(results: Path, dataset: str, preset: str) -> dict[float, tuple[str, dict]]:
    """Per grid psi: the row's variant and its summaries on the set's current file, by seed
    (:func:`~cbop_torchrl.evaluation.headline.grid_rows` at the CPU preset; the
    ``cbop-<preset>-psi<P>`` rows otherwise)."""
    if preset == "cpu":
        return grid_rows(results, dataset)
    rows = load_rows(results, dataset)
    if rows is None:
        return {}
    file, grid = current_file(rows), {}
    for psi in GRID:
        variant = grid_variant_of(psi, preset)
        found = summaries_on(results, dataset, variant, file)
        found = {seed: s for seed, s in found.items() if summary_psi(s) == psi}
        if found:
            grid[psi] = (variant, found)
    return grid


def selection_name(preset: str) -> str:
    """``psi_selection.json`` (the CPU preset's, which the headline reads), else
    ``psi_selection-<preset>.json``."""
    return SELECTION_NAME if preset == "cpu" else SELECTION_NAME.replace(".json", f"-{preset}.json")


def run_dir_here(
    results: Path, dataset: str, psi: float, seed: int, summary: dict, preset: str = "cpu"
) -> Path | None:
    """A run directory on this machine for the row's run ``summary`` (psi, seed), or None.

    The summary's own ``run_dir`` when it is here; else that of another grid variant's run of
    the same psi and seed on the same file whose curve is the same to the last digit (the same
    run made again: CPU runs are deterministic for a seed, dtype and CPU kind).
    """
    own = Path(summary.get("run_dir", ""))
    if (own / "config.json").is_file():
        return own
    file = str(summary.get("dataset_provenance", {}).get("sha256"))[:12]
    for variant in stand_ins(psi, preset):
        other = summaries_on(results, dataset, variant, file).get(seed)
        if other is None or summary_psi(other) != psi or other.get("curve") != summary.get("curve"):
            continue
        path = Path(other.get("run_dir", ""))
        if (path / "config.json").is_file():
            return path
    return None


def own_dir(summary: dict) -> Path | None:
    """The summary's own run directory when it is on this machine."""
    path = Path(summary.get("run_dir", ""))
    return path if (path / "config.json").is_file() else None


def seed_runs(
    results: Path,
    dataset: str,
    psi: float,
    variant: str,
    seed: int,
    summary: dict,
    file: str,
    preset: str = "cpu",
) -> list[tuple[str, dict]]:
    """``(key, summary)`` of the runs that can stand for the row's run at ``seed``, in order.

    First the row's own run; then the other grid variants' runs of the same psi and seed on
    the same file: the same configuration made again. Such a rerun can differ from the row's
    run (``estimator.rollout_dtype=auto`` picks bf16 or float32 by a timing taken at the
    start, so a loaded machine may pick the other), and is then scored as the policy it is,
    with its own online finals beside its FQE score.
    """
    runs = [(f"{variant}/seed{seed}", summary)]
    for other in stand_ins(psi, preset):
        rerun = summaries_on(results, dataset, other, file).get(seed) if other != variant else None
        if rerun is not None and summary_psi(rerun) == psi:
            runs.append((f"{other}/seed{seed}", rerun))
    return runs


def fitted_with_settings(entry: dict[str, Any]) -> bool:
    """Whether a stored FQE score was fitted with the settings FQE takes for its run today.

    An entry that names no settings was fitted at the critic's target rate and is not used.
    Where the run's directory is on this machine, the named settings must also equal those
    :func:`~cbop_torchrl.evaluation.selection.fqe_config_for_run` derives from its
    ``config.json`` now (a later change to how FQE is set up then fits the run again); where
    the directory is gone, the named settings are all there is to go by, and they count.
    """
    if "fqe_settings" not in entry:
        return False
    today = settings_for_run_here(Path(entry.get("run_dir", "")))
    return today is None or as_json(entry["fqe_settings"]) == today


def settings_for_run_here(run_dir: Path) -> Any:
    """The FQE settings (as JSON holds them) for the run in ``run_dir``; None if it is not here."""
    config_path = run_dir / "config.json"
    if not config_path.is_file():
        return None
    from dataclasses import asdict

    from cbop_torchrl.evaluation.selection import fqe_config_for_run

    return as_json(asdict(fqe_config_for_run(json.loads(config_path.read_text()))))


def as_json(value: Any) -> Any:
    """``value`` as a JSON round trip gives it back (tuples become lists), for comparisons."""
    return json.loads(json.dumps(value))


def is_scored(per_seed: dict[str, dict], key: str, summary: dict) -> bool:
    """Whether ``per_seed`` holds an FQE score of this very run, fitted with known settings."""
    entry = per_seed.get(key, {})
    return entry.get("summary") == summary_key(summary) and fitted_with_settings(entry)


def start_final(summary: dict) -> float | None:
    return summary.get("start_states", {}).get("final_normalized_score")


def overestimation(summary: dict) -> float | None:
    return summary.get("analysis", {}).get("conservatism", {}).get("overestimation")


def mean(values: list[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return sum(known) / len(known) if known else None


def summary_key(summary: dict) -> str:
    """What identifies one finished run's outcome (a rerun that changed it gets a new key)."""
    return f"{summary.get('finished_utc')}|{summary.get('final_normalized_score')}"


def read_json(path: Path, form: str) -> dict[str, Any]:
    if not path.is_file():
        return {"format": form}
    return json.loads(path.read_text())


def record_spreads(results: Path, dataset: str, grid: dict) -> dict[str, Any]:
    """``psi_grid.json`` updated with the end-of-run spreads of every run directory here."""
    from cbop_torchrl.evaluation.summaries import read_scalar_curves

    path = results / dataset / GRID_NAME
    stored = read_json(path, GRID_FORMAT)
    runs = stored.setdefault("runs", {})
    changed = False
    for psi, (variant, found) in grid.items():
        for seed, summary in found.items():
            run_dir = run_dir_here(results, dataset, psi, seed, summary)
            entry_key = f"{variant}/seed{seed}"
            if run_dir is None:
                continue
            entry = runs.get(entry_key, {})
            if entry.get("summary") == summary_key(summary):
                continue
            curves = read_scalar_curves(run_dir, "diag/")
            values = {k: curves[k][-1][1] for k in SPREAD_KEYS if curves.get(k)}
            if values:
                runs[entry_key] = {"summary": summary_key(summary), **values}
                changed = True
    if changed:
        atomic_json_dump(stored, path)
    return stored


def grid_table(results: Path, datasets: list[str]) -> str:
    lines = [
        "| set | psi | row | seeds | final (reset) | final (start states) | Q - MC at the end "
        "| E[h] at the end | Q spread, policy / data actions |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for dataset in datasets:
        grid = grid_rows(results, dataset)
        stored = record_spreads(results, dataset, grid) if grid else {}
        for psi, (variant, found) in grid.items():
            seeds = sorted(found)
            summaries = [found[seed] for seed in seeds]
            gaps = [overestimation(s) for s in summaries]
            horizons = [s.get("diagnostics", {}).get("expected_horizon_end") for s in summaries]
            spreads = [stored.get("runs", {}).get(f"{variant}/seed{seed}", {}) for seed in seeds]
            spread_pi = mean([s.get("q_std_pi") for s in spreads])
            spread_data = mean([s.get("q_std_data") for s in spreads])
            spread_seeds = [seed for seed, s in zip(seeds, spreads, strict=True) if s]
            spread_note = (
                f" (seed{'s' if len(spread_seeds) > 1 else ''} {', '.join(map(str, spread_seeds))})"
                if spread_seeds and spread_seeds != seeds
                else ""
            )
            lines.append(
                f"| {dataset} | {psi:g} | {variant} | {', '.join(map(str, seeds))} "
                f"| {_show(mean([s['final_normalized_score'] for s in summaries]))} "
                f"| {_show(mean([start_final(s) for s in summaries]))} "
                f"| {', '.join('n/a' if g is None else f'{g:+.0f}' for g in gaps)} "
                f"| {_show(mean(horizons), 2)} "
                f"| {_show(spread_pi, 2)} / {_show(spread_data, 2)}{spread_note} |"
            )
    return "\n".join(lines)


def _show(value: float | None, digits: int = 1) -> str:
    return "n/a" if value is None or math.isnan(value) else f"{value:.{digits}f}"


def select(
    results: Path, dataset: str, threads: int | None, preset: str = "cpu"
) -> dict[str, Any] | None:
    """Scores the grid's policies by FQE, writes and returns ``psi_selection.json`` (at
    another preset, ``psi_selection-<preset>.json`` from its ``cbop-<preset>-psi<P>`` rows)."""
    import torch

    from cbop_torchrl.evaluation.selection import score_runs, spearman_rho

    if threads:
        torch.set_num_threads(threads)
    grid = preset_grid_rows(results, dataset, preset)
    if len(grid) < 2:
        print(f"[psi] {dataset}: {len(grid)} grid value(s) with runs; nothing to choose between")
        return None
    path = results / dataset / selection_name(preset)
    stored = read_json(path, SELECTION_FORMAT)
    per_seed: dict[str, dict] = stored.get("fqe_per_run", {})
    file = current_file(load_rows(results, dataset))
    for psi, (variant, found) in grid.items():
        for seed, summary in sorted(found.items()):
            runs = seed_runs(results, dataset, psi, variant, seed, summary, file, preset)
            if any(is_scored(per_seed, key, run) for key, run in runs):
                continue
            for index, (key, run) in enumerate(runs):
                run_dir = (
                    run_dir_here(results, dataset, psi, seed, run, preset)
                    if index == 0
                    else own_dir(run)
                )
                if run_dir is None:
                    continue
                print(f"[psi] {dataset} psi {psi:g} ({key}): FQE of {run_dir}", flush=True)
                (score,) = score_runs([run_dir])
                per_seed[key] = {
                    "summary": summary_key(run),
                    "fqe_value": score.fqe_value,
                    "fqe_settings": score.fqe_settings,
                    "policy_step": score.policy_step,
                    "run_dir": str(run_dir),
                }
                break
    scored_by_psi: dict[float, tuple[str, dict, dict[int, tuple[str, dict]]]] = {}
    for psi, (variant, found) in grid.items():
        scored: dict[int, tuple[str, dict]] = {}
        for seed, summary in sorted(found.items()):
            runs = seed_runs(results, dataset, psi, variant, seed, summary, file, preset)
            first = next(((k, r) for k, r in runs if is_scored(per_seed, k, r)), None)
            if first is not None:
                scored[seed] = first
        if scored:
            scored_by_psi[psi] = (variant, found, scored)
    if len(scored_by_psi) < 2:
        return keep_scores(
            path, dataset, file, per_seed, "fewer than 2 grid values have a scored run"
        )
    # The candidates are compared on the seeds every one of them has scored: FQE's value
    # moves with the seed (hopper: 35.9 and 23.3 for one psi's seeds 0 and 1), so a mean
    # over more seeds for one psi than another would rank the seeds, not the psi.
    compared = sorted(set.intersection(*(set(s) for _, _, s in scored_by_psi.values())))
    if not compared:
        return keep_scores(path, dataset, file, per_seed, "no seed is scored for every grid value")
    candidates = []
    for psi, (variant, found, scored) in scored_by_psi.items():
        fqe = {s: per_seed[key]["fqe_value"] for s, (key, _) in scored.items()}
        runs_compared = [scored[s][1] for s in compared]
        candidates.append(
            {
                "psi": psi,
                "variant": variant,
                "fqe_seeds": sorted(scored),
                "fqe_runs": {str(s): key for s, (key, _) in scored.items()},
                "fqe_value": mean([fqe[s] for s in compared]),
                "fqe_value_all_seeds": sum(fqe.values()) / len(fqe),
                "fqe_per_seed": {str(s): v for s, v in fqe.items()},
                "final": mean([r["final_normalized_score"] for r in runs_compared]),
                "start_final": mean([start_final(r) for r in runs_compared]),
                "all_seeds": sorted(found),
                "final_all_seeds": mean([s["final_normalized_score"] for s in found.values()]),
                "start_final_all_seeds": mean([start_final(s) for s in found.values()]),
            }
        )
    candidates.sort(key=lambda c: -c["fqe_value"])
    missing = sorted(set(GRID) - {c["psi"] for c in candidates})
    fqe_values = [c["fqe_value"] for c in candidates]
    chosen = candidates[0]
    selection = selection_record(
        dataset,
        file,
        per_seed,
        statistic="FQE: mean over the compared seeds (those every candidate has scored) "
        "of E_{s0 in D}[mean_m Q_m(s0, pi(s0))]; online: mean of each run's last 3 "
        "evaluations, over the same seeds",
        compared_seeds=compared,
        # The paper chooses among the whole grid: until every value has a scored run the
        # file keeps the scores and names no choice (the set's default psi stands).
        selected_psi=chosen["psi"] if not missing else None,
        variant=chosen["variant"] if not missing else None,
        missing_psi=missing,
        candidates=candidates,
        spearman={
            "reset": spearman_rho(fqe_values, [c["final"] for c in candidates]),
            "start_states": _rho_or_none(spearman_rho, fqe_values, candidates, "start_final"),
        },
        online_best_psi=max(candidates, key=lambda c: c["final"])["psi"],
    )
    atomic_json_dump(selection, path)
    if missing:
        print(f"[psi] {dataset}: no choice yet, psi {', '.join(f'{m:g}' for m in missing)} "
              f"without a scored run; the FQE scores so far are in {path}")  # fmt: skip
    else:
        print(f"[psi] {dataset}: FQE chooses psi {chosen['psi']:g} ({chosen['variant']}); {path}")
    return selection


def selection_record(
    dataset: str, file: str, per_seed: dict[str, dict], **fields: Any
) -> dict[str, Any]:
    """``psi_selection.json``'s record: ``fields`` over the record of no choice."""
    return {
        "format": SELECTION_FORMAT,
        "dataset": dataset,
        "dataset_sha256": file,
        "compared_seeds": [],
        "selected_psi": None,
        "variant": None,
        "missing_psi": [],
        "candidates": [],
        "spearman": {"reset": None, "start_states": None},
        "online_best_psi": None,
        "fqe_per_run": per_seed,
        **fields,
    }


def keep_scores(
    path: Path, dataset: str, file: str, per_seed: dict[str, dict], reason: str
) -> dict[str, Any]:
    """Writes the FQE scores computed so far with no choice, so that none is computed twice."""
    selection = selection_record(dataset, file, per_seed, no_choice=reason)
    atomic_json_dump(selection, path)
    print(f"[psi] {dataset}: {reason}; nothing chosen, the FQE scores so far are in {path}")
    return selection


def _rho_or_none(rho, fqe_values: list[float], candidates: list[dict], key: str) -> float | None:
    online = [c[key] for c in candidates]
    return None if any(v is None for v in online) else rho(fqe_values, online)


def choice_is_provisional(selection: dict[str, Any]) -> bool:
    """Whether some FQE score behind a stored choice is not fitted with today's settings."""
    per_run = selection.get("fqe_per_run", {})
    return not all(
        fitted_with_settings(per_run.get(key, {}))
        for candidate in selection["candidates"]
        for key in candidate.get("fqe_runs", {}).values()
    )


def selection_table(results: Path, datasets: list[str]) -> str:
    lines = [
        "| set | psi | row | FQE seeds | FQE score | final (reset) | final (start states) "
        "| chosen |",
        "|---|---|---|---|---|---|---|---|",
    ]
    notes = []
    for dataset in datasets:
        path = results / dataset / SELECTION_NAME
        if not path.is_file():
            continue
        selection = json.loads(path.read_text())
        for c in sorted(selection["candidates"], key=lambda c: c["psi"]):
            lines.append(
                f"| {dataset} | {c['psi']:g} | {c['variant']} "
                f"| {', '.join(map(str, selection.get('compared_seeds', c['fqe_seeds'])))} "
                f"| {c['fqe_value']:.1f} "
                f"| {_show(c['final'])} | {_show(c['start_final'])} "
                f"| {'**FQE**' if c['psi'] == selection['selected_psi'] else ''}"
                f"{' online best' if c['psi'] == selection['online_best_psi'] else ''} |"
            )
        rho = selection["spearman"]
        if reason := selection.get("no_choice"):
            notes.append(f"- {dataset}: no choice ({reason})")
            continue
        if selection["selected_psi"] is None:
            missing = ", ".join(f"{m:g}" for m in selection["missing_psi"])
            notes.append(f"- {dataset}: no choice until psi {missing} have scored runs")
            continue
        notes.append(
            f"- {dataset}: FQE chooses psi {selection['selected_psi']:g}; the online best "
            f"(reset final) is psi {selection['online_best_psi']:g}; Spearman's rho of the two "
            f"orders {_show(rho['reset'], 2)} (reset), {_show(rho['start_states'], 2)} "
            "(start states)" + (PROVISIONAL if choice_is_provisional(selection) else "")
        )
    return "\n".join([*lines, "", *notes])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--datasets", nargs="+", default=list(SETS))
    parser.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument(
        "--select",
        action="store_true",
        help=f"fit FQE to the grid's runs found here, write <set>/{SELECTION_NAME}",
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads for FQE")
    parser.add_argument(
        "--preset",
        default="cpu",
        help="with --select: the grid's rows at this preset (paper: cbop-paper-psi<P>, the "
        "rows cbop-score makes of a GPU job's snapshots), chosen into "
        "<set>/psi_selection-<preset>.json",
    )
    args = parser.parse_args(argv)
    unknown = [d for d in args.datasets if not (args.results / d).is_dir()]
    if unknown:
        parser.exit(2, f"psi_grid: no results for {', '.join(unknown)} under {args.results}\n")
    if args.select:
        for dataset in args.datasets:
            select(args.results, dataset, args.threads, args.preset)
    print(grid_table(args.results, args.datasets))
    print()
    print(selection_table(args.results, args.datasets))
    return 0


if __name__ == "__main__":
    sys.exit(main())
