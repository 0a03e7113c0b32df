"""The offline pipeline: dynamics -> BC -> FQE -> CBOP, then evaluation and ``results.json``.

The first three stages are cached by data and config (a second run reuses
them); the CBOP stage runs on TorchRL's :class:`~torchrl.trainers.Trainer`:

- the "collector" is :class:`GradientSteps`, an endless iterator of empty
  TensorDicts, one per gradient step (so the Trainer's frame counter, its
  progress bar and ``total_frames`` count gradient steps), and
  :class:`SampleFromBuffer` draws the batch from the dataset's replay buffer
  at ``process_optim_batch``, where TorchRL's own ``ReplayBufferTrainer``
  samples;
- :class:`GuardedOptimizationStepper` does the optimizer step and refuses
  non-finite losses, targets and gradients;
- ``TargetNetUpdaterHook(SoftUpdate)`` updates the target Q-ensemble;
- :class:`MetricsHook`, :class:`EvaluationHook` and :class:`CheckpointHook`
  log, evaluate and save.

The Trainer's own checkpointing writes either a directory of components or a
deprecated pickle path; CBOP needs one file that ``torch.load(...,
weights_only=True)`` reads, so :class:`CheckpointHook` saves
``Trainer.state_dict()`` (which covers every registered stateful hook)
atomically itself and resuming calls ``Trainer.load_state_dict``.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.checkpoint import GlobalRNGState
from torchrl.data import ReplayBuffer
from torchrl.envs import EnvBase
from torchrl.objectives import SoftUpdate
from torchrl.record.loggers import Logger
from torchrl.trainers import OptimizationStepper, TargetNetUpdaterHook, Trainer, TrainerHookBase

from cbop_torchrl.config import RunConfig
from cbop_torchrl.data import DatasetInfo, make_replay_buffer
from cbop_torchrl.evaluation.evaluate import evaluate_policy, make_eval_env
from cbop_torchrl.modules.actor_critic import action_spec, make_actor, make_qvalue_ensemble
from cbop_torchrl.objectives.loss import CBOPLoss
from cbop_torchrl.objectives.pretrain import ensemble_q
from cbop_torchrl.trainers.checkpoint import (
    CHECKPOINT_NAME,
    POLICY_NAME,
    CheckpointError,
    CheckpointHook,
    NonFiniteLossError,
    check_resumable,
    load_checkpoint,
    policy_metadata,
    save_policy,
    training_config_hash,
)
from cbop_torchrl.trainers.dynamics import load_or_train_dynamics
from cbop_torchrl.trainers.logging import (
    MetricsHook,
    log_scalars,
    make_logger,
)
from cbop_torchrl.trainers.pretrain import load_or_train_bc, load_or_train_fqe
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


class GradientSteps:
    """Stands in for the collector: yields one empty TensorDict per gradient step.

    Offline training collects nothing; the Trainer only needs an iterable
    that advances its frame counter (one "frame" per step here) and the few
    collector methods it calls.
    """

    init_random_frames = 0

    def __iter__(self) -> Iterator[TensorDictBase]:
        while True:
            yield TensorDict(batch_size=[])

    def shutdown(self) -> None:
        return None

    def set_seed(self, seed: int, static_seed: bool = False) -> int:
        return seed

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        return None


class SampleFromBuffer(TrainerHookBase):
    """Draws each step's batch from the dataset replay buffer (``process_optim_batch``).

    The buffer samples with its own ``torch.Generator``, whose state is
    checkpointed, so a resumed run draws the same batches.
    """

    def __init__(self, buffer: ReplayBuffer, generator: torch.Generator) -> None:
        self.buffer = buffer
        self.generator = generator

    def __call__(self, batch: TensorDictBase) -> TensorDictBase:
        return self.buffer.sample()

    def state_dict(self) -> dict[str, Any]:
        return {"generator": self.generator.get_state()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.generator.set_state(state_dict["generator"].to(self.generator.get_state().device))

    def register(self, trainer: Trainer, name: str = "replay_sampler") -> None:
        trainer.register_op("process_optim_batch", self)
        trainer.register_module(name, self)


class GuardedOptimizationStepper(OptimizationStepper):
    """One Adam step on ``loss_actor + loss_qvalue + loss_alpha``, refusing non-finite values.

    The losses, the CBOP target statistics and the gradient norm are checked
    before ``optimizer.step()``: a NaN/inf raises :class:`NonFiniteLossError`
    naming the step and the last good checkpoint, and no parameter changes.
    """

    def __init__(self, checkpoint: CheckpointHook) -> None:
        self.checkpoint = checkpoint

    def step(self, trainer: Trainer, sub_batch: TensorDictBase) -> TensorDictBase:
        losses = trainer.compute_loss(sub_batch)
        total = sum(value for key, value in losses.items() if key.startswith("loss_"))
        trainer.optimizer.zero_grad(set_to_none=True)
        total.backward()
        params = [p for group in trainer.optimizer.param_groups for p in group["params"]]
        grad_norm = torch.nn.utils.clip_grad_norm_(params, math.inf)
        checked = {key: value for key, value in losses.items(True, True) if value.numel() > 0}
        bad = sorted(
            "/".join(key) if isinstance(key, tuple) else key
            for key, value in checked.items()
            if value.is_floating_point() and not torch.isfinite(value).all()
        )
        if not torch.isfinite(grad_norm):
            bad.append("gradient norm")
        if bad:
            trainer.optimizer.zero_grad(set_to_none=True)
            raise NonFiniteLossError(
                f"non-finite {', '.join(bad)} at gradient step {trainer.collected_frames} of the "
                "CBOP stage; the step was not applied and the run stopped. Last good "
                f"checkpoint: {self.checkpoint.describe_last()}. Lower the learning rates "
                "(agent.*_lr) or check the dataset/dynamics model, then resume (the same "
                "command continues from that checkpoint)."
            )
        trainer.optimizer.step()
        losses = losses.detach()
        losses.set("grad_norm", grad_norm.detach())
        return losses


class EvaluationHook(TrainerHookBase):
    """Evaluates the deterministic policy every ``interval`` gradient steps (``post_steps``).

    Logs ``eval/normalized_score`` (mean), ``eval/normalized_score_std`` and
    ``eval/return`` and keeps the history (checkpointed) for ``results.json``.
    The final evaluation after the last step is done by the pipeline itself.
    """

    def __init__(
        self,
        actor: Any,
        info: DatasetInfo,
        env: EnvBase,
        config: RunConfig,
        logger: Logger | None,
        total_steps: int,
    ) -> None:
        self.actor, self.info, self.env, self.logger = actor, info, env, logger
        self.interval = config.eval.interval
        self.max_steps = config.eval.max_steps
        self.seed = config.seed
        self.total_steps = total_steps
        self.history: list[dict[str, float]] = []
        self.trainer: Trainer | None = None

    def __call__(self) -> None:
        step = self.trainer.collected_frames  # one frame per gradient step
        if self.interval and step % self.interval == 0 and step < self.total_steps:
            self.evaluate(step)

    def evaluate(self, step: int) -> dict[str, Any]:
        result = evaluate_policy(self.actor, self.info.family, self.env, self.max_steps, self.seed)
        summary = result.summary()
        record = {
            "step": step,
            "normalized_score_mean": summary["normalized_score_mean"],
            "normalized_score_std": summary["normalized_score_std"],
            "return_mean": summary["return_mean"],
        }
        self.history.append(record)
        log_scalars(
            self.logger,
            {
                "eval/normalized_score": record["normalized_score_mean"],
                "eval/normalized_score_std": record["normalized_score_std"],
                "eval/return": record["return_mean"],
            },
            step,
        )
        return summary

    def state_dict(self) -> dict[str, Any]:
        return {"history": [dict(record) for record in self.history]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.history = [dict(record) for record in state_dict.get("history", [])]

    def register(self, trainer: Trainer, name: str = "evaluation") -> None:
        self.trainer = trainer
        trainer.register_op("post_steps", self)
        trainer.register_module(name, self)


class QValueStats(TrainerHookBase):
    """Logs Q-ensemble statistics on the step's batch every ``interval`` steps (``post_optim_log``).

    ``train/q_mean`` (mean over members and batch of ``Q_m(s, a)`` at the dataset
    actions) and ``train/q_member_std`` (mean over the batch of the std across
    members); the CBOP target's statistics come with the loss (``cbop/target_mean``,
    ``cbop/posterior_std``). One extra forward of the ensemble, no randomness.
    """

    def __init__(self, loss: CBOPLoss, logger: Logger | None, interval: int) -> None:
        self.loss, self.logger, self.interval = loss, logger, int(interval)
        self.trainer: Trainer | None = None

    def __call__(self, batch: TensorDictBase) -> None:
        step = self.trainer.collected_frames
        if step % self.interval != 0:
            return None
        with torch.no_grad():
            q = ensemble_q(self.loss.qvalue_network, self.loss.qvalue_network_params, batch)
        log_scalars(
            self.logger,
            {"train/q_mean": q.mean(), "train/q_member_std": q.std(0, unbiased=False).mean()},
            step,
        )
        return None

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        return None

    def register(self, trainer: Trainer, name: str = "qvalue_stats") -> None:
        self.trainer = trainer
        trainer.register_op("post_optim_log", self)


class ResumeProgressBar(TrainerHookBase):
    """Starts the Trainer's progress bar at the resumed step (``setup``)."""

    def __init__(self, trainer: Trainer) -> None:
        self.trainer = trainer

    def __call__(self) -> None:
        bar = getattr(self.trainer, "_pbar", None)
        if bar is not None and self.trainer.collected_frames:
            bar.update(self.trainer.collected_frames)

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        return None

    def register(self, trainer: Trainer, name: str = "resume_progress") -> None:
        trainer.register_op("setup", self)


