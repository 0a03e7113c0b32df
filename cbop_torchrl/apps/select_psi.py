"""``cbop-select-psi`` (``scripts/select_psi.py``): offline choice of psi (or any swept
setting) by fitted Q evaluation of each trained policy.

    cbop-select-psi sweeps/paper_grid
    cbop-select-psi multirun --steps 20000 --device cuda
    cbop-select-psi multirun --json selection.json
    cbop-select-psi multirun task.ref_min_score=0 task.ref_max_score=360

For every run under the sweep directory the trained policy is evaluated
offline (paper appendix C): a fresh Q-ensemble is fitted to the policy's
value on the run's dataset (FQE), and the policy scores
``E_{s0 in D}[Q_fqe(s0, pi(s0))]`` over the dataset's initial states. Per
dataset, the settings that differ between runs (e.g. ``estimator.psi``) are
ranked by their score averaged over seeds. When the runs were evaluated
online (``results.json``), the online ranking and Spearman's rho between the
two rankings are printed too: D4RL-normalized scores, or the raw return for
a task without reference scores (``task.ref_min_score``/``task.ref_max_score``
given here normalize it). The other ``task.*`` keys are accepted like in every
entry script, but offline selection never runs the environment. Fits are
cached in each run directory, so a second call is fast and an interrupted
one resumes.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import typing
from pathlib import Path

import torch
import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from cbop_torchrl.cli import describe_type
from cbop_torchrl.data import DatasetError
from cbop_torchrl.envs.task import TaskConfig
from cbop_torchrl.evaluation.selection import DatasetRanking, rank_runs, score_runs
from cbop_torchrl.sweeps import SweepError, find_runs
from cbop_torchrl.trainers.checkpoint import CheckpointError
from cbop_torchrl.utils import atomic_write, resolve_device, unwritable_reason


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Rank the runs of a sweep by FQE of their policies (offline selection).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument("sweep_dir", type=Path, help="a sweep's hydra.sweep.dir")
    parser.add_argument(
        "--steps", type=int, default=None, help="FQE gradient steps (default: each run's fqe.steps)"
    )
    parser.add_argument(
        "--batch-size",
        type=int,
        default=None,
        help="FQE batch (default: each run's fqe.batch_size)",
    )
    parser.add_argument("--qvalue-nets", type=int, default=2, help="FQE ensemble size")
    parser.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:<index>")
    parser.add_argument(
        "--threads", type=int, default=None, help="torch CPU threads (1 is fastest for tiny nets)"
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the rankings here")
    parser.add_argument("--no-progress", action="store_true", help="no FQE progress bars")
    parser.add_argument(
        "task", nargs="*", metavar="task.KEY=VALUE",
        help="task.* values as in scripts/cbop.py (task.ref_min_score=0 task.ref_max_score=360)",
    )  # fmt: skip
    return parser.parse_intermixed_args(argv)


def parse_task_overrides(items: list[str]) -> TaskConfig:
    """``["task.ref_min_score=0", ...]`` -> a validated :class:`TaskConfig` (values as YAML).

    Each value is checked against the field's type, as Hydra's schema does for
    the other entry scripts (``task.ref_min_score=abc`` is refused here, before any fit).
    """
    fields = {f.name: f for f in dataclasses.fields(TaskConfig)}
    hints = typing.get_type_hints(TaskConfig)
    schema = OmegaConf.structured(TaskConfig)
    for item in items:
        key, sep, text = item.partition("=")
        name = key.removeprefix("task.")
        if not sep or not key.startswith("task.") or name not in fields:
            raise SweepError(
                f"{item!r} is not a task setting; pass task.KEY=VALUE with KEY one of "
                f"{', '.join(sorted(fields))} (e.g. task.ref_min_score=0 task.ref_max_score=360)"
            )
        try:
            schema = OmegaConf.merge(schema, {name: yaml.safe_load(text)})
        except (OmegaConfBaseException, yaml.YAMLError):
            raise SweepError(
                f"{item}: task.{name} must be {describe_type(hints[name])} "
                "(e.g. task.ref_min_score=0 task.ref_max_score=360)"
            ) from None
    config = TaskConfig.from_dict(OmegaConf.to_container(schema))
    refs = (config.ref_min_score, config.ref_max_score)
    if (refs[0] is None) != (refs[1] is None) or (refs[0] is not None and refs[0] == refs[1]):
        raise SweepError(
            f"task.ref_min_score={refs[0]} and task.ref_max_score={refs[1]}: give both, "
            "different (the returns that normalize to 0 and 100), or neither"
        )
    return config


def check_arguments(args: argparse.Namespace) -> tuple[torch.device, TaskConfig]:
    """Every argument checked before any run is read: the device and the task settings.

    Raises:
        SweepError: naming the argument and what it takes.
    """
    for name, value in (("--steps", args.steps), ("--batch-size", args.batch_size)):
        if value is not None and value < 1:
            raise SweepError(f"{name}={value} must be a positive integer")
    if args.qvalue_nets < 1:
        raise SweepError(f"--qvalue-nets={args.qvalue_nets} must be a positive integer")
    if args.threads is not None and args.threads < 1:
        raise SweepError(f"--threads={args.threads} must be a positive integer")
    if args.json is not None and (reason := unwritable_reason(args.json.absolute().parent)):
        raise SweepError(f"--json {args.json} cannot be written: {reason}")
    try:
        device = resolve_device(args.device)
    except RuntimeError as error:
        raise SweepError(f"--device: {error}") from None
    return device, parse_task_overrides(args.task)


def format_ranking(ranking: DatasetRanking) -> str:
    """One dataset's table: candidates by FQE score, online scores and ranks, rho."""
    width = max(len("candidate"), *(len(c.label) for c in ranking.candidates))
    lines = [
        f"{ranking.dataset} ({ranking.env}): {len(ranking.candidates)} candidates",
        f"  {'candidate':<{width}}  runs  {'FQE score':>11}  FQE rank  "
        f"{'online score':>12}  online rank",
    ]
    for index, candidate in enumerate(ranking.candidates):
        online = candidate.online_score
        online_text = "n/a" if online is None else f"{online:.1f}"
        online_rank = "n/a" if ranking.online_ranks is None else f"{ranking.online_ranks[index]:g}"
        lines.append(
            f"  {candidate.label:<{width}}  {len(candidate.runs):>4}  "
            f"{candidate.fqe_value:>11.3f}  {ranking.fqe_ranks[index]:>8g}  "
            f"{online_text:>12}  {online_rank:>11}"
        )
    if ranking.online_ranks is None:
        rho = "n/a (online scores missing for some runs)"
    elif ranking.rho is None:
        rho = "n/a (needs two or more candidates with distinct scores)"
    else:
        rho = f"{ranking.rho:.2f}"
    steps = sorted({run.policy_step for c in ranking.candidates for run in c.runs})
    if len(steps) > 1:
        lines.append(
            f"  note: the policies were saved at different gradient steps ({steps[0]} to "
            f"{steps[-1]}); unfinished runs are scored at their last checkpoint"
        )
    lines.append(f"  selected by FQE: {ranking.selected.label}")
    lines.append(f"  Spearman's rho (FQE vs online ranking): {rho}")
    return "\n".join(lines)


