"""D4RL ids and Minari ids through TorchRL's dataset classes, and the bundled demo source.

Only the network fetch is replaced: ``urllib.request.urlretrieve`` (used by TorchRL's
D4RL download) copies a crafted local file, and ``minari.download_dataset`` fails.
"""

from __future__ import annotations

import shutil
import sys
import urllib.error
import urllib.request
from pathlib import Path

import gymnasium as gym
import minari
import numpy as np
import pytest
import torch
from d4rl_files import write_d4rl_hdf5
from tensordict import TensorDict
from torchrl.data.datasets import D4RLExperienceReplay

import cbop_torchrl.data.sources as sources
from cbop_torchrl.data import DatasetError, dataset_info, load_dataset, load_dataset_with_info
from cbop_torchrl.io import cache_dir
from cbop_torchrl.runtime import program_command

D4RL_ID = "hopper-medium-replay-v2"
TERMINAL_ROW, TIMEOUT_ROW = 5, 10  # of write_d4rl_hdf5's default episodes (6, 5, 4)


@pytest.fixture
def d4rl_file(tmp_path):
    # D4RL's files carry numeric and string metadata; TorchRL drops both.
    return write_d4rl_hdf5(tmp_path / "raw.hdf5", metadata={"algorithm": "SAC", "iteration": 7})


@pytest.fixture
def fake_download(monkeypatch, d4rl_file):
    """Replaces the network fetch in TorchRL's D4RL download; returns the URLs asked for."""
    requested = []

    def copy_local_file(url, destination):
        requested.append(url)
        shutil.copy(d4rl_file, destination)

    monkeypatch.setattr(urllib.request, "urlretrieve", copy_local_file)
    return requested


@pytest.fixture
def no_network(monkeypatch):
    def refuse(url, *args, **kwargs):
        raise urllib.error.URLError("network is unreachable")

    monkeypatch.setattr(urllib.request, "urlretrieve", refuse)


def test_d4rl_id_downloads_once_and_keeps_real_next_obs(
    fake_download, d4rl_file, torchrl_root, monkeypatch
):
    data, info = load_dataset_with_info(D4RL_ID, torchrl_root=torchrl_root)
    assert len(fake_download) == 1 and fake_download[0].endswith("hopper_medium_replay-v2.hdf5")
    assert (torchrl_root / "d4rl" / D4RL_ID).is_dir()
    expected = load_dataset(d4rl_file)  # the same file read directly

    # TorchRL drops the last row; the row before becomes a cut episode end.
    assert data.batch_size == torch.Size([14])
    for key in ("observation", "action", ("next", "observation"), ("next", "reward")):
        assert torch.equal(data[key], expected[key][:14]), key
    for row in (TERMINAL_ROW, TIMEOUT_ROW):
        assert data["next", "observation"][row].abs().sum() > 0
    assert data["next", "terminated"].squeeze(-1).nonzero().flatten().tolist() == [TERMINAL_ROW]
    assert data["next", "truncated"].squeeze(-1).nonzero().flatten().tolist() == [TIMEOUT_ROW, 13]
    assert data["dynamics_mask"].logical_not().nonzero().flatten().tolist() == [TIMEOUT_ROW, 13]
    assert info.name == D4RL_ID and info.family == "hopper" and info.source_kind == "d4rl"
    assert info.num_transitions == 14

    # A populated TorchRL cache is reused with no network call at all.
    monkeypatch.setattr(urllib.request, "urlretrieve", _fail_on_call)
    again, again_info = load_dataset_with_info(D4RL_ID, torchrl_root=torchrl_root)
    assert (again == data).all() and again_info == info


def _fail_on_call(*args, **kwargs):
    raise AssertionError("network access attempted")


def test_stock_torchrl_cache_is_used_with_a_warning(fake_download, torchrl_root):
    # A cache written by plain TorchRL has zeros as next observations at done rows.
    D4RLExperienceReplay(D4RL_ID, batch_size=1, root=torchrl_root / "d4rl", direct_download=True)
    with pytest.warns(UserWarning, match="without the real next observations of its 2 done rows"):
        data = load_dataset(D4RL_ID, torchrl_root=torchrl_root)
    assert data.batch_size == torch.Size([13])  # the timeout row is dropped
    assert data["next", "terminated"][TERMINAL_ROW]
    assert torch.equal(data["next", "observation"][TERMINAL_ROW], data["observation"][TERMINAL_ROW])
    assert not data["dynamics_mask"][TERMINAL_ROW]
    assert not data["next", "truncated"][TIMEOUT_ROW]  # the following row moved up
    assert (data["next", "observation"].abs().sum(-1) > 0).all()


def test_d4rl_id_offline_without_cache_explains_what_to_place_where(no_network, torchrl_root):
    with pytest.raises(DatasetError) as err:
        load_dataset(D4RL_ID, torchrl_root=torchrl_root)
    text = str(err.value)
    assert str(torchrl_root / "d4rl" / D4RL_ID) in text
    assert str(cache_dir("d4rl") / "hopper_medium_replay-v2.hdf5") in text
    # the console script beside this interpreter (a wheel's and setup.sh's editable install alike)
    collect = Path(sys.executable).parent / "cbop-collect"
    assert collect.is_file()
    assert f"{program_command('cbop-collect')} env=hopper kind=medium-replay" in text
    assert program_command("cbop-collect") in ("cbop-collect", str(collect))
    assert not (torchrl_root / "d4rl" / D4RL_ID).exists()


