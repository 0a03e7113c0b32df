"""End to end: the debug preset through the CLI, and kill-and-resume equivalence.

Runs use a small generated D4RL-format file (the debug preset's sizes) and a
private cache shared by the runs of this module, so pretraining is done once.
"""

from __future__ import annotations

import copy
import json
import math
import signal
import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from d4rl_files import debug_cbop_command as cli
from d4rl_files import pipeline_workspace
from inprocess import run_program, train_cbop

from cbop_torchrl.evaluation.summaries import summarize_run
from cbop_torchrl.trainers.checkpoint import (
    CheckpointError,
    check_resumable,
    load_checkpoint,
    load_policy,
)
from cbop_torchrl.trainers.offline import fqe_scheme

ROOT = Path(__file__).resolve().parents[1]


def run_here(workspace: dict, run_dir: Path, *overrides: str):
    """``cli(workspace, run_dir, *overrides)`` run in this process: what a run writes is
    checked, not the process (only the run that is killed is a subprocess)."""
    cache = {"CBOP_TORCHRL_CACHE": workspace["env"]["CBOP_TORCHRL_CACHE"]}
    return run_program("cbop", cli(workspace, run_dir, *overrides)[2:], cache)


def train_here(workspace: dict, run_dir: Path, *overrides: str) -> dict:
    """The same run through the Python API (``results.json``'s dict), for tests that read
    only the files a run writes."""
    cache = {"CBOP_TORCHRL_CACHE": workspace["env"]["CBOP_TORCHRL_CACHE"]}
    return train_cbop(cli(workspace, run_dir, *overrides)[2:], run_dir, cache)


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return pipeline_workspace(tmp_path_factory.mktemp("pipeline"))


@pytest.fixture(scope="module")
def reference_run(workspace: dict) -> Path:
    """An uninterrupted debug run (all stages, evaluation, results.json)."""
    run_dir = workspace["root"] / "reference"
    done = run_here(workspace, run_dir)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "normalized score" in done.stdout
    return run_dir


def test_debug_preset_end_to_end(reference_run: Path) -> None:
    results = json.loads((reference_run / "results.json").read_text())
    for key in (
        "dataset",
        "normalized_score_mean",
        "normalized_score_std",
        "return_mean",
        "episodes",
        "gradient_steps",
        "wall_time_s",
        "seed",
    ):
        assert key in results, key
    assert results["dataset"] == "hopper-medium-replay-tiny"
    assert results["gradient_steps"] == 40 and results["episodes"] == 2 and results["seed"] == 0
    assert math.isfinite(results["normalized_score_mean"])
    settings = results["settings"]
    assert settings["psi"] == 2.0  # the paper's hopper medium-replay psi
    # what a table of configurations needs, with the debug preset's values
    assert (settings["num_qvalue_nets"], settings["num_elites"], settings["horizon"]) == (3, 2, 2)
    assert settings["num_dynamics_members"] == 3 and settings["batch_size"] == 32
    assert settings["dynamics_max_epochs"] == 1
    assert settings["critic_hidden_sizes"] == settings["actor_hidden_sizes"] == [32, 32]
    assert settings["q_init"] == "torch"
    assert settings["fqe"] == {
        "scheme": "soft", "rounds": None, "steps": 40, "lr": 3e-4, "batch_size": 64,
    }  # fmt: skip
    assert results["expected_horizon_start"] is not None
    # one evaluation during training (interval 20) besides the final one
    assert [record["step"] for record in results["eval_history"]] == [20, 40]

    checkpoint = torch.load(reference_run / "checkpoint.pt", weights_only=True)
    assert checkpoint["step"] == 40
    actor, family, meta = load_policy(reference_run / "policy.pt")
    assert family.name == "hopper" and meta["step"] == 40
    for key, value in actor.state_dict().items():
        assert torch.equal(value, checkpoint["actor"][key])

    scalars = next((reference_run / "logs").glob("*/scalars"))
    for name in (
        "train/loss_qvalue",
        "train/alpha",
        "train/cbop/expected_horizon",
        "train/cbop/weights/0",
        "train/cbop/value_var_share/0",
        "train/grad_steps_per_s",
        "train/q_mean",
        "train/q_member_std",
        "eval/normalized_score",
        "bc/loss_bc",
        "fqe/loss_qvalue",
    ):
        assert (scalars / f"{name}.csv").is_file(), name


