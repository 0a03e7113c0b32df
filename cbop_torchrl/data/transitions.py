"""One builder that turns raw transition arrays into the project's dataset TensorDict.

Every source (D4RL through TorchRL, D4RL-format HDF5, Minari, the demo file) ends
here, so the episode-boundary rules live in one place:

- a row *continues* its episode when it is neither terminal nor a timeout and the
  next row starts where this one ends (``observation[i + 1] == next_observation[i]``);
- a row that is neither terminal, timeout nor continuing is the final row of a *cut*
  episode (for example the dataset's last row); it is marked truncated;
- ``dynamics_mask`` drops timeouts and cut rows, whose next observation the model
  must not learn from;
- ``("next", "action")`` is the following row's action where the episode continues
  (zeros elsewhere) and ``next_action_mask`` marks rows usable for fitted Q
  evaluation with dataset next actions: continuing rows and terminal rows.
"""

from __future__ import annotations

import torch
from tensordict import TensorDict

DATASET_KEYS = (
    "observation",
    "action",
    ("next", "observation"),
    ("next", "reward"),
    ("next", "terminated"),
    ("next", "truncated"),
    ("next", "done"),
    ("next", "action"),
    "dynamics_mask",
    "next_action_mask",
)
"""Every key of a dataset TensorDict returned by ``load_dataset``."""

COMPARE_BLOCK_ROWS = 1 << 16
"""Rows compared at a time in :func:`continues_episode` (bounds its temporaries)."""


def continues_episode(
    observation: torch.Tensor,
    next_observation: torch.Tensor,
    terminated: torch.Tensor,
    truncated: torch.Tensor,
) -> torch.Tensor:
    """Which rows are followed, in the next row, by the same episode.

    Args:
        observation: ``[N, obs]``.
        next_observation: ``[N, obs]``, the real next observations.
        terminated: ``[N]`` bool.
        truncated: ``[N]`` bool (timeouts).

    Returns:
        ``[N]`` bool; always False on the last row.
    """
    chained = torch.zeros_like(terminated)
    for start in range(0, observation.shape[0] - 1, COMPARE_BLOCK_ROWS):
        stop = min(start + COMPARE_BLOCK_ROWS, observation.shape[0] - 1)
        # Tolerance, not equality: some writers round-trip observations through float64.
        chained[start:stop] = torch.isclose(
            next_observation[start:stop], observation[start + 1 : stop + 1], rtol=1e-5, atol=1e-6
        ).all(-1)
    return chained & ~terminated & ~truncated


def build_transitions(
    observation: torch.Tensor,
    action: torch.Tensor,
    next_observation: torch.Tensor,
    reward: torch.Tensor,
    terminated: torch.Tensor,
    truncated: torch.Tensor,
    dynamics_usable: torch.Tensor | None = None,
    *,
    copy: bool = True,
) -> TensorDict:
    """Assembles the dataset TensorDict (see the module docstring for the rules).

    Args:
        observation: ``[N, obs]``, any float dtype (stored as float32).
        action: ``[N, act]``.
        next_observation: ``[N, obs]``, the real next observation of every row.
        reward: ``[N]`` or ``[N, 1]``.
        terminated: ``[N]`` or ``[N, 1]``, bool or 0/1.
        truncated: ``[N]`` or ``[N, 1]``, bool or 0/1 (the source's timeouts).
        dynamics_usable: optional ``[N]`` bool; False removes more rows from
            ``dynamics_mask`` (a source that lost some next observations).
        copy: False lets float32 inputs become the dataset's tensors without a copy;
            only for tensors made for this call (sources may hand in memory-mapped
            cache tensors, which must be copied). Saves a full copy of a large dataset.

    Returns:
        TensorDict of batch ``[N]`` with the keys in :data:`DATASET_KEYS`: float32
        ``observation``/``action``/``("next", "observation" | "action")``, ``("next",
        "reward")`` ``[N, 1]``, bool ``("next", "terminated" | "truncated" | "done")``
        ``[N, 1]``, bool ``dynamics_mask``/``next_action_mask`` ``[N]``.
    """
    observation = observation.to(torch.float32, copy=copy)
    action = action.to(torch.float32, copy=copy)
    next_observation = next_observation.to(torch.float32, copy=copy)
    terminated = terminated.reshape(-1).to(torch.bool, copy=True)
    timeout = truncated.reshape(-1).bool() & ~terminated
    continues = continues_episode(observation, next_observation, terminated, timeout)
    cut = ~continues & ~terminated & ~timeout
    truncated = timeout | cut

    next_action = torch.zeros_like(action)
    next_action[:-1] = action[1:]
    next_action[:-1].masked_fill_(~continues[:-1, None], 0.0)  # in place: no [N, act] temporary
    dynamics_mask = ~truncated
    if dynamics_usable is not None:
        dynamics_mask &= dynamics_usable.reshape(-1).bool()

    n = observation.shape[0]
    return TensorDict(
        {
            "observation": observation,
            "action": action,
            "next": {
                "observation": next_observation,
                "reward": reward.to(torch.float32, copy=copy).reshape(n, 1),
                "terminated": terminated.unsqueeze(-1),
                "truncated": truncated.unsqueeze(-1),
                "done": (terminated | truncated).unsqueeze(-1),
                "action": next_action,
            },
            "dynamics_mask": dynamics_mask,
            "next_action_mask": continues | terminated,
        },
        batch_size=[n],
    )


ACTION_TOLERANCE = 1e-6
"""How far past ``[-1, 1]`` an action may lie (float rounding) before it is reported."""


def warn_about_action_range(data: TensorDict, name: str) -> None:
    """Warns (one line, the range found) when ``data``'s actions leave the agent's ``[-1, 1]``.

    ``data`` holds actions in the agent's units (the task's action box mapped to
    ``[-1, 1]``, as the stages see them). D4RL's actions lie in ``[-1, 1]``; ones
    outside cannot come from the tanh policy that the stages fit, which usually
    means the file's actions are in other units than the environment's box.
    """
    action = data.get("action")
    outside = (action.abs() > 1.0 + ACTION_TOLERANCE).reshape(action.shape[0], -1).any(-1)
    count = int(outside.sum())
    if count == 0:
        return
    import warnings

    warnings.warn(
        f"the dataset {name!r} has actions outside the action range [-1, 1] (the task's "
        f"action box, in the agent's units) in {count} of {action.shape[0]} rows: found "
        f"[{float(action.min()):.4g}, {float(action.max()):.4g}]; the policy can only take "
        "actions inside the box, so check the file's action units (or clip them).",
        stacklevel=2,
    )
