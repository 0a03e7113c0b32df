"""Pretraining side by side: every distinct seed's cached stages trained together, first.

``cbop-train runs.seeds=[0,1,2] ...`` (:func:`~cbop_torchrl.apps.api.train_side_by_side`)
calls :func:`pretrain_together` before the runs take turns (``runs.pretrain_together``,
on by default). It finds the stage cache entries the runs will look for, exactly as each
run alone names them (the data's fingerprint as the run sees it, :func:`~cbop_torchrl.
trainers.offline_run.resolve_run_task`; the stage's config; the seeds of
:class:`~cbop_torchrl.trainers.decisions.StageSeeds`), trains the missing ones of all
seeds together and writes each into its entry. Then every run's own stages
(:func:`~cbop_torchrl.trainers.offline.run_pipeline`) find their entries, and the rest of
the pipeline is unchanged.

- Dynamics: the configs equal but for their seed (:func:`~cbop_torchrl.trainers.
  joint_dynamics.joinable`) form one group, trained as one ensemble
  (:func:`~cbop_torchrl.trainers.joint_dynamics.train_dynamics_together`); each seed is
  cached as soon as its own early stopping ends it.
- A stage whose entry exists is not trained again; a group with one missing entry is left
  to its run (the same training, with its per-epoch log in the run's logger).
- Runs whose directory already holds their finished results need nothing and are skipped.

Every entry is written under its :func:`~cbop_torchrl.io.cache_entry_lock` (all of a
group's, taken in path order, for the whole joint training, so a second process waits for
them as it waits for a single run), each file atomically, so a kill leaves no entry that
may be used: the rerun of the same command trains together what is still missing and
completes every run. A model that is not finite is not cached: its run trains it again
and reports the divergence as it does alone. The process's random-number state is put back
as it was, so the runs start from the state they start from without this step.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDictBase

from cbop_torchrl.config import RunConfig
from cbop_torchrl.data import DatasetInfo
from cbop_torchrl.io import cache_entry_lock
from cbop_torchrl.runtime import resolve_device
from cbop_torchrl.trainers.checkpoint import CHECKPOINT_NAME, NonFiniteLossError
from cbop_torchrl.trainers.datasize import check_dataset_size
from cbop_torchrl.trainers.decisions import uses_cuda_graph
from cbop_torchrl.trainers.dynamics import (
    _data_record,
    dynamics_entry,
    read_cached_dynamics,
    store_dynamics,
)
from cbop_torchrl.trainers.dynamics_quality import check_trained_dynamics
from cbop_torchrl.trainers.joint_dynamics import joinable, train_dynamics_together, without_seed
from cbop_torchrl.trainers.offline_run import resolve_run_task
from cbop_torchrl.trainers.portable import PortableRNGState
from cbop_torchrl.trainers.rundir import read_run_json


@dataclass
class Pretraining:
    """What the runs' pretraining sees: their data on their device, and how it trains.

    Attributes:
        info: the data's info as the stages see it (its fingerprint names the entries).
        data: the dataset ``[N]`` on the runs' device, actions in the agent's ``[-1, 1]``.
        termination: the task's termination function name.
        cuda_graph: whether the stages capture their steps (:func:`uses_cuda_graph`).
        progress: whether to print what is trained together.
    """

    info: DatasetInfo
    data: TensorDictBase
    termination: str
    cuda_graph: bool
    progress: bool

    def say(self, text: str) -> None:
        if self.progress:
            print(f"[cbop] pretraining side by side: {text}", flush=True)


def finished_run(config: RunConfig, run_dir: Path) -> bool:
    """Whether ``run_dir`` holds this run's finished results (its pipeline does nothing):
    a ``results.json`` of this budget and a checkpoint, with ``resume`` not ``false``."""
    if str(config.resume).lower() == "false" or not (run_dir / CHECKPOINT_NAME).is_file():
        return False
    try:
        results = read_run_json(run_dir / "results.json")
    except Exception:  # a damaged file: the run reports it itself
        return False
    return results is not None and results.get("gradient_steps") == config.train.total_steps


def pretrain_together(
    configs: Sequence[RunConfig],
    info: DatasetInfo,
    data: TensorDictBase,
    run_dirs: Sequence[Path],
) -> dict[str, list[int]]:
    """Trains the missing pretraining stages of the runs ``configs`` together and caches
    each where its run will look for it.

    Args:
        configs: the runs' resolved configs (one process: the same task, device, threads).
        info: the dataset's info as loaded.
        data: the dataset TensorDict.
        run_dirs: each run's directory (a finished run's stages are not needed).

    Returns:
        The seeds trained together per stage, e.g. ``{"dynamics": [0, 1, 2]}`` (empty lists
        when every entry was there).

    Raises:
        DatasetError, TaskError: as the runs would (the data too small, the task unknown).
    """
    pending = [c for c, d in zip(configs, run_dirs, strict=True) if not finished_run(c, d)]
    trained: dict[str, list[int]] = {"dynamics": []}
    if not pending:
        return trained
    first = pending[0]
    for config in pending:
        check_dataset_size(
            data, info.name,
            {"bc.batch_size": config.bc.batch_size, "train.batch_size": config.train.batch_size},
            fqe_batch=("fqe.batch_size", config.fqe.batch_size), dynamics=config.dynamics,
        )  # fmt: skip
    task, specs, info = resolve_run_task(first, info)
    device = resolve_device(first.device)
    if first.threads is not None:
        torch.set_num_threads(first.threads)
    setup = Pretraining(
        info, specs.to_agent_actions(data.to(device)), task.termination,
        uses_cuda_graph(first, device), bool(first.progress),
    )  # fmt: skip
    rng = PortableRNGState()
    saved = rng.state_dict()
    try:
        trained["dynamics"] = dynamics_together(setup, pending)
    finally:
        rng.load_state_dict(saved)
    return trained


def _groups(entries: dict[Path, Any]) -> list[list[tuple[Path, Any]]]:
    """The entries whose configs are equal but for their seeds, grouped, in path order."""
    groups: dict[str, list[tuple[Path, Any]]] = {}
    for directory, config in sorted(entries.items()):
        key = json.dumps(without_seed(config), sort_keys=True, default=str)
        groups.setdefault(key, []).append((directory, config))
    return list(groups.values())


def dynamics_together(setup: Pretraining, configs: Sequence[RunConfig]) -> list[int]:
    """The runs' missing dynamics models, trained together per group and cached as each
    seed stops; returns the seeds trained."""
    entries = {dynamics_entry(setup.info, c.dynamics): c.dynamics for c in configs}
    record = _data_record(setup.info)
    device = setup.data.get("observation").device
    trained: list[int] = []
    for group in _groups(entries):
        if len(group) < 2 or not joinable([config for _, config in group]):
            continue  # each run trains its own, as alone
        with contextlib.ExitStack() as locks:
            for directory, _ in group:
                locks.enter_context(cache_entry_lock(directory, "dynamics model"))
            missing = [
                (directory, config)
                for directory, config in group
                if read_cached_dynamics(directory, record, device, setup.termination) is None
            ]
            if len(missing) < 2:
                continue
            trained += _train_dynamics_group(setup, missing)
    return trained


def _train_dynamics_group(setup: Pretraining, missing: list[tuple[Path, Any]]) -> list[int]:
    """Trains the entries ``missing`` (directory, config) as one ensemble, their locks held,
    and caches each seed as it stops; returns the seeds cached."""
    seeds = [config.seed for _, config in missing]
    setup.say(f"the dynamics models of seeds {', '.join(map(str, seeds))} in one ensemble")
    cached: list[int] = []

    def store(index: int, model: Any, metrics: dict[str, Any]) -> None:
        directory, config = missing[index]
        try:
            check_trained_dynamics(model, metrics, config, setup.data)
        except NonFiniteLossError:  # not cached: its run trains it alone and says why
            setup.say(f"seed {config.seed}'s dynamics model diverged; its run reports it")
            return
        store_dynamics(model, metrics, setup.info, config, directory)
        cached.append(config.seed)

    train_dynamics_together(
        setup.data, setup.termination, [config for _, config in missing], setup.progress,
        on_trained=store, cuda_graph=setup.cuda_graph,
    )  # fmt: skip
    return cached


__all__ = ["Pretraining", "dynamics_together", "finished_run", "pretrain_together"]
