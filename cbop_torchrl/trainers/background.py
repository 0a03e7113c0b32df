"""Measurements beside training: the machinery of a hook that can measure in a worker thread.

:class:`BackgroundMeasurementHook` is what the evaluation hook
(:class:`~cbop_torchrl.trainers.hooks.EvaluationHook`) and the learning diagnostics
(:class:`~cbop_torchrl.trainers.diagnostics.LearningDiagnostics`) share: the schedule (every
``interval`` gradient steps before ``total_steps``, ``post_steps``), the one-thread worker,
the queue of measurements submitted and not yet written, their writing in step order, the
``history`` a checkpoint holds (``evaluation_history``, ``diagnostics_history``:
:mod:`cbop_torchrl.trainers.run_state`) and the registration. Each hook
supplies what differs: what a measurement takes in the training thread and runs in the
worker (:meth:`~BackgroundMeasurementHook._job`), how a finished one is written
(:meth:`~BackgroundMeasurementHook._write_result`) and the in-line measurement
(:meth:`~BackgroundMeasurementHook._in_line`).
"""

from __future__ import annotations

import abc
import time
import warnings
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from torchrl.trainers import Trainer, TrainerHookBase


class BackgroundMeasurementHook(TrainerHookBase):
    """Measures every ``interval`` gradient steps (``post_steps``), in-line or in a worker thread.

    A measurement is due at every step s with ``s % interval == 0`` and ``s < total_steps``
    (the last one is taken by the pipeline itself). In-line, :meth:`_in_line` takes and
    writes it at once. With ``background``, :meth:`submit` takes in the training thread what
    the measurement needs (a copy of the weights at s) and runs the rest in one worker
    thread (named after :attr:`hook_name`) while training goes on; the finished results are
    written by the training thread in step order, at a later step's hook or when
    :meth:`drain` waits for them. One runs at a time: a measurement due while the one
    before it still runs waits for it first, so results lag by at most one ``interval``
    (:attr:`waited_seconds` says how long training waited). Written records go into
    :attr:`history`, which the run's checkpoint holds (it drains first, so the history is
    complete up to its step).

    Args:
        interval: gradient steps between measurements (0: none).
        total_steps: the run's last step (measured by the pipeline itself).
        background: measure in a worker thread beside training.
    """

    hook_name: str = "measurement"
    """The name the hook registers under by default, and its worker thread's name prefix."""

    def __init__(self, interval: int, total_steps: int, background: bool) -> None:
        self.interval, self.total_steps = int(interval), int(total_steps)
        self.background = bool(background)
        self.history: list[dict[str, Any]] = []
        self.trainer: Trainer | None = None
        self._worker: ThreadPoolExecutor | None = None
        # Measurements submitted and not yet written, in step order (at most one running).
        self._pending: deque[Future[Any]] = deque()
        #: Seconds training waited for a measurement that took longer than ``interval``.
        self.waited_seconds = 0.0
        self._warned_backlog = False

    # ------------------------------------------------------------------ hook API
    def __call__(self) -> None:
        """Writes the finished background measurements, then starts the one due now, if any."""
        step = self.trainer.collected_frames  # one frame per gradient step
        if self.background:
            self._write_done(wait=False)
        if self.interval and step % self.interval == 0 and step < self.total_steps:
            if self.background:
                self._wait_for_backlog(step)
                self.submit(step)
            else:
                self._in_line(step)

    def state_dict(self) -> dict[str, Any]:
        """``{"history": [...]}``, after waiting for every measurement still running (what
        the run's checkpoint holds of this hook)."""
        self.drain()  # a checkpoint holds every measurement up to its step
        return {"history": [dict(record) for record in self.history]}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restores the history a checkpoint holds."""
        self.history = [dict(record) for record in state_dict.get("history", [])]

    def register(self, trainer: Trainer, name: str | None = None) -> None:
        """Registers the hook at ``post_steps``."""
        self.trainer = trainer
        trainer.register_op("post_steps", self)

    # ------------------------------------------------------------- scheduling
    def submit(self, step: int) -> Future[Any]:
        """Starts the measurement at ``step`` in the worker thread, on a copy of the weights."""
        job = self._job(step)
        if self._worker is None:
            self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix=self.hook_name)
        future = self._worker.submit(job)
        self._pending.append(future)
        return future

    def _wait_for_backlog(self, step: int) -> None:
        """Waits for the measurement still running, if any, before the one due at ``step``.

        So at most one runs at a time and results lag by at most one ``interval``: a queue
        that grows faster than the worker empties it would hold copies of the weights
        without bound and lose its tail when a run is stopped. Training waits only when a
        measurement takes longer than ``interval`` steps; the time is kept in
        :attr:`waited_seconds` and said once.
        """
        if not self._pending:
            return
        started = time.perf_counter()
        self._write_done(wait=True)
        waited = time.perf_counter() - started
        self.waited_seconds += waited
        if not self._warned_backlog:
            self._warned_backlog = True
            warnings.warn(
                f"the {self.hook_name} due at step {step} waited {waited:.1f} s for the one "
                f"before it, which took longer than its interval of {self.interval} steps; "
                "training goes on once it is written. A longer eval.interval keeps training "
                "from waiting (this is said once per run).",
                RuntimeWarning,
                stacklevel=3,
            )

    def _write_done(self, wait: bool) -> None:
        """Writes the finished background measurements (all of them with ``wait``) in step
        order."""
        while self._pending and (wait or self._pending[0].done()):
            self._write_result(self._pending.popleft().result())

    def drain(self) -> None:
        """Waits for every measurement started in the background and writes it."""
        self._write_done(wait=True)

    def close(self) -> None:
        """Drains, then stops the worker thread."""
        self.drain()
        if self._worker is not None:
            self._worker.shutdown(wait=True)
            self._worker = None

    # ---------------------------------------------------------- what differs
    @abc.abstractmethod
    def _in_line(self, step: int) -> None:
        """Takes the measurement at ``step`` in the training thread and writes it."""
        raise NotImplementedError

    @abc.abstractmethod
    def _job(self, step: int) -> Callable[[], Any]:
        """Takes in the training thread what the measurement at ``step`` needs (a copy of the
        weights at ``step``) and returns the rest of it, run in the worker thread; what the
        job returns is given to :meth:`_write_result`."""
        raise NotImplementedError

    @abc.abstractmethod
    def _write_result(self, result: Any) -> None:
        """Writes a finished background measurement (into ``history`` and the logs)."""
        raise NotImplementedError


__all__ = ["BackgroundMeasurementHook"]
