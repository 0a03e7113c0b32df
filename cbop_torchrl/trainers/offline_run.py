"""One offline run: its folder, lock, resume state, logger, clock, and ``results.json``.

:class:`OfflineRun` is what the stages of one run share, for the CBOP pipeline
(:mod:`cbop_torchrl.trainers.offline`) and the baselines (:mod:`cbop_torchrl.baselines`)
alike; :func:`write_results` writes the one ``results.json`` layout both use.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torchrl.record.loggers import Logger

from cbop_torchrl.config import RunConfig
from cbop_torchrl.data import DatasetInfo, data_record
from cbop_torchrl.envs import (
    NO_NORMALIZED_SCORE,
    EnvSpecs,
    check_data_fits_env,
    read_env_specs,
    resolve_task,
)
from cbop_torchrl.io import atomic_json_dump
from cbop_torchrl.registry import Task
from cbop_torchrl.trainers.checkpoint import (
    CHECKPOINT_FORMAT,
    CHECKPOINT_NAME,
    POLICY_NAME,
    CheckpointError,
    check_resumable,
    load_checkpoint,
    policy_metadata,
    read_data_record,
    save_policy,
)
from cbop_torchrl.trainers.decisions import RunDecisions, decide_run
from cbop_torchrl.trainers.logging import log_final, log_scalars, make_logger
from cbop_torchrl.trainers.memory import checkpoint_bytes
from cbop_torchrl.trainers.run_state import upgrade_run_state
from cbop_torchrl.trainers.rundir import (
    RunLock,
    check_run_data,
    claim_run_dir,
    clear_previous_run,
    read_run_json,
)


class StageClock:
    """Records each stage's wall-clock and process CPU seconds.

    The stages' settings are in the run banner (:func:`cbop_torchrl.apps.api.run_banner`),
    printed before the first stage; a stage prints a line only for a ``note`` the banner
    cannot know (where a resumed stage continues).
    """

    def __init__(self, progress: bool) -> None:
        self.progress = progress
        self.times: dict[str, dict[str, float]] = {}
        self._current: tuple[str, float, float] | None = None

    def start(self, name: str, note: str | None = None) -> None:
        self.stop()
        if self.progress and note:
            print(f"[cbop] {name}: {note}", flush=True)
        self._current = (name, time.perf_counter(), time.process_time())

    def stop(self) -> None:
        if self._current is not None:
            name, wall, cpu = self._current
            self.times[name] = {
                "wall_s": time.perf_counter() - wall,
                "cpu_s": time.process_time() - cpu,
            }
            self._current = None


def resolve_run_task(config: RunConfig, info: DatasetInfo) -> tuple[Task, EnvSpecs, DatasetInfo]:
    """The run's task, its environment's specs and the data's info as the stages see it.

    For a task whose action box is not ``[-1, 1]`` the stages train on
    ``specs.to_agent_actions(data)``, and ``info.fingerprint`` (what the cached stages' keys
    hold) says so.

    Raises:
        TaskError: the task cannot be resolved, or the data's sizes do not fit its env.
    """
    task = resolve_task(config.task, info)
    specs = read_env_specs(task)
    check_data_fits_env(info, specs, task)
    if specs.rescales_actions:  # the cached stages see actions in [-1, 1]: other data
        info = dataclasses.replace(info, fingerprint=info.fingerprint + specs.fingerprint_suffix())
    return task, specs, info


@dataclass
class OfflineRun:
    """What the stages of one run share: config, data, task, decisions, logger, clock, resume
    state.

    Used by the CBOP pipeline and by the baselines (:func:`cbop_torchrl.baselines.run_baseline`).
    ``task`` is resolved from ``config.task`` and the dataset, and ``specs`` read from its
    environment; the data's sizes must match them (checked when the run opens). For a
    task whose action box is not ``[-1, 1]``, the stages train on
    ``specs.to_agent_actions(data)`` and ``info.fingerprint`` says so. ``decisions``
    (:class:`~cbop_torchrl.trainers.decisions.RunDecisions`) holds what the run decided when
    it opened (device, dtype, capture, seeds); the stages read it.
    """

    config: RunConfig
    info: DatasetInfo
    task: Task
    specs: EnvSpecs
    run_dir: Path
    decisions: RunDecisions
    resume_state: dict[str, Any] | None
    start_time: float
    clock: StageClock
    lock: RunLock | None = None
    logger: Logger | None = None
    run_config: dict[str, Any] | None = None
    _data_record: dict[str, Any] | None = field(default=None, repr=False)

    @classmethod
    def open(
        cls,
        config: RunConfig,
        info: DatasetInfo,
        run_dir: Path,
        training_config: dict[str, Any],
        *,
        captures_step: bool = True,
    ) -> OfflineRun:
        """Resolves the task and checks the data against its environment's specs, decides
        the run (:func:`~cbop_torchrl.trainers.decisions.decide_run`: device, dtype, capture,
        seeds), then creates ``run_dir`` and reads the checkpoint to resume, if any (one of
        the earlier layout translated, :func:`~cbop_torchrl.trainers.run_state.upgrade_run_state`).

        ``captures_step``: whether the program captures its steps as CUDA graphs (the CBOP
        pipeline; the baselines do not).

        Raises:
            TaskError: the task cannot be resolved, or the data's sizes do not fit its env.
            ConfigError: ``cuda_graph=true`` off CUDA (``captures_step``).
        """
        start_time = time.perf_counter()
        record = data_record(info)
        task, specs, info = resolve_run_task(config, info)
        run_dir = Path(run_dir)
        decisions = decide_run(config, training_config, captures_step=captures_step)
        if config.threads is not None:
            torch.set_num_threads(config.threads)
        # refuses a folder of user files a run could overwrite, or too little free space
        claim_run_dir(run_dir, checkpoint_bytes(config, info.obs_dim, info.action_dim))
        lock = RunLock(run_dir)  # a second copy of the command stops here (RunLockedError)
        if lock.previous_holder:
            print(f"[cbop] took over the lock of a run that died ({lock.previous_holder})")
        if str(config.resume).lower() == "false" and (removed := clear_previous_run(run_dir)):
            print(
                f"[cbop] resume=false: removed the previous run's {', '.join(removed)} "
                f"from {run_dir}", flush=True,
            )  # fmt: skip
        try:
            resume_state = _resume_state(config, run_dir / CHECKPOINT_NAME, training_config)
            check_run_data(run_dir, record, resume_state is not None, resume_state)
        except BaseException:
            lock.release()  # a refused run (in a Python session too) leaves the directory free
            raise
        return cls(
            config, info, task, specs, run_dir, decisions, resume_state,
            start_time, StageClock(config.progress), lock,
        )  # fmt: skip

    @property
    def device(self) -> torch.device:
        """Where the run trains (``decisions.device``)."""
        return self.decisions.device

    @property
    def training_config(self) -> dict[str, Any]:
        """The settings that change what is trained (``decisions.training_config``)."""
        return self.decisions.training_config

    @property
    def checkpoint_path(self) -> Path:
        return self.run_dir / CHECKPOINT_NAME

    @property
    def results_path(self) -> Path:
        return self.run_dir / "results.json"

    @property
    def hidden_sizes(self) -> list[int]:
        return list(self.config.agent.hidden_sizes)

    @property
    def resume_step(self) -> int | None:
        return int(self.resume_state["step"]) if self.resume_state is not None else None

    def finished_results(self) -> dict[str, Any] | None:
        """The results of a run that already reached its last step, else None.

        A ``results.json`` of another budget (the one of a run being continued to
        more steps, killed after its last checkpoint) does not count.
        """
        step, total_steps = self.resume_step, self.config.train.total_steps
        if step is None or step < total_steps:
            return None
        previous = self.previous_results()
        if previous is None or previous.get("gradient_steps") != total_steps:
            return None
        if self.config.progress:
            print(f"[cbop] {self.run_dir} holds a finished run; nothing to do", flush=True)
        if self.lock is not None:
            self.lock.release()
        return previous

    def previous_results(self) -> dict[str, Any] | None:
        """The run directory's ``results.json``, or None when there is none."""
        return read_run_json(self.results_path)  # a damaged or replaced file: CheckpointError

    @property
    def continues_finished_run(self) -> bool:
        """Whether this session continues a run that had reached its last step to a larger budget.

        That run's final evaluation at its last step came after its last
        checkpoint (see :func:`restore_final_records`).
        """
        state = self.resume_state
        return (
            state is not None
            and int(state["step"]) == int(state.get("total_steps", -1))
            and int(state["step"]) < self.config.train.total_steps
        )

    def start(self, config_record: dict[str, Any]) -> None:
        """Writes ``config.json`` and opens the logger."""
        atomic_json_dump(config_record, self.run_dir / "config.json")
        self.run_config = config_record
        settings = self.config.logger
        self.logger = make_logger(
            settings.backend, self.run_dir, self.run_dir.name, settings.project,
            mode=settings.mode, entity=settings.entity, group=settings.group,
            tags=settings.tags, run_config=config_record,
        )  # fmt: skip

    def checkpoint_record(self, step: int, payload: dict[str, Any]) -> dict[str, Any]:
        """The run's part of its checkpoint at ``step``
        (:func:`~cbop_torchrl.trainers.run_state.run_state` adds the training's).

        ``payload``: the algorithm's part (``policy``, ``actor``, and for CBOP
        ``rollout_choice``).
        """
        if self._data_record is None:  # the data this run trains on, recorded when it started
            self._data_record = read_data_record(self.run_dir)
        decisions = self.decisions
        record = {
            "format": CHECKPOINT_FORMAT,
            "step": int(step),
            "total_steps": self.config.train.total_steps,
            "training_config": decisions.training_config,
            "training_config_hash": decisions.config_hash,
            "decisions": decisions.record(),
            **payload,
            "wall_time_s": self.wall_time(),
        }
        if self._data_record is not None:
            record["data"] = self._data_record
        return record

    def policy_metadata(self, step: int) -> dict[str, Any]:
        """What :func:`~cbop_torchrl.trainers.checkpoint.load_policy` needs at ``step``."""
        info = self.info
        return policy_metadata(
            self.task, info.obs_dim, info.action_dim, self.hidden_sizes, info.name, step
        )

    def wall_time(self) -> float:
        """Seconds spent on this run over all its sessions."""
        prior = float(self.resume_state.get("wall_time_s", 0.0)) if self.resume_state else 0.0
        return prior + time.perf_counter() - self.start_time

    def log(self, values: dict[str, float], step: int) -> None:
        log_scalars(self.logger, values, step)

    def log_dynamics_epoch(self, metrics: dict[str, Any]) -> None:
        numbers = {f"dynamics/{k}": v for k, v in metrics.items() if isinstance(v, (int, float))}
        self.log(numbers, int(metrics.get("epoch", 0)))

    def finish(self, results: dict[str, Any]) -> dict[str, Any]:
        """Logs the final score, writes ``results.json`` atomically and releases the run directory.

        The score is logged first: a run killed in between resumes from its final
        checkpoint and logs it again (replacing the rows), while a run with
        ``results.json`` is finished and logs nothing more.
        """
        final = {
            "final/normalized_score": results["normalized_score_mean"],
            "final/return": results["return_mean"],
        }
        final = {k: v for k, v in final.items() if v is not None}
        log_final(self.logger, self.run_config or {}, final, self.config.train.total_steps)
        atomic_json_dump(results, self.results_path)
        if self.lock is not None:
            self.lock.release()
        return results