def test_raw_d4rl_file_placed_in_the_cache_loads_offline(no_network, d4rl_file, torchrl_root):
    shutil.copy(d4rl_file, cache_dir("d4rl") / "hopper_medium_replay-v2.hdf5")
    data, info = load_dataset_with_info(D4RL_ID, torchrl_root=torchrl_root)
    assert data.batch_size == torch.Size([15])
    assert info.name == D4RL_ID and info.source_kind == "d4rl"
    assert torch.equal(data["next", "observation"], load_dataset(d4rl_file)["next", "observation"])


def _write_minari_dataset(dataset_id, monkeypatch, tmp_path):
    """A two-episode Hopper-v5 dataset stored locally the way Minari stores datasets."""
    from minari.data_collector.episode_buffer import EpisodeBuffer

    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    rng = np.random.default_rng(0)
    episodes, observations = [], []
    for index, (length, terminal) in enumerate([(5, True), (4, False)]):
        states = rng.normal(size=(length + 1, 11))
        observations.append(states)
        flags = np.zeros(length, dtype=bool)
        episodes.append(
            EpisodeBuffer(
                id=index,
                observations=states,
                actions=rng.uniform(-1, 1, (length, 3)).astype(np.float32),
                rewards=rng.normal(size=length),
                terminations=np.r_[flags[:-1], terminal],
                truncations=np.r_[flags[:-1], not terminal],
                infos={},
            )
        )
    minari.create_dataset_from_buffers(
        dataset_id,
        episodes,
        env=gym.spec("Hopper-v5"),
        algorithm_name="random",
        observation_space=gym.spaces.Box(-np.inf, np.inf, (11,), np.float64),
        action_space=gym.spaces.Box(-1, 1, (3,), np.float32),
    )
    return observations


@pytest.mark.filterwarnings("ignore:.*is set to None:UserWarning")
def test_local_minari_dataset_through_torchrl(monkeypatch, tmp_path, torchrl_root):
    dataset_id = "cbop/hopper/tiny-v0"
    observations = _write_minari_dataset(dataset_id, monkeypatch, tmp_path)
    monkeypatch.setattr(minari, "download_dataset", _fail_on_call)
    # TorchRL's conversion needs TensorDict.memmap_like replaced (cbop_torchrl/_torchrl_compat.py);
    # this process must never see that: checked at every Python call during the load.
    original = TensorDict.memmap_like
    patched_during = []

    def watch(frame, event, arg):
        if TensorDict.memmap_like is not original:
            patched_during.append(frame.f_code.co_name)

    sys.setprofile(watch)
    try:
        with pytest.warns(UserWarning, match="'Hopper-v4' unless task.gym_id=Hopper-v5"):
            data, info = load_dataset_with_info(f"minari:{dataset_id}", torchrl_root=torchrl_root)
    finally:
        sys.setprofile(None)
    assert patched_during == [] and TensorDict.memmap_like is original
    assert not list((torchrl_root / "minari").glob(".converting-*"))  # the scratch dir is gone
    assert info.family == "hopper" and info.source_kind == "minari"
    assert data.batch_size == torch.Size([9])
    first, second = (torch.from_numpy(o).float() for o in observations)
    assert torch.equal(data["observation"][:5], first[:-1])
    assert torch.equal(data["next", "observation"][4], first[-1])  # terminal: real next obs
    assert torch.equal(data["next", "observation"][8], second[-1])  # truncated: real next obs
    assert data["next", "terminated"].squeeze(-1).nonzero().flatten().tolist() == [4]
    assert data["next", "truncated"].squeeze(-1).nonzero().flatten().tolist() == [8]
    assert data["dynamics_mask"].sum() == 8 and not data["dynamics_mask"][8]
    assert torch.equal(data["next", "action"][:4], data["action"][1:5])

    # Converted once: TorchRL's copy is reused even when Minari's local files are gone.
    shutil.rmtree(tmp_path / "minari")
    with pytest.warns(UserWarning):
        again = load_dataset(f"minari:{dataset_id}", torchrl_root=torchrl_root)
    assert (again == data).all()


def test_unknown_minari_dataset_offline_is_a_dataset_error(monkeypatch, tmp_path, torchrl_root):
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))

    def offline(*args, **kwargs):
        raise ConnectionError("network is unreachable")

    monkeypatch.setattr(minari, "download_dataset", offline)
    with pytest.raises(DatasetError, match="neither converted by TorchRL .* nor stored locally"):
        load_dataset("minari:mujoco/hopper/medium-v0", torchrl_root=torchrl_root)


def test_demo_source(monkeypatch, tmp_path):
    monkeypatch.setattr(sources, "DEMO_DATASET_PATH", tmp_path / "absent.hdf5")
    with pytest.raises(DatasetError, match="demo dataset is missing.*cbop-collect env=hop") as err:
        load_dataset("demo")
    assert f"out_dir={tmp_path} " in str(err.value)  # where the package looks for the file
    demo = write_d4rl_hdf5(tmp_path / "hopper-demo-medium-replay-gen.hdf5")
    monkeypatch.setattr(sources, "DEMO_DATASET_PATH", demo)
    info = dataset_info("demo")
    assert info.source_kind == "demo" and info.family == "hopper"
    assert info.name == "hopper-demo-medium-replay-gen" and info.num_transitions == 15


def test_unreadable_torchrl_cache_and_wrong_family_are_dataset_errors(no_network, torchrl_root):
    (torchrl_root / "d4rl" / D4RL_ID).mkdir(parents=True)  # e.g. a killed conversion
    with pytest.raises(DatasetError, match="cannot be read .* Delete that directory"):
        load_dataset(D4RL_ID, torchrl_root=torchrl_root)
    with pytest.raises(DatasetError, match="is a hopper dataset but family='walker2d'"):
        load_dataset(D4RL_ID, family="walker2d", torchrl_root=torchrl_root)
