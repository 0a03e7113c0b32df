"""A checkpoint written on CUDA resumes on a CPU, checked without a GPU.

A CUDA run's checkpoint holds CUDA generator states: TorchRL's ``GlobalRNGState``
saves them (and refuses them where CUDA is unavailable) and the replay buffer's
generator is a CUDA one (16 bytes of state against a CPU generator's 5056). The
states here are made as CUDA makes them; ``tests/test_cuda.py`` resumes a real
CUDA run on the CPU and back.
"""

from __future__ import annotations

import warnings

import pytest
import torch
from torchrl.checkpoint import GlobalRNGState

from cbop_torchrl.trainers.portable import PortableRNGState, load_generator_state

# What torch.cuda.get_rng_state() returns: a seed and an offset, 8 bytes each.
CUDA_GENERATOR_STATE = torch.tensor(
    [7, 0, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0], dtype=torch.uint8
)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks a machine without CUDA")
def test_global_rng_state_with_cuda_states_loads_where_cuda_is_unavailable() -> None:
    torch.manual_seed(3)
    state = {**GlobalRNGState().state_dict(), "torch_cuda": [CUDA_GENERATOR_STATE]}
    expected = torch.rand(4)
    with pytest.raises(RuntimeError, match="CUDA"):  # what TorchRL's own class does
        GlobalRNGState().load_state_dict(state)
    torch.manual_seed(99)
    PortableRNGState().load_state_dict(state)
    assert torch.equal(torch.rand(4), expected)  # the CPU stream goes on where it was


def test_a_generator_state_of_another_device_reseeds_deterministically() -> None:
    def draws_after_loading(state: torch.Tensor) -> tuple[bool, torch.Tensor]:
        generator = torch.Generator().manual_seed(0)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            restored = load_generator_state(generator, state)
        assert restored or "another kind of device" in str(caught[0].message)
        return restored, torch.rand(5, generator=generator)

    restored, first = draws_after_loading(CUDA_GENERATOR_STATE)
    assert not restored
    assert torch.equal(draws_after_loading(CUDA_GENERATOR_STATE)[1], first)
    other = CUDA_GENERATOR_STATE.clone()
    other[0] = 8
    assert not torch.equal(draws_after_loading(other)[1], first)
    # Same kind of device: restored exactly.
    source = torch.Generator().manual_seed(11)
    torch.rand(3, generator=source)
    restored, draws = draws_after_loading(source.get_state())
    assert restored and torch.equal(draws, torch.rand(5, generator=source))