def common_results(
    info: DatasetInfo,
    task: Task,
    config: RunConfig,
    final: dict[str, Any],
    *,
    total_steps: int,
    start_step: int,
    train_time: float,
    wall_time: float,
) -> dict[str, Any]:
    """The ``results.json`` fields every training script writes (CBOP and the baselines).

    ``grad_steps_per_s`` counts the steps of this session over its training
    time, periodic evaluation included. Without reference scores
    (``task.ref_*``) the normalized score is None and ``normalized_score_note``
    says why; the raw return is always there.
    """
    steps_run = total_steps - start_step
    return {
        "dataset": info.name,
        "env_family": task.name,
        "gym_id": task.gym_id,
        "task": task.to_dict(),
        "obs_dim": info.obs_dim,
        "action_dim": info.action_dim,
        "seed": config.seed,
        "preset": config.preset,
        "normalized_score_mean": final["normalized_score_mean"],
        "normalized_score_std": final["normalized_score_std"],
        **({} if task.has_reference_scores else {"normalized_score_note": NO_NORMALIZED_SCORE}),
        "return_mean": final["return_mean"],
        "return_std": final["return_std"],
        "episodes": final["episodes"],
        "episode_returns": final["returns"],
        "gradient_steps": total_steps,
        "gradient_steps_this_session": steps_run,
        "grad_steps_per_s": steps_run / train_time if steps_run and train_time > 0 else None,
        "wall_time_s": wall_time,
        "resumed_from_step": start_step or None,
    }


