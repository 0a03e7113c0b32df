"""Loading in blocks (full-size data): the same dataset as a whole-array load.

The D4RL-format loader reads, checks and converts ``READ_BLOCK_ROWS`` rows at a
time and compares episode chains ``COMPARE_BLOCK_ROWS`` rows at a time, so that a
two-million-row file needs little more memory than its float32 arrays. These
tests shrink both block sizes to a few rows and check that nothing else changes.
"""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch
from d4rl_files import write_d4rl_hdf5
from tensordict import TensorDict

from cbop_torchrl.data import DatasetError, build_transitions, load_dataset
from cbop_torchrl.data import transitions as transitions_module
from cbop_torchrl.data.hdf5 import REQUIRED_KEYS, hdf5_fingerprint
from cbop_torchrl.data.hdf5 import validate as hdf5_validate


def _float64_file(path):
    """A walker2d file whose observations, rewards and flags are stored as D4RL never does:
    float64 observations (slightly off float32), [N, 1] float64 rewards, float32 terminals."""
    path = write_d4rl_hdf5(
        path,
        family="walker2d",
        episode_lengths=(9, 7, 6, 3),
        terminal_episodes=(0, 3),
        timeout_episodes=(1,),
        seed=5,
    )
    with h5py.File(path, "r+") as handle:
        for key in ("observations", "next_observations"):
            values = handle[key][()].astype(np.float64) + 1e-9
            del handle[key]
            handle[key] = values
        rewards = handle["rewards"][()].astype(np.float64).reshape(-1, 1)
        del handle["rewards"]
        handle["rewards"] = rewards
        terminals = handle["terminals"][()].astype(np.float32)
        del handle["terminals"]
        handle["terminals"] = terminals
    return path


def _whole_array_reference(path) -> TensorDict:
    """The dataset built from whole arrays, with every conversion done by torch."""
    with h5py.File(path, "r") as handle:
        raw = {key: torch.from_numpy(handle[key][()]) for key in REQUIRED_KEYS}
    return build_transitions(
        observation=raw["observations"],
        action=raw["actions"],
        next_observation=raw["next_observations"],
        reward=raw["rewards"],
        terminated=raw["terminals"],
        truncated=raw["timeouts"],
    )


def _assert_identical(a: TensorDict, b: TensorDict) -> None:
    assert a.batch_size == b.batch_size
    keys = set(a.keys(include_nested=True, leaves_only=True))
    assert keys == set(b.keys(include_nested=True, leaves_only=True))
    for key in keys:
        assert a.get(key).dtype == b.get(key).dtype, key
        assert a.get(key).shape == b.get(key).shape, key
        assert torch.equal(a.get(key), b.get(key)), key


@pytest.mark.parametrize("block", [4, 7, 25, 1 << 16])
def test_blockwise_load_equals_the_whole_array_build(tmp_path, monkeypatch, block):
    path = _float64_file(tmp_path / "walker2d-f64.hdf5")
    reference = _whole_array_reference(path)
    monkeypatch.setattr(hdf5_validate, "READ_BLOCK_ROWS", block)
    monkeypatch.setattr(transitions_module, "COMPARE_BLOCK_ROWS", block)
    first = load_dataset(path)  # converted
    second = load_dataset(path)  # from the cache
    _assert_identical(first, reference)
    _assert_identical(second, reference)
    # The chain test ran across block borders: rows 0-7 continue, 8 is terminal, ...
    continues = reference["next_action_mask"] & ~reference["next", "done"].squeeze(-1)
    assert continues.sum() == 25 - 4 and not continues[8] and continues[9]


def test_a_non_finite_value_in_a_later_block_names_its_row(tmp_path, monkeypatch):
    monkeypatch.setattr(hdf5_validate, "READ_BLOCK_ROWS", 4)
    good = write_d4rl_hdf5(tmp_path / "good.hdf5")
    with h5py.File(good, "r") as handle:
        rewards = handle["rewards"][()]
    rewards[[10, 13]] = np.nan
    path = write_d4rl_hdf5(tmp_path / "hopper-nan.hdf5", edit={"rewards": rewards})
    with pytest.raises(DatasetError, match=r"rewards has a non-finite value .* at row 10"):
        load_dataset(path)


def test_loaded_data_is_in_memory_and_does_not_alias_the_cache(tmp_path):
    path = write_d4rl_hdf5(tmp_path / "hopper-x.hdf5", episode_lengths=(30, 20))
    first = load_dataset(path)
    expected = first.clone()
    for data in (first, load_dataset(path)):
        for key, value in data.items(include_nested=True, leaves_only=True):
            assert type(value) is torch.Tensor, key  # not a MemoryMappedTensor
        data["observation"].add_(1.0)  # a caller that edits its copy in place
    _assert_identical(load_dataset(path), expected)
    assert hdf5_fingerprint(path).startswith("hopper-x-")


def test_build_transitions_without_copy_shares_float32_inputs_only():
    obs = torch.randn(6, 3)
    action = torch.randn(6, 2)
    args = dict(
        observation=obs,
        action=action,
        next_observation=torch.roll(obs, -1, 0),
        reward=torch.randn(6),
        terminated=torch.zeros(6, dtype=torch.bool),
        truncated=torch.zeros(6, dtype=torch.bool),
    )
    shared = build_transitions(**args, copy=False)
    copied = build_transitions(**args)
    _assert_identical(shared, copied)
    assert shared["observation"].data_ptr() == obs.data_ptr()
    assert copied["observation"].data_ptr() != obs.data_ptr()
    converted = build_transitions(**{**args, "action": action.double()}, copy=False)
    assert converted["action"].dtype == torch.float32
    assert torch.equal(converted["action"], action)
