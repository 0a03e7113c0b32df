"""The parts of the baselines' published recipes that are not a loss: reward scaling, the
actor's learning-rate schedule (``cbop_torchrl/configs/algo/<name>.yaml`` names each value's
source).

- :func:`return_range_scale`: IQL's reward scaling for D4RL locomotion, ``1000 / (max return -
  min return)`` over the dataset's trajectories, so that the rewards, and with them the
  critic's values, have the same range on every dataset.
- :func:`cosine_factor`: IQL's cosine decay of the actor's learning rate over the run.
"""

from __future__ import annotations

import math

import torch
from tensordict import TensorDictBase

RETURN_RANGE_TARGET = 1000.0
"""IQL's locomotion scaling: the dataset's trajectory returns span this range after it."""
REWARD_SCALES = ("none", "return_range")
"""``algo.reward_scale``: no scaling, or :func:`return_range_scale`."""
ACTOR_LR_SCHEDULES = ("constant", "cosine")
"""``algo.actor_lr_schedule``: a fixed actor learning rate, or :func:`cosine_factor`."""


def trajectory_returns(reward: torch.Tensor, done: torch.Tensor) -> torch.Tensor:
    """The undiscounted return of each trajectory of a dataset in row order.

    Args:
        reward: ``[N]`` or ``[N, 1]`` rewards.
        done: ``[N]`` or ``[N, 1]`` flags, true on a trajectory's last row (terminal or
            time-out); the rows after the last flag are one more, unfinished trajectory.

    Returns:
        ``[T]`` returns, one per trajectory.
    """
    reward = reward.reshape(-1).to(torch.float64)
    done = done.reshape(-1).bool()
    ids = torch.cat([done.new_zeros(1, dtype=torch.long), done[:-1].long().cumsum(0)])
    return torch.zeros(int(ids[-1]) + 1, dtype=torch.float64).index_add_(0, ids, reward)


def return_range_scale(data: TensorDictBase) -> float:
    """``1000 / (max - min)`` of the dataset's trajectory returns (1.0 if they are all equal)."""
    returns = trajectory_returns(data.get(("next", "reward")), data.get(("next", "done")))
    spread = float(returns.max() - returns.min())
    return RETURN_RANGE_TARGET / spread if spread > 0 else 1.0


def reward_scale(kind: str, data: TensorDictBase) -> float:
    """The factor ``algo.reward_scale`` (:data:`REWARD_SCALES`) multiplies the rewards by."""
    if kind == "return_range":
        return return_range_scale(data)
    if kind == "none":
        return 1.0
    raise ValueError(f"unknown reward scale {kind!r}; one of {', '.join(REWARD_SCALES)}")


def cosine_factor(step: int, total_steps: int) -> float:
    """The actor's learning rate at ``step`` as a share of its initial one: ``(1 + cos(pi
    step / total_steps)) / 2``, from 1 at step 0 to 0 at the last step."""
    progress = min(max(step / max(total_steps, 1), 0.0), 1.0)
    return 0.5 * (1.0 + math.cos(math.pi * progress))


__all__ = [
    "ACTOR_LR_SCHEDULES",
    "RETURN_RANGE_TARGET",
    "REWARD_SCALES",
    "cosine_factor",
    "return_range_scale",
    "reward_scale",
    "trajectory_returns",
]
