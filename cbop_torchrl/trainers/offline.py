"""The offline pipeline: dynamics -> BC -> FQE -> CBOP, then evaluation and ``results.json``.

The first three stages are cached by data and config (a second run reuses
them); the CBOP stage runs on TorchRL's :class:`~torchrl.trainers.Trainer`
with the offline hooks of :mod:`cbop_torchrl.trainers.hooks`
(:func:`build_offline_training` registers them):

- the "collector" is :class:`~cbop_torchrl.trainers.hooks.GradientSteps`, one
  empty TensorDict per gradient step, and
  :class:`~cbop_torchrl.trainers.hooks.SampleFromBuffer` draws the batch from
  the dataset's replay buffer;
- :class:`~cbop_torchrl.trainers.hooks.GuardedOptimizationStepper` does the
  optimizer step and refuses non-finite losses, targets and gradients;
- ``TargetNetUpdaterHook(SoftUpdate)`` updates the target Q-ensemble;
- :class:`~cbop_torchrl.trainers.logging.MetricsHook`,
  :class:`~cbop_torchrl.trainers.hooks.EvaluationHook` and
  :class:`~cbop_torchrl.trainers.checkpoint.CheckpointHook` log, evaluate and save.

The Trainer's own checkpointing writes either a directory of components or a
deprecated pickle path; CBOP needs one file that ``torch.load(...,
weights_only=True)`` reads, so ``CheckpointHook`` saves
``Trainer.state_dict()`` (which covers every registered stateful hook)
atomically itself and resuming calls ``Trainer.load_state_dict``.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDictBase
from torchrl.data import ReplayBuffer
from torchrl.envs import EnvBase
from torchrl.objectives import SoftUpdate
from torchrl.record.loggers import Logger
from torchrl.trainers import OptimizationStepper, TargetNetUpdaterHook, Trainer, TrainerHookBase

from cbop_torchrl.config import ConfigError, RunConfig
from cbop_torchrl.data import DatasetInfo, data_record, make_replay_buffer
from cbop_torchrl.data.transitions import warn_about_action_range
from cbop_torchrl.envs import (
    NO_NORMALIZED_SCORE,
    EnvSpecs,
    check_data_fits_env,
    make_eval_env,
    read_env_specs,
    resolve_task,
)
from cbop_torchrl.envs.starts import START_STATES_SEED, pick_start_states
from cbop_torchrl.modules.actor_critic import action_spec, make_actor, make_qvalue_ensemble
from cbop_torchrl.objectives.loss import CBOPLoss
from cbop_torchrl.registry import Task
from cbop_torchrl.trainers.checkpoint import (
    CHECKPOINT_NAME,
    POLICY_NAME,
    CheckpointError,
    CheckpointHook,
    check_resumable,
    load_checkpoint,
    policy_metadata,
    save_policy,
    training_config_hash,
)
from cbop_torchrl.trainers.datasize import check_dataset_size, warn_about_terminals
from cbop_torchrl.trainers.diagnostics import LearningDiagnostics
from cbop_torchrl.trainers.dynamics import load_or_train_dynamics
from cbop_torchrl.trainers.hooks import (
    ActorWeightAverage,
    EvaluationHook,
    GradientSteps,
    GuardedOptimizationStepper,
    QValueStats,
    ResumeProgressBar,
)
from cbop_torchrl.trainers.logging import (
    MetricsHook,
    log_final,
    log_scalars,
    make_logger,
)
from cbop_torchrl.trainers.memory import checkpoint_bytes
from cbop_torchrl.trainers.portable import PortableRNGState, PortableSampleFromBuffer
from cbop_torchrl.trainers.pretrain import load_or_train_bc, load_or_train_fqe
from cbop_torchrl.trainers.rundir import (
    RunLock,
    check_run_data,
    claim_run_dir,
    clear_previous_run,
    read_run_json,
)
from cbop_torchrl.trainers.slicing import SliceBudgetHook, slice_budget_hook
from cbop_torchrl.utils import atomic_json_dump, resolve_device, seed_everything

CBOP_SEED_OFFSET = 3
CBOP_KEYS = (
    "observation",
    "action",
    ("next", "observation"),
    ("next", "reward"),
    ("next", "terminated"),
    ("next", "done"),
)
"""What the CBOP loss reads from a dataset batch."""


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


def critic_hidden_sizes(config: RunConfig) -> list[int]:
    """The Q-networks' widths: ``agent.critic_hidden_sizes``, else ``agent.hidden_sizes``."""
    sizes = config.agent.critic_hidden_sizes
    return list(config.agent.hidden_sizes if sizes is None else sizes)


