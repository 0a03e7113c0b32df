"""A run decides once and writes one explicit checkpoint dict; the earlier layout resumes.

``tests/data/checkpoint_layout1_debug_step20.pt`` is a checkpoint of the earlier layout (the
whole TorchRL ``Trainer.state_dict()`` under ``trainer``), written by the code before
:mod:`cbop_torchrl.trainers.run_state` existed: ``scripts/cbop.py preset=debug
progress=false estimator.rollout_dtype=float32 seed=0`` on the bundled demo data, stopped by
``CBOP_TORCHRL_SLICE_STEPS=20`` at gradient step 20 of 40.
"""

from __future__ import annotations

import ast
import shutil
from pathlib import Path
from unittest import mock

import pytest
import torch
from inprocess import run_program
from training_states import assert_same_training_state

from cbop_torchrl.trainers import decisions as decisions_module
from cbop_torchrl.trainers.checkpoint import CHECKPOINT_NAME, load_checkpoint, seal
from cbop_torchrl.trainers.decisions import StageSeeds
from cbop_torchrl.trainers.run_state import RUN_STATE_KEYS, RUN_STATE_LAYOUT, upgrade_run_state
from cbop_torchrl.trainers.slicing import SLICE_EXIT_CODE

ROOT = Path(__file__).resolve().parents[1]
OLD_CHECKPOINT = ROOT / "tests" / "data" / "checkpoint_layout1_debug_step20.pt"
COMMAND = ("preset=debug", "progress=false", "estimator.rollout_dtype=float32", "seed=0")


def cbop(run_dir: Path, cache: Path, *overrides: str, env: dict[str, str] | None = None):
    return run_program(
        "cbop",
        [*COMMAND, f"hydra.run.dir={run_dir}", *overrides],
        {"CBOP_TORCHRL_CACHE": str(cache), **(env or {})},
    )


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """An uninterrupted 40-step run, with the calls that decide device and capture counted."""
    root = tmp_path_factory.mktemp("layout")
    calls = {"resolve_device": 0, "uses_cuda_graph": 0}

    def counted(name):
        original = getattr(decisions_module, name)

        def wrapper(*args, **kwargs):
            calls[name] += 1
            return original(*args, **kwargs)

        return mock.patch.object(decisions_module, name, wrapper)

    with counted("resolve_device"), counted("uses_cuda_graph"):
        finished = cbop(root / "whole", root / "cache")
    assert finished.returncode == 0, finished.stderr[-3000:]
    return {"root": root, "cache": root / "cache", "calls": calls}


def test_a_run_decides_device_and_capture_once(workspace: dict) -> None:
    assert workspace["calls"] == {"resolve_device": 1, "uses_cuda_graph": 1}
    state = load_checkpoint(workspace["root"] / "whole" / CHECKPOINT_NAME)
    assert state["decisions"] == {
        "device": "cpu",
        "dtype": "float32",
        "cuda_graph": False,
        "seeds": StageSeeds.of(0).to_dict(),
        "config_hash": state["training_config_hash"],
    }
    assert StageSeeds.of(0).to_dict() == {
        "run": 0, "dynamics": 0, "bc": 1, "fqe": 2, "cbop": 3, "evaluation": 0, "baseline": 5,
    }  # fmt: skip


def test_nothing_below_the_run_decides_again() -> None:
    """Only decisions.py calls resolve_device/uses_cuda_graph or seeds the process, among
    the run's modules (trainers/ and baselines.py)."""
    decided = {"resolve_device", "uses_cuda_graph", "seed_everything"}
    package = ROOT / "cbop_torchrl"
    callers = {}
    for path in [*sorted((package / "trainers").glob("*.py")), package / "baselines.py"]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call):
                name = getattr(node.func, "id", getattr(node.func, "attr", None))
                if name in decided:
                    callers.setdefault(path.name, set()).add(name)
    assert callers == {"decisions.py": decided}