class StageClock:
    """Prints a banner per stage and records its wall-clock and process CPU seconds."""

    def __init__(self, progress: bool) -> None:
        self.progress = progress
        self.times: dict[str, dict[str, float]] = {}
        self._current: tuple[str, float, float] | None = None

    def start(self, name: str, detail: str) -> None:
        self.stop()
        if self.progress:
            print(f"[cbop] {name}: {detail}", flush=True)
        self._current = (name, time.perf_counter(), time.process_time())

    def stop(self) -> None:
        if self._current is not None:
            name, wall, cpu = self._current
            self.times[name] = {
                "wall_s": time.perf_counter() - wall,
                "cpu_s": time.process_time() - cpu,
            }
            self._current = None


def build_cbop_loss(
    config: RunConfig, info: DatasetInfo, dynamics: Any, device: torch.device
) -> tuple[CBOPLoss, Any]:
    """The CBOP loss (actor, M Q-networks, the estimator on ``dynamics``) and its actor."""
    family = info.family
    hidden = tuple(config.agent.hidden_sizes)
    actor = make_actor(family.obs_dim, family.action_dim, hidden, device=device)
    qnets = make_qvalue_ensemble(
        config.agent.num_qvalue_nets, family.obs_dim, family.action_dim, hidden, device=device
    )
    estimator = config.estimator
    loss = CBOPLoss(
        actor,
        qnets,
        dynamics,
        action_spec=action_spec(family.action_dim, device),
        gamma=config.agent.gamma,
        horizon=estimator.horizon,
        psi=estimator.psi,
        mode=estimator.mode,
        termination=estimator.termination,
        rollout_dtype=estimator.rollout_dtype,
        eta=config.agent.eta,
        alpha_init=config.agent.alpha_init,
        compile=config.compile,
        estimator_kwargs={
            "fixed_weighting": estimator.fixed_weighting,
            "lmbda": estimator.lmbda,
            "quantile": estimator.quantile,
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
        ]
    )


