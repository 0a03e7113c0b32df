"""Runs in slices: ``benchmarks/learning.py --slice-steps``/``--max-minutes``.

Three slices of a tiny CBOP run (debug preset, 30 gradient steps, a checkpoint
every 10) end with the same checkpoint tensors and the same logged metrics as
one uninterrupted run, bit for bit; each slice exits 0 and says how to resume.
The wall-clock decision is checked with an injected clock.
"""

from __future__ import annotations

import contextlib
import json
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from d4rl_files import write_d4rl_hdf5

from benchmarks import learning
from cbop_torchrl.config import ConfigError
from cbop_torchrl.trainers.slicing import (
    DEADLINE_ENV,
    SLICE_EXIT_CODE,
    STEPS_ENV,
    SliceBudget,
    SliceBudgetHook,
)

DATASET = "hopper-medium-replay-gen"
# Timings vary from run to run; every other logged metric must match exactly.
TIMING_METRICS = ("grad_steps_per_s", "wall_time", "seconds", "_s.csv")

pytestmark = pytest.mark.usefixtures("no_repository_copies")


def bench_args(root: Path, *extra: str) -> list[str]:
    return [
        *("--datasets", DATASET, "--algos", "cbop", "--seeds", "0", "--preset", "debug"),
        *("--epochs", "3", "--steps-per-epoch", "10", "--eval-interval", "10", "--no-analysis"),
        *("--results", str(root / "results"), "--runs", str(root / "runs")),
        *extra,
        "estimator.rollout_dtype=float32",  # auto's bf16 timing costs ~5 s a run, untested here
    ]


def run_dir_of(root: Path) -> Path:
    return next((root / "runs").glob(f"{DATASET}/*/debug/cbop-debug/seed0"))


def tensors(state: object, prefix: str = "") -> dict[str, torch.Tensor]:
    """Every tensor in a nested checkpoint, by its path."""
    if isinstance(state, torch.Tensor):
        return {prefix: state}
    found: dict[str, torch.Tensor] = {}
    if isinstance(state, dict):
        for key, value in state.items():
            found.update(tensors(value, f"{prefix}/{key}"))
    elif isinstance(state, (list, tuple)):
        for index, value in enumerate(state):
            found.update(tensors(value, f"{prefix}/{index}"))
    return found


def metric_rows(run_dir: Path) -> dict[str, str]:
    """The CBOP stage's CSV files (the sliced run found dynamics, BC and FQE in the cache)."""
    scalars = next((run_dir / "logs").glob("*/scalars"))
    return {
        path.relative_to(scalars).as_posix(): path.read_text()
        for stage in ("train", "eval")
        for path in sorted((scalars / stage).rglob("*.csv"))
        if not any(word in path.name for word in TIMING_METRICS)
    }


