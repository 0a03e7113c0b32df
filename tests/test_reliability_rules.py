"""The five rules of docs/reliability.md, each held by one mechanism in every program.

1. Only regular files are opened by programs that gather files
   (``cbop_torchrl.io.find_regular_files``).
2. Every setting is checked before work starts (``cbop_torchrl.cli.hydra_entry``).
3. A file's family and kind are read from any legal file name
   (``cbop_torchrl.registry.parse_dataset_name``).
4. Every way a write can fail reads like a full disk (``cbop_torchrl.io.write_failure``).
5. Nothing is written into a folder another program made before the check
   (``cbop_torchrl.cli.guard``).

Programs run in this process (tests/inprocess.py); a FIFO that were opened would block,
so each such call runs under an alarm.
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from inprocess import run_program

BLOCKED_AFTER_S = 60  # far above the seconds each call takes; only a blocked open reaches it


@contextlib.contextmanager
def no_blocking(seconds: int = BLOCKED_AFTER_S) -> Iterator[None]:
    """Fails the test when the block takes ``seconds`` (a FIFO opened for reading)."""

    def blocked(signum: int, frame: object) -> None:
        raise TimeoutError(f"still running after {seconds} s: a special file was opened")

    previous = signal.signal(signal.SIGALRM, blocked)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


# ------------------------------------------------------ 1. only regular files are opened


def _fifo_folder(root: Path, *names: str) -> Path:
    for name in names:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        os.mkfifo(root / name)
    return root


def _skipped(stderr: str, path: Path) -> bool:
    return f"skipped {str(path)!r}" in stderr and "FIFO" in stderr


def test_report_skips_a_fifo_named_json(tmp_path: Path) -> None:
    folder = _fifo_folder(tmp_path / "runs", "x.json", "run/results.json")
    with no_blocking():
        done = run_program("report", [f"paths={folder}", f"out={tmp_path / 'out'}"],
                           {"CBOP_TORCHRL_CACHE": str(tmp_path / "cache")})  # fmt: skip
    assert _skipped(done.stderr, folder / "x.json"), done.stderr
    assert _skipped(done.stderr, folder / "run" / "results.json"), done.stderr
    assert done.returncode == 2 and "no finished runs" in done.stderr  # nothing else there


def test_select_psi_skips_a_fifo_named_json(tmp_path: Path) -> None:
    sweep = _fifo_folder(tmp_path / "sweep", "run/config.json", "run/results.json")
    (sweep / "run" / "policy.pt").write_bytes(b"x")
    with no_blocking():
        done = run_program("select_psi", [f"sweep_dir={sweep}"],
                           {"CBOP_TORCHRL_CACHE": str(tmp_path / "cache")})  # fmt: skip
    assert _skipped(done.stderr, sweep / "run" / "config.json"), done.stderr
    assert done.returncode == 2 and "Traceback" not in done.stderr


def test_the_sweep_readers_skip_a_fifo(tmp_path: Path, capfd: pytest.CaptureFixture) -> None:
    from cbop_torchrl.sweeps import collect_results, find_runs

    sweep = _fifo_folder(tmp_path, "a/results.json", "b/config.json")
    (tmp_path / "b" / "policy.pt").write_bytes(b"x")
    with no_blocking():
        assert collect_results(sweep) == [] and find_runs(sweep) == []
    err = capfd.readouterr().err
    assert _skipped(err, sweep / "a" / "results.json"), err
    assert _skipped(err, sweep / "b" / "config.json"), err


def test_the_benchmark_tools_skip_a_fifo(tmp_path: Path, capfd: pytest.CaptureFixture) -> None:
    from benchmarks import cbop_row, learning, psi_grid

    results = _fifo_folder(tmp_path, "set/cbop/seed0.json", "set/cbop-psi1/seed1.json")
    with no_blocking():
        assert learning.write_rows(results, "set") is None
        assert cbop_row.seed_summaries(results, "set", "cbop", "abc") == []
        assert psi_grid.main(["--datasets", "set", "--results", str(results)]) == 0
    err = capfd.readouterr().err
    assert _skipped(err, results / "set" / "cbop" / "seed0.json"), err
    assert _skipped(err, results / "set" / "cbop-psi1" / "seed1.json"), err


def test_no_program_walks_a_folder_but_through_the_one_walker() -> None:
    """Every glob, rglob and os.walk of the package and the benchmark tools is the walker's,
    or lists a folder without opening what it finds (named here with why)."""
    root = Path(__file__).resolve().parents[1]
    allowed = {
        "cbop_torchrl/io/walking.py": "the walker",
        "cbop_torchrl/evaluation/summaries.py": "globs folders (logs/*/scalars), then walks",
    }
    found = []
    for folder in ("cbop_torchrl", "benchmarks"):
        for path in sorted((root / folder).rglob("*.py")):
            name = path.relative_to(root).as_posix()
            text = path.read_text()
            if name not in allowed and any(
                word in text for word in (".glob(", ".rglob(", "os.walk(", "fnmatch.filter(")
            ):
                found.append(name)
    assert found == [
        "cbop_torchrl/data/safe_memmap.py",  # lists a memmap folder to refuse what is not its own
    ], found


# ------------------------------------------ 3. family and kind read from any legal name


@pytest.mark.parametrize(
    ("name", "family", "kind"),
    [
        ("hopper-medium-replay-gen.hdf5", "hopper", "medium-replay"),
        ("hopper medium replay.hdf5", "hopper", "medium-replay"),
        ("Hopper.Medium.v2.hdf5", "hopper", "medium"),
        ("walker2d--medium---expert.hdf5", "walker2d", "medium-expert"),
        ("halfcheetah_full_replay (copy 2).hdf5", "halfcheetah", "full-replay"),
        ("hopper\u2013medium.hdf5", "hopper", "medium"),  # an en dash
        ("hopper@random.hdf5", "hopper", "random"),
        ("hopper\u2122-expert.hdf5", "hopper", "expert"),  # a trade mark sign
        ("\uff48\uff4f\uff50\uff50\uff45\uff52-medium.hdf5", "hopper", "medium"),  # full width
        ("HalfCheetah MediumReplay \u00fcber-d\u00e4ten.hdf5", "halfcheetah", "medium-replay"),
        ("Walker 2d \u2014 medium.hdf5", "walker2d", "medium"),
        ("2024.my-hopper.data.hdf5", "hopper", None),
        ("data.hdf5", None, None),
        ("hopper-vs-walker2d.hdf5", None, None),  # two families: the name does not say
    ],
)
def test_family_and_kind_are_read_from_any_legal_name(
    name: str, family: str | None, kind: str | None
) -> None:
    from cbop_torchrl.config import infer_dataset_kind
    from cbop_torchrl.registry import family_in_name

    assert (family_in_name(name), infer_dataset_kind(name)) == (family, kind)


def test_a_file_named_with_an_unusual_character_loads_as_its_family(tmp_path: Path) -> None:
    from d4rl_files import write_d4rl_hdf5

    from cbop_torchrl.data import dataset_info

    for name, family in (("hopper\u2019s medium (1).hdf5", "hopper"),
                         ("walker2d\u00b7medium.expert.hdf5", "walker2d")):  # fmt: skip
        assert dataset_info(write_d4rl_hdf5(tmp_path / name, family)).family == family


@pytest.mark.parametrize(
    ("name", "family", "fixes"),
    [
        ("data.hdf5", "hopper", ["Hopper-v4"]),
        ("my-robot.hdf5", "walker2d", ["Walker2d-v4", "HalfCheetah-v4"]),
        ("hopper-vs-walker2d.hdf5", "hopper", ["Hopper-v4"]),
    ],
)
def test_a_name_that_does_not_say_names_the_setting_that_does(
    tmp_path: Path, name: str, family: str, fixes: list[str]
) -> None:
    """The message gives, for each known family of the data's sizes, a command whose task
    settings resolve the task as written."""
    import shlex

    from d4rl_files import write_d4rl_hdf5

    from cbop_torchrl.data import dataset_info
    from cbop_torchrl.envs.task import TaskError, resolve_task

    info = dataset_info(write_d4rl_hdf5(tmp_path / name, family))
    assert info.family is None
    with pytest.raises(TaskError) as error:
        resolve_task(None, info)
    message = str(error.value)
    commands = [part for i, part in enumerate(message.split("`")) if i % 2]
    assert len(commands) == len(fixes), message
    for command, gym_id in zip(commands, fixes, strict=True):
        words = shlex.split(command)
        task = dict(w.removeprefix("task.").split("=", 1) for w in words if w.startswith("task."))
        assert task == {"gym_id": gym_id} and f"env={info.source}" in words, command
        assert resolve_task(task, info).gym_id == gym_id  # the suggestion works as written


# --------------------------------- 4. every way a write can fail reads like a full disk

USER_CAUSED = {
    errno.ENOSPC: "not enough disk space", errno.EDQUOT: "quota", errno.EFBIG: "ulimit -f",
    errno.EROFS: "EROFS", errno.EACCES: "EACCES", errno.EPERM: "EPERM",
}  # fmt: skip


def _writers(folder: Path) -> dict:
    """One writer per kind of file the programs write, each failing as the OS would."""
    import torch

    from cbop_torchrl.io import atomic_json_dump, atomic_torch_save, atomic_write

    def failing(number: int, text: bool = False) -> Callable[..., None]:
        def write(*args: object) -> None:
            if text:  # h5py's form: the errno in the text only
                raise OSError(
                    f"Can't synchronously write data (file write failed: filename = "
                    f"'{folder / 'data.hdf5'}', file descriptor = 3, errno = {number}, "
                    f"error message = '{os.strerror(number)}')"
                )
            raise OSError(number, os.strerror(number), str(folder / "file"))

        return write

    return {
        "checkpoint": lambda n: atomic_torch_save(
            {"x": torch.zeros(4)}, _failing_save(folder / "checkpoint.pt", failing(n))
        ),
        "results": lambda n: atomic_write(folder / "results.json", failing(n)),
        "log": lambda n: failing(n)(),  # a logger appending a row
        "cache": lambda n: atomic_write(folder / "cache" / "leaves.json", failing(n, True)),
        "json": lambda n: atomic_json_dump({"a": 1}, _failing_json(folder, failing(n))),
    }


def _failing_save(path: Path, fail: Callable[..., None]) -> Path:
    import torch

    _patches.append(("save", torch.save))
    torch.save = fail  # restored by the test (monkeypatch would not reach the lambda)
    return path


def _failing_json(folder: Path, fail: Callable[..., None]) -> Path:
    _patches.append(("write_text", Path.write_text))
    Path.write_text = fail
    return folder / "config.json"


_patches: list[tuple[str, object]] = []


def _restore() -> None:
    import torch

    while _patches:
        name, original = _patches.pop()
        setattr(torch if name == "save" else Path, name, original)


@pytest.mark.parametrize("number", sorted(USER_CAUSED), ids=errno.errorcode.get)
@pytest.mark.parametrize("kind", ["checkpoint", "results", "log", "cache", "json"])
def test_every_write_the_system_stops_is_one_paragraph(
    tmp_path: Path, kind: str, number: int, capsys: pytest.CaptureFixture
) -> None:
    """Each user-caused errno, from each kind of file, raised inside any program's task,
    ends in one paragraph with exit code 2 and no temporary left (``io.write_failure``)."""
    from cbop_torchrl.cli import hydra_entry, run_entry

    folder = tmp_path / "out"
    (folder / "cache").mkdir(parents=True)
    write = _writers(folder)[kind]

    def task(cfg: object) -> None:
        try:
            write(number)
        finally:
            _restore()

    code = run_entry(hydra_entry("report")(task), [f"paths={tmp_path}"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert USER_CAUSED[number] in err and "Traceback" not in err, err
    assert "Nothing half-written" in err or kind in ("log", "json"), err
    assert [p.name for p in folder.rglob("*") if p.is_file()] == [], "a temporary was left"


def test_a_real_file_size_limit_reads_like_a_full_disk(tmp_path: Path) -> None:
    """``ulimit -f`` (RLIMIT_FSIZE) stops a checkpoint (torch, which gives no cause) and an
    HDF5 file (h5py): each is one paragraph, exit 2, nothing half-written."""
    script = f"""
