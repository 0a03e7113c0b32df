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
- BC, then FQE: the runs' actors (critics) with equal settings but for the seed, trained
  together (:mod:`cbop_torchrl.trainers.joint_pretrain`: the step-count stages; with
  ``bc.converge``, ``fqe.converge`` or ``fqe.eta`` each run trains its own, as before).
- A stage whose entry exists is not trained again; a group with one missing entry is left
  to its run (the same training, with its log in the run's logger). Runs of one seed share
  its entries, as before.
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
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDictBase

from cbop_torchrl.config import RunConfig
from cbop_torchrl.data import DatasetInfo
from cbop_torchrl.io import cache_entry_lock
from cbop_torchrl.trainers.cbop_stage import critic_hidden_sizes
from cbop_torchrl.trainers.checkpoint import CHECKPOINT_NAME, NonFiniteLossError
from cbop_torchrl.trainers.datasize import check_dataset_size
from cbop_torchrl.trainers.decisions import StageSeeds
from cbop_torchrl.trainers.dynamics import (
    _data_record,
    dynamics_entry,
    read_cached_dynamics,
    store_dynamics,
)
from cbop_torchrl.trainers.dynamics_quality import check_trained_dynamics
from cbop_torchrl.trainers.joint_dynamics import joinable, train_dynamics_together, without_seed
from cbop_torchrl.trainers.joint_pretrain import (
    fqe_joinable,
    train_bc_together,
    train_fqe_together,
)
from cbop_torchrl.trainers.offline_run import resolve_run_task
from cbop_torchrl.trainers.portable import PortableRNGState
from cbop_torchrl.trainers.pretrain import FQEStage, _store_result, bc_entry
from cbop_torchrl.trainers.rundir import read_run_json
from cbop_torchrl.trainers.stage_loop import read_cached_stage

STAGES = ("dynamics", "bc", "fqe")


@dataclass
class Pretraining:
    """What the runs' pretraining sees: their data on their device, and how it trains.

    Attributes:
        info: the data's info as the stages see it (its fingerprint names the entries).
        data: the dataset ``[N]`` on the runs' device, actions in the agent's ``[-1, 1]``.
        termination: the task's termination function name.
        cuda_graph: whether the stages capture their steps (the caller's
            :func:`~cbop_torchrl.trainers.decisions.uses_cuda_graph`).
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

    @property
    def record(self) -> dict[str, Any]:
        """The record of the data a BC or FQE entry holds."""
        return {"fingerprint": self.info.fingerprint}


@dataclass
class StageJob:
    """One pretraining stage of all the runs: its entries and how to fill them together.

    Attributes:
        name: ``dynamics``, ``bc`` or ``fqe``.
        what: the entry's description for its lock's messages.
        entries: each entry's folder -> what trains it (a config or a stage), one per seed.
        group_key: what must be equal (all but the seeds) for entries to train together.
        joinable: whether a group of them can train together.
        cached: whether an entry holds a result its run uses (its lock held).
        train: trains the missing ``[(folder, item)]`` of a group together and caches each;
            returns the seeds cached.
        seed: the run seed an item trains (for messages and the returned lists).
    """

    name: str
    what: str
    entries: dict[Path, Any]
    group_key: Callable[[Any], Any]
    joinable: Callable[[list[Any]], bool]
    cached: Callable[[Path, Any], bool]
    train: Callable[[list[tuple[Path, Any]]], list[int]]
    seed: Callable[[Any], int]


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
    stages: Sequence[str] = STAGES,
    *,
    device: torch.device,
    cuda_graph: bool,
) -> dict[str, list[int]]:
    """Trains the missing pretraining stages of the runs ``configs`` together and caches
    each where its run will look for it.

    Args:
        configs: the runs' resolved configs (one process: the same task, device, threads).
        info: the dataset's info as loaded.
        data: the dataset TensorDict.
        run_dirs: each run's directory (a finished run's stages are not needed).
        stages: which of :data:`STAGES` to train (all by default).
        device: the runs' device, decided by the caller
            (:func:`~cbop_torchrl.runtime.resolve_device` of ``configs[0].device``, as
            :func:`~cbop_torchrl.apps.api.train_side_by_side` resolves it once for the
            job); the data and every stage train there.
        cuda_graph: whether the stages capture their steps as CUDA graphs, decided by the
            caller (:func:`~cbop_torchrl.trainers.decisions.uses_cuda_graph` of
            ``configs[0]`` on ``device``); nothing here decides either again.

    Returns:
        The run seeds trained together per stage, e.g. ``{"dynamics": [0, 1, 2], "bc":
        [0, 1, 2], "fqe": [0, 1, 2]}`` (empty lists where every entry was there).

    Raises:
        DatasetError, TaskError: as the runs would (the data too small, the task unknown).
    """
    pending = [c for c, d in zip(configs, run_dirs, strict=True) if not finished_run(c, d)]
    trained: dict[str, list[int]] = {name: [] for name in stages}
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
    if first.threads is not None:
        torch.set_num_threads(first.threads)
    setup = Pretraining(
        info, specs.to_agent_actions(data.to(device)), task.termination,
        bool(cuda_graph), bool(first.progress),
    )  # fmt: skip
    jobs = {"dynamics": dynamics_job, "bc": bc_job, "fqe": fqe_job}
    rng = PortableRNGState()
    saved = rng.state_dict()
    try:
        for name in stages:
            trained[name] = run_job(setup, jobs[name](setup, pending))
    finally:
        rng.load_state_dict(saved)
    return trained


def run_job(setup: Pretraining, job: StageJob) -> list[int]:
    """Trains each group of ``job``'s entries with two or more missing together, the group's
    locks held (taken in path order); returns the seeds cached."""
    groups: dict[str, list[tuple[Path, Any]]] = {}
    for directory, item in sorted(job.entries.items()):
        key = json.dumps(job.group_key(item), sort_keys=True, default=str)
        groups.setdefault(key, []).append((directory, item))
    trained: list[int] = []
    for group in groups.values():
        if len(group) < 2 or not job.joinable([item for _, item in group]):
            continue  # each run trains its own, as alone
        with contextlib.ExitStack() as locks:
            for directory, _ in group:
                locks.enter_context(cache_entry_lock(directory, job.what))
            missing = [(d, item) for d, item in group if not job.cached(d, item)]
            if len(missing) < 2:
                continue
            seeds = ", ".join(str(job.seed(item)) for _, item in missing)
            setup.say(f"{job.name} of seeds {seeds} together")
            trained += job.train(missing)
    return trained


def dynamics_job(setup: Pretraining, configs: Sequence[RunConfig]) -> StageJob:
    """The runs' dynamics models: one ensemble per group, each seed cached as it stops."""
    record = _data_record(setup.info)
    device = setup.data.get("observation").device

    def cached(directory: Path, config: Any) -> bool:
        found = read_cached_dynamics(directory, record, device, setup.termination)
        return found is not None

    def train(missing: list[tuple[Path, Any]]) -> list[int]:
        stored: list[int] = []

        def store(index: int, model: Any, metrics: dict[str, Any]) -> None:
            directory, config = missing[index]
            try:
                check_trained_dynamics(model, metrics, config, setup.data)
            except NonFiniteLossError:  # not cached: its run trains it alone and says why
                setup.say(f"seed {config.seed}'s dynamics model diverged; its run reports it")
                return
            store_dynamics(model, metrics, setup.info, config, directory)
            stored.append(config.seed)

        train_dynamics_together(
            setup.data, setup.termination, [config for _, config in missing], setup.progress,
            on_trained=store, cuda_graph=setup.cuda_graph,
        )  # fmt: skip
        return stored

    entries = {dynamics_entry(setup.info, c.dynamics): c.dynamics for c in configs}
    return StageJob("dynamics", "dynamics model", entries, without_seed, joinable, cached,
                    train, lambda config: config.seed)  # fmt: skip


