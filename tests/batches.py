"""Random transition batches for the loss and estimator tests (reusable by every test module)."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from tensordict import TensorDict


def random_transitions(
    shape: Sequence[int], obs_dim: int, action_dim: int, seed: int = 1
) -> TensorDict:
    """A batch of ``shape`` non-terminal transitions with TorchRL's keys, drawn from ``seed``.

    ``observation`` and ``("next", "observation")`` ``[*shape, obs_dim]`` are standard
    normal, ``action`` ``[*shape, action_dim]`` uniform in [-1, 1], ``("next", "reward")``
    ``[*shape, 1]`` standard normal; ``terminated`` and ``done`` are all False.
    """
    shape = tuple(shape)
    g = torch.Generator().manual_seed(seed)
    return TensorDict(
        {
            "observation": torch.randn(*shape, obs_dim, generator=g),
            "action": torch.rand(*shape, action_dim, generator=g) * 2 - 1,
            ("next", "observation"): torch.randn(*shape, obs_dim, generator=g),
            ("next", "reward"): torch.randn(*shape, 1, generator=g),
            ("next", "terminated"): torch.zeros(*shape, 1, dtype=torch.bool),
            ("next", "done"): torch.zeros(*shape, 1, dtype=torch.bool),
        },
        batch_size=shape,
    )