def test_killed_run_resumes_to_the_same_parameters(workspace: dict, reference_run: Path) -> None:
    run_dir = workspace["root"] / "killed"
    process = subprocess.Popen(
        cli(workspace, run_dir),
        env=workspace["env"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    checkpoint = run_dir / "checkpoint.pt"
    deadline = time.monotonic() + 120
    while not checkpoint.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)
    process.wait()
    killed_at = torch.load(checkpoint, weights_only=True)["step"]
    assert killed_at < 40, "the run finished before it could be killed"

    resumed = run_here(workspace, run_dir)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    results = json.loads((run_dir / "results.json").read_text())
    assert results["resumed_from_step"] == killed_at

    expected = torch.load(reference_run / "checkpoint.pt", weights_only=True)
    actual = torch.load(checkpoint, weights_only=True)
    assert expected["loss_module"].keys() == actual["loss_module"].keys()
    for key, value in expected["loss_module"].items():
        assert torch.equal(value, actual["loss_module"][key]), key
    for index, state in expected["optimizer"]["state"].items():
        assert torch.equal(state["exp_avg_sq"], actual["optimizer"]["state"][index]["exp_avg_sq"])
    assert expected["trainer_loop"]["optim_steps"] == actual["trainer_loop"]["optim_steps"] == 40

    # Rows logged between the checkpoint and the kill are not written twice.
    def rows(run: Path, name: str) -> str:
        return (run / "logs" / run.name / "scalars" / f"{name}.csv").read_text()

    for name in ("train/loss_qvalue", "eval/normalized_score"):
        assert rows(run_dir, name) == rows(reference_run, name), name


def test_changed_settings_are_not_resumed(reference_run: Path) -> None:
    path = reference_run / "checkpoint.pt"
    state = load_checkpoint(path)
    same = copy.deepcopy(state["training_config"])
    check_resumable(state, same, path)  # the settings it was written with: accepted
    changed = copy.deepcopy(same)
    changed["agent"]["gamma"] = 0.95
    with pytest.raises(CheckpointError, match="other training settings") as error:
        check_resumable(state, changed, path)
    assert "agent.gamma" in str(error.value) and "resume=false" in str(error.value)


def test_metrics_are_flattened_and_written_by_torchrl_loggers(tmp_path: Path) -> None:
    from tensordict import TensorDict

    from cbop_torchrl.trainers.logging import MetricsHook, flatten_metrics, make_logger

    losses = TensorDict(
        {
            "loss_qvalue": torch.tensor(2.0),
            "cbop": {"weights": torch.tensor([0.5, 0.25, 0.25]), "expected_horizon": 0.75},
        },
        [],
    )
    flat = flatten_metrics(losses)
    assert flat == {
        "loss_qvalue": 2.0,
        "cbop/weights/0": 0.5,
        "cbop/weights/1": 0.25,
        "cbop/weights/2": 0.25,
        "cbop/expected_horizon": 0.75,
    }
    assert make_logger("none", tmp_path / "none", "run", "p") is None
    tensorboard = make_logger("tensorboard", tmp_path / "tb", "run", "p")
    hook = MetricsHook(make_logger("csv", tmp_path / "csv", "run", "p"), interval=2)
    assert hook(1, losses) is None
    shown = hook(2, losses)
    assert shown["log_pbar"] is True and shown["expected_horizon"] == 0.75
    tensorboard.log_scalar("train/loss_qvalue", 2.0, step=2)
    assert list((tmp_path / "tb" / "logs").rglob("events.out.tfevents.*"))
    rows = (tmp_path / "csv/logs/run/scalars/train/cbop/weights/1.csv").read_text().split()
    assert rows == ["2,0.25"]
    assert hook.state_dict()["first_window"]["cbop/expected_horizon"] == 0.75


def test_a_new_session_replaces_the_csv_rows_it_logs_again(tmp_path: Path) -> None:
    from cbop_torchrl.trainers.logging import log_scalars, make_logger

    logger = make_logger("csv", tmp_path, "run", "p")
    for step in (10, 20, 30):
        log_scalars(logger, {"train/loss": step / 10, "bc/loss": step}, step)
    scalars = tmp_path / "logs" / "run" / "scalars"
    with open(scalars / "train" / "loss.csv", "a") as handle:
        handle.write("4")  # the partial line of a killed process
    del logger

    resumed = make_logger("csv", tmp_path, "run", "p")  # resumed from a checkpoint at step 10
    log_scalars(resumed, {"train/loss": 2.5}, 20)
    log_scalars(resumed, {"train/loss": 3.5}, 30)
    assert (scalars / "train" / "loss.csv").read_text() == "10,1.0\n20,2.5\n30,3.5\n"
    assert (scalars / "bc" / "loss.csv").read_text() == "10,10.0\n20,20.0\n30,30.0\n"
    restarted = make_logger("csv", tmp_path, "run", "p")  # a stage that starts over at step 10
    log_scalars(restarted, {"bc/loss": 1.0}, 10)
    assert (scalars / "bc" / "loss.csv").read_text() == "10,1.0\n"


def test_evaluate_script_scores_a_saved_policy(workspace: dict, reference_run: Path) -> None:
    output = workspace["root"] / "evaluation.json"
    done = run_program(
        "evaluate",
        [f"checkpoint={reference_run / 'policy.pt'}", "episodes=2", "max_steps=20",
         f"output={output}"],
        {"CBOP_TORCHRL_CACHE": workspace["env"]["CBOP_TORCHRL_CACHE"]},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "normalized score" in done.stdout and "Hopper-v4" in done.stdout
    summary = json.loads(output.read_text())
    assert summary["episodes"] == 2 and math.isfinite(summary["normalized_score_mean"])
    assert all(length <= 20 for length in summary["lengths"])


@pytest.mark.parametrize(
    "overrides",
    [
        ("estimator.mode=map",),
        ("estimator.mode=fixed", "estimator.fixed_weighting=uniform"),
        ("estimator.mode=fixed", "estimator.fixed_weighting=lambda"),
        ("estimator.mode=quantile",),
    ],
    ids=["map", "fixed-uniform", "fixed-lambda", "quantile"],
)
def test_ablation_modes_train_end_to_end(
    workspace: dict, reference_run: Path, overrides: tuple[str, ...]
) -> None:
    run_dir = workspace["root"] / "ablation" / "_".join(o.split("=")[1] for o in overrides)
    # float32: auto's bf16 timing (~5 s a run) is not what this test checks
    train_here(workspace, run_dir, "estimator.rollout_dtype=float32", *overrides)
    results = json.loads((run_dir / "results.json").read_text())
    config = json.loads((run_dir / "config.json").read_text())
    assert config["estimator"]["mode"] == overrides[0].split("=")[1]
    assert results["gradient_steps"] == 40 and math.isfinite(results["normalized_score_mean"])


def test_rollout_dtype_auto_records_its_choice(reference_run: Path) -> None:
    """The reference run has the default rollout_dtype, auto: it records what it chose."""
    config = json.loads((reference_run / "config.json").read_text())
    assert config["estimator"]["rollout_dtype"] == "auto"
    settings = json.loads((reference_run / "results.json").read_text())["settings"]
    choice = settings["rollout_choice"]
    assert settings["rollout_dtype"] == choice["rollout_dtype"]
    fast = choice["bf16_native"]
    accurate = choice["bf16_target_rel_error"] <= choice["bf16_tolerance"]
    assert choice["rollout_dtype"] == ("bfloat16" if fast and accurate else "float32")


def test_actor_average_is_evaluated_beside_an_unchanged_training(workspace: dict) -> None:
    """eval.actor_average (beyond the paper): same training and scores, plus eval/average_*.

    Then a finished run without the average, continued to a larger budget with it, starts
    the average at its checkpoint's weights (a decay of nearly 1 keeps it there).
    """
    fp32 = "estimator.rollout_dtype=float32"  # auto's choice depends on the CPU
    runs = {}
    for name, extra in (("plain", []), ("average", ["eval.actor_average=0.5"])):
        runs[name] = workspace["root"] / "actor_average" / name
        train_here(workspace, runs[name], fp32, *extra)
    plain, average = (json.loads((runs[n] / "results.json").read_text()) for n in runs)
    assert [r["normalized_score_mean"] for r in average["eval_history"]] == [
        r["normalized_score_mean"] for r in plain["eval_history"]
    ]
    assert all("average_normalized_score_mean" in r for r in average["eval_history"])
    assert not any("average_normalized_score_mean" in r for r in plain["eval_history"])
    trained = [torch.load(runs[n] / "checkpoint.pt", weights_only=True) for n in runs]
    for key, value in trained[0]["loss_module"].items():
        assert torch.equal(value, trained[1]["loss_module"][key]), key
    assert "actor_average" in trained[1] and "actor_average" not in trained[0]
    scalars = next((runs["average"] / "logs").glob("*/scalars"))
    assert (scalars / "eval" / "average_normalized_score.csv").is_file()
    summaries = {n: summarize_run(runs[n], analysis=False) for n in runs}
    assert summaries["plain"]["device"] == "cpu"  # from results.json: where it trained
    assert "actor_average" not in summaries["plain"]
    summarized = summaries["average"]["actor_average"]
    assert summarized["decay"] == 0.5
    assert [score for _, score in summarized["curve"]] == [
        r["average_normalized_score_mean"] for r in average["eval_history"]
    ]

    train_here(workspace, runs["plain"], fp32, "train.epochs=3", "eval.actor_average=0.999999")
    state = torch.load(runs["plain"] / "checkpoint.pt", weights_only=True)
    assert state["step"] == 60
    at_40 = torch.load(runs["average"] / "checkpoint.pt", weights_only=True)["actor"]
    for key, value in state["actor_average"].items():
        torch.testing.assert_close(value, at_40[key], atol=1e-4, rtol=0)


def test_the_summary_names_each_fqe_scheme() -> None:
    def fqe(rounds: int | None, converge: bool) -> SimpleNamespace:
        return SimpleNamespace(rounds=rounds, converge=converge, steps=900, lr=1e-3, batch_size=8)

    assert fqe_scheme(fqe(None, False))["scheme"] == "soft"
    assert fqe_scheme(fqe(5, False)) == {
        "scheme": "rounds", "rounds": 5, "steps": 900, "lr": 1e-3, "batch_size": 8,
    }  # fmt: skip
    converged = fqe_scheme(fqe(5, True))
    assert converged["scheme"] == "converged" and converged["steps"] is None  # epochs, not steps