@dataclass(frozen=True)
class BCStage:
    """One run's BC stage: its actor's widths, settings and seeds."""

    hidden_sizes: tuple[int, ...]
    config: Any
    seed: int  # the run's (in the key)
    stage_seed: int  # decisions.seeds.bc


def _store_stage(
    setup: Pretraining, module: Any, stage: str, key: str, lr: float, directory: Path
) -> bool:
    """Caches a trained BC actor or FQE loss (``result.pt``); False when it is not finite
    (not cached: its run trains it alone and reports it)."""
    if module is None:
        return False
    try:
        _store_result(module, stage, key, lr, directory, setup.record)
    except NonFiniteLossError:
        return False
    return True


def bc_job(setup: Pretraining, configs: Sequence[RunConfig]) -> StageJob:
    """The runs' BC actors (the step-count stage), trained together per group."""
    info = setup.info
    entries = {}
    for config in configs:
        seeds = StageSeeds.of(config.seed, config.dynamics.seed)
        stage = BCStage(tuple(config.agent.hidden_sizes), config.bc, seeds.run, seeds.bc)
        entries[bc_entry(info.fingerprint, stage.hidden_sizes, stage.config, stage.seed)] = stage

    def cached(directory: Path, stage: BCStage) -> bool:
        return read_cached_stage(directory / "result.pt", "actor", setup.record) is not None

    def train(missing: list[tuple[Path, BCStage]]) -> list[int]:
        first = missing[0][1]
        losses = train_bc_together(
            setup.data, info.obs_dim, info.action_dim, first.hidden_sizes, first.config,
            [stage.stage_seed for _, stage in missing], setup.progress, setup.cuda_graph,
        )  # fmt: skip
        actors = [None if loss is None else loss.actor_network for loss in losses]
        return [
            stage.seed
            for (directory, stage), actor in zip(missing, actors, strict=True)
            if _store_stage(setup, actor, "bc", "actor", stage.config.lr, directory)
        ]

    def group_key(stage: BCStage) -> Any:
        return [list(stage.hidden_sizes), vars(stage.config)]

    def bc_joinable(stages: list[BCStage]) -> bool:
        return not getattr(stages[0].config, "converge", False)

    return StageJob("BC actors", "behaviour-cloning stage", entries, group_key, bc_joinable,
                    cached, train, lambda stage: stage.seed)  # fmt: skip


