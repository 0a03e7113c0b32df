"""Losses and value estimators: CBOP, behaviour cloning and fitted Q evaluation.

CBOP's public objects, imported from here:

- :func:`gaussian_posterior` and the ablation reductions (``posterior.py``),
- :class:`CBOPValueEstimator`, the model-based target (``estimator.py``),
- :class:`CBOPLoss`, the EDAC-style SAC loss on that target (``loss.py``).

These are the eager forms (the networks as modules, float32); :mod:`cbop_torchrl.accel`
turns the fast paths on (``accel.accelerate(loss)``).
"""

from cbop_torchrl.objectives.estimator import CBOPValueEstimator
from cbop_torchrl.objectives.loss import CBOPLoss, SACLossWithCBOPTarget
from cbop_torchrl.objectives.posterior import (
    VAR_FLOOR,
    GaussianPosterior,
    fixed_weight_moments,
    fixed_weights,
    gaussian_posterior,
    pooled_quantile,
)

__all__ = [
    "VAR_FLOOR",
    "CBOPLoss",
    "CBOPValueEstimator",
    "GaussianPosterior",
    "SACLossWithCBOPTarget",
    "fixed_weight_moments",
    "fixed_weights",
    "gaussian_posterior",
    "pooled_quantile",
]
