"""A TorchRL replay buffer over a whole dataset TensorDict, sampled on its device."""

from __future__ import annotations

import torch
from tensordict import TensorDictBase
from torchrl.data import ImmutableDatasetWriter, RandomSampler, ReplayBuffer, TensorStorage


def make_replay_buffer(
    data: TensorDictBase,
    batch_size: int,
    device: torch.device | str | None = None,
    seed: int | None = None,
) -> ReplayBuffer:
    """Uniform sampling with replacement from ``data``.

    The dataset is moved once to ``device`` and every ``sample()`` draws its indices
    there with one ``torch.randint`` call, so GPU training never copies from the host.

    Args:
        data: dataset TensorDict of batch ``[N]`` (from ``load_dataset``).
        batch_size: transitions per ``sample()``; each sample has batch ``[batch_size]``.
        device: where the storage and the sampled batches live (default: ``data.device``
            or CPU).
        seed: seeds a dedicated ``torch.Generator`` on ``device`` (passed to the buffer
            as ``generator=``), so two buffers with the same seed draw the same batches
            regardless of the global RNG. ``None`` uses the global generator.

    Returns:
        A read-only ``ReplayBuffer`` (``TensorStorage`` + ``RandomSampler``).
    """
    if device is None:
        device = data.device if data.device is not None else "cpu"
    device = torch.device(device)
    generator = None
    if seed is not None:
        generator = torch.Generator(device=device)
        generator.manual_seed(seed)
    return ReplayBuffer(
        storage=TensorStorage(data.to(device), device=device),
        sampler=RandomSampler(),
        writer=ImmutableDatasetWriter(),
        batch_size=batch_size,
        generator=generator,
    )
