"""The cache and the disk: a full disk refused before staging, ENOSPC while writing leaves
nothing half written and reads as one paragraph with exit code 2, an empty sha256 memo is not
trusted, a process waiting for a cache lock names the holder, and stale temporaries are
removed (nothing else).

Everything runs in-process.
"""

from __future__ import annotations

import errno
import fcntl
import os
import shutil
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from d4rl_files import write_d4rl_hdf5

import cbop_torchrl.data.hdf5 as hdf5
import cbop_torchrl.io.cache as cache
from cbop_torchrl.io import (
    DiskFullError,
    atomic_torch_save,
    atomic_write,
    cache_dir,
    cache_entry_lock,
)
from cbop_torchrl.trainers.rundir import claim_run_dir


def leftovers(directory: Path) -> list[str]:
    """Names under ``directory`` that look like temporaries (``.*.tmp``) or staging dirs."""
    return sorted(p.name for p in directory.rglob(".*") if p.name.endswith(".tmp"))


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
