"""How far one target is from another: the relative error the report gives, on seeded targets."""

from __future__ import annotations

import torch
from tensordict import TensorDictBase


def relative_error(
    y: torch.Tensor, reference: torch.Tensor, scale: torch.Tensor | None = None
) -> float:
    """``mean|y - reference| / std(scale)``; ``scale`` defaults to ``reference``."""
    scale = reference if scale is None else scale
    return float((y - reference).abs().mean() / scale.std().clamp_min(1e-12))


def seeded_target(estimator, batch: TensorDictBase, seed: int = 0) -> torch.Tensor:
    """``estimator``'s target ``y`` for ``batch`` after ``torch.manual_seed(seed)``; RNG kept."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return estimator.compute_target(batch)[0]
