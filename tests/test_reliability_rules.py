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

import errno
import os
import subprocess
import sys
from pathlib import Path

import pytest
from inprocess import run_program
from refusals import no_blocking

BLOCKED_AFTER_S = 60  # far above the seconds each call takes; only a blocked open reaches it

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
    with no_blocking(BLOCKED_AFTER_S):
        done = run_program("report", [f"paths={folder}", f"out={tmp_path / 'out'}"],
                           {"CBOP_TORCHRL_CACHE": str(tmp_path / "cache")})  # fmt: skip
    assert _skipped(done.stderr, folder / "x.json"), done.stderr
    assert _skipped(done.stderr, folder / "run" / "results.json"), done.stderr
    assert done.returncode == 2 and "no finished runs" in done.stderr  # nothing else there


def test_select_psi_skips_a_fifo_named_json(tmp_path: Path) -> None:
    sweep = _fifo_folder(tmp_path / "sweep", "run/config.json", "run/results.json")
    (sweep / "run" / "policy.pt").write_bytes(b"x")
    with no_blocking(BLOCKED_AFTER_S):
        done = run_program("select_psi", [f"sweep_dir={sweep}"],
                           {"CBOP_TORCHRL_CACHE": str(tmp_path / "cache")})  # fmt: skip
    assert _skipped(done.stderr, sweep / "run" / "config.json"), done.stderr
    assert done.returncode == 2 and "Traceback" not in done.stderr


def test_the_sweep_readers_skip_a_fifo(tmp_path: Path, capfd: pytest.CaptureFixture) -> None:
    from cbop_torchrl.sweeps import find_runs

    sweep = _fifo_folder(tmp_path, "b/config.json")
    (tmp_path / "b" / "policy.pt").write_bytes(b"x")
    with no_blocking(BLOCKED_AFTER_S):
        assert find_runs(sweep) == []
    err = capfd.readouterr().err
    assert _skipped(err, sweep / "b" / "config.json"), err


def test_the_benchmark_tools_skip_a_fifo(tmp_path: Path, capfd: pytest.CaptureFixture) -> None:
    from benchmarks import cbop_row, learning, psi_grid

    results = _fifo_folder(tmp_path, "set/cbop/seed0.json", "set/cbop-psi1/seed1.json")
    with no_blocking(BLOCKED_AFTER_S):
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


def _write(kind: str, folder: Path, number: int, patch: pytest.MonkeyPatch) -> None:
    """Writes one kind of file the programs write, failing with ``number`` as the OS would:
    a checkpoint (``torch.save`` fails), a result (its writer fails), a logger's row, a
    cache entry (h5py's form: the errno in the text only), a JSON record (``write_text``)."""
    import torch

    from cbop_torchrl.io import atomic_json_dump, atomic_torch_save, atomic_write

    def fail(*args: object, **kwargs: object) -> None:
        if kind == "cache":
            raise OSError(
                f"Can't synchronously write data (file write failed: filename = "
                f"'{folder / 'data.hdf5'}', file descriptor = 3, errno = {number}, "
                f"error message = '{os.strerror(number)}')"
            )
        raise OSError(number, os.strerror(number), str(folder / "file"))

    if kind == "checkpoint":
        patch.setattr(torch, "save", fail)
        atomic_torch_save({"x": torch.zeros(4)}, folder / "checkpoint.pt")
    elif kind == "json":
        patch.setattr(Path, "write_text", fail)
        atomic_json_dump({"a": 1}, folder / "config.json")
    elif kind == "log":
        fail()  # a logger appending a row to its file
    else:
        atomic_write(folder / ("results.json" if kind == "results" else "leaves.json"), fail)


@pytest.mark.parametrize("number", sorted(USER_CAUSED), ids=errno.errorcode.get)
@pytest.mark.parametrize("kind", ["checkpoint", "results", "log", "cache", "json"])
def test_every_write_the_system_stops_is_one_paragraph(
    tmp_path: Path, kind: str, number: int, capsys: pytest.CaptureFixture
) -> None:
    """Each user-caused errno, from each kind of file, raised inside any program's task,
    ends in one paragraph with exit code 2 and no temporary left (``io.write_failure``)."""
    from cbop_torchrl.cli import hydra_entry, run_entry

    folder = tmp_path / "out"
    folder.mkdir()

    def task(cfg: object) -> None:
        with pytest.MonkeyPatch.context() as patch:
            _write(kind, folder, number, patch)

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


# ------------------- 5. nothing written into a folder another program made, before the check

OTHER_APP = """
import logging, hydra
@hydra.main(version_base="1.3", config_path=None)
def my_app(cfg):
    logging.getLogger(__name__).info("hello from another application")
my_app()
"""

