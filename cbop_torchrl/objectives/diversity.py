"""EDAC's ensemble gradient-diversity penalty (An et al. 2021), shared by CBOP and FQE."""

from __future__ import annotations

import torch

GRAD_NORM_EPS = 1e-10


def gradient_diversity_penalty(grad: torch.Tensor) -> torch.Tensor:
    """EDAC's ``1/(M-1) sum_{i != j} cos(g_i, g_j)`` per sample: ``[M, *batch, A]`` -> ``[*batch]``.

    ``M`` times the mean pairwise cosine: ``M`` when all members' action
    gradients point the same way, 0 when they are orthogonal on average.
    """
    unit = grad / (grad.norm(dim=-1, keepdim=True) + GRAD_NORM_EPS)
    pair_sum = unit.sum(0).pow(2).sum(-1) - unit.pow(2).sum(-1).sum(0)
    return pair_sum / (grad.shape[0] - 1)