def fqe_scheme(fqe: Any) -> dict[str, Any]:
    """The FQE pretraining's scheme, for the run summary: soft targets, rounds, or converged."""
    if fqe.rounds and fqe.converge:
        scheme = "converged"  # the authors' FQE: each round fitted to held-out early stopping
    elif fqe.rounds:
        scheme = "rounds"
    else:
        scheme = "soft"
    return {
        "scheme": scheme,
        "rounds": fqe.rounds,
        "steps": None if scheme == "converged" else fqe.steps,
        "lr": fqe.lr,
        "batch_size": fqe.batch_size,
    }


def build_cbop_loss(
    config: RunConfig, info: DatasetInfo, dynamics: Any, device: torch.device
) -> tuple[CBOPLoss, Any]:
    """The CBOP loss (actor, M Q-networks, the estimator on ``dynamics``) and its actor."""
    obs_dim, action_dim = info.obs_dim, info.action_dim
    actor = make_actor(obs_dim, action_dim, tuple(config.agent.hidden_sizes), device=device)
    qnets = make_qvalue_ensemble(
        config.agent.num_qvalue_nets, obs_dim, action_dim, tuple(critic_hidden_sizes(config)),
        device=device, init=config.agent.q_init, layer_norm=config.agent.critic_layer_norm,
        prior_scale=config.agent.critic_prior_scale, prior_seed=config.seed,
    )  # fmt: skip
    estimator = config.estimator
    loss = CBOPLoss(
        actor,
        qnets,
        dynamics,
        action_spec=action_spec(action_dim, device),
        gamma=config.agent.gamma,
        horizon=estimator.horizon,
        psi=estimator.psi,
        mode=estimator.mode,
        termination=estimator.termination,
        # "auto" starts in float32; choose_rollout_dtype decides once the networks are loaded.
        rollout_dtype="float32" if estimator.rollout_dtype == "auto" else estimator.rollout_dtype,
        eta=config.agent.eta,
        bc_weight=config.agent.bc_weight,
        critic_penalty=config.agent.critic_penalty,
        alpha_init=config.agent.alpha_init,
        compile=config.compile,
        estimator_kwargs={
            "fixed_weighting": estimator.fixed_weighting,
            "lmbda": estimator.lmbda,
            "quantile": estimator.quantile,
            "sampling": estimator.sampling,
        },
    )
    return loss.to(device), actor


def make_optimizer(loss: CBOPLoss, config: RunConfig) -> torch.optim.Optimizer:
    """One Adam with a parameter group per part (actor, Q-ensemble, log-alpha).

    The SAC losses touch disjoint parameters (the actor loss reads detached Q
    parameters, the alpha loss a detached log-prob), so one optimizer on the
    summed loss equals three separate ones, and the Trainer wants one.
    """
    agent = config.agent
    return torch.optim.Adam(
        [
            {"params": list(loss.actor_network_params.values(True, True)), "lr": agent.actor_lr},
            {"params": list(loss.qvalue_network_params.values(True, True)), "lr": agent.critic_lr},
            {"params": [loss.log_alpha], "lr": agent.alpha_lr},
        ],
        # One fused kernel over all parameters (CPU and CUDA): fewer small kernels, and
        # no per-parameter read of the step count (13 host syncs per step unfused).
        fused=True,
        # On CUDA the step count stays on the device, so the step can be captured in a
        # CUDA graph (torch refuses to capture a non-capturable optimizer's step).
        capturable=loss.log_alpha.device.type == "cuda",
    )


def uses_cuda_graph(config: RunConfig, device: torch.device) -> bool:
    """Whether the CBOP step is captured as a CUDA graph (``cuda_graph``: null = on CUDA).

    Raises:
        ConfigError: ``cuda_graph=true`` on a device that is not CUDA, or with ``compile=true``
            (the estimator's own CUDA graphs cannot nest in the step's).
    """
    on_cuda = device.type == "cuda"
    if config.cuda_graph and not on_cuda:
        raise ConfigError(
            f"cuda_graph=true captures the CBOP step as a CUDA graph, but this run is on "
            f"{device}; run with device=cuda on a machine with a GPU, or drop cuda_graph=true "
            "(the default, cuda_graph=null, captures only on CUDA)."
        )
    if config.cuda_graph and config.compile:
        raise ConfigError(
            "cuda_graph=true and compile=true both ask for CUDA graphs (the whole step, and "
            "the target's Q-ensemble inside it), which cannot nest; use one: cuda_graph=true "
            "compile=false (faster: the whole step) or cuda_graph=false compile=true."
        )
    return on_cuda and not config.compile if config.cuda_graph is None else bool(config.cuda_graph)


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


