"""D4RL-format HDF5 files: semantics at terminal/timeout/cut rows, caching, family, errors."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch
from d4rl_files import write_d4rl_hdf5

from cbop_torchrl.data import (
    DATASET_KEYS,
    DatasetError,
    dataset_info,
    load_dataset,
    load_dataset_with_info,
    make_replay_buffer,
)


def _raw(path):
    with h5py.File(path, "r") as handle:
        return {key: handle[key][()] for key in ("observations", "next_observations", "actions")}


def test_terminal_and_timeout_rows_keep_true_next_obs_and_stay_apart(tmp_path):
    # episode 0 ends terminal (row 5), episode 1 ends by timeout (row 10), episode 2 is cut.
    path = write_d4rl_hdf5(tmp_path / "hopper-medium-v2.hdf5", episode_lengths=(6, 5, 4))
    data = load_dataset(path)
    raw = _raw(path)
    terminal_row, timeout_row, cut_row = 5, 10, 14

    assert data.batch_size == torch.Size([15])
    assert set(data.keys(include_nested=True, leaves_only=True)) == set(DATASET_KEYS)
    for row in (terminal_row, timeout_row):
        expected = torch.from_numpy(raw["next_observations"][row])
        assert torch.equal(data["next", "observation"][row], expected)
        assert data["next", "observation"][row].abs().sum() > 0
    terminated = data["next", "terminated"].squeeze(-1)
    truncated = data["next", "truncated"].squeeze(-1)
    assert terminated.nonzero().flatten().tolist() == [terminal_row]
    # the cut final row is truncated too (the episode ends there without termination)
    assert truncated.nonzero().flatten().tolist() == [timeout_row, cut_row]
    assert torch.equal(data["next", "done"].squeeze(-1), terminated | truncated)

    dynamics = data["dynamics_mask"]
    assert not dynamics[timeout_row] and not dynamics[cut_row] and dynamics[terminal_row]
    assert int(dynamics.sum()) == 13

    # next action: the following row's action inside an episode; usable rows for FQE.
    actions = torch.from_numpy(raw["actions"])
    assert torch.equal(data["next", "action"][:5], actions[1:6])
    assert torch.equal(data["next", "action"][terminal_row], torch.zeros(3))
    usable = data["next_action_mask"]
    assert usable[terminal_row] and not usable[timeout_row] and not usable[cut_row]
    assert int(usable.sum()) == 13

    assert data["observation"].dtype == torch.float32
    assert data["next", "reward"].shape == (15, 1)
    assert data["next", "terminated"].dtype == torch.bool


def test_second_load_reuses_the_cache_without_opening_the_file(tmp_path, monkeypatch):
    path = write_d4rl_hdf5(tmp_path / "data.hdf5", metadata={"family": "hopper"})
    first = load_dataset(path)
    info = dataset_info(path)

    def refuse(*args, **kwargs):
        raise AssertionError("the HDF5 file was opened again")

    monkeypatch.setattr(h5py, "File", refuse)
    second = load_dataset(path)
    assert (first == second).all()
    assert dataset_info(path) == info
    assert info.name == "data" and info.family == "hopper" and info.source_kind == "hdf5"
    assert info.num_transitions == 15 and (info.obs_dim, info.action_dim) == (11, 3)


def test_fingerprint_follows_content_not_location(tmp_path):
    first = write_d4rl_hdf5(tmp_path / "a" / "hopper-x.hdf5", seed=0)
    copy = write_d4rl_hdf5(tmp_path / "b" / "hopper-x.hdf5", seed=0)
    other = write_d4rl_hdf5(tmp_path / "c" / "hopper-x.hdf5", seed=1)
    assert dataset_info(first).fingerprint == dataset_info(copy).fingerprint
    assert dataset_info(first).fingerprint != dataset_info(other).fingerprint


@pytest.mark.parametrize(
    ("file_name", "metadata", "family", "expected"),
    [
        ("run.hdf5", {"env_id": "Walker2d-v4"}, None, "walker2d"),
        ("run.hdf5", {"family": "halfcheetah"}, None, "halfcheetah"),
        ("walker2d-medium-replay-gen.hdf5", None, None, "walker2d"),
        ("run.hdf5", None, "walker2d", "walker2d"),
    ],
)
def test_family_from_metadata_name_or_argument(tmp_path, file_name, metadata, family, expected):
    path = write_d4rl_hdf5(tmp_path / file_name, family="walker2d", metadata=metadata)
    assert dataset_info(path, family=family).family == expected


def test_v5_env_ids_name_their_family_with_a_warning(tmp_path):
    v5 = write_d4rl_hdf5(tmp_path / "v5.hdf5", metadata={"env_id": "Hopper-v5"})
    with pytest.warns(UserWarning, match="evaluated on 'Hopper-v4'"):
        info = dataset_info(v5)
    assert info.family == "hopper" and info.env_id == "Hopper-v5"


def test_sizes_come_from_the_data_and_never_decide_the_family(tmp_path):
    """A file of no known family loads: its sizes are read, the task is named elsewhere."""
    hopper_sized = write_d4rl_hdf5(tmp_path / "run.hdf5", family="hopper")
    info = dataset_info(hopper_sized)
    assert info.family is None and info.env_id is None
    assert (info.obs_dim, info.action_dim) == (11, 3)
    swimmer = write_d4rl_hdf5(
        tmp_path / "my-robot.hdf5", family="swimmer", metadata={"env_id": "Swimmer-v4"}
    )
    data, info = load_dataset_with_info(swimmer)
    assert info.family is None and info.env_id == "Swimmer-v4"
    assert (
        (info.obs_dim, info.action_dim)
        == (8, 2)
        == (
            data["observation"].shape[-1],
            data["action"].shape[-1],
        )
    )
    with pytest.raises(DatasetError, match="not a known task family .*task.gym_id"):
        dataset_info(swimmer, family="swimmer")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"drop_keys": ("timeouts",)}, r"lacks the key\(s\) \['timeouts'\]"),
        (
            {"edit": {"rewards": np.ones(14, np.float32)}},
            r"rewards has 14 rows .*first bad row: 14",
        ),
        (
            {"edit": {"next_observations": np.zeros((15, 12), np.float32)}},
            r"observations are \[N, 11\] but next_observations are \[N, 12\]",
        ),
        ({"edit": {"actions": np.zeros(15, np.float32)}}, r"actions has shape \[15\]"),
        ({"edit": {"terminals": np.full(15, 2)}}, r"terminals must hold booleans .* row 0"),
    ],
)
def test_invalid_files_name_the_key_and_row(tmp_path, kwargs, message):
    path = write_d4rl_hdf5(tmp_path / "hopper-bad.hdf5", **kwargs)
    with pytest.raises(DatasetError, match=message):
        load_dataset(path)


@pytest.mark.parametrize("key", ["observations", "next_observations", "actions", "rewards"])
def test_non_finite_values_name_the_key_and_first_bad_row(tmp_path, key):
    good = write_d4rl_hdf5(tmp_path / "good.hdf5")
    with h5py.File(good, "r") as handle:
        array = handle[key][()]
    array[7] = np.nan
    array[9] = np.inf
    path = write_d4rl_hdf5(tmp_path / "hopper-nan.hdf5", edit={key: array})
    with pytest.raises(DatasetError, match=rf"{key} has a non-finite value .* at row 7"):
        load_dataset(path)


def test_missing_file_and_unknown_source_errors(tmp_path):
    with pytest.raises(DatasetError, match="no file at"):
        load_dataset(tmp_path / "absent.hdf5")
    (tmp_path / "notes.hdf5").write_text("not hdf5")
    with pytest.raises(DatasetError, match="cannot be opened as an HDF5 file"):
        load_dataset(tmp_path / "notes.hdf5", family="hopper")
    with pytest.raises(DatasetError) as err:
        load_dataset("hopper-mediocre-v2")
    text = str(err.value)
    assert "hopper-medium-replay-v2" in text and "walker2d-expert-v2" in text
    assert "HDF5" in text and "'demo'" in text
    assert isinstance(err.value, ValueError)


def test_replay_buffer_samples_on_device_reproducibly(tmp_path):
    data = load_dataset(write_d4rl_hdf5(tmp_path / "hopper-x.hdf5", episode_lengths=(40, 30)))
    first = make_replay_buffer(data, batch_size=32, seed=3)
    second = make_replay_buffer(data, batch_size=32, seed=3)
    other = make_replay_buffer(data, batch_size=32, seed=4)
    batch_a, batch_b, batch_c = first.sample(), second.sample(), other.sample()
    assert batch_a.batch_size == torch.Size([32])
    assert batch_a["observation"].device == torch.device("cpu")
    assert torch.equal(batch_a["observation"], batch_b["observation"])
    assert not torch.equal(batch_a["observation"], batch_c["observation"])
    # every sampled row is a dataset row with its own next observation
    rows = (batch_a["observation"][:, None] == data["observation"][None]).all(-1)
    index = rows.float().argmax(1)
    assert rows.any(1).all()
    assert torch.equal(batch_a["next", "observation"], data["next", "observation"][index])
    assert len(first) == 70


def test_dataset_storage_gathers_like_tensordict_indexing(tmp_path):
    data = load_dataset(write_d4rl_hdf5(tmp_path / "hopper-x.hdf5"))
    storage = make_replay_buffer(data, batch_size=4).storage
    index = torch.tensor([3, 0, 14, 3])
    assert (storage.get(index) == data[index]).all()
    mask = torch.arange(15) % 4 == 1
    assert (storage.get(mask) == data[mask]).all()
    assert (storage.get(slice(2, 5)) == data[2:5]).all()
