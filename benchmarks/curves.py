"""Print a run's learning curve with its diagnostics as a markdown table.

    python benchmarks/curves.py RUN_DIR [RUN_DIR ...] [--keys eval/normalized_score diag/q_pi ...]

Reads the CSV logger's files (``<run>/logs/<name>/scalars/<group>/<key>.csv``,
rows ``step,value``) of runs trained with ``eval.diagnostics=true`` and prints
one row per evaluation step (by default the diagnostics the runs logged, with the
start-state score of ``eval.start_states`` beside the reset score). With several
runs, each key is the mean over them (e.g. seeds), and ``--per-run`` prints each
run's table instead.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from cbop_torchrl.evaluation.summaries import read_scalar_curves

DEFAULT_KEYS = [
    "eval/normalized_score",
    "diag/q_pi",
    "diag/q_data",
    "diag/q_pi_minus_data",
    "diag/q_std_pi",
    "diag/q_start",
    "diag/mc_start",
    "diag/q_minus_mc_visited",
    "diag/bc_logprob",
    "diag/action_distance",
    "diag/model_error_policy",
    "diag/model_error_data",
    "diag/horizon_gap_1",
    "diag/lcb_penalty",
    "train/alpha",
]
AVERAGE_KEY = "eval/average_normalized_score"  # with eval.actor_average (beyond the paper)
START_KEY = "eval/start_normalized_score"  # with eval.start_states: episodes from dataset states


def read_scalars(run_dir: Path) -> dict[str, dict[int, float]]:
    """``{"group/key": {step: value}}`` from every CSV under ``run_dir/logs``.

    A copied or moved run directory that was resumed (two logger names) reads
    as one curve; see :func:`read_scalar_curves`.
    """
    curves = read_scalar_curves(run_dir, prefix="")
    return {key: {int(step): value for step, value in points} for key, points in curves.items()}


def nearest(values: dict[int, float], step: int) -> float | None:
    """The value logged at ``step``, or at the last step before it (training metrics)."""
    if step in values:
        return values[step]
    before = [s for s in values if s <= step]
    return values[max(before)] if before else None


def measured(key: str) -> bool:
    """Whether ``key`` is a measurement (evaluation, diagnostics), logged at the steps it
    measures, rather than a training statistic logged every few steps."""
    return key.startswith(("eval/", "diag/"))


def table(runs: list[dict[str, dict[int, float]]], keys: list[str]) -> str:
    """One row per step with a measurement (an evaluation or a diagnostic): a measurement
    missing at a step is left blank, a training statistic is its last value at or before."""
    measurements = ["eval/normalized_score", *(k for k in keys if measured(k))]
    steps = sorted(set().union(*(r.get(k, {}).keys() for r in runs for k in measurements)))
    lines = ["| step | " + " | ".join(k.split("/", 1)[1] for k in keys) + " |"]
    lines.append("|---" * (len(keys) + 1) + "|")
    for step in steps:
        cells = []
        for key in keys:
            if measured(key):
                values = [r.get(key, {}).get(step) for r in runs]
            else:
                values = [nearest(r.get(key, {}), step) for r in runs]
            values = [v for v in values if v is not None]
            cells.append(f"{sum(values) / len(values):.3g}" if values else "")
        lines.append(f"| {step} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    parser.add_argument("--keys", nargs="+", help="group/key names (default: the diagnostics)")
    parser.add_argument("--per-run", action="store_true")
    args = parser.parse_args()
    runs = [read_scalars(run) for run in args.runs]
    logged = set().union(*runs)
    if args.keys is None:  # the diagnostics these runs logged (a baseline logs none of diag/*)
        optional = (START_KEY, AVERAGE_KEY)
        args.keys = [k for k in DEFAULT_KEYS if k in logged] or DEFAULT_KEYS
        args.keys[1:1] = [k for k in optional if k in logged]
    unknown = [key for key in args.keys if key not in logged]
    if unknown:
        parser.error(
            f"--keys {' '.join(unknown)}: not logged by these runs; keys are group/name, "
            f"one of: {' '.join(sorted(logged))}"
        )
    if args.per_run:
        for path, run in zip(args.runs, runs, strict=True):
            print(f"\n{path}\n")
            print(table([run], args.keys))
    else:
        print(table(runs, args.keys))


if __name__ == "__main__":
    main()