def run_pipeline(config: RunConfig, info: DatasetInfo, data: TensorDictBase, run_dir: Path) -> dict:
    """Runs CBOP as in appendix B of the paper and returns the ``results.json`` dict.

    Learn the dynamics ensemble, pretrain the actor by behaviour cloning and the
    Q-ensemble by fitted Q evaluation of the behaviour policy, train CBOP from
    them, evaluate. Each stage is one function below.

    Args:
        config: a config from :func:`cbop_torchrl.config.load_config`.
        info: the dataset's :class:`DatasetInfo`.
        data: the dataset TensorDict (any device; moved to the run's device).
        run_dir: where the checkpoint, the policy, the logs and ``results.json`` go.
            A checkpoint already there is resumed (``resume=auto|true``).

    Raises:
        DatasetError: the data is smaller than a batch or the model's holdout split.
        CheckpointError: ``resume=true`` without a checkpoint, a checkpoint
            written with other training settings, or a budget
            (``train.epochs * train.steps_per_epoch``) that ends before the
            checkpoint's step. A larger budget continues the run.
        NonFiniteLossError: a stage produced NaN/inf.
    """
    check_dataset_size(
        data,
        info.name,
        {"bc.batch_size": config.bc.batch_size, "train.batch_size": config.train.batch_size},
        fqe_batch=("fqe.batch_size", config.fqe.batch_size),
        dynamics=config.dynamics,
    )
    run = OfflineRun.open(config, info, run_dir, config.training_dict())
    if (finished := run.finished_results()) is not None:
        return finished
    uses_cuda_graph(config, run.device)  # cuda_graph=true off CUDA: refused before any stage
    warn_about_terminals(data, info.name, run.task)
    run.start(config.to_dict())
    data = run.specs.to_agent_actions(data.to(run.device))
    warn_about_action_range(data, info.name)
    seed_everything(config.seed)
    dynamics, dynamics_metrics = dynamics_stage(run, data)
    bc_state, bc_cached = behaviour_cloning_stage(run, data)
    fqe_state, fqe_cached = fitted_q_evaluation_stage(run, data)
    cbop = cbop_stage(run, data, dynamics, bc_state, fqe_state)
    final = final_evaluation(run, cbop.training)
    if cbop.diagnostics is not None:
        cbop.diagnostics.measure(config.train.total_steps)
    pretraining = {
        "dynamics_cached": bool(dynamics_metrics.get("cached")),
        "dynamics_holdout_r2_mean": dynamics_metrics.get("holdout_r2_mean"),
        "bc_cached": bc_cached,
        "fqe_cached": fqe_cached,
    }
    return write_cbop_results(run, cbop, final, pretraining)


@dataclass
class OfflineRun:
    """What the stages of one run share: config, data, task, device, logger, clock, resume state.

    Used by the CBOP pipeline and by the baselines (:func:`cbop_torchrl.baselines.run_baseline`).
    ``task`` is resolved from ``config.task`` and the dataset, and ``specs`` read from its
    environment; the data's sizes must match them (checked when the run opens). For a
    task whose action box is not ``[-1, 1]``, the stages train on
    ``specs.to_agent_actions(data)`` and ``info.fingerprint`` says so.
    """

    config: RunConfig
    info: DatasetInfo
    task: Task
    specs: EnvSpecs
    run_dir: Path
    device: torch.device
    training_config: dict[str, Any]
    resume_state: dict[str, Any] | None
    start_time: float
    clock: StageClock
    lock: RunLock | None = None
    logger: Logger | None = None
    run_config: dict[str, Any] | None = None

    @classmethod
    def open(
        cls, config: RunConfig, info: DatasetInfo, run_dir: Path, training_config: dict[str, Any]
    ) -> OfflineRun:
        """Resolves the task and checks the data against its environment's specs, then creates
        ``run_dir``, picks the device and reads the checkpoint to resume, if any.

        Raises:
            TaskError: the task cannot be resolved, or the data's sizes do not fit its env.
        """
        start_time = time.perf_counter()
        record = data_record(info)
        task = resolve_task(config.task, info)
        specs = read_env_specs(task)
        check_data_fits_env(info, specs, task)
        if specs.rescales_actions:  # the cached stages see actions in [-1, 1]: other data
            info = dataclasses.replace(
                info, fingerprint=info.fingerprint + specs.fingerprint_suffix()
            )
        run_dir = Path(run_dir)
        device = resolve_device(config.device)
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
            config, info, task, specs, run_dir, device, training_config, resume_state,
            start_time, StageClock(config.progress), lock,
        )  # fmt: skip

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


