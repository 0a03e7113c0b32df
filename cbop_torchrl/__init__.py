"""CBOP (Conservative Bayesian Model-Based Value Expansion) on TorchRL."""

from cbop_torchrl.registry import Task, get_family, register_family, register_termination

__all__ = ["Task", "get_family", "register_family", "register_termination"]
__version__ = "0.1.0"
