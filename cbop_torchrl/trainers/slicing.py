"""Runs in slices: stop a training at a checkpoint when a wall-clock or step budget is spent.

A long run (the paper's preset: 1,000,000 gradient steps) often has to fit into
jobs of a few minutes each (a cluster's time limit, a lent GPU). The driver
(``benchmarks/learning.py --max-minutes M`` or ``--slice-steps N``) hands the
budget to the training process through the environment, so the run's config,
its hash and its checkpoint are the same as an uninterrupted run's:

- :data:`DEADLINE_ENV`: a Unix time (seconds); stop at the last checkpoint that
  can be written before it;
- :data:`STEPS_ENV`: stop at the first checkpoint at least that many gradient
  steps after the step this process started from (deterministic; the tests use it).

The stop comes right after a regular checkpoint (``train.checkpoint_interval``),
at the same point where a killed run would resume from, so the next process
continues exactly (``tests/test_slicing.py`` checks three slices against one
run, bit for bit). It goes through TorchRL's ``Trainer.request_stop``; when the
Trainer's loop has ended, :meth:`SliceBudgetHook.exit_if_stopped` ends the process
with :data:`SLICE_EXIT_CODE` after writing ``slice_end.json`` into the run directory.
The exit is a :class:`SystemExit` so that it passes the entry scripts' and Hydra's
error reporting unchanged (it is not an error), and the driver tells it from a
failure by its code.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torchrl.trainers import Trainer, TrainerHookBase

from cbop_torchrl.config import ConfigError
from cbop_torchrl.io import atomic_json_dump

DEADLINE_ENV = "CBOP_TORCHRL_SLICE_DEADLINE"
STEPS_ENV = "CBOP_TORCHRL_SLICE_STEPS"
#: The exit code of a process that stopped at its slice budget (``EX_TEMPFAIL``: try again).
SLICE_EXIT_CODE = 75
SLICE_END_NAME = "slice_end.json"
#: The time a checkpoint interval is predicted to take is multiplied by this before it is
#: compared with the time left: evaluations and checkpoint writes make intervals uneven.
SAFETY_FACTOR = 1.25


class SliceEnded(SystemExit):
    """The process stopped at its slice budget after a checkpoint; run the command again."""

    def __init__(self) -> None:
        super().__init__(SLICE_EXIT_CODE)


@dataclass(frozen=True)
class SliceBudget:
    """How far one process may train: a deadline (Unix seconds) and/or a number of steps."""

    deadline: float | None = None
    steps: int | None = None

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> SliceBudget | None:
        """The budget in :data:`DEADLINE_ENV` / :data:`STEPS_ENV`, or None when neither is set.

        Raises:
            ConfigError: a variable is set to something other than a number (a
                finite Unix time; a positive whole number of steps).
        """
        environ = os.environ if environ is None else environ
        deadline_text, steps_text = environ.get(DEADLINE_ENV), environ.get(STEPS_ENV)
        if not deadline_text and not steps_text:
            return None
        deadline = steps = None
        if deadline_text:
            try:
                deadline = float(deadline_text)
            except ValueError:
                deadline = math.nan
            if not math.isfinite(deadline):
                raise ConfigError(
                    f"{DEADLINE_ENV}={deadline_text!r} is not a Unix time in seconds; set it to "
                    "e.g. $(($(date +%s) + 540)) or unset it"
                )
        if steps_text:
            if not steps_text.isdigit() or int(steps_text) < 1:
                raise ConfigError(
                    f"{STEPS_ENV}={steps_text!r} is not a positive whole number of gradient "
                    "steps; set it to e.g. 10000 or unset it"
                )
            steps = int(steps_text)
        return cls(deadline, steps)


class SliceBudgetHook(TrainerHookBase):
    """Stops the Trainer right after a checkpoint once this process's budget is spent.

    Registered on ``post_steps`` after the :class:`CheckpointHook`, it looks at
    each step where that hook has just saved (before the last step): it stops when
    the step budget is reached, or when the next checkpoint is predicted to come
    after the deadline (seconds per step measured in this process, times
    :data:`SAFETY_FACTOR`). It has no state of its own in the checkpoint.

    Args:
        budget: this process's budget.
        checkpoint: the run's checkpoint hook (its ``path``, ``interval``,
            ``total_steps`` and ``last_saved_step``).
        release: called before the process exits (releases the run directory's lock).
        clock: Unix seconds now (injectable for tests).
    """

    def __init__(
        self,
        budget: SliceBudget,
        checkpoint: Any,
        release: Callable[[], None] | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.budget = budget
        self.checkpoint = checkpoint
        self.release = release
        self.clock = clock
        self.trainer: Trainer | None = None
        self.first: tuple[int, float] | None = None  # (step, time) at this process's first step
        self.stopped_at: int | None = None

    def should_stop(self, step: int, now: float) -> bool:
        """Whether to stop at ``step``, a step just checkpointed before the last one."""
        start_step = self.first[0] - 1 if self.first is not None else step
        if self.budget.steps is not None and step - start_step >= self.budget.steps:
            return True
        if self.budget.deadline is None:
            return False
        if now >= self.budget.deadline:
            return True
        if self.first is None or step <= self.first[0]:
            return False
        seconds_per_step = (now - self.first[1]) / (step - self.first[0])
        next_save = min(step + self.checkpoint.interval, self.checkpoint.total_steps)
        predicted = now + SAFETY_FACTOR * seconds_per_step * (next_save - step)
        return predicted > self.budget.deadline

    def __call__(self) -> None:
        step, now = int(self.trainer.collected_frames), self.clock()
        if self.first is None:
            self.first = (step, now)
        saved_here = self.checkpoint.last_saved_step == step
        if not saved_here or step >= self.checkpoint.total_steps or not self.should_stop(step, now):
            return
        self.stopped_at = step
        self.trainer.request_stop(f"slice budget spent at gradient step {step}")

    def exit_if_stopped(self) -> None:
        """After the Trainer's loop: writes ``slice_end.json`` and exits when this hook stopped it.

        Raises:
            SliceEnded: the run stopped at its budget (exit code :data:`SLICE_EXIT_CODE`).
        """
        if self.stopped_at is None:
            return
        total = self.checkpoint.total_steps
        run_dir = Path(self.checkpoint.path).parent
        atomic_json_dump(
            {
                "step": self.stopped_at,
                "total_steps": total,
                "checkpoint": str(self.checkpoint.path),
            },
            run_dir / SLICE_END_NAME,
        )
        print(
            f"[cbop] slice budget spent: stopped at gradient step {self.stopped_at} of {total} "
            f"after writing {self.checkpoint.path}; resume with the same command",
            flush=True,
        )
        if self.release is not None:
            self.release()
        raise SliceEnded()

    def register(self, trainer: Trainer, name: str = "slice_budget") -> None:
        self.trainer = trainer
        trainer.register_op("post_steps", self)


def slice_budget_hook(
    checkpoint: Any, release: Callable[[], None] | None = None
) -> SliceBudgetHook | None:
    """The hook for the budget set in the environment, or None when no budget is set."""
    budget = SliceBudget.from_environ()
    return None if budget is None else SliceBudgetHook(budget, checkpoint, release)