def write_results(
    run: OfflineRun,
    training: Any,
    final: dict[str, Any],
    metadata: dict[str, Any],
    fields: dict[str, Any],
) -> dict[str, Any]:
    """Saves the final policy and writes ``results.json``; returns its dict.

    The layout every run shares: :func:`common_results`, the evaluation history,
    ``fields`` (what the algorithm adds: its settings, its own histories), then the paths
    of the checkpoint and the policy.

    Args:
        run: the run.
        training: its :class:`~cbop_torchrl.trainers.offline_training.OfflineTraining`.
        final: the final evaluation's scores.
        metadata: the policy's metadata (:meth:`OfflineRun.policy_metadata` and more).
        fields: the algorithm's own fields.
    """
    total_steps = run.config.train.total_steps
    policy_path = run.run_dir / POLICY_NAME
    save_policy(policy_path, training.actor, metadata)
    results = {
        **common_results(
            run.info,
            run.task,
            run.config,
            final,
            total_steps=total_steps,
            start_step=training.start_step,
            train_time=training.train_time,
            wall_time=run.wall_time(),
        ),
        "device": str(run.device),  # where it trained (cpu, cuda:0): rows may pool both
        "eval_history": training.evaluation.history,
        **fields,
        "checkpoint": str(run.checkpoint_path),
        "policy": str(policy_path),
    }
    return run.finish(results)


def _resume_state(
    config: RunConfig, path: Path, training_config: dict[str, Any]
) -> dict[str, Any] | None:
    resume = str(config.resume).lower()
    if resume == "false" or not path.is_file():
        if resume == "true":
            raise CheckpointError(
                f"resume=true but there is no checkpoint at {str(path)!r}; run without "
                "resume=true to start, or point hydra.run.dir at the run to continue"
            )
        return None
    state = upgrade_run_state(load_checkpoint(path), path)
    check_resumable(state, training_config, path)
    return state


__all__ = ["OfflineRun", "StageClock", "common_results", "resolve_run_task", "write_results"]
