"""The CBOP stage: the CBOP loss from the BC actor and the FQE Q-ensemble, trained on
TorchRL's Trainer (:mod:`cbop_torchrl.trainers.offline_training`), resumable."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import torch
from tensordict import TensorDictBase
from torchrl.objectives import SoftUpdate
from torchrl.trainers import OptimizationStepper, Trainer, TrainerHookBase

from cbop_torchrl.accel import CapturedStep, CBOPLoss  # the loss with its fast paths
from cbop_torchrl.config import RunConfig
from cbop_torchrl.data import DatasetInfo, make_replay_buffer
from cbop_torchrl.envs import make_eval_env
from cbop_torchrl.modules.actor_critic import action_spec, make_actor, make_qvalue_ensemble
from cbop_torchrl.objectives.cbop_update import cbop_update
from cbop_torchrl.objectives.cbop_update import make_optimizer as cbop_optimizer
from cbop_torchrl.trainers.checkpoint import CheckpointHook, NonFiniteLossError
from cbop_torchrl.trainers.decisions import CBOP_SEED_OFFSET, seed_stage, uses_cuda_graph
from cbop_torchrl.trainers.diagnostics import LearningDiagnostics
from cbop_torchrl.trainers.hooks import QValueStats
from cbop_torchrl.trainers.offline_run import OfflineRun
from cbop_torchrl.trainers.offline_training import (
    CBOP_KEYS,
    OfflineTraining,
    build_offline_training,
    restore_final_records,
)
from cbop_torchrl.trainers.update import GradientStep


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
            "unbiased_variance": estimator.unbiased_variance,
        },
    )
    return loss.to(device), actor


def make_optimizer(loss: CBOPLoss, config: RunConfig) -> torch.optim.Optimizer:
    """The CBOP step's Adam (:func:`~cbop_torchrl.objectives.cbop_update.make_optimizer`)
    with ``agent.actor_lr``, ``agent.critic_lr`` and ``agent.alpha_lr``."""
    agent = config.agent
    return cbop_optimizer(
        loss, actor_lr=agent.actor_lr, critic_lr=agent.critic_lr, alpha_lr=agent.alpha_lr
    )


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
    generator = torch.Generator().manual_seed(run.decisions.seeds.cbop)
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
    take_turns: TrainerHookBase | None = None,
) -> CBOPStage:
    """CBOP from the BC actor and the FQE Q-ensemble on TorchRL's Trainer (resumable).

    ``take_turns``: registered last on the Trainer (runs side by side,
    :mod:`cbop_torchrl.trainers.side_by_side`).
    """
    config, decisions = run.config, run.decisions
    seed_stage(decisions.seeds.cbop)
    loss, actor = build_cbop_loss(config, run.info, dynamics, decisions.device)
    cuda_graph = decisions.cuda_graph
    loss.value_estimator.whole_step_graph = cuda_graph
    # TorchRL's contract: the target updater is associated before the loss reads its targets.
    # It is stepped inside the gradient step (cbop_update), captured with it.
    target_update = SoftUpdate(loss, tau=config.agent.tau)
    actor.load_state_dict(bc_state)
    incompatible = loss.load_state_dict(fqe_state, strict=False)  # FQE's online and target Qs
    if incompatible.unexpected_keys:
        raise RuntimeError(f"FQE parameters do not fit the Q-ensemble: {incompatible}")
    rollout_choice = choose_rollout_dtype(run, loss, data)  # measured on FQE's target ensemble
    copy_online_to_target(loss)  # CBOP's target ensemble starts as FQE's online ensemble
    optimizer = make_optimizer(loss, config)
    buffer = make_replay_buffer(data.select(*CBOP_KEYS), config.train.batch_size, device=run.device)
    generator = torch.Generator(device=run.device).manual_seed(decisions.seeds.cbop)
    buffer.set_rng(generator)
    eval_env = make_eval_env(run.task, config.eval.episodes, config.eval.backend)
    diagnostics = (
        LearningDiagnostics(
            loss, data, run.task.gym_id, config.agent.gamma, config.eval.interval,
            config.train.total_steps, run.logger, max_steps=config.eval.max_steps,
            seed=decisions.seeds.evaluation, task=run.task, mc_states=config.eval.mc_states,
            background=config.eval.background,
        )
        if config.eval.diagnostics
        else None
    )  # fmt: skip
    checkpoint = CheckpointHook(
        run.checkpoint_path, config.train.checkpoint_interval, config.train.total_steps,
        partial(cbop_checkpoint_payload, run, actor, rollout_choice),
    )  # fmt: skip
    update = partial(cbop_update, loss, optimizer, target_update)  # the step, one page
    training = build_offline_training(
        run, loss=loss, optimizer=optimizer, stepper=cbop_stepper(config, checkpoint, update,
        cuda_graph), checkpoint=checkpoint, buffer=buffer, generator=generator,
        actor=actor, eval_env=eval_env, target_update=None,
        extra_hooks=(QValueStats(loss, run.logger, config.train.log_interval),),
        diagnostics=diagnostics, take_turns=take_turns,
    )  # fmt: skip
    start = training.start_step
    run.clock.start("cbop", f"resuming at gradient step {start}" if start else None)
    if diagnostics is not None and start == 0:
        # The curves' reference point: the BC actor and the FQE critic, before any CBOP step.
        training.evaluation.evaluate(0)
        diagnostics.measure(0)
    restore_final_records(run, training, diagnostics)
    training.train(config.train.total_steps)
    return CBOPStage(loss, dynamics, training, diagnostics, rollout_choice)


def cbop_stepper(
    config: RunConfig, checkpoint: CheckpointHook, update: Callable, cuda_graph: bool
) -> GuardedOptimizationStepper:
    """The CBOP step ``update`` (:func:`~cbop_torchrl.objectives.cbop_update.cbop_update`):
    eager with a finiteness read per step, or captured with one per log step."""
    if not cuda_graph:
        return GuardedOptimizationStepper(checkpoint, update=update)
    return GuardedOptimizationStepper(
        checkpoint, update=update, cuda_graph=True, check_interval=config.train.log_interval,
        strict_capture=config.cuda_graph is True,
    )  # fmt: skip


class GuardedOptimizationStepper(OptimizationStepper):
    """One optimizer step on ``loss_actor + loss_qvalue + loss_alpha``, refusing non-finite values.

    The step is a :class:`~cbop_torchrl.trainers.update.GradientStep` (losses,
    backward, gradient norm, optimizer step and, given ``target_update``, the
    target-network update). Every loss, CBOP target statistic and the gradient
    norm are checked on the device; the host reads the result every
    ``check_interval`` steps. A non-finite value raises
    :class:`NonFiniteLossError` naming the first bad step and the last good
    checkpoint. With ``check_interval=1`` (the default) the check comes before
    ``optimizer.step()`` and no parameter changes; with a longer interval (a
    captured step) a fused optimizer skips the bad steps on the device, so the
    parameters and every checkpoint stay finite, and the run stops at the next check.

    Args:
        checkpoint: the run's checkpoint hook (``describe_last()`` names the last good one).
        target_update: a TorchRL target updater stepped inside the step (None: a
            ``post_optim`` hook does it).
        update: the whole step as a function ``update(batch, guard) -> losses`` (the CBOP
            stage's :func:`~cbop_torchrl.objectives.cbop_update.cbop_update`, bound to its
            loss, optimizer and target updater: give it instead of ``target_update``);
            None: the Trainer's loss, optimizer and ``target_update`` in a
            :class:`~cbop_torchrl.trainers.update.GradientStep`.
        cuda_graph: capture the step as a CUDA graph after ``warmup_steps`` eager
            steps (:class:`~cbop_torchrl.accel.CapturedStep`; the loss must
            be on a CUDA device and the optimizer fused and capturable).
        check_interval: gradient steps between reads of the finiteness record.
        warmup_steps: eager steps before the capture.
        strict_capture: a failed capture raises; otherwise (``cuda_graph=null``) it warns
            and the run goes on with the eager step.
    """

    def __init__(
        self,
        checkpoint: CheckpointHook,
        target_update: Any | None = None,
        *,
        update: Callable[[TensorDictBase, Any], TensorDictBase] | None = None,
        cuda_graph: bool = False,
        check_interval: int = 1,
        warmup_steps: int = 3,
        strict_capture: bool = True,
    ) -> None:
        if check_interval < 1:
            raise ValueError(f"check_interval must be >= 1; got {check_interval}")
        self.checkpoint = checkpoint
        self.target_update = target_update
        self.update_function = update
        self.cuda_graph = cuda_graph
        self.check_interval = check_interval
        self.warmup_steps = warmup_steps
        self.strict_capture = strict_capture
        self.update: GradientStep | None = None
        self._bound_trainer: Trainer | None = None
        self.captured: CapturedStep | None = None
        self._first_frame = 0
        self._calls = 0

    def _build(self, trainer: Trainer) -> None:
        self.update = GradientStep(
            trainer.compute_loss, trainer.optimizer, self.target_update, self.update_function
        )
        if (self.cuda_graph or self.check_interval > 1) and not self.update.skips_on_device:
            optimizer = trainer.optimizer
            raise ValueError(
                "a captured step or a check_interval > 1 needs an optimizer that skips a "
                "non-finite step on the device (fused Adam/AdamW/SGD: fused=True); got "
                f"{type(optimizer).__name__} with fused={optimizer.defaults.get('fused')}"
            )
        if self.cuda_graph:
            self.captured = CapturedStep(self.update, warmup_steps=self.warmup_steps)
        self._first_frame = trainer.collected_frames
        self._calls = 0
        self._bound_trainer = trainer

    def step(self, trainer: Trainer, sub_batch: TensorDictBase) -> TensorDictBase:
        if self._bound_trainer is not trainer:  # bound to one trainer's loss and optimizer
            self._build(trainer)
        self._calls += 1
        check_now = self._calls % self.check_interval == 0
        if self.captured is not None:
            losses = self._captured_step(sub_batch)
        elif check_now and self.update_function is not None:
            # The check runs before the optimizer step: a bad step changes nothing.
            def guard(losses: TensorDictBase, grad_norm: torch.Tensor) -> None:
                self.update.guard(losses, grad_norm)
                self.raise_if_not_finite(trainer)

            return self.update_function(sub_batch, guard)
        elif check_now:  # check before the optimizer step: a bad step changes nothing
            self.update.zero_grad()
            losses = self.update.forward_backward(sub_batch)
            self.raise_if_not_finite(trainer)
            self.update.apply()
            return losses
        else:
            losses = self.update(sub_batch)
        if check_now:
            self.raise_if_not_finite(trainer)
        return losses

    def _captured_step(self, sub_batch: TensorDictBase) -> TensorDictBase:
        if self.captured.captured or self.captured.warmed < self.captured.warmup_steps:
            return self.captured(sub_batch)
        try:  # this call captures; nothing has run on the device yet if it fails
            return self.captured(sub_batch)
        except Exception as error:
            if self.strict_capture:
                raise
            warnings.warn(
                f"the CBOP step could not be captured as a CUDA graph ({type(error).__name__}: "
                f"{error}); the run goes on with the eager step. Set cuda_graph=false to skip "
                "the attempt.",
                RuntimeWarning,
                stacklevel=2,
            )
            self.captured = None
            return self.update(sub_batch)

    def raise_if_not_finite(self, trainer: Trainer) -> None:
        """Reads the finiteness record (one host synchronisation); raises on a bad step."""
        bad_steps, first_bad, names = self.update.health.read()
        if not bad_steps:
            return
        self.update.zero_grad()
        step = self._first_frame + first_bad
        skipped = (
            ""
            if self.captured is None and self.check_interval == 1
            else f" ({bad_steps} non-finite step(s) up to step {trainer.collected_frames}, "
            "none of them applied)"
        )
        raise NonFiniteLossError(
            f"non-finite {', '.join(sorted(names))} at gradient step {step} of the CBOP "
            f"stage{skipped}; the step was not applied and the run stopped. Last good "
            f"checkpoint: {self.checkpoint.describe_last()}. Lower the learning rates "
            "(agent.*_lr) or check the dataset/dynamics model, then resume (the same "
            "command continues from that checkpoint)."
        )


def cbop_checkpoint_payload(
    run: OfflineRun, actor: Any, rollout_choice: dict[str, Any] | None, step: int
) -> dict[str, Any]:
    """CBOP's part of its checkpoint at ``step`` (:meth:`OfflineRun.checkpoint_record` and
    :func:`~cbop_torchrl.trainers.run_state.run_state` add the rest)."""
    return {
        "rollout_choice": rollout_choice,
        "policy": run.policy_metadata(step),
        "actor": actor.state_dict(),
    }


def cbop_result_fields(run: OfflineRun, cbop: CBOPStage, pretraining: dict[str, Any]) -> dict:
    """CBOP's own ``results.json`` fields (:func:`~.offline_run.write_results` adds the rest)."""
    config, training = run.config, cbop.training
    return {
        "stage_times": run.clock.times,
        "expected_horizon_start": training.metrics.first_window.get("cbop/expected_horizon"),
        "expected_horizon_end": training.metrics.last_window.get("cbop/expected_horizon"),
        **({"diagnostics_history": cbop.diagnostics.history} if cbop.diagnostics else {}),
        "stages": pretraining,
        "settings": {
            "num_elites": cbop.dynamics.num_elites,
            "num_dynamics_members": config.dynamics.num_members,
            "dynamics_max_epochs": config.dynamics.max_epochs,  # None: the patience rule alone
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
    }


__all__ = [
    "CBOP_SEED_OFFSET",
    "CBOPStage",
    "build_cbop_loss",
    "cbop_result_fields",
    "cbop_stage",
    "choose_rollout_dtype",
    "critic_hidden_sizes",
    "fqe_scheme",
    "make_optimizer",
    "uses_cuda_graph",
]