def common_results(
    info: DatasetInfo,
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
    time, periodic evaluation included.
    """
    steps_run = total_steps - start_step
    return {
        "dataset": info.name,
        "env_family": info.family.name,
        "gym_id": info.family.gym_id,
        "seed": config.seed,
        "preset": config.preset,
        "normalized_score_mean": final["normalized_score_mean"],
        "normalized_score_std": final["normalized_score_std"],
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
    """Runs every stage for a validated config and returns the results dict.

    Args:
        config: a config from :func:`cbop_torchrl.config.load_config`.
        info: the dataset's :class:`DatasetInfo`.
        data: the dataset TensorDict (any device; moved to the run's device).
        run_dir: where the checkpoint, the policy, the logs and ``results.json`` go.
            A checkpoint already there is resumed (``resume=auto|true``).

    Raises:
        CheckpointError: ``resume=true`` without a checkpoint, or a checkpoint
            written with other training settings.
        NonFiniteLossError: a stage produced NaN/inf.
    """
    start_time = time.perf_counter()
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    device = resolve_device(config.device)
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    family = info.family
    progress = config.progress
    training_config = config.training_dict()
    checkpoint_path = run_dir / CHECKPOINT_NAME
    resume_state = _resume_state(config, checkpoint_path, training_config)
    total_steps = config.train.total_steps
    results_path = run_dir / "results.json"
    if resume_state is not None and resume_state["step"] >= total_steps and results_path.is_file():
        if progress:
            print(f"[cbop] {run_dir} holds a finished run; nothing to do (resume=false reruns it)")
        return json.loads(results_path.read_text())
    prior_wall_time = float(resume_state.get("wall_time_s", 0.0)) if resume_state else 0.0
    clock = StageClock(progress)
    atomic_json_dump(config.to_dict(), run_dir / "config.json")

    logger = make_logger(
        config.logger.backend,
        run_dir,
        run_dir.name,
        config.logger.project,
        resume_step=int(resume_state["step"]) if resume_state is not None else None,
    )

    def log_stage(values: dict[str, float], step: int) -> None:
        log_scalars(logger, values, step)

    data = data.to(device)
    seed_everything(config.seed)

    # 1. Dynamics ensemble (cached by dataset + dynamics config).
    clock.start("dynamics", f"{config.dynamics.num_members} members")
    dynamics, dynamics_metrics = load_or_train_dynamics(
        data,
        info,
        config.dynamics,
        progress=progress,
        log_fn=lambda m: log_stage(
            {f"dynamics/{k}": v for k, v in m.items() if isinstance(v, (int, float))},
            int(m.get("epoch", 0)),
        ),
    )
    dynamics = dynamics.to(device)

    # 2. Behaviour cloning, 3. FQE of the behaviour policy (cached, resumable).
    hidden = list(config.agent.hidden_sizes)
    clock.start("bc", f"{config.bc.steps} steps")
    bc_state, bc_cached = load_or_train_bc(
        data, info.fingerprint, family.obs_dim, family.action_dim, hidden, config.bc,
        config.seed, progress, log_stage,
    )  # fmt: skip
    clock.start("fqe", f"{config.fqe.steps} steps, M={config.agent.num_qvalue_nets}")
    fqe_state, fqe_cached = load_or_train_fqe(
        data, info.fingerprint, family.obs_dim, family.action_dim, hidden,
        config.agent.num_qvalue_nets, config.agent.gamma, config.fqe,
        config.seed, progress, log_stage,
    )  # fmt: skip

    # 4. CBOP on TorchRL's Trainer.
    seed_everything(config.seed + CBOP_SEED_OFFSET)
    loss, actor = build_cbop_loss(config, info, dynamics, device)
    actor.load_state_dict(bc_state)
    incompatible = loss.load_state_dict(fqe_state, strict=False)
    if incompatible.unexpected_keys:
        raise RuntimeError(f"FQE parameters do not fit the Q-ensemble: {incompatible}")
    optimizer = make_optimizer(loss, config)
    buffer = make_replay_buffer(data.select(*CBOP_KEYS), config.train.batch_size, device=device)
    generator = torch.Generator(device=device).manual_seed(config.seed + CBOP_SEED_OFFSET)
    buffer.set_rng(generator)
    eval_env = make_eval_env(family, config.eval.episodes, config.eval.backend)

    def checkpoint_payload(step: int) -> dict[str, Any]:
        return {
            "training_config": training_config,
            "training_config_hash": training_config_hash(training_config),
            "policy": policy_metadata(family, hidden, info.name, step),
            "actor": actor.state_dict(),
            "wall_time_s": prior_wall_time + time.perf_counter() - start_time,
        }

    checkpoint_hook = CheckpointHook(
        checkpoint_path, config.train.checkpoint_interval, total_steps, checkpoint_payload
    )
    trainer = Trainer(
        collector=GradientSteps(),
        total_frames=total_steps,
        frame_skip=1,
        optim_steps_per_batch=1,
        loss_module=loss,
        optimizer=optimizer,
        optimization_stepper=GuardedOptimizationStepper(checkpoint_hook),
        logger=None,  # MetricsHook/EvaluationHook write to the TorchRL logger themselves
        progress_bar=progress,
        auto_log_optim_steps=False,
        log_interval=config.train.log_interval,
    )
    SampleFromBuffer(buffer, generator).register(trainer)
    trainer.register_op("post_optim", TargetNetUpdaterHook(SoftUpdate(loss, tau=config.agent.tau)))
    metrics = MetricsHook(logger, config.train.log_interval)
    metrics.register(trainer)
    QValueStats(loss, logger, config.train.log_interval).register(trainer)
    evaluation = EvaluationHook(actor, info, eval_env, config, logger, total_steps)
    evaluation.register(trainer)
    checkpoint_hook.register(trainer)
    trainer.register_module("rng", GlobalRNGState())
    ResumeProgressBar(trainer).register(trainer)

    start_step = 0
    if resume_state is not None:
        trainer.load_state_dict(resume_state["trainer"])
        start_step = int(resume_state["step"])
        checkpoint_hook.last_saved_step = start_step
    clock.start(
        "cbop",
        f"{total_steps} gradient steps (K={dynamics.num_elites}, M="
        f"{config.agent.num_qvalue_nets}, H={config.estimator.horizon}, psi="
        f"{config.estimator.psi}, batch {config.train.batch_size})"
        + (f", resuming at step {start_step}" if start_step else ""),
    )
    train_start = time.perf_counter()
    if start_step < total_steps:
        trainer.train()
    train_time = time.perf_counter() - train_start

    # Final evaluation and outputs.
    clock.start("eval", f"{config.eval.episodes} episodes")
    final = evaluation.evaluate(total_steps)
    eval_env.close()
    clock.stop()
    save_policy(
        run_dir / POLICY_NAME, actor, policy_metadata(family, hidden, info.name, total_steps)
    )
    results = {
        **common_results(
            info,
            config,
            final,
            total_steps=total_steps,
            start_step=start_step,
            train_time=train_time,
            wall_time=prior_wall_time + time.perf_counter() - start_time,
        ),
        "stage_times": clock.times,
        "expected_horizon_start": metrics.first_window.get("cbop/expected_horizon"),
        "expected_horizon_end": metrics.last_window.get("cbop/expected_horizon"),
        "eval_history": evaluation.history,
        "stages": {
            "dynamics_cached": bool(dynamics_metrics.get("cached")),
            "dynamics_holdout_r2_mean": dynamics_metrics.get("holdout_r2_mean"),
            "bc_cached": bc_cached,
            "fqe_cached": fqe_cached,
        },
        "settings": {
            "num_elites": dynamics.num_elites,
            "num_qvalue_nets": config.agent.num_qvalue_nets,
            "horizon": config.estimator.horizon,
            "psi": config.estimator.psi,
            "mode": config.estimator.mode,
            "batch_size": config.train.batch_size,
        },
        "checkpoint": str(checkpoint_path),
        "policy": str(run_dir / POLICY_NAME),
    }
    atomic_json_dump(results, results_path)
    log_scalars(logger, {"final/normalized_score": results["normalized_score_mean"]}, total_steps)
    if logger is not None and hasattr(logger, "experiment") and config.logger.backend == "wandb":
        logger.experiment.finish()
    return results


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
    "CheckpointError",
    "EvaluationHook",
    "GradientSteps",
    "GuardedOptimizationStepper",
    "NonFiniteLossError",
    "SampleFromBuffer",
    "build_cbop_loss",
    "make_optimizer",
    "run_pipeline",
]
