"""``cbop-select-psi`` (``scripts/select_psi.py``): offline choice of psi (or any swept
setting) by fitted Q evaluation of each trained policy.

    cbop-select-psi sweep_dir=sweeps/paper_grid
    cbop-select-psi sweep_dir=multirun steps=20000 device=cuda
    cbop-select-psi sweep_dir=multirun json=selection.json
    cbop-select-psi sweep_dir=multirun task.ref_min_score=0 task.ref_max_score=360
    cbop-select-psi -m sweep_dir=multirun steps=5000,20000 'json=fqe_${steps}.json'

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
one resumes. Every setting: ``cbop_torchrl/configs/select_psi.yaml``.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from omegaconf import DictConfig

from cbop_torchrl.cli import (
    config_values,
    hydra_entry,
    refuse,
    run_entry,
)
from cbop_torchrl.data import DatasetError
from cbop_torchrl.envs.task import TaskConfig
from cbop_torchrl.evaluation.selection import DatasetRanking, rank_runs, score_runs
from cbop_torchrl.io import (
    ForeignFileError,
    add_write_root,
    atomic_write,
    cache_dir,
    check_owned_output,
    owned_outputs,
    unwritable_reason,
)
from cbop_torchrl.runtime import program_command, resolve_device
from cbop_torchrl.sweeps import SweepError, find_runs
from cbop_torchrl.trainers.checkpoint import CheckpointError
from cbop_torchrl.trainers.rundir import MARKER_NAME


def check_task(values: Mapping[str, Any]) -> TaskConfig:
    """The ``task`` section as a :class:`TaskConfig`, its reference scores checked.

    Raises:
        SweepError: only one reference score, or two equal ones.
    """
    config = TaskConfig.from_dict(values)
    refs = (config.ref_min_score, config.ref_max_score)
    if (refs[0] is None) != (refs[1] is None) or (refs[0] is not None and refs[0] == refs[1]):
        shown = ["null" if ref is None else ref for ref in refs]
        raise SweepError(
            f"task.ref_min_score={shown[0]} and task.ref_max_score={shown[1]}: give both, "
            "different (the returns that normalize to 0 and 100), or neither"
        )
    return config


def check_settings(cfg: DictConfig) -> tuple[torch.device, TaskConfig]:
    """Every setting checked before any run is read: the output, the device, the task (the
    sizes' ranges: :data:`cbop_torchrl.config.SETTING_RANGES`, checked by ``hydra_entry``).

    Raises:
        SweepError: naming the setting and what it takes.
    """
    if cfg.json is not None and (reason := unwritable_reason(Path(cfg.json).absolute().parent)):
        raise SweepError(
            f"json={cfg.json} cannot be written: {reason}; set json= to a path in a "
            "directory you can write to"
        )
    if cfg.json is not None:  # before any fit: only an earlier ranking of ours is replaced
        try:
            check_owned_output(cfg.json, PROGRAM)
        except ForeignFileError as error:
            raise SweepError(f"json={cfg.json}: {error}") from None
    try:
        device = resolve_device(cfg.device)
    except RuntimeError as error:
        raise SweepError(f"device={cfg.device}: {error}") from None
    return device, check_task(config_values(cfg.task))


def fit_folders(runs: Sequence[Path], sweep_dir: Path) -> tuple[Callable[[Path], Path], int]:
    """Where each run's FQE fits are cached, and how many runs keep them elsewhere.

    In ``<run>/selection_fqe`` only for a run directory of this sweep that a run claimed
    (the ``.cbop-run`` marker alone says so), lying inside ``sweep_dir`` (not reached
    through a link to a folder elsewhere) and writable; the fits of every other run go to
    the package's cache (``$CBOP_TORCHRL_CACHE/selection_fqe``, keyed by the policy's
    weights, the data and the FQE settings), so nothing is written into a folder that is
    not a run's own.

    Raises:
        SweepError: a run's ``selection_fqe`` is a link (never written through).
    """
    root = Path(sweep_dir).resolve()
    own: set[Path] = set()
    for run_dir in runs:
        marker, folder = Path(run_dir) / MARKER_NAME, Path(run_dir) / "selection_fqe"
        if folder.is_symlink():
            raise SweepError(
                f"{str(folder)!r} is a link (to {os.readlink(folder)!r}); cbop-select-psi "
                "caches a run's fits there and never writes through a link, and nothing was "
                "written. Remove the link (its target is not needed) and run the same "
                "command again"
            )
        real = Path(run_dir).resolve()
        if (
            marker.is_file()
            and not marker.is_symlink()
            and (real == root or root in real.parents)
            and os.access(run_dir, os.W_OK | os.X_OK)
            and (not folder.exists() or os.access(folder, os.W_OK | os.X_OK))
        ):
            own.add(Path(run_dir))
            add_write_root(run_dir)

    def fit_dir(run_dir: Path) -> Path:
        if Path(run_dir) in own:
            return Path(run_dir) / "selection_fqe"
        return cache_dir("selection_fqe")

    return fit_dir, len(runs) - len(own)


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


def validate(cfg: DictConfig) -> None:
    """Refuses (exit 2) before any run is read a setting that cannot run
    (:func:`check_settings`)."""
    try:
        check_settings(cfg)
    except SweepError as error:
        refuse(error)


def run(cfg: DictConfig) -> None:
    """The Hydra task: fit FQE for every run of the sweep, print (and write) the rankings."""
    try:
        device, task = check_settings(cfg)
        runs = find_runs(Path(cfg.sweep_dir))
        if not runs:
            raise SweepError(
                f"no trained runs under sweep_dir={cfg.sweep_dir}: a run directory holds "
                "config.json and policy.pt (or checkpoint.pt while training). Set sweep_dir= "
                f"to the hydra.sweep.dir of a multirun of {program_command('cbop-train')} whose "
                "jobs have started"
            )
        if cfg.threads is not None:
            torch.set_num_threads(cfg.threads)
        fit_dir, elsewhere = fit_folders(runs, Path(cfg.sweep_dir))
        if elsewhere and cfg.progress:
            print(
                f"[select] {elsewhere} of the {len(runs)} runs are not run directories of this "
                "sweep that cbop-select-psi may write into (no .cbop-run marker, reached through "
                "a link, or read-only): their fits are cached under "
                f"{cache_dir('selection_fqe')}",
                flush=True,
            )

        def announce(index: int, run_dir: Path) -> None:
            if cfg.progress:
                print(f"[select] FQE {index + 1}/{len(runs)}: {run_dir}", flush=True)

        scores = score_runs(
            runs,
            device,
            cfg.progress,
            announce,
            steps=cfg.steps,
            batch_size=cfg.batch_size,
            num_qvalue_nets=cfg.qvalue_nets,
            task=task,
            fit_dir=fit_dir,
        )
    except (SweepError, DatasetError, CheckpointError, FloatingPointError, ValueError) as error:
        refuse(error)
    rankings = rank_runs(scores)
    print("\n\n".join(format_ranking(ranking) for ranking in rankings))
    if cfg.json is not None:
        text = json.dumps([ranking_record(r) for r in rankings], indent=2)
        with owned_outputs(cfg.json, PROGRAM):
            atomic_write(cfg.json, lambda tmp: tmp.write_text(text))


PROGRAM = "cbop-select-psi"


def main(argv: Sequence[str] | None = None) -> int:
    """Runs the program on ``argv`` (Hydra overrides and flags; default: the command line)
    and returns its exit code."""
    words = sys.argv[1:] if argv is None else list(argv)

    def program() -> None:
        hydra_entry("select_psi", validate=validate)(run)()

    return run_entry(program, words)
