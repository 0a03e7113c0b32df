"""Losses and value estimators: CBOP, behaviour cloning and fitted Q evaluation."""

from cbop_torchrl.objectives.cbop import (
    CBOPLoss,
    CBOPValueEstimator,
    SACLossWithCBOPTarget,
    gaussian_posterior,
)

__all__ = ["CBOPLoss", "CBOPValueEstimator", "SACLossWithCBOPTarget", "gaussian_posterior"]