def test_the_checkpoint_is_one_dict_whose_keys_name_what_they_hold(workspace: dict) -> None:
    state = load_checkpoint(workspace["root"] / "whole" / CHECKPOINT_NAME)
    optional = {"actor_average", "diagnostics_history"}
    assert set(state) == (set(RUN_STATE_KEYS) - optional) | {"data", "rollout_choice"}
    assert state["layout"] == RUN_STATE_LAYOUT and "trainer" not in state
    assert state["step"] == state["trainer_loop"]["collected_frames"] == 40
    assert state["trainer_loop"]["optim_steps"] == 40
    assert [record["step"] for record in state["evaluation_history"]] == [20]
    assert state["sampler_generator"].dtype == torch.uint8
    assert {"python", "torch_cpu", "numpy"} <= set(state["rng"])
    for key, value in state["actor"].items():  # the actor's weights are the loss module's
        assert torch.equal(value, state["loss_module"][f"actor_network_params.{key}"])


def test_the_earlier_layout_is_translated_entry_by_entry() -> None:
    old = load_checkpoint(OLD_CHECKPOINT)
    trainer = old["trainer"]
    new = upgrade_run_state(old)
    assert "trainer" not in new and new["layout"] == RUN_STATE_LAYOUT and new["step"] == 20
    for key, value in trainer["loss_module"].items():
        assert torch.equal(new["loss_module"][key], value), key
    assert new["optimizer"] is trainer["optimizer"]
    assert torch.equal(new["sampler_generator"], trainer["replay_sampler"]["generator"])
    assert new["evaluation_history"] == trainer["evaluation"]["history"]
    assert new["metrics_windows"] == trainer["metrics"]
    assert new["trainer_loop"]["optim_steps"] == trainer["state"]["_optim_count"] == 20
    assert new["rng"] is trainer["rng"] and "actor_average" not in new
    assert upgrade_run_state(new) is new  # this layout stays as it is


def earlier_layout(state: dict) -> dict:
    """A checkpoint of this layout written back in the earlier one (its training state as
    TorchRL's ``Trainer.state_dict()`` under ``trainer``): what the code before the run-state
    dict would have written at the same step. Its shape is checked against the committed
    checkpoint that code wrote (:func:`test_earlier_layout_is_the_shape_the_earlier_code_wrote`)."""
    loop = state["trainer_loop"]
    trainer = {
        "collector": {},
        "loss_module": state["loss_module"],
        "state": {"_last_log": loop["last_log"], "_last_save": loop["last_save"],
                  "_optim_count": loop["optim_steps"],
                  "collected_frames": loop["collected_frames"]},
        "optimizer": state["optimizer"],
        "optimization_stepper": {},
        "replay_sampler": {"generator": state["sampler_generator"]},
        "metrics": state["metrics_windows"],
        "evaluation": {"history": state["evaluation_history"]},
        "rng": state["rng"],
    }  # fmt: skip
    if "actor_average" in state:
        trainer["actor_average"] = state["actor_average"]
    if "diagnostics_history" in state:
        trainer["diagnostics"] = {"history": state["diagnostics_history"]}
    moved = {"layout", "decisions", *RUN_STATE_KEYS, "integrity"}
    kept = {key: value for key, value in state.items() if key not in moved or key in KEPT}
    return seal({**kept, "trainer": trainer})


KEPT = {"step", "total_steps", "actor", "policy", "data", "rollout_choice", "training_config",
        "training_config_hash", "wall_time_s", "format"}  # fmt: skip
"""Top-level entries both layouts hold."""


def key_tree(value) -> object:
    """The nested keys of a checkpoint entry (dicts' keys, down to the tensors)."""
    if isinstance(value, dict):
        return {str(key): key_tree(item) for key, item in value.items()}
    return type(value).__name__ if isinstance(value, torch.Tensor) else None


