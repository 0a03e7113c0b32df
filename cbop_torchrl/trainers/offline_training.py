"""TorchRL's Trainer over dataset batches, with the offline hooks: CBOP and the baselines.

:func:`build_offline_training` registers the hooks of :mod:`cbop_torchrl.trainers.hooks`
on a :class:`~torchrl.trainers.Trainer` and resumes it from the run's checkpoint:

- the "collector" is :class:`~cbop_torchrl.trainers.hooks.GradientSteps`, one
  empty TensorDict per gradient step, and
  :class:`~cbop_torchrl.trainers.hooks.SampleFromBuffer` draws the batch from
  the dataset's replay buffer;
- the optimization stepper (for CBOP
  :class:`~cbop_torchrl.trainers.cbop_stage.GuardedOptimizationStepper`) does the optimizer
  step and refuses non-finite losses, targets and gradients;
- ``TargetNetUpdaterHook(SoftUpdate)`` updates the target networks (every
  ``target_update_every``-th step: :class:`~cbop_torchrl.trainers.hooks.DelayedTargetUpdate`);
- :class:`~cbop_torchrl.trainers.logging.MetricsHook`,
  :class:`~cbop_torchrl.trainers.hooks.EvaluationHook` and
  :class:`~cbop_torchrl.trainers.checkpoint.CheckpointHook` log, evaluate and save.

The Trainer's own checkpointing writes either a directory of components or a
deprecated pickle path; a run needs one file that ``torch.load(...,
weights_only=True)`` reads, so ``CheckpointHook`` saves the run's one state dict
(:func:`~cbop_torchrl.trainers.run_state.run_state`) atomically itself and resuming
restores it (:func:`~cbop_torchrl.trainers.run_state.load_run_state`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
from torchrl.data import ReplayBuffer
from torchrl.envs import EnvBase
from torchrl.objectives import SoftUpdate
from torchrl.trainers import OptimizationStepper, TargetNetUpdaterHook, Trainer, TrainerHookBase

from cbop_torchrl.envs.starts import START_STATES_SEED, pick_start_states
from cbop_torchrl.trainers.checkpoint import CheckpointHook
from cbop_torchrl.trainers.diagnostics import LearningDiagnostics
from cbop_torchrl.trainers.hooks import (
    ActorWeightAverage,
    DelayedTargetUpdate,
    EvaluationHook,
    GradientSteps,
    ResumeProgressBar,
    SampleFromBuffer,
)
from cbop_torchrl.trainers.logging import MetricsHook
from cbop_torchrl.trainers.offline_run import OfflineRun
from cbop_torchrl.trainers.run_state import RunParts, load_run_state, run_state
from cbop_torchrl.trainers.slicing import SliceBudgetHook, slice_budget_hook
from cbop_torchrl.trainers.snapshots import snapshot_hook

CBOP_KEYS = (
    "observation",
    "action",
    ("next", "observation"),
    ("next", "reward"),
    ("next", "terminated"),
    ("next", "done"),
)
"""What the CBOP loss reads from a dataset batch."""


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
    target_update_every: int = 1,
    extra_hooks: tuple[TrainerHookBase, ...] = (),
    diagnostics: LearningDiagnostics | None = None,
    take_turns: TrainerHookBase | None = None,
) -> OfflineTraining:
    """TorchRL's Trainer with the offline hooks registered, resumed from the run's checkpoint.

    Hooks, in registration order: batch sampling, target-network update,
    metrics, ``extra_hooks``, ``diagnostics``, periodic evaluation, checkpoints, the
    progress bar and ``take_turns`` (runs side by side: the hand-over to the next run
    after each step, :mod:`cbop_torchrl.trainers.side_by_side`). The checkpoint hook saves
    the run's state dict (:func:`~cbop_torchrl.trainers.run_state.run_state`) of these
    objects, and a resumed run restores it (:func:`~.run_state.load_run_state`).
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
    SampleFromBuffer(buffer, generator).register(trainer)
    if target_update is not None and target_update_every > 1:
        DelayedTargetUpdate(target_update, target_update_every).register(trainer)
    elif target_update is not None:
        trainer.register_op("post_optim", TargetNetUpdaterHook(target_update))
    metrics = MetricsHook(run.logger, config.train.log_interval)
    metrics.register(trainer)
    for hook in extra_hooks:
        hook.register(trainer)
    if diagnostics is not None:
        diagnostics.register(trainer)
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
        seed=run.decisions.seeds.evaluation,
    )  # fmt: skip
    evaluation.register(trainer)
    if config.eval.snapshot_interval > 0:  # before the checkpoint: a resume rewrites, never skips
        snapshot_hook(run, loss, actor, buffer).register(trainer)
    checkpoint.register(trainer)
    slice_budget = slice_budget_hook(checkpoint, run.lock.release if run.lock else None)
    if slice_budget is not None:  # after the checkpoint hook: it stops right after a save
        slice_budget.register(trainer)
    ResumeProgressBar(trainer).register(trainer)
    if take_turns is not None:
        take_turns.register(trainer)
    training = OfflineTraining(trainer, actor, metrics, evaluation, checkpoint, eval_env)
    training.slice_budget = slice_budget
    parts = RunParts(trainer, loss, optimizer, generator, metrics, evaluation, average, diagnostics)
    checkpoint.state = lambda step: run_state(
        parts, run.checkpoint_record(step, checkpoint.payload(step))
    )
    if run.resume_state is not None:
        training.start_step = load_run_state(parts, run.resume_state)
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


def final_evaluation(run: OfflineRun, training: OfflineTraining) -> dict[str, Any]:
    """Scores the final policy on ``eval.episodes`` episodes and closes the environments."""
    run.clock.start("eval")
    final = training.evaluation.evaluate(run.config.train.total_steps)
    training.evaluation.close()
    training.eval_env.close()
    run.clock.stop()
    return final


__all__ = [
    "CBOP_KEYS",
    "OfflineTraining",
    "build_offline_training",
    "final_evaluation",
    "restore_final_records",
]
