"""Refusals of data, cache and disk: changed data, diverged stages, a full disk, and the
smaller data checks (action range, file format, lock waits, stale temporaries,
complex arrays).

Everything runs in-process on tiny generated files except one ``train_dynamics.py`` run
(a diverged model must end that script with exit code 2, not 0).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch
from d4rl_files import write_d4rl_hdf5

import cbop_torchrl.data.hdf5 as hdf5
import cbop_torchrl.data.transitions as transitions
import cbop_torchrl.io.cache as cache
import cbop_torchrl.trainers.offline as offline
import cbop_torchrl.trainers.offline_run as offline_run
import cbop_torchrl.trainers.pretrain as pretrain
from cbop_torchrl.config import PretrainConfig, RunConfig
from cbop_torchrl.data import DatasetError, data_record, load_dataset_with_info
from cbop_torchrl.io import (
    DiskFullError,
    atomic_torch_save,
    atomic_write,
    cache_dir,
    cache_entry_lock,
)
from cbop_torchrl.modules.dynamics import dynamics_state, load_dynamics
from cbop_torchrl.trainers.checkpoint import CheckpointError, NonFiniteLossError, save_stage
from cbop_torchrl.trainers.dynamics import DynamicsConfig, load_or_train_dynamics
from cbop_torchrl.trainers.rundir import claim_run_dir

# new names are read from their modules inside the tests, so that each test fails on its
# own (not the whole module at import) where they are missing
DATA_RECORD_NAME = "data.json"

REPO = Path(__file__).resolve().parents[1]
TINY = dict(num_members=2, num_elites=1, hidden_size=8, num_layers=1, weight_decay=(0.0, 0.0))


def leftovers(directory: Path) -> list[str]:
    """Names under ``directory`` that look like temporaries (``.*.tmp``) or staging dirs."""
    return sorted(p.name for p in directory.rglob(".*") if p.name.endswith(".tmp"))


# ------------------------------------------------------------------- changed data on resume


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


# -------------------------------------------------------------------------- diverged stages


def hopper_data(tmp_path: Path):
    file = write_d4rl_hdf5(tmp_path / "hopper-x.hdf5", episode_lengths=(40, 40, 40))
    return load_dataset_with_info(str(file))


def test_a_diverged_dynamics_model_is_refused_and_never_cached(tmp_path: Path) -> None:
    data, info = hopper_data(tmp_path)
    config = DynamicsConfig(lr=1e8, max_epochs=3, **TINY)
    with pytest.raises(NonFiniteLossError, match=r"diverged.*dynamics\.lr=1e\+08"):
        load_or_train_dynamics(data, info, config, progress=False, termination="hopper")
    assert not list(cache_dir("dynamics").rglob("model.pt"))
    assert not list(cache_dir("dynamics").rglob("metrics.json"))


def test_a_cached_nan_dynamics_model_is_trained_again(tmp_path: Path) -> None:
    data, info = hopper_data(tmp_path)
    config = DynamicsConfig(max_epochs=2, **TINY)
    model, metrics = load_or_train_dynamics(data, info, config, False, termination="hopper")
    path = Path(metrics["cache_path"])
    broken = load_dynamics(path)
    with torch.no_grad():
        next(broken.ensemble.parameters()).fill_(float("nan"))
    record = torch.load(path, weights_only=True)["stage"]["data"]
    save_stage(dynamics_state(broken), path, record)  # what an earlier version cached
    with pytest.warns(UserWarning, match="not finite"):
        again, metrics = load_or_train_dynamics(data, info, config, False, termination="hopper")
    assert metrics["cached"] is False
    assert all(torch.isfinite(p).all() for p in again.ensemble.parameters())


def test_train_dynamics_script_exits_2_on_a_diverged_model(tmp_path: Path) -> None:
    file = write_d4rl_hdf5(tmp_path / "hopper-x.hdf5", episode_lengths=(40, 40, 40))
    env = {**os.environ, "CBOP_TORCHRL_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1"}
    command = [
        sys.executable, str(REPO / "scripts" / "train_dynamics.py"), f"env={file}",
        f"output_dir={tmp_path / 'out'}", "progress=false", "dynamics.lr=1e8",
        "dynamics.num_members=2", "dynamics.num_elites=1", "dynamics.max_epochs=3",
        "dynamics.hidden_size=8", "dynamics.num_layers=1", "dynamics.weight_decay=[0,0]",
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr and "diverged" in done.stderr, done.stderr
    assert "dynamics.lr=1e+08" in done.stderr and "dynamics.lr=0.001" in done.stderr
    assert not (tmp_path / "out" / "dynamics_metrics.json").exists()
    assert not list((tmp_path / "cache").rglob("model.pt"))


def test_a_bc_stage_that_ends_in_nan_is_not_cached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    data, info = hopper_data(tmp_path)

    def diverging_last_step(name, loss, *args, **kwargs):  # noqa: ANN001, ANN202
        with torch.no_grad():
            next(loss.parameters()).fill_(float("inf"))
        return {}

    monkeypatch.setattr(pretrain, "run_supervised_stage", diverging_last_step)
    with pytest.raises(NonFiniteLossError, match=r"bc stage diverged.*bc\.lr"):
        pretrain.load_or_train_bc(
            data, info.fingerprint, info.obs_dim, info.action_dim, [8],
            PretrainConfig(steps=2, batch_size=4), seed=0, progress=False,
        )  # fmt: skip
    assert not list(cache_dir("pretrain").rglob("result.pt"))


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


# ------------------------------------------------------------------------------ a full disk


def little_free_space(monkeypatch: pytest.MonkeyPatch, free: int = 1 << 20) -> None:
    usage = shutil.disk_usage("/")
    fake = type(usage)(usage.total, usage.total - free, free)
    monkeypatch.setattr(shutil, "disk_usage", lambda path: fake)


def test_the_dataset_cache_refuses_a_full_disk_before_staging(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    file = write_d4rl_hdf5(tmp_path / "hopper-x.hdf5")
    hdf5.file_sha256(file)  # the memo is written before the disk is "full"
    little_free_space(monkeypatch)
    with pytest.raises(DiskFullError, match="not enough disk space.*CBOP_TORCHRL_CACHE"):
        hdf5.load_hdf5(file)
    assert [p.name for p in cache_dir("datasets").iterdir()] == ["_sha256"]


def test_enospc_while_writing_the_cache_leaves_nothing_half_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    file = write_d4rl_hdf5(tmp_path / "hopper-x.hdf5")

    def disk_fills_up(data, directory):  # noqa: ANN001, ANN202
        directory.mkdir()
        (directory / "observation.bin").write_bytes(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device", str(directory))

    monkeypatch.setattr(hdf5.cache, "_write_cache_data", disk_fills_up)
    with pytest.raises(DiskFullError, match="Nothing half-written"):
        hdf5.load_hdf5(file)
    assert [p.name for p in cache_dir("datasets").iterdir()] == ["_sha256"]


def test_atomic_writes_turn_enospc_into_a_message_and_keep_the_old_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target = tmp_path / "results.json"
    target.write_text("old\n")

    def full(tmp: Path) -> None:
        tmp.write_text("half")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(DiskFullError, match="not enough disk space"):
        atomic_write(target, full)
    assert target.read_text() == "old\n" and leftovers(tmp_path) == []

    little_free_space(monkeypatch)
    with pytest.raises(DiskFullError, match=r"needs about 40 MB"):
        atomic_torch_save({"w": torch.zeros(10_000_000)}, tmp_path / "checkpoint.pt")
    assert not (tmp_path / "checkpoint.pt").exists() and leftovers(tmp_path) == []


def test_an_entry_point_reports_enospc_in_one_paragraph_with_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    from cbop_torchrl.cli import hydra_entry

    def task(cfg) -> None:  # noqa: ANN001
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / "out" / "x.pt"))

    argv = ["train_dynamics", f"output_dir={tmp_path / 'out'}", f"hydra.run.dir={tmp_path}/r"]
    monkeypatch.setattr(sys, "argv", argv)
    with pytest.raises(SystemExit) as exited:
        hydra_entry("train_dynamics")(task)()
    assert exited.value.code == 2
    error = capsys.readouterr().err
    assert "error: not enough disk space to write into" in error and str(tmp_path / "out") in error
    assert "Traceback" not in error


def test_an_empty_sha256_memo_is_not_trusted(tmp_path: Path) -> None:
    file = write_d4rl_hdf5(tmp_path / "hopper-x.hdf5")
    digest = hdf5.file_sha256(file)
    (memo,) = cache_dir("datasets", "_sha256").glob("*.txt")
    memo.write_text("")  # what a kill or a full disk mid-write left before
    assert hdf5.file_sha256(file) == digest


# ----------------------------------------------------------------------- the smaller checks


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


def test_a_process_waiting_for_a_cache_lock_names_the_holder_and_the_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    monkeypatch.setattr(cache, "LOCK_REPORT_INTERVAL_S", 0.3)
    monkeypatch.setattr(cache, "_LOCK_POLL_S", 0.05)
    entry = tmp_path / "entry"
    held, release = threading.Event(), threading.Event()

    def holder() -> None:
        with cache_entry_lock(entry, "dynamics model"):
            held.set()
            release.wait(10)

    thread = threading.Thread(target=holder)
    thread.start()
    held.wait(10)
    threading.Timer(1.0, release.set).start()
    with cache_entry_lock(entry, "dynamics model"):
        pass
    thread.join()
    lines = [line for line in capsys.readouterr().out.splitlines() if "waiting" in line]
    assert len(lines) >= 2, lines
    assert all(f"pid {os.getpid()} on " in line for line in lines), lines
    assert "waited 0 s" in lines[0] and "waited 0 s" not in lines[-1], lines


def age(path: Path, seconds: float = 3600) -> Path:
    past = time.time() - seconds
    os.utime(path, (past, past), follow_symlinks=False)
    return path


def test_stale_temporaries_are_removed_and_nothing_else(tmp_path: Path) -> None:
    run_dir = tmp_path / "run"
    claim_run_dir(run_dir)
    (run_dir / "logs").mkdir()
    stale = [run_dir / ".checkpoint.pt.a1b2c3d4.tmp", run_dir / "logs" / ".x.csv.zzzzzzzz.tmp"]
    for path in stale:
        path.write_text("partial")
        age(path)
    young = run_dir / ".results.json.abcdefgh.tmp"
    young.write_text("being written")
    held = run_dir / ".policy.pt.held1234.tmp"
    held.write_text("a live writer")
    age(held)
    holder = os.open(held, os.O_RDONLY)
    fcntl.flock(holder, fcntl.LOCK_SH)
    target = tmp_path / "precious.txt"
    target.write_text("keep")
    link = run_dir / ".link.pt.linklink.tmp"
    link.symlink_to(target)
    age(link)
    users = [run_dir / ".notes.tmp", run_dir / "draft.tmp", run_dir / ".draft.ab.tmp"]
    for path in users:
        path.write_text("mine")
        age(path)

    claim_run_dir(run_dir)  # a run starting again in its directory
    os.close(holder)
    assert not any(path.exists() for path in stale)
    assert young.exists() and held.exists() and link.is_symlink()
    assert target.read_text() == "keep" and all(path.exists() for path in users)

    staging = cache_dir("datasets") / ".hopper-x-0123456789ab.qwertyui.tmp"
    (staging / "data").mkdir(parents=True)
    age(staging)
    leaked = cache_dir("datasets") / ".hopper-y-0123456789ab.k2j4h6g8"  # an older version's
    (leaked / "data").mkdir(parents=True)
    age(leaked, 2 * 86400)
    recent = cache_dir("datasets") / ".hopper-z-0123456789ab.k2j4h6g8"  # may be live
    recent.mkdir()
    age(recent)
    hdf5.load_hdf5(write_d4rl_hdf5(tmp_path / "hopper-x.hdf5"))
    assert not staging.exists() and not leaked.exists() and recent.exists()
    entry = tmp_path / "entry"
    entry.mkdir()
    left = entry / ".model.pt.9z8y7x6w.tmp"
    left.write_text("partial")
    age(left)
    with cache_entry_lock(entry, "dynamics model"):
        assert not left.exists()


def test_complex_arrays_are_refused_without_a_numpy_warning(tmp_path: Path) -> None:
    base = write_d4rl_hdf5(tmp_path / "hopper-base.hdf5")
    with h5py.File(base) as handle:
        rewards = handle["rewards"][()].astype(np.complex64)
    file = write_d4rl_hdf5(tmp_path / "hopper-complex.hdf5", edit={"rewards": rewards})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(DatasetError, match="rewards holds complex numbers"):
            hdf5.load_hdf5(file)