def test_earlier_layout_is_the_shape_the_earlier_code_wrote() -> None:
    written = load_checkpoint(OLD_CHECKPOINT)  # by the earlier code
    rewritten = earlier_layout(upgrade_run_state(written))
    assert set(rewritten) == set(written)
    assert key_tree(rewritten["trainer"]) == key_tree(written["trainer"])


def old_run_dir(run_dir: Path, checkpoint: Path = OLD_CHECKPOINT) -> Path:
    """A run directory as the earlier code left it after step 20 (its marker, its checkpoint)."""
    run_dir.mkdir(parents=True)
    (run_dir / ".cbop-run").touch()
    shutil.copy(checkpoint, run_dir / CHECKPOINT_NAME)
    return run_dir


def test_the_committed_earlier_checkpoint_resumes_to_its_last_step(workspace: dict) -> None:
    """The earlier code's own file resumes and finishes. (Its weights are this CPU kind's: on
    another, its first 20 steps differ in the last bits from an uninterrupted run's, so the
    exact comparison is the next test's, on a checkpoint written here.)"""
    run_dir = old_run_dir(workspace["root"] / "committed")
    finished = cbop(run_dir, workspace["cache"])
    assert finished.returncode == 0, finished.stderr[-3000:]
    state = load_checkpoint(run_dir / CHECKPOINT_NAME)
    assert state["layout"] == RUN_STATE_LAYOUT and state["step"] == 40
    assert [record["step"] for record in state["evaluation_history"]] == [20]
    assert all(torch.isfinite(value).all() for value in state["loss_module"].values())


def test_a_checkpoint_of_the_earlier_layout_resumes_to_the_uninterrupted_weights(
    workspace: dict,
) -> None:
    sliced = workspace["root"] / "sliced"
    stopped = cbop(sliced, workspace["cache"], env={"CBOP_TORCHRL_SLICE_STEPS": "20"})
    assert stopped.returncode == SLICE_EXIT_CODE, stopped.stderr[-3000:]
    at_step_20 = load_checkpoint(sliced / CHECKPOINT_NAME)
    assert at_step_20["step"] == 20
    earlier = workspace["root"] / "earlier.pt"
    torch.save(earlier_layout(at_step_20), earlier)
    run_dir = old_run_dir(workspace["root"] / "old", earlier)
    finished = cbop(run_dir, workspace["cache"])
    assert finished.returncode == 0, finished.stderr[-3000:]
    assert_same_training_state(run_dir, workspace["root"] / "whole")
    expected = load_checkpoint(workspace["root"] / "whole" / CHECKPOINT_NAME)
    actual = load_checkpoint(run_dir / CHECKPOINT_NAME)
    assert actual["layout"] == RUN_STATE_LAYOUT and actual["step"] == 40
    assert torch.equal(expected["sampler_generator"], actual["sampler_generator"])
    assert actual["evaluation_history"] == expected["evaluation_history"]
    policy = torch.load(run_dir / "policy.pt", weights_only=True)["actor"]
    for key, value in torch.load(workspace["root"] / "whole" / "policy.pt")["actor"].items():
        assert torch.equal(value, policy[key]), key


def test_an_earlier_checkpoint_missing_an_entry_is_refused_with_a_command(
    workspace: dict,
) -> None:
    run_dir = old_run_dir(workspace["root"] / "damaged")
    state = torch.load(run_dir / CHECKPOINT_NAME, weights_only=True)
    del state["trainer"]["replay_sampler"]
    torch.save(seal(state), run_dir / CHECKPOINT_NAME)
    refused = cbop(run_dir, workspace["cache"])
    assert refused.returncode == 2, refused.stderr[-3000:]
    message = " ".join(refused.stderr.split())
    assert "earlier layout" in message and "'replay_sampler'" in message
    assert "resume=false" in message and f"hydra.run.dir={run_dir}" in message
    restarted = cbop(run_dir, workspace["cache"], "resume=false")  # the suggested command
    assert restarted.returncode == 0, restarted.stderr[-3000:]
    assert load_checkpoint(run_dir / CHECKPOINT_NAME)["step"] == 40
