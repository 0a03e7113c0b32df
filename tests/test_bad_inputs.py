"""Bad input to every entry script: exit code 2, no traceback, the key named, in seconds.

Each case runs the real script from an empty working directory (so a refused
command is also checked to leave no run directory behind), all of them one
after another in one child process (tests/programs.py). Every case is refused
before any data is loaded or any stage runs: the timeout is far below the
seconds a debug run's first stage needs.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path

import pytest
from d4rl_files import write_d4rl_hdf5
from programs import Call, run_programs, selected_ids

from cbop_torchrl.apps import report, select_psi
from cbop_torchrl.apps.api import compose_config, train_baseline
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

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 120  # imports on a loaded 2-core machine (up to ~60 s seen); training takes longer

# (script, overrides, words the message must hold); the type/choice cases of the schema
# itself are tested in-process in tests/test_config.py and only one per kind of refusal
# runs here. In overrides and words, {unwritable} is a directory that cannot be created
# (see unwritable_dir) and {one_row} a hopper dataset of one transition.
CASES = [
    (
        "cbop.py",
        ["estimator.horizon=2.5"],
        ["estimator.horizon=2.5", "must be null or an integer", "configs/config.yaml"],
    ),
    ("cbop.py", ["train.batch_size=-3"], ["train.batch_size=-3", "an integer >= 1"]),
    ("cbop.py", ["-m", "seed=abc,1"], ["seed=abc: seed must be an integer"]),  # no multirun/ left
    # refused by the job
    ("cbop.py", ["-m", "train.batch_size=-3,1"], ["train.batch_size=-3", "an integer >= 1"]),
    ("cbop.py", ["device=cuda"], ["device=cuda", "device=auto", "device=cpu"]),
    (
        "cbop.py",
        ["preset=debug", "env={one_row}", "estimator.psi=1"],
        ["too small to train on", "1 transition", "train.batch_size=32", "needs at least 5"],
    ),
    (
        "cbop.py",
        ["preset=debug", "hydra.run.dir={unwritable}"],
        ["cannot create the run directory", "{unwritable_part}", "hydra.run.dir="],
    ),
    ("baseline.py", ["algo=sac"], ["algo=sac", "td3bc", "iql", "cql"]),
    ("evaluate.py", [], ["checkpoint"]),
    (
        "evaluate.py",
        ["checkpoint=policy.pt", "output={unwritable}/scores.json"],
        ["output={unwritable}/scores.json cannot be written", "{unwritable_part}"],
    ),
    (
        "collect.py",
        ["out_dir={unwritable}"],
        ["out_dir={unwritable} cannot be", "{unwritable_part}"],
    ),
    ("collect.py", ["medium_reference=x"], ["medium_reference", "best, d4rl"]),
    ("collect.py", ["tag=", "sac.lr=nan"], ["tag is an empty string", "sac.lr=nan is not a"]),
    (
        "collect.py",
        ["tag=x/../../escaped", "out_dir=out"],
        ["tag='x/../../escaped' must be a plain name part", "tag=demo"],
    ),
    ("train_dynamics.py", ["dynamics.num_members=abc"], ["dynamics.num_members", "an integer"]),
    ("train_dynamics.py", ["env={missing}"], ["no file at", "missing.hdf5"]),
]


def unwritable_dir(tmp_path: Path) -> tuple[Path, Path]:
    """A directory this process cannot create, and the part of its path that blocks it.

    A read-only (0o555) directory for a regular user; root writes into one
    regardless, so for root the blocking part is a regular file instead.
    """
    if os.geteuid() != 0:
        blocked = tmp_path / "read_only"
        blocked.mkdir()
        blocked.chmod(0o555)
    else:
        blocked = tmp_path / "a_file"
        blocked.write_text("not a directory\n")
    return blocked / "run", blocked


def script_env(cwd: Path, env: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment with a cache in ``cwd``, no GPU and no ``HYDRA_FULL_ERROR``."""
    merged = {
        **os.environ,
        "CBOP_TORCHRL_CACHE": str(cwd / "cache"),
        "CUDA_VISIBLE_DEVICES": "",
        **(env or {}),
    }
    merged.pop("HYDRA_FULL_ERROR", None)
    return merged


def assert_refused(done: subprocess.CompletedProcess, words: list[str], cwd: Path) -> None:
    """Exit 2, one ``error:`` paragraph naming ``words``, no traceback, nothing left in ``cwd``."""
    output = done.stdout + done.stderr
    assert done.returncode == 2, output
    for noise in ("Traceback", "HYDRA_FULL_ERROR", "object_type", "full_key"):
        assert noise not in output, output
    error_lines = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert len(error_lines) == 1, done.stderr
    for word in words:
        assert word in error_lines[0], (word, output)
    left = sorted(p.name for p in cwd.iterdir() if p.name != "cache")
    assert left == [], f"the refused command left {left} behind"


IDS = [f"{script}:{' '.join(overrides) or '(none)'}" for script, overrides, _ in CASES]
UNWRITABLE_CACHE = "unwritable cache"


@dataclass
class Refused:
    """One case's command, run: its result, working directory and the ``{...}`` values."""

    done: subprocess.CompletedProcess
    cwd: Path
    values: dict[str, Path]


def case_folder(root: Path) -> tuple[Path, dict[str, Path]]:
    """An empty working directory in ``root`` and the values of ``{unwritable}``, ... there."""
    cwd = root / "work"
    cwd.mkdir()
    unwritable, blocking = unwritable_dir(root)
    one_row = root / "hopper-one.hdf5"
    write_d4rl_hdf5(one_row, episode_lengths=(1,), terminal_episodes=(), timeout_episodes=())
    values = {
        "unwritable": unwritable,
        "unwritable_part": blocking,
        "one_row": one_row,
        "missing": root / "missing.hdf5",
    }
    return cwd, values


