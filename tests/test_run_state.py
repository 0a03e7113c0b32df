"""Faults on the run directory: a second copy of a command, SIGKILL at several points, restarts.

The runs go through ``scripts/cbop.py`` at the debug preset on the bundled demo
data. A kill is placed deterministically: a small driver runs the script with
TorchRL's CSV logger patched to SIGKILL its own process right after it writes a
chosen row (the worst moment: rows logged past the last checkpoint), or to
wait there while a second copy of the command is started. Runs whose own process is not
what is checked (the reference, a resume after the kills, the refused second copy) run the
same program in the test process (``tests/inprocess.py``).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from inprocess import Finished, run_program

from cbop_torchrl.trainers.rundir import LOCK_NAME, RunLock, RunLockedError

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "cbop.py"

DRIVER = """
import os, signal, sys, time, runpy
from pathlib import Path
from cbop_torchrl.trainers import logging as run_logging

prefix, rows = os.environ["FAULT_PREFIX"], int(os.environ["FAULT_ROWS"])
action = os.environ["FAULT"]
original = run_logging.ResumableCSVLogger.log_scalar
seen = []

def log_scalar(self, name, value, step=None):
    original(self, name, value, step)
    if name.startswith(prefix):
        seen.append(name)
        if len(seen) == rows:
            if action == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            Path(os.environ["FAULT_WAITING"]).touch()
            while not Path(os.environ["FAULT_GO"]).exists():
                time.sleep(0.05)

