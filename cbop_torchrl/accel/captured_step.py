"""A gradient step recorded once as a CUDA graph and replayed: :class:`CapturedStep`.

After a few eager warm-up steps (on a side stream, as PyTorch's whole-network capture
recipe asks, so the optimizer's state and every lazy buffer exist), one capture, then per
step one copy of the batch into the graph's static input and one ``replay()``: about 1,100
kernel launches become one, with no Python per kernel. The step it records
(:class:`~cbop_torchrl.trainers.update.GradientStep`) holds the optimizer step and the
found-inf health check, both on the device. Random draws come from the device's default
generator, whose offsets a CUDA graph advances on every replay, so a captured step draws
what the eager one would.

Why not ``tensordict.nn.CudaGraphModule`` (tensordict 0.14, ``tensordict/nn/cudagraphs.py``),
which also warms up on a side stream, copies its inputs into static ones and accepts an
optimizer step inside the function:

- every replay calls ``torch.cuda.synchronize()`` after copying the inputs: a host
  synchronisation per step, where this class queues replays without one (the run reads
  its found-inf record every log interval; ``tests/test_cuda.py`` checks a captured step
  makes no synchronisation, and runs side by side need the host to run ahead);
- every replay returns a clone of the outputs (a copy kernel per loss entry); this class
  returns the graph's static outputs, which the caller reads before the next replay;
- its capture uses ``torch.cuda.graph``'s default ``capture_error_mode="global"``, under
  which a CUDA call of another thread (a background evaluation,
  :mod:`cbop_torchrl.trainers.background`) during the capture fails it; this class
  captures with ``"thread_local"``;
- building one removes TensorDict from PyTree's registered nodes for the whole process
  ("irreversible", its warning says), which changes how every later ``torch.compile``
  and ``torch.func`` call sees TensorDicts.

Shapes: the batch is a TensorDict with batch ``[B]`` (B fixed for the whole run: a new B
would need a new capture); the returned losses are a TensorDict with batch ``[]`` that the
next replay overwrites (clone what you keep).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from tensordict import TensorDictBase


class CapturedStep:
    """``step(batch)`` recorded once as a CUDA graph, then replayed (CUDA only).

    Args:
        step: the function to capture (a :class:`GradientStep`): it must make no
            host synchronisation and allocate nothing from host data once warm.
        warmup_steps: eager steps, run on a side stream, before the capture.

    The first ``warmup_steps`` calls run ``step`` eagerly (they are real steps);
    the next records it with the batch copied into a static input and replays it
    (that replay is the step); later calls copy their batch into the static input
    and replay. The outputs are the graph's static tensors. The step only reads the
    static input (it gets a shallow copy of it), so the input holds the same tensors
    from one replay to the next.
    """

    def __init__(
        self,
        step: Callable[[TensorDictBase], TensorDictBase],
        warmup_steps: int = 3,
    ) -> None:
        if warmup_steps < 1:
            raise ValueError(
                f"warmup_steps must be >= 1 (lazy state must exist); got {warmup_steps}"
            )
        self.step = step
        self.warmup_steps = warmup_steps
        self.warmed = 0
        self.graph: torch.cuda.CUDAGraph | None = None
        self.static_batch: TensorDictBase | None = None
        self.static_out: TensorDictBase | None = None

    @property
    def captured(self) -> bool:
        return self.graph is not None

    def _on_side_stream(self, batch: TensorDictBase) -> TensorDictBase:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            out = self.step(batch)
        torch.cuda.current_stream().wait_stream(side)
        return out

    def capture(self, batch: TensorDictBase) -> None:
        """Records ``step`` on a copy of ``batch`` (nothing is computed until :meth:`replay`)."""
        self.static_batch = batch.clone()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, capture_error_mode="thread_local"):
            # A shallow copy: whatever a step writes into its batch stays out of the
            # static input, which every later call copies its batch into.
            self.static_out = self.step(self.static_batch.copy())
        self.graph = graph

    def __call__(self, batch: TensorDictBase) -> TensorDictBase:
        if self.graph is None:
            if self.warmed < self.warmup_steps:
                self.warmed += 1
                return self._on_side_stream(batch)
            self.capture(batch)
        else:
            self.static_batch.update_(batch)
        self.graph.replay()
        return self.static_out


__all__ = ["CapturedStep"]
