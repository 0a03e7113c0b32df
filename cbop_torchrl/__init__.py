"""CBOP (Conservative Bayesian Model-Based Value Expansion) on TorchRL."""

from cbop_torchrl.registry import EnvFamily, get_family, register_family

__all__ = ["EnvFamily", "get_family", "register_family"]
__version__ = "0.1.0"
