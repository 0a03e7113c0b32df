"""``cbop-score`` (``scripts/score.py``): the snapshots of runs trained with
``eval.snapshot_interval`` scored on the CPU, written as the benchmark's seed summaries.

    cbop-score paths=gpu-runs/halfcheetah-medium-replay-gen      # a folder of run directories
    cbop-score paths=[runs/psi2-seed0,runs/psi3-seed0] results=benchmarks/results

A GPU job trains with snapshots and no evaluation inside its window
(:mod:`cbop_torchrl.trainers.snapshots`); this program evaluates every snapshot on the
measures the CPU runs use (:mod:`cbop_torchrl.evaluation.snapshot_scores`): the reset
measure, the start-state measure and Q - MC at the snapshot's 100 dataset states. The
records go to ``<run dir>/snapshot_scores.json``; scoring again skips the snapshots scored
already. A finished run (its ``results.json`` written) also gets its seed summary,
``<results>/<set>/cbop-<preset>-psi<psi>/seed<k>.json``, the file ``benchmarks/learning.py``
writes; ``python benchmarks/learning.py --rows --datasets <set>`` then rewrites the set's
``rows.json``. Every setting: ``cbop_torchrl/configs/score.yaml``.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

import torch
from omegaconf import DictConfig, ListConfig

from cbop_torchrl.cli import hydra_entry, refuse, run_entry
from cbop_torchrl.io import atomic_json_dump, find_regular_files, unwritable_reason
from cbop_torchrl.trainers.checkpoint import CheckpointError
from cbop_torchrl.trainers.snapshots import SNAPSHOT_DIR, snapshot_steps

PROGRAM = "cbop-score"


def score_paths(value: object) -> list[Path]:
    """``paths=`` (one path or a list of paths) as a list; refuses (exit 2) anything else."""
    items = list(value) if isinstance(value, (ListConfig, list, tuple)) else [value]
    if not items or any(item is None or isinstance(item, (DictConfig, dict)) for item in items):
        refuse(
            f"paths={value} must be a path or a list of paths, e.g. paths=gpu-runs/halfcheetah "
            "or paths=[runs/psi2-seed0,runs/psi3-seed0]"
        )
    return [Path(str(item)) for item in items]


def runs_with_snapshots(paths: Sequence[Path]) -> list[Path]:
    """The run directories given or held (at any depth) by ``paths``, each with snapshots.

    Refuses (exit 2), before anything is scored: a path that does not exist, one that is
    neither a run directory (``config.json``) nor a folder holding one, and a run without
    snapshots.
    """
    runs: list[Path] = []
    for path in paths:
        if not path.is_dir():
            refuse(
                f"paths: {str(path)!r} is not a folder; give a run directory of cbop-train "
                "(it holds config.json) or a folder holding such run directories"
            )
        found = [f.parent for f in find_regular_files(path, "config.json")]
        found = [run for run in found if (run / "results.json").is_file() or
                 (run / SNAPSHOT_DIR).is_dir() or (run / "checkpoint.pt").is_file()]  # fmt: skip
        if not found:
            refuse(
                f"paths: {str(path)!r} is not a run directory and holds none (no config.json "
                "with results.json, checkpoint.pt or snapshots/ beside it, at any depth); give "
                "the hydra.run.dir of a cbop-train run trained with eval.snapshot_interval=N, or "
                "a folder holding such runs"
            )
        runs.extend(run for run in found if run not in runs)
    bare = [run for run in runs if not snapshot_steps(run)]
    if bare:
        names = ", ".join(repr(str(run)) for run in bare[:3]) + (" ..." if len(bare) > 3 else "")
        refuse(
            f"no snapshots found in {len(bare)} run(s): {names}; only a run trained with "
            "eval.snapshot_interval=N (e.g. eval.snapshot_interval=2500) writes "
            f"{SNAPSHOT_DIR}/step<k>.pt. Leave those runs out of paths=, or train them again "
            "with that setting"
        )
    return runs


def validate(cfg: DictConfig) -> None:
    """Refuses (exit 2) before any snapshot is scored: bad paths (:func:`runs_with_snapshots`)
    and a results folder that cannot be written."""
    runs_with_snapshots(score_paths(cfg.paths))
    results = Path(cfg.results).absolute()
    existing = next(p for p in (results, *results.parents) if p.exists())
    if reason := unwritable_reason(existing):
        refuse(
            f"results={cfg.results} cannot be written: {reason}; set results= to a folder "
            "you can write to, e.g. results=benchmarks/results"
        )


def run(cfg: DictConfig) -> None:
    """The Hydra task: score every run's snapshots, write the finished runs' seed summaries."""
    from cbop_torchrl.data import DatasetError
    from cbop_torchrl.evaluation.snapshot_scores import ScoringError, score_run, seed_summary

    if cfg.threads is not None:
        torch.set_num_threads(int(cfg.threads))
    runs = runs_with_snapshots(score_paths(cfg.paths))

    def announce(run_dir: Path, step: int) -> None:
        print(f"[score] {run_dir}: snapshot at step {step}", flush=True)

    datasets = set()
    for run_dir in runs:
        try:
            records = score_run(run_dir, announce)
            finished = (run_dir / "results.json").is_file()
            summary = seed_summary(run_dir, records) if finished else None
        except (ScoringError, DatasetError, CheckpointError) as error:
            refuse(error)
        if summary is None:
            print(
                f"[score] {run_dir}: {len(records)} snapshot(s) scored; the run has not "
                "finished (no results.json), so it has no seed summary yet",
                flush=True,
            )
            continue
        path = (
            Path(cfg.results) / summary["dataset"] / summary["variant"] / f"seed{summary['seed']}"
        ).with_suffix(".json")
        if not path.is_file() or json.loads(path.read_text()).get("curve") != summary["curve"]:
            atomic_json_dump(summary, path)
        datasets.add(summary["dataset"])
        print(
            f"[score] {run_dir}: final {summary['final_normalized_score']:.1f} (start states "
            f"{summary['start_states']['final_normalized_score']:.1f}, Q - MC "
            f"{summary['analysis']['conservatism']['overestimation']:+.1f}) -> {path}",
            flush=True,
        )
    for dataset in sorted(datasets):
        where = "" if cfg.results == "benchmarks/results" else f" --results {cfg.results}"
        print(f"[score] rows: python benchmarks/learning.py --rows{where} --datasets {dataset}")


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the program on ``argv`` (Hydra overrides; default: the command line) and returns
    its exit code."""
    words = sys.argv[1:] if argv is None else list(argv)

    def program() -> None:
        hydra_entry("score", validate=validate)(run)()

    return run_entry(program, words)
