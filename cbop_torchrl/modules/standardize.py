"""Observation standardization inside a network: ``(observation - loc) / scale`` first.

TD3+BC (and the BC baseline with its recipe) trains on states standardized by the dataset's
mean and standard deviation. Keeping the standardization inside the actor, as buffers, lets
the evaluated and exported policy read raw environment observations and lets a checkpoint
carry the statistics with the weights.
"""

from __future__ import annotations

import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModule
from torch import nn

STD_EPS = 1e-3
"""Added to the dataset's standard deviation (TD3+BC's recipe), so constant features stay finite."""


class StandardizedInput(nn.Module):
    """Runs ``net((observation - loc) / scale, *rest)``: the first input standardized.

    ``loc`` and ``scale`` (``[obs_dim]``) are buffers: saved with the weights, untouched by
    any optimizer or target update. ``rest`` (a Q-network's action) passes through.
    """

    def __init__(self, net: nn.Module, loc: torch.Tensor, scale: torch.Tensor) -> None:
        super().__init__()
        self.net = net
        self.register_buffer("loc", loc.detach().clone())
        self.register_buffer("scale", scale.detach().clone())

    def forward(self, observation: torch.Tensor, *rest: torch.Tensor):
        return self.net((observation - self.loc) / self.scale, *rest)


def observation_statistics(data: TensorDictBase) -> tuple[torch.Tensor, torch.Tensor]:
    """The dataset's ``[obs_dim]`` mean and standard deviation + :data:`STD_EPS`."""
    observation = data.get("observation").to(torch.float64)
    loc = observation.mean(0)
    scale = observation.std(0, correction=0) + STD_EPS
    dtype = data.get("observation").dtype
    return loc.to(dtype), scale.to(dtype)


def standardize_observation(module: nn.Module, loc: torch.Tensor, scale: torch.Tensor) -> nn.Module:
    """Puts :class:`StandardizedInput` in front of the network that reads ``observation``.

    ``module``: an actor or a Q-network built by :mod:`cbop_torchrl.modules.actor_critic`;
    the first (innermost) ``TensorDictModule`` whose first in-key is ``observation`` gets
    its network wrapped, in place. Returns ``module``.
    """
    for leaf in module.modules():
        if (
            isinstance(leaf, TensorDictModule)
            and leaf.in_keys[:1] == ["observation"]
            and not isinstance(leaf.module, (nn.ModuleList, TensorDictModule, StandardizedInput))
        ):
            device = _device(leaf)
            leaf.module = StandardizedInput(leaf.module, loc.to(device), scale.to(device))
            return module
    raise ValueError(f"{type(module).__name__} has no network that reads 'observation'")


def _device(module: nn.Module) -> torch.device:
    parameter = next(module.parameters(), None)
    return parameter.device if parameter is not None else torch.device("cpu")


__all__ = ["STD_EPS", "StandardizedInput", "observation_statistics", "standardize_observation"]
