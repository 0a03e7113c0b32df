"""Runs side by side: several CBOP runs over one dataset, trained in turn in one process.

Design. Each run is the single-run pipeline (:func:`~cbop_torchrl.trainers.offline.run_pipeline`)
untouched: its own objects, maths, run directory, checkpoint, resume and ``results.json``.
The runs take turns, one gradient step each: every run has its own thread, and a
:class:`Turns` baton lets exactly one of them run at a time. At each hand-over the
process-wide random-number state (torch's CPU and CUDA generators, NumPy's, Python's:
TorchRL's ``GlobalRNGState``) is saved for the run that stops and restored for the run
that goes on, so every run draws what it would draw alone, and a run side by side is bit
for bit the run alone on the CPU (``tests/test_side_by_side.py``). The hand-over is a
TorchRL Trainer hook (:class:`TakeTurns`, on ``post_steps``), so the runs interleave per
step of the CBOP stage. Their pretraining (dynamics, BC, FQE) is cached by data, config and
seed (the stage caches of :mod:`cbop_torchrl.trainers.dynamics` and
:mod:`cbop_torchrl.trainers.pretrain`), so runs that share a seed share its models; with
``runs.pretrain_together`` (the default) the missing ones of every distinct seed are trained
together before the first turn (:mod:`cbop_torchrl.trainers.pretrain_together`), otherwise
each run trains its own in its first turn.

On CUDA each run's thread issues its work on its own stream, and its captured step
(:class:`~cbop_torchrl.accel.CapturedStep`) is replayed there: a replay only
queues work, so while one run's graph executes the next run's is queued, and the device
runs them concurrently.

Why not stack the runs' parameters on a leading axis and ``vmap`` the update (one Adam over
stacked tensors)? It makes bigger kernels, but it needs every part of the step (the
estimator's rollouts, the Q-ensemble's ``from_modules`` stack, the guard, the captured
graph), the checkpoints and the resume to take a run axis, and its equivalence to a run
alone holds only to float rounding. Turn-taking keeps each run exactly what it is alone,
and on CUDA the per-run graphs on their own streams fill the device from the other side.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torchrl.trainers import Trainer, TrainerHookBase

from cbop_torchrl.trainers.portable import PortableRNGState


class Turns:
    """A baton over ``count`` runs: one runs at a time, in order, each with its own RNG state.

    A run waits for its turn (:meth:`begin`), hands the baton to the next run still
    active after each step (:meth:`pass_on`) and leaves when it ends (:meth:`leave`).
    Each run's process-wide random-number state is swapped in and out at its turns.
    """

    def __init__(self, count: int) -> None:
        self._condition = threading.Condition()
        self._active = list(range(count))
        self._position = 0  # index into _active of the run that holds the baton
        self._rng = PortableRNGState()
        self._states: list[dict[str, Any] | None] = [None] * count

    def _holder(self) -> int | None:
        return self._active[self._position] if self._active else None

    def begin(self, run: int) -> None:
        """Waits until ``run`` holds the baton, then puts its RNG state in place."""
        with self._condition:
            self._condition.wait_for(lambda: self._holder() == run)
        if self._states[run] is not None:
            self._rng.load_state_dict(self._states[run])

    def pass_on(self, run: int) -> None:
        """Saves ``run``'s RNG state, hands the baton on and waits for ``run``'s next turn."""
        if len(self._active) == 1:
            return  # alone now: nothing to swap
        self._states[run] = self._rng.state_dict()
        with self._condition:
            self._position = (self._position + 1) % len(self._active)
            self._condition.notify_all()
        self.begin(run)

    def leave(self, run: int) -> None:
        """``run`` has ended (finished or failed): the baton goes to the next active run."""
        with self._condition:
            position = self._active.index(run)
            self._active.pop(position)
            if self._active:
                if position < self._position:
                    self._position -= 1
                self._position %= len(self._active)
            self._condition.notify_all()


class TakeTurns(TrainerHookBase):
    """A Trainer hook (``post_steps``): after each gradient step, the next run's turn."""

    def __init__(self, turns: Turns, run: int) -> None:
        self.turns, self.run = turns, run

    def __call__(self) -> None:
        self.turns.pass_on(self.run)

    def register(self, trainer: Trainer, name: str = "take_turns") -> None:
        trainer.register_op("post_steps", self)


@contextlib.contextmanager
def _own_stream(device: torch.device) -> Iterator[None]:
    """On CUDA, the calling thread's work on a stream of its own (after what came before)."""
    if device.type != "cuda":
        yield
        return
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        yield
    torch.cuda.current_stream(device).wait_stream(stream)


class RunFailed(RuntimeError):
    """A run side by side failed; the other runs went on to their ends."""


def train_in_turn(
    runs: Sequence[Callable[[TakeTurns], dict[str, Any]]],
    names: Sequence[str],
    device: torch.device,
) -> list[dict[str, Any]]:
    """Trains ``runs`` side by side, one gradient step each in turn; returns their results.

    Args:
        runs: one function per run that trains it (registering the given hook on its
            CBOP Trainer) and returns its ``results.json`` dict.
        names: each run's name (its run directory's), for messages.
        device: the runs' device (on CUDA each run's thread gets its own stream).

    Raises:
        BaseException: the first failure of a run (the package's errors as they are,
            others as :class:`RunFailed` naming the run), raised once every other run
            has ended; a :class:`~cbop_torchrl.trainers.slicing.SliceEnded` of a slice
            budget stops each run at its own checkpoint first.
    """
    turns = Turns(len(runs))
    results: list[dict[str, Any] | None] = [None] * len(runs)
    errors: list[tuple[int, BaseException]] = []

    def work(index: int) -> None:
        turns.begin(index)
        try:
            with _own_stream(device):
                results[index] = runs[index](TakeTurns(turns, index))
        except BaseException as error:  # reported by the calling thread, after the others
            errors.append((index, error))
        finally:
            turns.leave(index)

    threads = [
        threading.Thread(target=work, args=(i,), name=f"run-{names[i]}", daemon=True)
        for i in range(len(runs))
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        index, error = min(errors, key=lambda item: item[0])
        if isinstance(error, (SystemExit, KeyboardInterrupt)) or type(error).__module__.startswith(
            "cbop_torchrl"
        ):
            raise error
        raise RunFailed(f"run {names[index]!r} failed: {type(error).__name__}: {error}") from error
    return [result for result in results if result is not None]


__all__ = ["RunFailed", "TakeTurns", "Turns", "train_in_turn"]