def dynamics_stage(run: OfflineRun, data: TensorDictBase) -> tuple[Any, dict[str, Any]]:
    """The dynamics ensemble (cached by dataset and dynamics config) and its metrics."""
    run.clock.start("dynamics")
    dynamics, metrics = load_or_train_dynamics(
        data, run.info, run.config.dynamics, progress=run.config.progress,
        log_fn=run.log_dynamics_epoch, termination=run.task.termination,
        cuda_graph=uses_cuda_graph(run.config, run.device),
    )  # fmt: skip
    return dynamics.to(run.device), metrics


def behaviour_cloning_stage(run: OfflineRun, data: TensorDictBase) -> tuple[dict, bool]:
    """The BC actor's parameters (cached, resumable) and whether they came from the cache."""
    config, info = run.config, run.info
    run.clock.start("bc")
    return load_or_train_bc(
        data, info.fingerprint, info.obs_dim, info.action_dim, run.hidden_sizes,
        config.bc, config.seed, config.progress, run.log,
        cuda_graph=uses_cuda_graph(config, run.device),
    )  # fmt: skip


def fitted_q_evaluation_stage(run: OfflineRun, data: TensorDictBase) -> tuple[dict, bool]:
    """The Q-ensemble's parameters after FQE of the behaviour policy (cached, resumable)."""
    config, info = run.config, run.info
    run.clock.start("fqe")
    return load_or_train_fqe(
        data, info.fingerprint, info.obs_dim, info.action_dim, critic_hidden_sizes(config),
        config.agent.num_qvalue_nets, config.agent.gamma, config.fqe,
        config.seed, config.progress, run.log, q_init=config.agent.q_init,
        layer_norm=config.agent.critic_layer_norm, prior_scale=config.agent.critic_prior_scale,
        cuda_graph=uses_cuda_graph(config, run.device),
    )  # fmt: skip


@dataclass
class OfflineTraining:
    """A Trainer over dataset batches, its hooks and where it started (CBOP and baselines)."""

    trainer: Trainer
    actor: Any
    metrics: MetricsHook
    evaluation: EvaluationHook
    checkpoint: CheckpointHook
    eval_env: EnvBase
    start_step: int = 0
    train_time: float = 0.0
    slice_budget: SliceBudgetHook | None = None  # a budget from benchmarks/learning.py

    def train(self, total_steps: int) -> None:
        """Runs the remaining gradient steps (none when the checkpoint is at the end).

        Raises:
            SliceEnded: the process's slice budget was spent (a checkpoint was just written).
        """
        train_start = time.perf_counter()
        if self.start_step < total_steps:
            self.trainer.train()
        self.train_time = time.perf_counter() - train_start
        if self.slice_budget is not None:
            self.slice_budget.exit_if_stopped()