@pytest.fixture(scope="module")
def refused(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, Refused]:
    """Every case this session runs (and the unwritable cache), one child process for all.

    Each command still runs as ``scripts/<script>`` from its own empty working directory
    with its own environment (tests/programs.py): ~1 s each instead of ~8 s.
    """
    wanted = selected_ids(request, "test_bad_input_is_refused_with_exit_2")
    cases = {id_: case for id_, case in zip(IDS, CASES, strict=True) if id_ in wanted}
    calls, folders = [], {}
    for id_, (script, overrides, _) in cases.items():
        cwd, values = case_folder(tmp_path_factory.mktemp("case"))
        folders[id_] = cwd, values
        args = [o.format(**values) for o in overrides]
        calls.append(Call(script, args, str(cwd), script_env(cwd)))
    cwd, values = case_folder(tmp_path_factory.mktemp("cache"))
    folders[UNWRITABLE_CACHE] = cwd, values
    env = script_env(cwd, {"CBOP_TORCHRL_CACHE": str(values["unwritable"])})
    calls.append(Call("baseline.py", ["preset=debug"], str(cwd), env))
    results = run_programs(calls, timeout_s=TIMEOUT_S + 30 * len(calls))
    return {id_: Refused(done, *folders[id_]) for id_, done in zip(folders, results, strict=True)}


@pytest.mark.parametrize(("script", "overrides", "words"), CASES, ids=IDS)
def test_bad_input_is_refused_with_exit_2(
    script: str, overrides: list[str], words: list[str], refused: dict[str, Refused],
    request: pytest.FixtureRequest,
) -> None:  # fmt: skip
    case = refused[request.node.callspec.id]
    assert case.done.args[1:] == [
        str(ROOT / "scripts" / script),
        *(o.format(**case.values) for o in overrides),
    ]
    assert_refused(case.done, [w.format(**case.values) for w in words], case.cwd)


def test_an_unwritable_cache_is_named_before_any_work(refused: dict[str, Refused]) -> None:
    case = refused[UNWRITABLE_CACHE]
    unwritable, blocking = case.values["unwritable"], case.values["unwritable_part"]
    assert_refused(
        case.done,
        [f"the cache directory '{unwritable}'", str(blocking), "CBOP_TORCHRL_CACHE="],
        case.cwd,
    )


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


def load_script(name: str):
    """A script of ``scripts/`` as a module, so its ``main(argv)`` runs in-process."""
    spec = importlib.util.spec_from_file_location(f"{name}_script", ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["task.ref_min_score=abc", "task.ref_max_score=1"], ["task.ref_min_score must be"]),
        (["task.gym_kwargs=3"], ["task.gym_kwargs must be a mapping"]),
        (["task.ref_min_score=3"], ["task.ref_min_score=3.0 and task.ref_max_score=null"]),
        (["device=gpu"], ["device=gpu: device='gpu' is not a device"]),
        (["steps=0"], ["steps=0 must be an integer >= 1"]),
        (["qvalue_nets=abc"], ["qvalue_nets must be an integer, e.g. qvalue_nets=2"]),
        (["json={unwritable}/x.json"], ["cannot be written", "{unwritable_part}", "set json="]),
        (["json="], ["json is an empty string"]),
    ],
)
def test_select_psi_checks_every_argument_before_reading_runs(
    argv: list[str], words: list[str], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """The sweep directory does not even exist: each refusal comes before it is looked at."""
    unwritable, blocking = unwritable_dir(tmp_path)
    values = {"unwritable": unwritable, "unwritable_part": blocking}
    argv = [f"sweep_dir={tmp_path / 'no_sweep'}", *(a.format(**values) for a in argv)]
    assert select_psi.main(argv) == 2
    error = capsys.readouterr().err
    assert "no_sweep" not in error
    for word in words:
        assert word.format(**values) in error, error


def test_report_names_an_unwritable_output_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    unwritable, blocking = unwritable_dir(tmp_path)
    assert report.main([f"paths={tmp_path}", f"out={unwritable}"]) == 2
    error = capsys.readouterr().err
    assert f"out={unwritable} cannot be written" in error and str(blocking) in error


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--rounds", "0"], ["--rounds 0: give a positive integer"]),
        (["--json", "{unwritable}/bench.json"], ["cannot be written", "{unwritable_part}"]),
    ],
)
def test_bench_refuses_before_benchmarking(
    argv: list[str], words: list[str], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """A --json it cannot write is found before minutes of benchmarks, not after."""
    unwritable, blocking = unwritable_dir(tmp_path)
    values = {"unwritable": unwritable, "unwritable_part": blocking}
    assert load_script("bench").main([a.format(**values) for a in argv]) == 2
    error = capsys.readouterr().err
    for word in words:
        assert word.format(**values) in error, error


def test_baselines_refuse_a_dataset_smaller_than_a_batch(tmp_path: Path) -> None:
    """On main a baseline trained on a 1-row file and reported a score."""
    one_row = tmp_path / "hopper-one.hdf5"
    write_d4rl_hdf5(one_row, episode_lengths=(1,), terminal_episodes=(), timeout_episodes=())
    cfg = compose_config(["preset=debug", f"env={one_row}", "algo=bc"], command="baseline")
    with pytest.raises(DatasetError, match=r"1 transition, fewer than one batch \(train.batch_si"):
        train_baseline(cfg, tmp_path / "run")
    assert not (tmp_path / "run").exists()
