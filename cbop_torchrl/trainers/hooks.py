"""The pieces that make TorchRL's :class:`~torchrl.trainers.Trainer` train offline.

A ``Trainer`` expects a data collector, an optimizer step and hooks
registered at named points of its loop; offline training collects nothing,
so these stand-ins and hooks turn it into a loop of gradient steps on
dataset batches (wired together by
:func:`cbop_torchrl.trainers.offline_training.build_offline_training`, for CBOP and
for the baselines):

- :class:`GradientSteps` is the "collector": an endless iterator of empty
  TensorDicts, one per gradient step, so the Trainer's frame counter, its
  progress bar and ``total_frames`` count gradient steps;
- :class:`SampleFromBuffer` (``process_optim_batch``, where TorchRL's own
  ``ReplayBufferTrainer`` samples) replaces that empty batch with one drawn
  from the dataset's replay buffer;
- :class:`DelayedTargetUpdate` (``post_optim``) moves the target networks on every
  ``every``-th step only (TD3+BC's, with its delayed actor);
- :class:`EvaluationHook` (``post_steps``) evaluates the policy every
  ``eval.interval`` steps (with ``eval.actor_average``, also the weight average
  :class:`ActorWeightAverage` keeps at ``post_optim``), :class:`QValueStats`
  (``post_optim_log``) logs Q-ensemble statistics, and :class:`ResumeProgressBar` (``setup``) starts
  the progress bar at a resumed step.

The hooks carry logging, evaluation and checkpoint timing; what a checkpoint restores is
the run's one state dict (:mod:`cbop_torchrl.trainers.run_state`), read from the objects
themselves (the sampler's generator, the average's weights, the evaluation history), not
``Trainer.state_dict()``. The metrics and checkpoint hooks live with what they write:
:class:`~cbop_torchrl.trainers.logging.MetricsHook` and
:class:`~cbop_torchrl.trainers.checkpoint.CheckpointHook`.
"""

from __future__ import annotations

import copy
import time
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from functools import partial
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase
from torchrl.data import ReplayBuffer
from torchrl.envs import EnvBase
from torchrl.objectives import SoftUpdate
from torchrl.record.loggers import Logger
from torchrl.trainers import Trainer, TrainerHookBase

from cbop_torchrl.config import RunConfig
from cbop_torchrl.envs import PolicyEvaluator, run_evaluator
from cbop_torchrl.envs.evaluate import deterministic_policy
from cbop_torchrl.envs.starts import evaluate_from_states
from cbop_torchrl.objectives.loss import CBOPLoss
from cbop_torchrl.objectives.pretrain import ensemble_q
from cbop_torchrl.registry import Task
from cbop_torchrl.trainers.background import BackgroundMeasurementHook
from cbop_torchrl.trainers.logging import log_scalars


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

    The buffer samples with its own ``torch.Generator``, whose state is in the run's
    checkpoint (``sampler_generator``), so a resumed run draws the same batches.
    """

    def __init__(self, buffer: ReplayBuffer, generator: torch.Generator) -> None:
        self.buffer = buffer
        self.generator = generator

    def __call__(self, batch: TensorDictBase) -> TensorDictBase:
        return self.buffer.sample()

    def register(self, trainer: Trainer, name: str = "replay_sampler") -> None:
        trainer.register_op("process_optim_batch", self)


class DelayedTargetUpdate(TrainerHookBase):
    """``updater.step()`` after each optimizer step whose count is a multiple of ``every``.

    TorchRL's ``TargetNetUpdaterHook`` steps after every optimizer step. TD3's target
    networks move only on the steps its delayed actor takes (TD3+BC's authors' code, and
    TorchRL's td3_bc sota-implementation, which steps its updater inside the actor's
    branch). The count is the trainer's, which a resumed run restores, so a resumed run
    moves its targets on the same steps.
    """

    def __init__(self, updater: SoftUpdate, every: int) -> None:
        self.updater = updater
        self.every = every
        self.trainer: Trainer | None = None

    def __call__(self) -> None:
        if self.trainer._optim_count % self.every == 0:  # the stepper's own step count
            self.updater.step()

    def register(self, trainer: Trainer, name: str = "delayed_target_update") -> None:
        self.trainer = trainer
        trainer.register_op("post_optim", self)


class ActorWeightAverage(TrainerHookBase):
    """An exponential moving average of the actor's weights, for evaluation only (``post_optim``).

    BEYOND THE PAPER (``eval.actor_average=decay``): after every optimizer step
    ``w_avg <- decay * w_avg + (1 - decay) * w``, on a copy of the actor that
    :class:`EvaluationHook` scores beside the trained one. Training never reads
    it. A run resumed from a checkpoint without an average starts it there.
    """

    def __init__(self, actor: Any, decay: float) -> None:
        self.decay = float(decay)
        self.averaged = copy.deepcopy(actor).requires_grad_(False)
        self.weights = TensorDict.from_module(self.averaged)
        self.current = TensorDict.from_module(actor)

    def __call__(self) -> None:
        with torch.no_grad():
            self.weights.lerp_(self.current, 1.0 - self.decay)

    def restart(self) -> None:
        """Restarts the average at the actor's present weights."""
        with torch.no_grad():
            self.weights.update_(self.current)

    def state_dict(self) -> dict[str, Any]:
        """The averaged weights (the checkpoint's ``actor_average``)."""
        return self.averaged.state_dict()

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.averaged.load_state_dict(state_dict)

    def register(self, trainer: Trainer, name: str = "actor_average") -> None:
        trainer.register_op("post_optim", self)


