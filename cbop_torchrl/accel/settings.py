"""The settings that select CBOP's fast paths: :class:`FastPaths`.

They change how the target and the losses are computed, never what: the eager forms
(:class:`~cbop_torchrl.objectives.estimator.CBOPValueEstimator`,
:class:`~cbop_torchrl.objectives.loss.CBOPLoss`) compute the same quantities, to float
rounding (bit for bit where a path runs the same operations).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from cbop_torchrl.accel.rollout_dtype import resolve_rollout_dtype


@dataclass(frozen=True)
class FastPaths:
    """Which fast paths :func:`~cbop_torchrl.accel.accelerate` turns on.

    Args:
        fused_q: when the Q-network is a plain MLP on ``cat(observation, action)``
            (a ``ValueOperator`` over Linear/LayerNorm/ReLU/Tanh/SiLU layers, as
            :func:`~cbop_torchrl.modules.actor_critic.make_qvalue` builds), evaluate the
            ensemble with one fused ``baddbmm`` (+ in-place activation) per layer
            (:mod:`cbop_torchrl.accel.fused_mlp`) instead of ``vmap``, and run a plain
            actor (:func:`~cbop_torchrl.modules.actor_critic.make_actor`) as its matmuls
            (:mod:`cbop_torchrl.accel.plans`). Any other network runs as a module.
        q_chunk_rows: rows per block of the fused Q-ensemble in the rollout (``None``: all
            at once; ``"auto"``: 8,192 on a CPU, 65,536 on CUDA, where the paper's 51k rows
            are one block and the step launches fewer kernels). Bounds its activations to
            ``M x q_chunk_rows x width`` (at the paper's sizes all 51k rows at once need
            1 GB per layer in fp32 at M = 20). Results do not depend on it beyond float
            rounding.
        compile: on CUDA, run the fused Q-ensemble through ``torch.compile`` with
            ``mode="reduce-overhead"`` (CUDA graphs: the per-layer kernels are replayed
            without launch overhead), or, inside a captured step (``whole_step_graph``),
            the whole target compiled by inductor. On CPU, compile the whole target's
            tensor part (rollout, returns, posterior; one graph) with inductor, static
            shapes: the matmuls stay the same, the small elementwise ops between them
            fuse. It needs a C++ compiler, costs a compilation at the first call (much
            less once inductor's cache holds the graph) and recompiles for a new batch
            size or ``rollout_dtype``; random draws are eager ones (``fallback_random``),
            so targets equal the eager ones up to float rounding.
        rollout_dtype: ``torch.float32`` (default) or ``torch.bfloat16`` (or their
            names): run the rollout's actor, dynamics and Q matmuls in bf16
            (``torch.autocast`` for modules, cast weights for the fused paths); the action
            distribution, returns and posterior stay in float32.
            :func:`~cbop_torchrl.accel.rollout_dtype.select_rollout_dtype` chooses it
            (``estimator.rollout_dtype=auto``).
        whole_step_graph: the step computing the target is captured as one CUDA graph
            (:class:`~cbop_torchrl.accel.CapturedStep`; the CBOP stage's ``cuda_graph``).
            With ``compile`` on CUDA the capture then records the whole target compiled by
            inductor without CUDA graphs of its own (graphs cannot nest).

    Raises:
        ValueError: an unknown ``rollout_dtype`` or a ``q_chunk_rows`` that is not a
            positive integer, None or ``"auto"``.
    """

    fused_q: bool = True
    q_chunk_rows: int | str | None = "auto"
    compile: bool = False
    rollout_dtype: torch.dtype | str = torch.float32
    whole_step_graph: bool = False

    def __post_init__(self) -> None:
        rows = self.q_chunk_rows
        if (
            rows is not None
            and rows != "auto"
            and (isinstance(rows, str) or int(rows) != rows or rows < 1)
        ):
            raise ValueError(
                f"q_chunk_rows must be a positive integer, None (no chunking) or 'auto'; "
                f"got {rows!r}."
            )
        normal = {
            "fused_q": bool(self.fused_q),
            "q_chunk_rows": rows if rows in (None, "auto") else int(rows),
            "compile": bool(self.compile),
            "rollout_dtype": resolve_rollout_dtype(self.rollout_dtype),
            "whole_step_graph": bool(self.whole_step_graph),
        }
        for name, value in normal.items():
            object.__setattr__(self, name, value)

    @classmethod
    def split(cls, options: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """``options`` as ``(FastPaths keywords, the others)``."""
        names = {field.name for field in dataclasses.fields(cls)}
        fast = {key: value for key, value in options.items() if key in names}
        return fast, {key: value for key, value in options.items() if key not in names}


__all__ = ["FastPaths"]