import resource, sys
import numpy as np, torch, h5py
from cbop_torchrl.cli import hydra_entry, run_entry
from cbop_torchrl.io import atomic_torch_save, atomic_write
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, resource.RLIM_INFINITY))
def checkpoint(cfg):
    atomic_torch_save({{"x": torch.zeros(1 << 19)}}, {str(tmp_path / "out" / "checkpoint.pt")!r})
def dataset(cfg):
    def write(tmp):
        with h5py.File(tmp, "w", locking=False) as handle:  # its temporary is flock-ed
            handle["observations"] = np.zeros(1 << 19)
    atomic_write({str(tmp_path / "out" / "data.hdf5")!r}, write)
for task in (checkpoint, dataset):
    print("code", run_entry(hydra_entry("report")(task), ["paths=."]), file=sys.stderr)
"""
    env = {**os.environ, "CBOP_TORCHRL_CACHE": str(tmp_path / "cache")}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path,
        timeout=300, env=env,
    )  # fmt: skip
    err = done.stderr
    assert done.returncode == 0 and err.count("code 2") == 2, err
    paragraphs = [line for line in err.splitlines() if line.startswith("error: ")]
    assert len(paragraphs) == 2 and "Traceback" not in err, err
    assert all("not enough room" in p and "ulimit -f" in p for p in paragraphs), err
    assert all("Nothing half-written" in p for p in paragraphs), err
    assert list((tmp_path / "out").iterdir()) == []
