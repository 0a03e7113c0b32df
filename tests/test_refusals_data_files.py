"""What a run refuses of its data: a dataset changed under a run (never continued or
reported finished on it), a missing data record, float64 values that overflow float32, actions
outside the unit box, a file of another format (refused before it is hashed) and complex
arrays.

Everything runs in-process on tiny generated files.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import h5py
import numpy as np
import pytest
from d4rl_files import write_d4rl_hdf5

import cbop_torchrl.data.hdf5 as hdf5
import cbop_torchrl.data.transitions as transitions
import cbop_torchrl.trainers.offline as offline
import cbop_torchrl.trainers.offline_run as offline_run
from cbop_torchrl.config import RunConfig
from cbop_torchrl.data import DatasetError, data_record, load_dataset_with_info
from cbop_torchrl.trainers.checkpoint import CheckpointError
from cbop_torchrl.trainers.rundir import claim_run_dir

# new names are read from their modules inside the tests, so that each test fails on its
# own (not the whole module at import) where they are missing
DATA_RECORD_NAME = "data.json"


def open_run(file: Path, run_dir: Path, resume: str = "auto") -> offline.OfflineRun:
    config = RunConfig()
    config.resume, config.progress = resume, False
    config.train.epochs, config.train.steps_per_epoch = 1, 10
    _, info = load_dataset_with_info(str(file))
    return offline.OfflineRun.open(config, info, run_dir, config.training_dict())


def test_a_run_is_never_continued_or_reported_finished_on_changed_data(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    file = write_d4rl_hdf5(tmp_path / "hopper-x.hdf5", episode_lengths=(30, 30))
    run_dir = tmp_path / "run"
    run = open_run(file, run_dir)
    run.lock.release()
    recorded = json.loads((run_dir / DATA_RECORD_NAME).read_text())
    assert recorded["size_bytes"] == file.stat().st_size and len(recorded["content"]) == 64

    # a finished run: its checkpoint at the last step and results.json of that budget
    total = 10
    state = {"step": total, "total_steps": total, "wall_time_s": 1.0}
    monkeypatch.setattr(offline_run, "_resume_state", lambda *args: state)
    (run_dir / "results.json").write_text(json.dumps({"gradient_steps": total}))
    run = open_run(file, run_dir)
    assert run.finished_results() == {"gradient_steps": total}  # same data: finished

    write_d4rl_hdf5(file, episode_lengths=(30, 30), seed=1)  # same path, other content
    with pytest.raises(CheckpointError) as refused:
        open_run(file, run_dir)
    message = str(refused.value)
    assert recorded["content"][:16] in message and "hydra.run.dir=" in message
    assert "resume=false" in message and "started on other data" in message
    assert json.loads((run_dir / DATA_RECORD_NAME).read_text()) == recorded  # kept

    monkeypatch.setattr(offline_run, "_resume_state", lambda *args: None)  # resume=false
    open_run(file, run_dir, resume="false").lock.release()
    assert json.loads((run_dir / DATA_RECORD_NAME).read_text())["content"] != recorded["content"]


def test_a_missing_data_record_comes_from_the_checkpoint_or_the_run_is_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    file = write_d4rl_hdf5(tmp_path / "hopper-x.hdf5", episode_lengths=(30, 30))
    record = data_record(load_dataset_with_info(str(file))[1])
    run_dir = tmp_path / "run"
    claim_run_dir(run_dir)  # a run whose data.json was removed: marked, no data.json
    monkeypatch.setattr(offline_run, "_resume_state", lambda *args: {"step": 1, "data": record})
    open_run(file, run_dir).lock.release()
    assert json.loads((run_dir / DATA_RECORD_NAME).read_text()) == record
    (run_dir / DATA_RECORD_NAME).unlink()  # and the checkpoint records no data either
    monkeypatch.setattr(offline_run, "_resume_state", lambda *args: {"step": 1})
    with pytest.raises(CheckpointError, match="data.json is missing and its checkpoint records"):
        open_run(file, run_dir)
    assert not (run_dir / DATA_RECORD_NAME).exists()


def test_float64_values_that_overflow_float32_are_refused_with_count_and_row(
    tmp_path: Path,
) -> None:
    base = write_d4rl_hdf5(tmp_path / "hopper-base.hdf5")
    with h5py.File(base) as handle:
        observations = handle["observations"][()].astype(np.float64)
    observations[[3, 7], 2] = 1e300
    file = write_d4rl_hdf5(tmp_path / "hopper-big.hdf5", edit={"observations": observations})
    with pytest.raises(DatasetError, match=r"observations.*float32.*in 2 row\(s\).*row 3 "):
        hdf5.load_hdf5(file)
    observations[[3, 7], 2] = 0.0
    observations[[5, 6, 9], 1] = np.nan
    file = write_d4rl_hdf5(tmp_path / "hopper-nan.hdf5", edit={"observations": observations})
    with pytest.raises(DatasetError, match=r"non-finite.*in 3 row\(s\), the first at row 5"):
        hdf5.load_hdf5(file)


def test_actions_outside_the_unit_box_are_reported_with_their_range(tmp_path: Path) -> None:
    base = write_d4rl_hdf5(tmp_path / "hopper-base.hdf5")
    with h5py.File(base) as handle:
        actions = handle["actions"][()]
    actions[2, 0], actions[4, 1] = 2.5, -1.75
    data, _ = load_dataset_with_info(
        str(write_d4rl_hdf5(tmp_path / "hopper-wide.hdf5", edit={"actions": actions}))
    )
    with pytest.warns(UserWarning, match=r"outside the action range.*2 of 15 rows.*-1\.75, 2\.5"):
        transitions.warn_about_action_range(data, "hopper-wide")
    actions = np.clip(actions, -1, 1)
    actions[0, 0] = 1.0 + 1e-7  # float rounding
    data, _ = load_dataset_with_info(
        str(write_d4rl_hdf5(tmp_path / "hopper-ok.hdf5", edit={"actions": actions}))
    )
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        transitions.warn_about_action_range(data, "hopper-ok")


def test_a_file_of_another_format_is_refused_before_it_is_hashed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    file = tmp_path / "big.hdf5"
    file.write_bytes(os.urandom(1 << 20))

    def never(path: Path) -> str:
        raise AssertionError("hashed before the format check")

    monkeypatch.setattr(hdf5.hashing, "file_sha256", never)
    with pytest.raises(DatasetError, match="cannot be opened as an HDF5 file.*signature"):
        hdf5.load_hdf5(file)
    with_user_block = tmp_path / "hopper-ub.hdf5"
    with h5py.File(with_user_block, "w", userblock_size=512) as handle:
        handle["x"] = np.zeros(1)
    hdf5.check_hdf5_signature(with_user_block)  # the signature after a user block counts


def test_complex_arrays_are_refused_without_a_numpy_warning(tmp_path: Path) -> None:
    base = write_d4rl_hdf5(tmp_path / "hopper-base.hdf5")
    with h5py.File(base) as handle:
        rewards = handle["rewards"][()].astype(np.complex64)
    file = write_d4rl_hdf5(tmp_path / "hopper-complex.hdf5", edit={"rewards": rewards})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(DatasetError, match="rewards holds complex numbers"):
            hdf5.load_hdf5(file)