run_logging.ResumableCSVLogger.log_scalar = log_scalar
script = sys.argv[1]
sys.argv = sys.argv[1:]
runpy.run_path(script, run_name="__main__")
"""

# Four dynamics epochs (about 4 rows each), so a kill can land inside the dynamics stage.
# float32 rollouts: auto's bf16 timing (~5 s a run) is not what these tests check.
OVERRIDES = (
    "preset=debug", "progress=false", "dynamics.max_epochs=4", "dynamics.patience=10",
    "estimator.rollout_dtype=float32",
)  # fmt: skip


def command(run_dir: Path, *extra: str, driver: bool = False) -> list[str]:
    head = [sys.executable, "-c", DRIVER] if driver else [sys.executable]
    return [*head, str(SCRIPT), *OVERRIDES, f"hydra.run.dir={run_dir}", *extra]


def run_here(run_dir: Path, cache: Path, *extra: str) -> Finished:
    """The same command run in this process (where only another process's lock, not this
    run's own process, matters), with the cache ``cache``."""
    return run_program("cbop", command(run_dir, *extra)[2:], {"CBOP_TORCHRL_CACHE": str(cache)})


def environment(cache: Path, **fault: str) -> dict[str, str]:
    return {**os.environ, "CBOP_TORCHRL_CACHE": str(cache), "WANDB_MODE": "offline", **fault}


def csv_steps(run_dir: Path) -> dict[str, list[float]]:
    """``{metric: [step, ...]}`` over every CSV file of the run, in file order."""
    steps = {}
    for scalars in run_dir.glob("logs/*/scalars"):
        for path in sorted(scalars.rglob("*.csv")):
            lines = path.read_text().splitlines()
            steps[path.relative_to(scalars).as_posix()] = [float(x.split(",")[0]) for x in lines]
    return steps


def run_killed(run_dir: Path, cache: Path, prefix: str, rows: int) -> subprocess.CompletedProcess:
    fault = {"FAULT": "kill", "FAULT_PREFIX": prefix, "FAULT_ROWS": str(rows)}
    done = subprocess.run(
        command(run_dir, driver=True), env=environment(cache, **fault),
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert done.returncode == -signal.SIGKILL, (prefix, done.stdout[-2000:], done.stderr[-3000:])
    return done


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An uninterrupted run with an empty cache (every stage trained); returns its root."""
    root = tmp_path_factory.mktemp("reference")
    done = run_here(root / "run", root / "cache")
    assert done.returncode == 0, done.stderr[-3000:]
    return root


@pytest.fixture(scope="module")
def reference(reference_run: Path) -> dict[str, list[float]]:
    """The CSV steps of the uninterrupted run."""
    return csv_steps(reference_run / "run")


def test_every_csv_step_once_after_kills_resumes_and_a_refused_second_copy(
    tmp_path: Path, reference: dict[str, list[float]]
) -> None:
    run_dir, cache = tmp_path / "run", tmp_path / "cache"
    assert any(name.startswith("dynamics/") for name in reference)
    assert all(len(steps) == len(set(steps)) for steps in reference.values()), reference

    # SIGKILL inside the dynamics stage (in its second epoch's rows; it is retrained from
    # epoch 1), after BC's row (BC resumes from its step-20 partial checkpoint), in the
    # CBOP stage's train/ rows past a checkpoint, and after the final score (the final
    # checkpoint is written, results.json is not).
    for prefix, rows in (("dynamics/", 6), ("bc/", 1), ("train/", 40)):
        killed = run_killed(run_dir, cache, prefix, rows)
    assert not (run_dir / "results.json").exists()
    killed = run_killed(run_dir, cache, "final/", 1)
    assert not (run_dir / "results.json").exists()
    resumed = run_here(run_dir, cache)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    # The lock file of the killed process still named it; the resumed run took it over.
    assert "took over the lock of a run that died (pid" in resumed.stdout, resumed.stdout
    assert killed.returncode == -signal.SIGKILL

    steps = csv_steps(run_dir)
    assert steps == reference

    # A restart with resume=false starts the CSV files over and says so. While it runs
    # (held at its first CBOP row), a second copy of the same command is refused at once.
    restarted = start_waiting(run_dir, cache, tmp_path, "resume=false")
    try:
        refused_in = time.monotonic()
        second = run_here(run_dir, cache, "resume=false")  # this process, not the holder
        refused_in = time.monotonic() - refused_in
        assert second.returncode == 2, second.stderr[-3000:]
        assert "Traceback" not in second.stderr
        assert str(run_dir) in second.stderr and f"pid {restarted.pid} on" in second.stderr
        assert refused_in < 60
    finally:
        (tmp_path / "go").touch()
    out, err = restarted.communicate(timeout=300)
    assert restarted.returncode == 0, err[-3000:]
    assert "resume=false: removed the previous run's checkpoint.pt" in out
    assert (run_dir / LOCK_NAME).read_text() == ""  # released at the end
    # The pretraining stages now come from the cache and log nothing; the rest once each.
    assert csv_steps(run_dir) == {
        name: steps for name, steps in reference.items() if name.split("/")[0] in (
            "train", "eval", "final"
        )
    }  # fmt: skip


def start_waiting(run_dir: Path, cache: Path, tmp_path: Path, *extra: str) -> subprocess.Popen:
    """Starts the command and returns once it holds at its first ``train/`` row."""
    waiting, go = tmp_path / "waiting", tmp_path / "go"
    fault = {
        "FAULT": "wait", "FAULT_PREFIX": "train/", "FAULT_ROWS": "1",
        "FAULT_WAITING": str(waiting), "FAULT_GO": str(go),
    }  # fmt: skip
    process = subprocess.Popen(
        command(run_dir, *extra, driver=True), env=environment(cache, **fault),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 240
    while not waiting.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    if not waiting.exists():
        go.touch()
        process.kill()
        pytest.fail(f"the run did not reach its first CBOP row: {process.communicate()[1][-3000:]}")
    return process


def test_a_lock_left_by_a_dead_process_is_taken_over(tmp_path: Path) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)  # fmt: skip
    (tmp_path / LOCK_NAME).write_text(f"pid {dead.stdout.strip()} on somewhere\n")
    lock = RunLock(tmp_path)
    assert lock.previous_holder == f"pid {dead.stdout.strip()} on somewhere"
    assert (tmp_path / LOCK_NAME).read_text().startswith(f"pid {os.getpid()} on ")
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time; from cbop_torchrl.trainers.rundir import RunLock; "
         f"lock = RunLock({str(tmp_path / 'other')!r}); print('locked', flush=True); "
         "time.sleep(60)"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "locked"
        with pytest.raises(RunLockedError, match=f"process pid {holder.pid} on"):
            RunLock(tmp_path / "other")
    finally:
        holder.kill()
        holder.wait()
    RunLock(tmp_path / "other").release()  # the killed holder's lock is free again
    lock.release()
    assert (tmp_path / LOCK_NAME).read_text() == ""


def test_wandb_offline_logs_the_config_and_a_resumed_run_keeps_its_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import wandb.sdk.wandb_init as wandb_init

    from cbop_torchrl.trainers.logging import log_final, log_scalars, make_logger

    monkeypatch.setenv("WANDB_MODE", "offline")
    run_config = {"seed": 7, "estimator": {"psi": 1.25}, "marker": "config-marker-1234"}
    # Both sessions start in the same second (wandb names a session's directory after its
    # start second), the case that used to lose a session's records: pinned, not left to luck.
    start = time.time()
    monkeypatch.setattr(wandb_init, "time", type("PinnedClock", (), {
        "time": staticmethod(lambda: start), "__getattr__": lambda self, name: getattr(time, name)
    })())  # fmt: skip

    def open_logger():
        return make_logger(
            "wandb", tmp_path, "run", "proj", mode="offline", group="grp",
            tags=["tag-one"], run_config=run_config,
        )  # fmt: skip

    first = open_logger()
    run_id = first.experiment.id
    assert first.experiment.config["marker"] == "config-marker-1234"
    assert first.experiment.config["estimator"]["psi"] == 1.25
    assert first.experiment.group == "grp" and list(first.experiment.tags) == ["tag-one"]
    log_scalars(first, {"train/loss": 1.0}, 10)
    first.shutdown()

    resumed = open_logger()  # a second session of the same run directory
    assert resumed.experiment.id == run_id
    assert resumed.experiment.config["marker"] == "config-marker-1234"
    log_scalars(resumed, {"train/loss": 2.0}, 20)
    # TorchRL's WandbLogger logs each metric against its own step key at the step given.
    assert resumed.experiment.summary["train/step"] == 20
    assert resumed.experiment.summary["train/loss"] == 2.0
    log_final(resumed, run_config, {"final/return": 3.0}, 20)
    # Each session has its own offline-run-<start second>-<id> directory; two sessions that
    # start in the same second get "-1", "-2", ... appended by wandb (which made this test
    # flaky when it looked for the unsuffixed name only); `wandb sync` takes either.
    records = [
        path
        for path in (tmp_path / "logs" / "wandb").glob(
            f"offline-run-*-{run_id}*/run-{run_id}.wandb"
        )
        if re.fullmatch(rf"offline-run-\d{{8}}_\d{{6}}-{run_id}(-\d+)?", path.parent.name)
    ]
    assert len(records) == 2  # two sessions, one run id
    # The config reached the offline run's records on disk. wandb writes them from its own
    # service process, so the resumed session's file may hold only its header yet; the
    # finished first session's holds the config. Which file is the first's cannot be told by
    # modification time (a busy machine reorders the writes), so one of the two must hold it.
    assert any(b"config-marker-1234" in path.read_bytes() for path in records)


def test_tensorboard_gets_hparams_with_the_final_score(tmp_path: Path) -> None:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from cbop_torchrl.trainers.logging import log_final, make_logger

    logger = make_logger("tensorboard", tmp_path, "run")
    log_final(logger, {"seed": 3, "agent": {"lr": 0.1}}, {"final/return": 12.5}, 40)
    events = list((tmp_path / "logs").rglob("hparams/events.out.tfevents.*"))
    assert events
    accumulator = EventAccumulator(str(events[0].parent)).Reload()
    assert accumulator.Scalars("final/return")[0].value == 12.5
    plugin = accumulator.PluginTagToContent("hparams")
    assert any(b"agent/lr" in content for content in plugin.values())


def test_damaged_cache_files_are_named_and_retrained(
    reference_run: Path, reference: dict[str, list[float]], tmp_path: Path
) -> None:
    cache = reference_run / "cache"
    damaged = [
        *cache.glob("dynamics/*/model.pt"),
        *cache.glob("pretrain/bc/*/result.pt"),
        *cache.glob("pretrain/fqe/*/result.pt"),
    ]
    assert len(damaged) == 3, damaged
    for path in damaged:
        path.write_bytes(b"not a torch file")
    done = run_here(tmp_path / "run", cache)
    assert done.returncode == 0, done.stderr[-3000:]
    for path in damaged:
        assert f"cache file {path} cannot be read" in done.stderr, (path, done.stderr[-3000:])
    assert "will likely succeed" not in done.stderr and "Traceback" not in done.stderr
    assert csv_steps(tmp_path / "run") == reference  # every stage was trained again


def test_checkpoint_errors_never_suggest_unsafe_loading(tmp_path: Path) -> None:
    import pathlib

    import torch

    from cbop_torchrl.trainers.checkpoint import CheckpointError, load_checkpoint

    path = tmp_path / "checkpoint.pt"
    torch.save({"format": "cbop-torchrl/1", "odd": pathlib.PurePosixPath("not/a/tensor")}, path)
    with pytest.raises(CheckpointError) as refused:
        load_checkpoint(path)
    message = str(refused.value)
    assert str(path) in message and "weights_only=True" in message
    assert "weights_only=False" not in message and "likely succeed" not in message


def test_runs_sharing_a_cache_entry_make_it_once(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A second process wanting a cache entry another one is making waits for it to finish."""
    from cbop_torchrl.io import cache_entry_lock

    entry, released = tmp_path / "entry", tmp_path / "released"
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time; from pathlib import Path; "
         "from cbop_torchrl.io import cache_entry_lock\n"
         f"with cache_entry_lock({str(entry)!r}, 'stage'):\n"
         "    print('holding', flush=True); time.sleep(2)\n"
         f"    Path({str(released)!r}).touch()\n"],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "holding"
        with cache_entry_lock(entry, "BC stage"):
            assert released.exists()  # entered only after the holder was done
        assert "waiting for another process that is making the same BC stage" in (
            capsys.readouterr().out
        )
    finally:
        holder.wait(timeout=60)