#: ``eval_history`` record key -> logged ``eval/<name>`` (``average_``-prefixed for the average).
EVAL_SCALARS = {
    "normalized_score_mean": "normalized_score",
    "normalized_score_std": "normalized_score_std",
    "return_mean": "return",
}


class EvaluationHook(BackgroundMeasurementHook):
    """Evaluates the deterministic policy every ``interval`` gradient steps (``post_steps``).

    Logs ``eval/return`` and, when the task has reference scores,
    ``eval/normalized_score`` (mean) and ``eval/normalized_score_std``; keeps
    the history (checkpointed) for ``results.json``. With ``average`` it also
    scores the averaged actor (``eval/average_*``, ``average_*`` in the history).
    With ``start_obs`` (``eval.start_states``) every policy is also scored on one
    episode from each of those dataset states restored in the simulator
    (:func:`~cbop_torchrl.envs.starts.evaluate_from_states`): ``start_*`` in the
    history, ``eval/start_normalized_score`` and ``eval/start_seconds`` (its wall
    time; the reset evaluation's: ``eval/seconds``) in the logs; the reset evaluation is
    unchanged and stays the primary score.
    The final evaluation after the last step is done by the pipeline itself.

    With ``background`` (``eval.background``) an evaluation due at step s runs in a worker
    thread on a CPU copy of the policies' weights taken at s, while training goes on; its
    record and logs carry s and are written, in step order, by the training thread once
    it is done (at a later step's hook, or when :meth:`drain` waits for it). The history
    a checkpoint holds is complete up to its step (:meth:`state_dict` drains first), so a
    resumed run logs every evaluation once. The episodes use no torch random numbers
    (deterministic policy, seeded environments), so the scores are those of the
    in-line evaluation (on a GPU, up to the float rounding of the CPU's actor).
    """

    hook_name = "evaluation"
    # The evaluations submitted and not yet written; each result is (record, scalars, summaries).
    _pending: deque[Future[tuple[dict[str, Any], dict[str, Any], dict[str, Any]]]]

    def __init__(
        self,
        actor: Any,
        task: Task,
        env: EnvBase,
        config: RunConfig,
        logger: Logger | None,
        total_steps: int,
        average: ActorWeightAverage | None = None,
        start_obs: torch.Tensor | None = None,
        background: bool = False,
        seed: int | None = None,
    ) -> None:
        super().__init__(config.eval.interval, total_steps, background)
        self.actor, self.task, self.env, self.logger = actor, task, env, logger
        self.average = average
        self.start_obs = start_obs
        self.max_steps = config.eval.max_steps
        self.seed = config.seed if seed is None else int(seed)  # a run's decisions.seeds
        self._evaluators: dict[str, PolicyEvaluator] | None = None

    def _policies(self) -> dict[str, Any]:
        policies = {"": self.actor}
        if self.average is not None:
            policies["average_"] = self.average.averaged
        return policies

    def evaluators(self) -> dict[str, PolicyEvaluator]:
        """One :class:`~cbop_torchrl.envs.PolicyEvaluator` (a TorchRL collector) per policy,
        made at the first evaluation, over ``env``.

        In-line, each collector runs the trained policy itself, on its device (it reads the
        weights as they are). With ``background``, each runs its own copy of the policy on
        the CPU, where the environments are: on a GPU the episodes' small actor calls would
        queue behind the captured training step's kernels (an H200 shared by four captured
        runs wrote no background evaluation in 10,000 steps), and on a CPU run the copy is
        what keeps the weights of step s while training changes the policy's. The copy is
        made here, not by the collector: TorchRL's collector copies a policy only when its
        ``policy_device`` differs from the parameters' (never on a CPU run).
        """
        if self._evaluators is None:
            devices = [torch.cuda.current_device()] if torch.cuda.is_initialized() else []
            with torch.random.fork_rng(devices=devices), torch.no_grad():
                self._evaluators = {
                    prefix: PolicyEvaluator(
                        self.env,
                        copy.deepcopy(policy).to("cpu") if self.background else policy,
                        self.max_steps,
                    )
                    for prefix, policy in self._policies().items()
                }
        return self._evaluators

    def _update_weights(self) -> None:
        """Loads the policies' present weights into the background collectors' copies, with
        TorchRL's ``update_policy_weights_`` (in-line, the collectors run the policies
        themselves: nothing to load)."""
        if not self.background:
            return
        for prefix, policy in self._policies().items():
            weights = TensorDict.from_module(deterministic_policy(policy)).data
            self.evaluators()[prefix].update_policy_weights_(weights)

    def close(self) -> None:
        """Drains, stops the worker thread and shuts the collectors down (``env`` stays open)."""
        super().close()
        for evaluator in (self._evaluators or {}).values():
            evaluator.close()
        self._evaluators = None

    def _job(
        self, step: int
    ) -> Callable[[], tuple[dict[str, Any], dict[str, Any], dict[str, Any]]]:
        """Loads the policies' weights at ``step`` into the collectors' copies; the job scores
        them and returns ``(record, scalars, summaries)``.

        Nothing else runs on the copies meanwhile: :meth:`_wait_for_backlog` has waited for
        the evaluation before this one, and an in-line one drains first.
        """
        self._update_weights()
        # In the worker the global RNG is not forked: restoring it would undo the draws
        # training made meanwhile.
        return partial(self._measure, step, False)

    def _write_result(self, result: tuple[dict[str, Any], dict[str, Any], dict[str, Any]]) -> None:
        """Writes a finished background evaluation: ``(record, scalars, summaries)``."""
        record, scalars, _ = result
        self._write(record, scalars)

    def _write(self, record: dict[str, Any], scalars: dict[str, Any]) -> None:
        """Keeps ``record`` in ``history`` and logs the scalars that are not None."""
        self.history.append(record)
        log_scalars(
            self.logger, {k: v for k, v in scalars.items() if v is not None}, record["step"]
        )

    def evaluate(self, step: int) -> dict[str, Any]:
        """Scores the trained actor (and the average) at ``step``; returns the actor's summary.

        In-line: evaluations still running in the background are written first.
        """
        self.drain()
        self._update_weights()
        record, scalars, summaries = self._measure(step)
        self._write(record, scalars)
        return summaries[""]

    def _in_line(self, step: int) -> None:
        """The evaluation due at ``step``, in-line (:meth:`evaluate`)."""
        self.evaluate(step)

    def _measure(
        self, step: int, in_line: bool = True
    ) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
        """``(record, scalars, summaries)`` of the collectors' policies at ``step``; writes
        nothing.

        The start-state measure (``start_obs``) restores MuJoCo states in gymnasium
        environments of its own (:func:`~cbop_torchrl.envs.starts.evaluate_from_states`):
        a TorchRL collector starts every episode with ``env.reset()`` and has no way to
        begin one in a given simulator state, so it keeps its own loop.
        """
        record: dict[str, Any] = {"step": step}
        scalars: dict[str, Any] = {}
        summaries = {}
        for prefix, evaluator in self.evaluators().items():
            started = time.perf_counter()
            summary = run_evaluator(evaluator, self.task, self.seed, fork_rng=in_line).summary()
            scalars[f"eval/{prefix}seconds"] = time.perf_counter() - started
            summaries[prefix] = summary
            for key, name in EVAL_SCALARS.items():
                record[f"{prefix}{key}"] = summary[key]
                scalars[f"eval/{prefix}{name}"] = summary[key]
            if self.start_obs is not None:
                started = time.perf_counter()
                starts = evaluate_from_states(
                    evaluator.policy, self.task, self.start_obs, self.max_steps, fork_rng=in_line
                ).summary()
                scalars[f"eval/{prefix}start_seconds"] = time.perf_counter() - started
                for key, name in EVAL_SCALARS.items():
                    record[f"{prefix}start_{key}"] = starts[key]
                    scalars[f"eval/{prefix}start_{name}"] = starts[key]
        return record, scalars, summaries


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

    def register(self, trainer: Trainer, name: str = "resume_progress") -> None:
        trainer.register_op("setup", self)


__all__ = [
    "EvaluationHook",
    "GradientSteps",
    "QValueStats",
    "ResumeProgressBar",
    "SampleFromBuffer",
]