def build_offline_training(
    run: OfflineRun,
    *,
    loss: Any,
    optimizer: torch.optim.Optimizer,
    stepper: OptimizationStepper,
    checkpoint: CheckpointHook,
    buffer: ReplayBuffer,
    generator: torch.Generator,
    actor: Any,
    eval_env: EnvBase,
    target_update: SoftUpdate | None,
    extra_hooks: tuple[TrainerHookBase, ...] = (),
) -> OfflineTraining:
    """TorchRL's Trainer with the offline hooks registered, resumed from the run's checkpoint.

    Hooks, in registration order: batch sampling, target-network update,
    metrics, ``extra_hooks``, periodic evaluation, checkpoints, the global RNG
    state and the progress bar.
    """
    config, total_steps = run.config, run.config.train.total_steps
    trainer = Trainer(
        collector=GradientSteps(),
        total_frames=total_steps,
        frame_skip=1,
        optim_steps_per_batch=1,
        loss_module=loss,
        optimizer=optimizer,
        optimization_stepper=stepper,
        logger=None,  # MetricsHook/EvaluationHook write to the TorchRL logger themselves
        progress_bar=config.progress,
        auto_log_optim_steps=False,
        log_interval=config.train.log_interval,
    )
    PortableSampleFromBuffer(buffer, generator).register(trainer)  # resumes across devices
    if target_update is not None:
        trainer.register_op("post_optim", TargetNetUpdaterHook(target_update))
    metrics = MetricsHook(run.logger, config.train.log_interval)
    metrics.register(trainer)
    for hook in extra_hooks:
        hook.register(trainer)
    average = None
    if config.eval.actor_average > 0:  # beyond the paper, opt-in: evaluated, never trained on
        average = ActorWeightAverage(actor, config.eval.actor_average)
        average.register(trainer)
    start_obs = None
    if config.eval.start_states:  # episodes from dataset states, beside the reset evaluation
        observations = buffer.storage.get(slice(None)).get("observation")
        start_obs = pick_start_states(observations, config.eval.start_states, START_STATES_SEED)
    evaluation = EvaluationHook(
        actor, run.task, eval_env, config, run.logger, total_steps, average=average,
        start_obs=start_obs, background=config.eval.background,
    )  # fmt: skip
    evaluation.register(trainer)
    checkpoint.register(trainer)
    slice_budget = slice_budget_hook(checkpoint, run.lock.release if run.lock else None)
    if slice_budget is not None:  # after the checkpoint hook: it stops right after a save
        slice_budget.register(trainer)
    trainer.register_module("rng", PortableRNGState())
    ResumeProgressBar(trainer).register(trainer)
    training = OfflineTraining(trainer, actor, metrics, evaluation, checkpoint, eval_env)
    training.slice_budget = slice_budget
    if run.resume_state is not None:
        state = run.resume_state["trainer"]
        started_without_average = average is not None and "actor_average" not in state
        if started_without_average:  # Trainer.load_state_dict wants every module's entry
            state = {**state, "actor_average": average.state_dict()}
        trainer.load_state_dict(state)
        if started_without_average:
            average.restart()  # at the checkpoint's weights, just loaded
        training.start_step = int(run.resume_state["step"])
        checkpoint.last_saved_step = training.start_step
    return training


def restore_final_records(
    run: OfflineRun, training: OfflineTraining, diagnostics: LearningDiagnostics | None = None
) -> None:
    """Puts the final evaluation of a run being continued to a larger budget back in its history.

    A run's final evaluation (and diagnostics) at its last step s is made after
    its last checkpoint, so the checkpoint's histories end before s; the
    records are in its ``results.json``, from which they are taken (and not
    logged again: the logs hold them already). When that file is missing (the
    run was killed before writing it) they are measured again at s and logged.
    No-op unless :attr:`OfflineRun.continues_finished_run`.
    """
    if not run.continues_finished_run:
        return
    step = training.start_step
    previous = run.previous_results() or {}
    if previous.get("gradient_steps") != step:
        previous = {}  # none, or the results of another budget

    def restore(hook: Any, key: str, measure: Callable[[int], Any]) -> None:
        if any(record["step"] == step for record in hook.history):
            return
        records = [r for r in previous.get(key) or [] if r.get("step") == step]
        if records:
            hook.history.append(dict(records[-1]))
        else:
            measure(step)

    restore(training.evaluation, "eval_history", training.evaluation.evaluate)
    if diagnostics is not None:
        restore(diagnostics, "diagnostics_history", diagnostics.measure)


@dataclass
class CBOPStage:
    """The CBOP stage's loss, dynamics model and training state."""

    loss: CBOPLoss
    dynamics: Any
    training: OfflineTraining
    diagnostics: LearningDiagnostics | None = None  # eval.diagnostics=true
    rollout_choice: dict[str, Any] | None = None  # estimator.rollout_dtype=auto


#: Transitions on which ``estimator.rollout_dtype=auto`` measures the bf16 target error.
ROLLOUT_CHOICE_SAMPLES = 1024