def ranking_record(ranking: DatasetRanking) -> dict:
    """A JSON-ready dict of one dataset's ranking."""
    return {
        "env": ranking.env,
        "dataset": ranking.dataset,
        "selected": ranking.selected.label,
        "rho": ranking.rho,
        "candidates": [
            {
                "label": candidate.label,
                "fqe_value": candidate.fqe_value,
                "fqe_rank": ranking.fqe_ranks[index],
                "online_score": candidate.online_score,
                "online_rank": None
                if ranking.online_ranks is None
                else ranking.online_ranks[index],
                "runs": [
                    {
                        "run_dir": str(run.run_dir),
                        "seed": run.seed,
                        "fqe_value": run.fqe_value,
                        "online_score": run.online_score,
                        "policy_step": run.policy_step,
                    }
                    for run in candidate.runs
                ],
            }
            for index, candidate in enumerate(ranking.candidates)
        ],
    }


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        device, task = check_arguments(args)
        runs = find_runs(args.sweep_dir)
        if not runs:
            raise SweepError(
                f"no trained runs under {str(args.sweep_dir)!r}: a run directory holds "
                "config.json and policy.pt (or checkpoint.pt while training). Pass the "
                "hydra.sweep.dir of a multirun of scripts/cbop.py whose jobs have started"
            )
        if args.threads is not None:
            torch.set_num_threads(args.threads)
        progress = not args.no_progress

        def announce(index: int, run_dir: Path) -> None:
            if progress:
                print(f"[select] FQE {index + 1}/{len(runs)}: {run_dir}", flush=True)

        scores = score_runs(
            runs,
            device,
            progress,
            announce,
            steps=args.steps,
            batch_size=args.batch_size,
            num_qvalue_nets=args.qvalue_nets,
            task=task,
        )
    except (SweepError, DatasetError, CheckpointError, FloatingPointError, ValueError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    rankings = rank_runs(scores)
    print("\n\n".join(format_ranking(ranking) for ranking in rankings))
    if args.json is not None:
        text = json.dumps([ranking_record(r) for r in rankings], indent=2)
        atomic_write(args.json, lambda tmp: tmp.write_text(text))
    return 0
