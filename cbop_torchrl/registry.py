"""Environment registry: everything the project knows about an environment family.

One :class:`EnvFamily` entry per family holds the gymnasium id used for
evaluation, the observation/action sizes, D4RL's normalized-score constants
and the termination function used in model rollouts. Adding a family means
calling :func:`register_family` once; nothing else in the package names
environments.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

TerminationFn = Callable[[torch.Tensor], torch.Tensor]
"""Maps predicted next observations ``[..., obs_dim]`` to a bool ``[...]`` tensor."""

D4RL_KINDS = ("random", "medium", "medium-replay", "medium-expert", "expert", "full-replay")


def hopper_termination(next_obs: torch.Tensor) -> torch.Tensor:
    """Hopper falls when its height, torso angle or any state leaves the healthy range.

    Args:
        next_obs: ``[..., 11]`` observations in D4RL layout.

    Returns:
        ``[...]`` bool, True where the episode terminates.
    """
    height, angle = next_obs[..., 0], next_obs[..., 1]
    alive = (
        torch.isfinite(next_obs).all(-1)
        & (next_obs[..., 1:].abs() < 100).all(-1)
        & (height > 0.7)
        & (angle.abs() < 0.2)
    )
    return ~alive


def walker2d_termination(next_obs: torch.Tensor) -> torch.Tensor:
    """Walker2d falls when its height leaves (0.8, 2.0) or its angle leaves (-1, 1).

    Args:
        next_obs: ``[..., 17]`` observations in D4RL layout.

    Returns:
        ``[...]`` bool, True where the episode terminates.
    """
    height, angle = next_obs[..., 0], next_obs[..., 1]
    alive = (height > 0.8) & (height < 2.0) & (angle > -1.0) & (angle < 1.0)
    return ~alive


def never_terminates(next_obs: torch.Tensor) -> torch.Tensor:
    """For families such as halfcheetah whose episodes only end by timeout."""
    return torch.zeros(next_obs.shape[:-1], dtype=torch.bool, device=next_obs.device)


@dataclass(frozen=True)
class EnvFamily:
    """What the project needs to know about one environment family."""

    name: str
    gym_id: str
    obs_dim: int
    action_dim: int
    ref_min_score: float
    ref_max_score: float
    termination_fn: TerminationFn
    max_episode_steps: int = 1000

    def normalized_score(self, episode_return: float) -> float:
        """D4RL's normalized score: 0 for a random policy, 100 for an expert."""
        span = self.ref_max_score - self.ref_min_score
        return 100.0 * (episode_return - self.ref_min_score) / span


_FAMILIES: dict[str, EnvFamily] = {}


def register_family(family: EnvFamily) -> EnvFamily:
    """Adds ``family`` to the registry; registering a name twice is an error."""
    if family.name in _FAMILIES:
        raise ValueError(f"environment family {family.name!r} is already registered")
    if not math.isfinite(family.ref_max_score - family.ref_min_score):
        raise ValueError(f"family {family.name!r} needs finite score constants")
    _FAMILIES[family.name] = family
    return family


def families() -> dict[str, EnvFamily]:
    """All registered families by name."""
    return dict(_FAMILIES)


def get_family(name: str) -> EnvFamily:
    """The family called ``name`` (``"hopper"``), with a helpful error otherwise."""
    try:
        return _FAMILIES[name]
    except KeyError:
        raise KeyError(
            f"unknown environment family {name!r}; registered families are "
            f"{sorted(_FAMILIES)}. Register a new one with "
            "cbop_torchrl.registry.register_family(EnvFamily(...)), giving its "
            "termination function (or never_terminates) explicitly."
        ) from None


def d4rl_ids() -> list[str]:
    """The D4RL MuJoCo v2 dataset ids of every registered family."""
    return [f"{name}-{kind}-v2" for name in _FAMILIES for kind in D4RL_KINDS]


def parse_d4rl_id(dataset_id: str) -> tuple[EnvFamily, str] | None:
    """Splits ``"hopper-medium-replay-v2"`` into its family and kind, or returns None."""
    if not dataset_id.endswith("-v2"):
        return None
    family_name, _, kind = dataset_id[: -len("-v2")].partition("-")
    if family_name in _FAMILIES and kind in D4RL_KINDS:
        return _FAMILIES[family_name], kind
    return None


def family_from_gym_id(gym_id: str) -> EnvFamily:
    """The family evaluated on ``gym_id`` (``"Hopper-v4"``)."""
    for family in _FAMILIES.values():
        if family.gym_id == gym_id:
            return family
    raise KeyError(
        f"no registered family is evaluated on {gym_id!r}; known: "
        f"{sorted(f.gym_id for f in _FAMILIES.values())}"
    )


register_family(EnvFamily("hopper", "Hopper-v4", 11, 3, -20.272305, 3234.3, hopper_termination))
register_family(
    EnvFamily("walker2d", "Walker2d-v4", 17, 6, 1.629008, 4592.3, walker2d_termination)
)
register_family(
    EnvFamily("halfcheetah", "HalfCheetah-v4", 17, 6, -280.178953, 12135.0, never_terminates)
)