def fqe_job(setup: Pretraining, configs: Sequence[RunConfig]) -> StageJob:
    """The runs' FQE critics (the step-count stage without ``eta``), trained together."""
    info = setup.info
    entries = {}
    for config in configs:
        seeds, agent = StageSeeds.of(config.seed, config.dynamics.seed), config.agent
        stage = FQEStage(
            info.fingerprint, info.obs_dim, info.action_dim, tuple(critic_hidden_sizes(config)),
            agent.num_qvalue_nets, agent.gamma, config.fqe, seeds.run, str(agent.q_init),
            bool(agent.critic_layer_norm), float(agent.critic_prior_scale), seeds.fqe,
        )  # fmt: skip
        entries[stage.entry()] = stage

    def cached(directory: Path, stage: FQEStage) -> bool:
        return read_cached_stage(directory / "result.pt", "qvalue", setup.record) is not None

    def train(missing: list[tuple[Path, FQEStage]]) -> list[int]:
        stages = [stage for _, stage in missing]
        losses = train_fqe_together(setup.data, stages, setup.progress, setup.cuda_graph)
        return [
            stage.seed
            for (directory, stage), loss in zip(missing, losses, strict=True)
            if _store_stage(setup, loss, "fqe", "qvalue", stage.config.lr, directory)
        ]

    def group_key(stage: FQEStage) -> Any:
        values = {k: v for k, v in vars(stage).items() if k not in ("seed", "stage_seed")}
        return {**values, "config": vars(stage.config)}

    return StageJob("FQE critics", "FQE stage", entries, group_key, fqe_joinable, cached,
                    train, lambda stage: stage.seed)  # fmt: skip


__all__ = [
    "STAGES",
    "Pretraining",
    "StageJob",
    "bc_job",
    "dynamics_job",
    "finished_run",
    "fqe_job",
    "pretrain_together",
    "run_job",
]