def test_three_slices_equal_one_uninterrupted_run(
    tmp_path: Path, isolated_cache: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_d4rl_hdf5(
        isolated_cache / "generated" / f"{DATASET}.hdf5",
        episode_lengths=(150,) * 8,
        terminal_episodes=(0, 3),
    )
    whole, sliced = tmp_path / "whole", tmp_path / "sliced"
    assert learning.main(bench_args(whole)) == 0
    capsys.readouterr()

    args = bench_args(sliced, "--slice-steps", "10")
    for expected_step in (10, 20):
        assert learning.main(args) == 0
        out = capsys.readouterr().out
        assert f"stopped at gradient step {expected_step} of 30" in out
        assert "resume with the same command" in out
        assert not (sliced / "results" / DATASET / "cbop-debug" / "seed0.json").exists()
    assert learning.main(args) == 0
    assert "finished" in capsys.readouterr().out

    summary = json.loads((sliced / "results" / DATASET / "cbop-debug" / "seed0.json").read_text())
    assert [s["end_step"] for s in summary["slices"]] == [10, 20, 30]
    assert [s["outcome"] for s in summary["slices"]][-1] == "finished"
    assert summary["gradient_steps"] == 30

    expected = torch.load(run_dir_of(whole) / "checkpoint.pt", weights_only=True)
    actual = torch.load(run_dir_of(sliced) / "checkpoint.pt", weights_only=True)
    assert actual["step"] == expected["step"] == 30
    expected_tensors, actual_tensors = tensors(expected), tensors(actual)
    assert expected_tensors.keys() == actual_tensors.keys()
    assert any("optimizer" in key for key in expected_tensors)
    for key, value in expected_tensors.items():
        assert torch.equal(value, actual_tensors[key]), key

    expected_rows, actual_rows = metric_rows(run_dir_of(whole)), metric_rows(run_dir_of(sliced))
    assert "train/loss_qvalue.csv" in expected_rows and "eval/normalized_score.csv" in expected_rows
    assert expected_rows == actual_rows
    whole_summary = json.loads(
        (whole / "results" / DATASET / "cbop-debug" / "seed0.json").read_text()
    )
    assert summary["final_normalized_score"] == whole_summary["final_normalized_score"]
    assert "slices" not in whole_summary


def _hook(budget: SliceBudget, clock: list[float]) -> SliceBudgetHook:
    checkpoint = SimpleNamespace(interval=100, total_steps=1000, last_saved_step=None, path="x")
    return SliceBudgetHook(budget, checkpoint, clock=lambda: clock[0])


def test_the_deadline_stops_before_the_next_checkpoint_would_pass_it() -> None:
    now = [1000.0]
    hook = _hook(SliceBudget(deadline=1000.0 + 250.0), now)
    hook.first = (401, 1000.0)  # this process started after step 400, at t = 1000 s
    # 1 s per step: the checkpoint at 600 leaves 50 s, the next one (700) needs 100 x 1.25 s.
    assert not hook.should_stop(500, 1100.0)  # 150 s left, next save needs 125 s
    assert hook.should_stop(600, 1200.0)
    assert hook.should_stop(500, 1251.0)  # past the deadline: stop at any checkpoint
    # Faster steps fit another interval.
    assert not hook.should_stop(600, 1000.0 + 0.2 * 199)


def test_the_step_budget_counts_from_where_the_process_started() -> None:
    hook = _hook(SliceBudget(steps=200), [0.0])
    hook.first = (301, 0.0)
    assert not hook.should_stop(400, 0.0)
    assert hook.should_stop(500, 0.0)


def test_the_budget_comes_from_the_environment_and_bad_values_are_named() -> None:
    assert SliceBudget.from_environ({}) is None
    budget = SliceBudget.from_environ({DEADLINE_ENV: "1700000000.5", STEPS_ENV: "20"})
    assert budget == SliceBudget(deadline=1700000000.5, steps=20)
    with pytest.raises(ConfigError, match=DEADLINE_ENV):
        SliceBudget.from_environ({DEADLINE_ENV: "soon"})
    with pytest.raises(ConfigError, match=STEPS_ENV):
        SliceBudget.from_environ({STEPS_ENV: "0"})


@pytest.mark.parametrize("flag", [("--max-minutes", "0"), ("--slice-steps", "-3")])
def test_a_budget_that_is_not_positive_is_refused(
    flag: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        learning.parse_args(list(flag))
    assert exit_.value.code == 2
    assert flag[0] in capsys.readouterr().err


@contextlib.contextmanager
def signal_ignored(signum: int) -> Iterator[None]:
    previous = signal.signal(signum, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signum, previous)


@pytest.mark.parametrize("logged", [None, 9000])
def test_a_run_interrupted_between_checkpoints_is_recorded_in_the_stage_it_was_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, logged: int | None
) -> None:
    """Killed at the deadline 9,000 steps into a CBOP stage that saves every 10,000, a run
    is recorded in its CBOP stage (its logged curves say so), not before it."""
    run_dir = tmp_path / "run"
    curve = run_dir / "logs" / "run" / "scalars" / "train" / "loss_qvalue.csv"
    curve.parent.mkdir(parents=True)
    if logged is not None:
        curve.write_text(f"1000,2.0\n{logged},1.0\n")
    monkeypatch.setattr(learning, "KILL_GRACE_S", 0.2)
    interrupted = tmp_path / "interrupted"
    child = (
        "import pathlib, sys, time\n"
        "try:\n    time.sleep(60)\n"
        f"except KeyboardInterrupt:\n    pathlib.Path({str(interrupted)!r}).touch()\n"
        "    sys.exit(130)\n"
    )
    args = SimpleNamespace(slice_steps=None, max_minutes=0.01)
    with signal_ignored(signal.SIGINT):  # as in a job put in the background with `&`
        outcome = learning.run_slice(
            [sys.executable, "-c", child], run_dir, args, deadline=time.time() + 1.5
        )
    assert outcome.returncode == SLICE_EXIT_CODE and outcome.step is None
    # SIGINT reached the program as KeyboardInterrupt (its own way out), not the SIGKILL
    assert interrupted.is_file()
    assert outcome.logged_step == logged
    record = json.loads((run_dir / "slices.json").read_text())[-1]
    assert record["stage"] == ("before cbop" if logged is None else "cbop")
    assert record["last_logged_step"] == logged
    label = learning.slice_end_label(outcome, 50000)
    if logged is None:
        assert label == "before its CBOP stage"
    else:
        assert label.startswith("in its CBOP stage after gradient step 9000 of 50000")