def choose_rollout_dtype(run: OfflineRun, loss: CBOPLoss, data: TensorDictBase) -> dict | None:
    """``estimator.rollout_dtype=auto``: bf16 if fast here and accurate on this run's data.

    Measured once, with the BC actor and the FQE critic, on
    ``ROLLOUT_CHOICE_SAMPLES`` transitions drawn with their own generator (the
    replay buffer's and the global streams are untouched); a resumed run reuses
    the choice stored in its checkpoint. None unless the setting is ``auto``.
    """
    if run.config.estimator.rollout_dtype != "auto":
        return None
    estimator = loss.value_estimator
    stored = (run.resume_state or {}).get("rollout_choice")
    if stored is not None:
        estimator.rollout_dtype = (
            torch.bfloat16 if stored["rollout_dtype"] == "bfloat16" else torch.float32
        )
        return dict(stored)
    generator = torch.Generator().manual_seed(run.config.seed + CBOP_SEED_OFFSET)
    rows = torch.randint(data.shape[0], (ROLLOUT_CHOICE_SAMPLES,), generator=generator)
    sample = data.select(*CBOP_KEYS)[rows].to(run.device)
    return estimator.select_rollout_dtype(sample)


def copy_online_to_target(loss: Any) -> None:
    """Copies every online parameter set of ``loss`` onto its ``target_<name>_params``.

    What constructing a TorchRL target updater does (``TargetNetUpdater.init_``); here for
    an updater constructed before the loss's parameters were loaded.
    """
    for name, target in loss.named_children():
        if name.startswith("target_") and name.endswith("_params"):
            target.data.update_(getattr(loss, name.removeprefix("target_")).data)


def cbop_stage(
    run: OfflineRun,
    data: TensorDictBase,
    dynamics: Any,
    bc_state: dict[str, torch.Tensor],
    fqe_state: dict[str, torch.Tensor],
) -> CBOPStage:
    """CBOP from the BC actor and the FQE Q-ensemble on TorchRL's Trainer (resumable)."""
    config = run.config
    seed_everything(config.seed + CBOP_SEED_OFFSET)
    loss, actor = build_cbop_loss(config, run.info, dynamics, run.device)
    cuda_graph = uses_cuda_graph(config, run.device)
    # TorchRL's contract: the target updater is associated before the loss reads its targets.
    # It is stepped inside the gradient step (GuardedOptimizationStepper), captured with it.
    target_update = SoftUpdate(loss, tau=config.agent.tau)
    actor.load_state_dict(bc_state)
    incompatible = loss.load_state_dict(fqe_state, strict=False)  # FQE's online and target Qs
    if incompatible.unexpected_keys:
        raise RuntimeError(f"FQE parameters do not fit the Q-ensemble: {incompatible}")
    rollout_choice = choose_rollout_dtype(run, loss, data)  # measured on FQE's target ensemble
    copy_online_to_target(loss)  # CBOP's target ensemble starts as FQE's online ensemble
    optimizer = make_optimizer(loss, config)
    buffer = make_replay_buffer(data.select(*CBOP_KEYS), config.train.batch_size, device=run.device)
    generator = torch.Generator(device=run.device).manual_seed(config.seed + CBOP_SEED_OFFSET)
    buffer.set_rng(generator)
    eval_env = make_eval_env(run.task, config.eval.episodes, config.eval.backend)
    diagnostics = (
        [LearningDiagnostics(
            loss, data, run.task.gym_id, config.agent.gamma, config.eval.interval,
            config.train.total_steps, run.logger, max_steps=config.eval.max_steps,
            seed=config.seed, task=run.task, mc_states=config.eval.mc_states,
        )]
        if config.eval.diagnostics
        else []
    )  # fmt: skip
    checkpoint = CheckpointHook(
        run.checkpoint_path, config.train.checkpoint_interval, config.train.total_steps,
        partial(cbop_checkpoint_payload, run, actor, rollout_choice),
    )  # fmt: skip
    training = build_offline_training(
        run, loss=loss, optimizer=optimizer, stepper=cbop_stepper(config, checkpoint,
        target_update, cuda_graph), checkpoint=checkpoint, buffer=buffer, generator=generator,
        actor=actor, eval_env=eval_env, target_update=None,
        extra_hooks=(QValueStats(loss, run.logger, config.train.log_interval), *diagnostics),
    )  # fmt: skip
    start = training.start_step
    run.clock.start("cbop", f"resuming at gradient step {start}" if start else None)
    if diagnostics and start == 0:
        # The curves' reference point: the BC actor and the FQE critic, before any CBOP step.
        training.evaluation.evaluate(0)
        diagnostics[0].measure(0)
    restore_final_records(run, training, diagnostics[0] if diagnostics else None)
    training.train(config.train.total_steps)
    return CBOPStage(
        loss, dynamics, training, diagnostics[0] if diagnostics else None, rollout_choice
    )


