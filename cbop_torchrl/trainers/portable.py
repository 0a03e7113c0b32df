"""Checkpoints that resume on another kind of device (written on CUDA, resumed on a CPU, and back).

Two parts of a run's checkpoint belong to the device it was written on:

- TorchRL's ``GlobalRNGState`` saves the CUDA generators' states when CUDA is in
  use and refuses to load them where CUDA is unavailable;
- the replay buffer's sampling generator lives on the run's device, and a CUDA
  generator's state (a seed and an offset, 16 bytes) does not fit a CPU one (5056).

A CUDA stream of random numbers cannot be replayed on a CPU, so exactness across
device kinds is impossible; what matters is that the run goes on, deterministically.
:class:`PortableRNGState` restores the CPU, Python and NumPy states always and the
CUDA states where CUDA is present; :func:`load_generator_state` restores a
generator's state where it fits and otherwise seeds the generator from a hash of
the saved state (the same checkpoint always gives the same batches) and says so.
Resuming on the same kind of device stays exact.
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Mapping
from typing import Any

import torch
from torchrl.checkpoint import GlobalRNGState


class PortableRNGState(GlobalRNGState):
    """``GlobalRNGState`` that skips the CUDA generators' states where CUDA is unavailable."""

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        state = dict(state_dict)
        cuda_states = state.pop("torch_cuda", None)
        super().load_state_dict(state)
        if cuda_states is None or not torch.cuda.is_available():
            return  # CPU-only here (the CPU, Python and NumPy states are restored above)
        if len(cuda_states) == torch.cuda.device_count():
            torch.cuda.set_rng_state_all([s.cpu() for s in cuda_states])
        else:  # another number of GPUs: the first one's stream goes on
            torch.cuda.set_rng_state(cuda_states[0].cpu())


def load_generator_state(generator: torch.Generator, state: torch.Tensor) -> bool:
    """Restores ``generator`` from ``state``; returns False when it was reseeded instead.

    A state saved from a generator on another kind of device (another size)
    seeds ``generator`` from the state's SHA-256, with a warning.
    """
    current = generator.get_state()
    state = state.to(device=current.device, dtype=current.dtype)
    if state.numel() == current.numel():
        generator.set_state(state)
        return True
    seed = int.from_bytes(hashlib.sha256(state.numpy().tobytes()).digest()[:8], "little")
    generator.manual_seed(seed)
    warnings.warn(
        f"the checkpoint's replay-sampling generator was saved on another kind of device "
        f"than this run's {generator.device.type}; it is seeded from that state instead "
        "(deterministic, but the batches differ from a resume on the original device)",
        stacklevel=2,
    )
    return False
