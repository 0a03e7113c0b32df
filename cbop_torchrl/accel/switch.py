"""One call that turns CBOP's fast paths on: :func:`accelerate`."""

from __future__ import annotations

from typing import Any, TypeVar

from cbop_torchrl.accel.estimator import accelerate_estimator
from cbop_torchrl.accel.loss import accelerate_loss
from cbop_torchrl.accel.settings import FastPaths
from cbop_torchrl.objectives.estimator import CBOPValueEstimator
from cbop_torchrl.objectives.loss import CBOPLoss

Accelerated = TypeVar("Accelerated", CBOPLoss, CBOPValueEstimator)


def accelerate(
    target: Accelerated, fast_paths: FastPaths | None = None, **settings: Any
) -> Accelerated:
    """Turns the fast paths on for a CBOP loss (and its estimator) or an estimator, in place.

    Args:
        target: a :class:`~cbop_torchrl.objectives.CBOPLoss` or a
            :class:`~cbop_torchrl.objectives.CBOPValueEstimator` (e.g.
            ``CBOPValueEstimator.from_sac_loss(sac_loss, dynamics)``), eager or already
            accelerated (its fast paths are then replaced).
        fast_paths: a :class:`~cbop_torchrl.accel.FastPaths`, or none and its fields as
            keywords (``fused_q=True``, ``q_chunk_rows="auto"``, ``compile=False``,
            ``rollout_dtype="float32"``, ``whole_step_graph=False``).

    Returns:
        ``target`` itself, now of the class with the fast paths
        (:class:`~cbop_torchrl.accel.CBOPLoss`,
        :class:`~cbop_torchrl.accel.CBOPValueEstimator` or a subclass of the given one's
        class made once): the same parameters, buffers and ``state_dict`` keys, the same
        losses and targets to float rounding (bit for bit where a path runs the same
        operations: ``fused_q=False`` in float32).

    Raises:
        TypeError: ``target`` is neither, or both ``fast_paths`` and keywords are given.
    """
    if fast_paths is None:
        fast_paths = FastPaths(**settings)
    elif settings:
        raise TypeError(f"pass fast_paths= or its keywords, not both; got {sorted(settings)}.")
    if isinstance(target, CBOPLoss):
        return accelerate_loss(target, fast_paths)
    if isinstance(target, CBOPValueEstimator):
        return accelerate_estimator(target, fast_paths)
    raise TypeError(
        f"accelerate takes a CBOPLoss or a CBOPValueEstimator; got {type(target).__name__}."
    )


__all__ = ["accelerate"]