def cbop_stepper(
    config: RunConfig, checkpoint: CheckpointHook, target_update: SoftUpdate, cuda_graph: bool
) -> GuardedOptimizationStepper:
    """The CBOP step: eager with a finiteness read per step, or captured with one per log step."""
    if not cuda_graph:
        return GuardedOptimizationStepper(checkpoint, target_update)
    return GuardedOptimizationStepper(
        checkpoint, target_update, cuda_graph=True, check_interval=config.train.log_interval,
        strict_capture=config.cuda_graph is True,
    )  # fmt: skip


def cbop_checkpoint_payload(
    run: OfflineRun, actor: Any, rollout_choice: dict[str, Any] | None, step: int
) -> dict[str, Any]:
    """The non-trainer part of a CBOP checkpoint at ``step``."""
    return {
        "rollout_choice": rollout_choice,
        "training_config": run.training_config,
        "training_config_hash": training_config_hash(run.training_config),
        "policy": run.policy_metadata(step),
        "actor": actor.state_dict(),
        "wall_time_s": run.wall_time(),
    }


def final_evaluation(run: OfflineRun, training: OfflineTraining) -> dict[str, Any]:
    """Scores the final policy on ``eval.episodes`` episodes and closes the environments."""
    run.clock.start("eval")
    final = training.evaluation.evaluate(run.config.train.total_steps)
    training.evaluation.close()
    training.eval_env.close()
    run.clock.stop()
    return final


def write_cbop_results(
    run: OfflineRun, cbop: CBOPStage, final: dict[str, Any], pretraining: dict[str, Any]
) -> dict[str, Any]:
    """Saves the policy and writes ``results.json``; returns its dict."""
    config, training = run.config, cbop.training
    total_steps = config.train.total_steps
    policy_path = run.run_dir / POLICY_NAME
    metadata = run.policy_metadata(total_steps)
    save_policy(policy_path, training.actor, metadata)
    results = {
        **common_results(
            run.info,
            run.task,
            config,
            final,
            total_steps=total_steps,
            start_step=training.start_step,
            train_time=training.train_time,
            wall_time=run.wall_time(),
        ),
        "stage_times": run.clock.times,
        "expected_horizon_start": training.metrics.first_window.get("cbop/expected_horizon"),
        "expected_horizon_end": training.metrics.last_window.get("cbop/expected_horizon"),
        "eval_history": training.evaluation.history,
        **({"diagnostics_history": cbop.diagnostics.history} if cbop.diagnostics else {}),
        "stages": pretraining,
        "settings": {
            "num_elites": cbop.dynamics.num_elites,
            "num_dynamics_members": config.dynamics.num_members,
            "num_qvalue_nets": config.agent.num_qvalue_nets,
            "critic_hidden_sizes": critic_hidden_sizes(config),
            "actor_hidden_sizes": list(config.agent.hidden_sizes),
            "q_init": config.agent.q_init,
            "fqe": fqe_scheme(config.fqe),
            "horizon": config.estimator.horizon,
            "psi": config.estimator.psi,
            "mode": config.estimator.mode,
            "batch_size": config.train.batch_size,
            "rollout_dtype": (
                cbop.rollout_choice["rollout_dtype"]
                if cbop.rollout_choice
                else config.estimator.rollout_dtype
            ),
            **({"rollout_choice": cbop.rollout_choice} if cbop.rollout_choice else {}),
        },
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
    state = load_checkpoint(path)
    check_resumable(state, training_config, path)
    return state


__all__ = [
    "CBOPStage",
    "OfflineRun",
    "OfflineTraining",
    "behaviour_cloning_stage",
    "build_cbop_loss",
    "build_offline_training",
    "cbop_stage",
    "dynamics_stage",
    "final_evaluation",
    "fitted_q_evaluation_stage",
    "make_optimizer",
    "restore_final_records",
    "run_pipeline",
    "write_cbop_results",
]