PROGRAM_ARGS = {  # each program's required settings, refused or finished before any stage
    "cbop": ["preset=debug"],
    "baseline": ["preset=debug", "algo=bc"],
    "evaluate": ["checkpoint=missing.pt"],
    "collect": ["compression_level=99"],
    "train_dynamics": ["output_dir=out", "dynamics.lr=0"],
    "select_psi": ["sweep_dir=missing"],
    "report": ["paths=missing"],
}


@pytest.fixture(scope="module")
def other_app_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder another Hydra application made: its .hydra/ record and its job log."""
    root = tmp_path_factory.mktemp("other_app")
    folder = root / "outputs"
    (root / "my_app.py").write_text(OTHER_APP)
    subprocess.run([sys.executable, "my_app.py", f"hydra.run.dir={folder}"], cwd=root,
                   check=True, capture_output=True, timeout=120)  # fmt: skip
    assert {p.name for p in folder.iterdir()} == {".hydra", "my_app.log"}
    assert (folder / ".hydra" / "config.yaml").is_file()
    assert "hello" in (folder / "my_app.log").read_text()
    return folder


def _snapshot(folder: Path) -> dict[str, bytes | None]:
    return {
        p.relative_to(folder).as_posix(): (p.read_bytes() if p.is_file() else None)
        for p in sorted(folder.rglob("*"))
    } | {".": None}


@pytest.mark.parametrize("module", list(PROGRAM_ARGS))
def test_no_program_writes_into_another_applications_folder(
    module: str, other_app_folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shutil

    folder = tmp_path / "theirs"
    shutil.copytree(other_app_folder, folder)
    before = _snapshot(folder)
    monkeypatch.chdir(tmp_path)
    done = run_program(module, [*PROGRAM_ARGS[module], f"hydra.run.dir={folder}"],
                       {"CBOP_TORCHRL_CACHE": str(tmp_path / "cache")})  # fmt: skip
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert _snapshot(folder) == before, done.stderr
    if module in ("cbop", "baseline"):  # their run directory: refused before Hydra starts it
        assert "no .cbop-run marker" in done.stderr and ".hydra" in done.stderr, done.stderr


def test_a_multirun_never_overwrites_another_applications_sweep(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    sweep = tmp_path / "their_sweep"
    sweep.mkdir()
    (sweep / "multirun.yaml").write_text("hydra:\n  job:\n    config_name: my_app\n")
    before = _snapshot(sweep)
    monkeypatch.chdir(tmp_path)
    done = run_program("baseline", ["-m", "preset=debug", "seed=0,1", f"hydra.sweep.dir={sweep}"],
                       {"CBOP_TORCHRL_CACHE": str(tmp_path / "cache")})  # fmt: skip
    assert done.returncode == 2 and "another application's sweep" in done.stderr, done.stderr
    assert "'my_app'" in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert _snapshot(sweep) == before


@pytest.mark.parametrize("setting", ["hydra.output_subdir=.hydra", "hydra/job_logging=default"])
@pytest.mark.parametrize("module", list(PROGRAM_ARGS))
def test_no_program_lets_hydra_write_before_the_check(
    module: str, setting: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = tmp_path / "run"
    monkeypatch.chdir(tmp_path)
    done = run_program(module, [*PROGRAM_ARGS[module], f"hydra.run.dir={folder}", setting],
                       {"CBOP_TORCHRL_CACHE": str(tmp_path / "cache")})  # fmt: skip
    assert done.returncode == 2 and "Hydra would write into" in done.stderr, done.stderr
    assert setting.partition("=")[0] in done.stderr and not folder.exists(), done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) in ([], ["cache"]), list(tmp_path.iterdir())


# ---------------------------------------- 2. every setting checked before work starts

FIRST_STAGES = {  # each program's first piece of work, which no refusal may follow
    "cbop": "cbop_torchrl.trainers.offline.dynamics_stage",
    "baseline": "cbop_torchrl.baselines.build_baseline",
    "collect": "cbop_torchrl.apps.collect.generate_datasets",
    "train_dynamics": "cbop_torchrl.trainers.dynamics.load_or_train_dynamics",
    "evaluate": "cbop_torchrl.envs.evaluate_policy",
    "select_psi": "cbop_torchrl.apps.select_psi.score_runs",
    "report": "cbop_torchrl.apps.report.load_summaries",
}
REFUSED_WITHIN_S = 20  # in this process, on a loaded 2-core machine; no stage takes less

BAD_VALUES = {  # program -> section -> (one bad value, words of the refusal)
    "cbop": {
        "": (["seed=-1"], "seed=-1"),
        "env": (["env=/no/such/data.hdf5"], "/no/such/data.hdf5"),
        "task": (["task.termination=bogus"], "task.termination='bogus'"),
        "agent": (["agent.hidden_sizes=[]"], "agent.hidden_sizes"),
        "estimator": (["estimator.psi=-1"], "estimator.psi"),
        "dynamics": (["dynamics.lr=0"], "dynamics.lr"),
        "bc": (["bc.steps=0"], "bc.steps"),
        "fqe": (["fqe.target_tau=5"], "fqe.target_tau"),
        "train": (["train.batch_size=0"], "train.batch_size"),
        "eval": (["eval.episodes=0"], "eval.episodes"),
    },
    "baseline": {
        "algo": (["algo=iql", "algo.expectile=2"], "algo.expectile"),
        "env": (["env=/no/such/data.hdf5"], "/no/such/data.hdf5"),
        "task": (["task.termination=bogus"], "task.termination='bogus'"),
        "train": (["train.batch_size=0"], "train.batch_size"),
    },
    "collect": {
        "": (["compression_level=99"], "compression_level=99"),
        "env": (["env=swimmer"], "swimmer"),
        "task": (["task.termination=bogus"], "bogus"),
        "kind": (["kind=bogus"], "bogus"),
        "sac": (["sac.lr=0"], "sac.lr"),
        "out_dir": (["out_dir=/dev/null/x"], "out_dir=/dev/null/x"),
    },
    "train_dynamics": {
        "env": (["env=/no/such/data.hdf5"], "/no/such/data.hdf5"),
        "task": (["task.termination=bogus"], "bogus"),
        "dynamics": (["dynamics.lr=0"], "dynamics.lr"),
        "output_dir": (["output_dir=/dev/null/x"], "output_dir=/dev/null/x"),
    },
    "evaluate": {
        "checkpoint": (["checkpoint=/no/such/policy.pt"], "/no/such/policy.pt"),
        "": (["episodes=0"], "episodes=0"),
    },
    "select_psi": {
        "sweep_dir": (["sweep_dir=/no/such/sweep"], "/no/such/sweep"),
        "": (["qvalue_nets=1"], "qvalue_nets=1"),
        "json": (["json=/dev/null/x/x.json"], "json=/dev/null/x"),
    },
    "report": {
        "paths": (["paths=/no/such/runs"], "/no/such/runs"),
        "out": (["out=/dev/null/x"], "out=/dev/null/x"),
    },
}
REQUIRED = {"cbop": ["preset=debug"], "baseline": ["preset=debug"],
            "train_dynamics": ["output_dir=out"], "evaluate": ["checkpoint=policy.pt"],
            "select_psi": ["sweep_dir=sweep"], "report": ["paths=runs"]}  # fmt: skip
CASES = [(m, s) for m, sections in BAD_VALUES.items() for s in sections]


@pytest.mark.parametrize(("module", "section"), CASES, ids=[f"{m}-{s or 'top'}" for m, s in CASES])
def test_one_bad_value_per_section_is_refused_before_any_stage(
    module: str, section: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import importlib
    import time

    values, words = BAD_VALUES[module][section]
    started: list[str] = []
    owner, _, name = FIRST_STAGES[module].rpartition(".")

    def stage(*args: object, **kwargs: object) -> None:
        started.append(name)
        raise AssertionError(f"{name} started before the bad value was refused")

    monkeypatch.setattr(importlib.import_module(owner), name, stage)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "sweep").mkdir()  # the required folders exist (and hold nothing)
    (tmp_path / "runs").mkdir()
    given = {value.partition("=")[0] for value in values}
    args = [a for a in REQUIRED.get(module, []) if a.partition("=")[0] not in given] + values
    begin = time.perf_counter()
    done = run_program(module, args, {"CBOP_TORCHRL_CACHE": str(tmp_path / "cache")})
    took = time.perf_counter() - begin
    assert started == [], done.stderr
    # one paragraph: the error line, and the list of every problem load_config found
    lines = done.stderr[done.stderr.find("error: ") :].splitlines()
    assert (
        done.returncode == 2
        and lines
        and all(line.startswith("  - ") for line in lines[1:] if not line.startswith("note: "))
    ), done.stderr
    assert words in lines[0] + "".join(lines[1:2]), done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert took < REFUSED_WITHIN_S, f"refused after {took:.1f} s"
    assert sorted(p.name for p in tmp_path.iterdir()) in (["runs", "sweep"],
                                                          ["cache", "runs", "sweep"])  # fmt: skip
    assert not any((tmp_path / "runs").iterdir())
