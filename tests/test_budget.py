"""Raising the budget continues a run: ``train.epochs`` up resumes, down is refused.

The debug preset trains 2 epochs x 20 = 40 CBOP steps (evaluation every 20).
A run to 40 steps continued with ``train.epochs=4`` must end where a run
straight to 80 steps ends, with every evaluation logged once; a checkpoint
whose hash was computed the way it was before the budget left it (over the
whole training config) must resume and extend the same way.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
from pathlib import Path

import pytest
import torch
from d4rl_files import debug_cbop_command, pipeline_workspace
from inprocess import Finished, run_program
from training_states import assert_same_training_state

from cbop_torchrl.io import config_hash
from cbop_torchrl.trainers.checkpoint import (
    CheckpointError,
    check_resumable,
    load_checkpoint,
    training_config_hash,
)


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return pipeline_workspace(tmp_path_factory.mktemp("budget"))


def run(workspace: dict, run_dir: Path, *overrides: str) -> Finished:
    """``scripts/cbop.py`` at the debug preset, run in this process (~7 s of imports less
    than a subprocess), with float32 rollouts (auto's bf16 timing costs ~5 s a run)."""
    argv = debug_cbop_command(workspace, run_dir, "estimator.rollout_dtype=float32", *overrides)
    cache = {"CBOP_TORCHRL_CACHE": workspace["env"]["CBOP_TORCHRL_CACHE"]}
    return run_program("cbop", argv[2:], cache)


def rows(run_dir: Path, metric: str) -> list[str]:
    return (run_dir / "logs" / run_dir.name / "scalars" / f"{metric}.csv").read_text().split()


def results(run_dir: Path) -> dict:
    return json.loads((run_dir / "results.json").read_text())


@pytest.fixture(scope="module")
def first_budget(workspace: dict) -> dict:
    """A finished 40-step run in ``extended/``; copies of its checkpoint and results.json."""
    run_dir = workspace["root"] / "extended"
    done = run(workspace, run_dir)
    assert done.returncode == 0, done.stderr[-3000:]
    saved = workspace["root"] / "first-budget"
    saved.mkdir()
    for name in ("checkpoint.pt", "results.json"):
        shutil.copy(run_dir / name, saved / name)
    return {
        "run_dir": run_dir,
        "checkpoint": saved / "checkpoint.pt",
        "results": saved / "results.json",
    }


@pytest.fixture(scope="module")
def straight_run(workspace: dict) -> Path:
    """A run straight to 80 steps."""
    run_dir = workspace["root"] / "straight"
    done = run(workspace, run_dir, "train.epochs=4")
    assert done.returncode == 0, done.stderr[-3000:]
    return run_dir


@pytest.fixture(scope="module")
def extended_run(first_budget: dict, straight_run: Path, workspace: dict) -> Path:
    """The 40-step run continued with ``train.epochs=4``."""
    run_dir = first_budget["run_dir"]
    done = run(workspace, run_dir, "train.epochs=4")
    assert done.returncode == 0, done.stderr[-3000:]
    return run_dir


def test_a_run_continued_to_twice_its_budget_ends_as_a_run_straight_there(
    extended_run: Path, straight_run: Path
) -> None:
    assert_same_training_state(extended_run, straight_run)
    extended, straight = results(extended_run), results(straight_run)
    assert extended["gradient_steps"] == 80 and extended["resumed_from_step"] == 40
    assert extended["gradient_steps_this_session"] == 40
    # The first budget's final evaluation (step 40) stays; the next one is at 60, the last at 80.
    assert [record["step"] for record in extended["eval_history"]] == [20, 40, 60, 80]
    assert extended["eval_history"] == straight["eval_history"]
    for metric in ("eval/normalized_score", "eval/return", "train/loss_qvalue", "train/q_mean"):
        assert rows(extended_run, metric) == rows(straight_run, metric), metric
    assert [row.split(",")[0] for row in rows(extended_run, "eval/return")] == [
        "20", "40", "60", "80"
    ]  # fmt: skip
    # Each finished budget logged its final score at its last step.
    assert [row.split(",")[0] for row in rows(extended_run, "final/return")] == ["40", "80"]
    assert json.loads((extended_run / "config.json").read_text())["train"]["epochs"] == 4


def test_a_budget_below_the_checkpoint_is_refused_with_one_that_works(
    extended_run: Path, workspace: dict
) -> None:
    done = run(workspace, extended_run, "train.epochs=1")
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr
    message = done.stderr
    assert "checkpoint" in message and "is at gradient step 80" in message, message
    assert "train.epochs=4 (or more)" in message and "resume=false" in message, message
    assert results(extended_run)["gradient_steps"] == 80  # nothing was touched

    # The suggested value is accepted, with any steps_per_epoch that divides or not.
    state = load_checkpoint(extended_run / "checkpoint.pt")
    for steps_per_epoch in (20, 30):
        config = copy.deepcopy(state["training_config"])
        config["train"].update(epochs=1, steps_per_epoch=steps_per_epoch)
        with pytest.raises(CheckpointError) as error:
            check_resumable(state, config, extended_run / "checkpoint.pt")
        config["train"]["epochs"] = int(re.search(r"train\.epochs=(\d+) \(or more\)", str(
            error.value
        )).group(1))  # fmt: skip
        check_resumable(state, config, extended_run / "checkpoint.pt")
        assert config["train"]["epochs"] * steps_per_epoch >= 80


def old_format(state: dict) -> dict:
    """``state`` with its hash computed as before the budget left it: over the whole config."""
    legacy = dict(state)
    legacy.pop("integrity", None)  # checkpoints of that time carried no content digest
    legacy["training_config_hash"] = config_hash(state["training_config"], length=16)
    assert legacy["training_config_hash"] != training_config_hash(state["training_config"])
    return legacy


def test_an_old_format_checkpoint_resumes_and_is_extended(
    first_budget: dict, straight_run: Path, workspace: dict
) -> None:
    path = first_budget["checkpoint"]
    state = old_format(load_checkpoint(path))
    settings = state["training_config"]
    check_resumable(state, copy.deepcopy(settings), path)  # its own settings
    longer = copy.deepcopy(settings)
    longer["train"]["epochs"] = 4
    check_resumable(state, longer, path)
    other = copy.deepcopy(longer)
    other["agent"]["gamma"] = 0.95
    with pytest.raises(CheckpointError, match="other training settings") as error:
        check_resumable(state, other, path)
    assert "agent.gamma" in str(error.value) and "train.epochs" not in str(error.value)
    shorter = copy.deepcopy(settings)
    shorter["train"]["epochs"] = 1
    with pytest.raises(CheckpointError, match="train.epochs=2 \\(or more\\)"):
        check_resumable(state, shorter, path)

    # End to end, without the first budget's results.json (as if that run was killed after
    # its last checkpoint): its final evaluation at step 40 is made again, then 40 -> 80.
    run_dir = workspace["root"] / "legacy"
    run_dir.mkdir()
    (run_dir / ".run.lock").write_text("")  # what an earlier version's run leaves besides
    (run_dir / ".cbop-run").write_text("")  # marked by its user: the marker alone decides
    torch.save(state, run_dir / "checkpoint.pt")
    done = run(workspace, run_dir, "train.epochs=4")
    assert done.returncode == 0, done.stderr[-3000:]
    assert_same_training_state(run_dir, straight_run)
    assert results(run_dir)["eval_history"] == results(straight_run)["eval_history"]
    assert [row.split(",")[0] for row in rows(run_dir, "eval/return")] == ["40", "60", "80"]
    assert rows(run_dir, "eval/return") == rows(straight_run, "eval/return")[1:]


def test_results_of_the_previous_budget_do_not_end_a_continued_run(
    extended_run: Path, first_budget: dict, workspace: dict
) -> None:
    # Killed after its last checkpoint (step 80): results.json is still the 40-step one.
    final = results(extended_run)
    shutil.copy(first_budget["results"], extended_run / "results.json")
    done = run(workspace, extended_run, "train.epochs=4")
    assert done.returncode == 0, done.stderr[-3000:]
    again = results(extended_run)
    assert again["gradient_steps"] == 80
    assert again["eval_history"] == final["eval_history"]
    assert [row.split(",")[0] for row in rows(extended_run, "eval/return")] == [
        "20", "40", "60", "80"
    ]  # fmt: skip
