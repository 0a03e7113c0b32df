"""The checks behind every program's refusals: a refused command removes only what it made,
datasets too small to train on and terminal flags that look wrong, a policy scored on
another task, a device that does not exist.

Each program's own refused commands are in tests/test_refusals_cbop_*.py (one file per
program) and tests/test_refusals_benchmarks.py.
"""

from __future__ import annotations

import os
import shutil
import warnings
from pathlib import Path

import pytest
from d4rl_files import write_d4rl_hdf5

from cbop_torchrl.cli import remove_if_only_hydra_files
from cbop_torchrl.data import DatasetError, load_dataset
from cbop_torchrl.envs import TaskError
from cbop_torchrl.envs.task import override_task
from cbop_torchrl.registry import get_family
from cbop_torchrl.runtime import resolve_device
from cbop_torchrl.trainers.datasize import (
    check_dataset_size,
    min_dynamics_rows,
    warn_about_terminals,
)
from cbop_torchrl.trainers.dynamics import DynamicsConfig
from cbop_torchrl.trainers.rundir import LOCK_NAME


def test_a_refused_command_removes_only_what_it_made(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The marker, the run's .hydra/ and this process's lock go; another run's lock, a
    .hydra/ without the marker (another application's) and a folder that existed stay."""
    from cbop_torchrl.trainers.rundir import MARKER_NAME, note_run_dir

    monkeypatch.chdir(tmp_path)  # empty parents are removed up to the working directory
    for holder, marked, removed in (
        (f"pid {os.getpid()} on here\n", True, True),
        ("", True, True),
        ("pid 1 on x", True, False),
        ("", False, False),
    ):
        run_dir = tmp_path / "runs" / "a" / "b"
        (run_dir / ".hydra").mkdir(parents=True)
        (run_dir / ".hydra" / "config.yaml").write_text("seed: 0\n")
        if marked:
            (run_dir / MARKER_NAME).write_text("")
        (run_dir / LOCK_NAME).write_text(holder)
        remove_if_only_hydra_files(run_dir)
        assert (not (tmp_path / "runs").exists()) == removed, holder
        if not removed:
            assert (run_dir / LOCK_NAME).read_text() == holder
            shutil.rmtree(tmp_path / "runs")
    existing = tmp_path / "existing"
    existing.mkdir()
    note_run_dir(existing)  # as the guard does before Hydra starts
    (existing / MARKER_NAME).write_text("")
    remove_if_only_hydra_files(existing)
    assert existing.is_dir()


def test_too_small_datasets_are_refused_with_the_sizes_named(tmp_path: Path) -> None:
    data = load_dataset(write_d4rl_hdf5(tmp_path / "hopper-x.hdf5", episode_lengths=(6, 5, 4)))
    config = DynamicsConfig(num_members=2, num_elites=1)
    assert min_dynamics_rows(config) == 5  # int(5 * 0.2) = 1 holdout row, 4 training rows
    check_dataset_size(data, "x", {"train.batch_size": 15}, ("fqe.batch_size", 8), config)
    with pytest.raises(DatasetError) as error:
        check_dataset_size(data, "x", {"train.batch_size": 16, "bc.batch_size": 4})
    assert "it has 15 transitions, fewer than one batch (train.batch_size=16)" in str(error.value)
    usable = int(data.get("next_action_mask").sum())
    with pytest.raises(DatasetError, match=f"the {usable} rows with a next action"):
        check_dataset_size(data, "x", {}, ("fqe.batch_size", usable + 1))
    with pytest.raises(DatasetError, match="needs at least 50 for a holdout"):
        check_dataset_size(data, "x", {}, dynamics=DynamicsConfig(holdout_ratio=0.02))


def test_terminal_flags_that_look_wrong_are_warned_about(tmp_path: Path) -> None:
    hopper, cheetah = get_family("hopper"), get_family("halfcheetah")

    def warned(data, task) -> list[str]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            warn_about_terminals(data, "x", task)
        return [str(w.message) for w in caught]

    none = load_dataset(write_d4rl_hdf5(tmp_path / "hopper-n.hdf5", terminal_episodes=()))
    assert "no row of the dataset 'x' is terminal" in warned(none, hopper)[0]
    assert warned(none, cheetah) == []  # halfcheetah episodes never terminate
    some = load_dataset(write_d4rl_hdf5(tmp_path / "hopper-s.hdf5", terminal_episodes=(0,)))
    assert warned(some, hopper) == []
    every = load_dataset(
        write_d4rl_hdf5(
            tmp_path / "hopper-e.hdf5", episode_lengths=(1, 1), terminal_episodes=(0, 1)
        )
    )
    assert "every row of the dataset 'x' is terminal" in warned(every, cheetah)[0]


def test_a_policy_is_not_scored_on_another_task() -> None:
    """Walker2d and halfcheetah have the same sizes (17 observations, 6 actions)."""
    walker = get_family("walker2d")
    with pytest.raises(TaskError, match="HalfCheetah-v4 is the halfcheetah environment"):
        override_task(walker, {"gym_id": "HalfCheetah-v4"})
    with pytest.raises(TaskError, match="halfcheetah environment, but this is a walker2d"):
        override_task(walker, {"gym_id": "HalfCheetah-v5"})
    assert override_task(walker, {"gym_id": "Walker2d-v5"}).gym_id == "Walker2d-v5"


def test_a_device_that_does_not_exist_is_named() -> None:
    with pytest.raises(RuntimeError, match="device='gpu0' is not a device; use auto, cpu, cuda"):
        resolve_device("gpu0")
