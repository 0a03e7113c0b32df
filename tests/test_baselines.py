"""Baselines: a tiny run per algorithm through scripts/baseline.py, configs, optimizer groups."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from d4rl_files import write_d4rl_hdf5
from inprocess import run_program

from cbop_torchrl.baselines import (
    ALGOS,
    AlgoConfig,
    BaselineConfigError,
    build_baseline,
    run_baseline,
)
from cbop_torchrl.config import RunConfig, load_config
from cbop_torchrl.data import DatasetInfo, load_dataset_with_info
from cbop_torchrl.evaluation.analysis import analyze_baseline_run
from cbop_torchrl.trainers.checkpoint import CheckpointError, load_checkpoint, load_policy

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "baseline.py"


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("baselines")
    dataset = write_d4rl_hdf5(
        root / "hopper-tiny.hdf5",  # no D4RL kind in the name: no paper psi, none needed
        episode_lengths=[100] * 5,
        terminal_episodes=(0,),
        timeout_episodes=(1,),
    )
    env = {**os.environ, "CBOP_TORCHRL_CACHE": str(root / "cache")}
    return {"root": root, "dataset": dataset, "env": env}


def baseline(
    workspace: dict, *overrides: str, flags: tuple[str, ...] = ()
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(SCRIPT), *flags, "preset=debug", f"env={workspace['dataset']}",
         "progress=false", *overrides],
        cwd=workspace["root"], env=workspace["env"], capture_output=True, text=True,
    )  # fmt: skip


@pytest.fixture(scope="module")
def sweep(workspace: dict) -> Path:
    """One Hydra multirun process: every algorithm on the debug preset."""
    sweep = workspace["root"] / "sweep"
    done = baseline(
        workspace, f"algo={','.join(ALGOS)}", f"hydra.sweep.dir={sweep}",
        "hydra.sweep.subdir=${algo.name}", flags=("-m",),
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Warning" not in done.stderr, done.stderr  # TorchRL's target-updater notice included
    assert not list(sweep.rglob("*.log"))  # no empty baseline.log: the program prints
    return sweep


def test_every_algorithm_trains_and_writes_results(sweep: Path) -> None:
    for algo in ALGOS:
        run = sweep / algo
        results = json.loads((run / "results.json").read_text())
        assert results["algo"] == algo and results["device"] == "cpu"
        # debug preset: CBOP's whole pipeline, BC 40 + FQE 40 + CBOP 2 x 20
        assert results["gradient_steps"] == 120
        assert results["dataset"] == "hopper-tiny"
        assert [r["step"] for r in results["eval_history"]] == [20, 40, 60, 80, 100, 120]
        assert len(results["episode_returns"]) == 2
        config = json.loads((run / "config.json").read_text())
        assert config["algo"]["name"] == algo
        state = load_checkpoint(run / "checkpoint.pt")
        assert state["step"] == 120
        actor, task, meta = load_policy(run / "policy.pt")
        assert task.name == "hopper" and meta["algo"] == algo
        kind = {"td3bc": "deterministic", "iql": "tanh_mean_gaussian"}.get(algo, "tanh_normal")
        assert meta["actor_kind"] == kind
        action = actor(_obs_td(meta["obs_dim"])).get("action")
        assert action.shape == (4, meta["action_dim"]) and action.abs().max() <= 1.0
        assert list((run / "logs").rglob("eval/normalized_score.csv"))


def _pipeline_steps(cbop_overrides: list[str]) -> int:
    """BC + FQE + CBOP gradient steps of ``cbop-train`` with these overrides."""
    from cbop_torchrl.apps.api import compose_config
    from cbop_torchrl.config import PAPER_SHARED

    cfg = compose_config(cbop_overrides)
    epochs = cfg.train.epochs or PAPER_SHARED["train.epochs"]
    steps_per_epoch = cfg.train.steps_per_epoch or PAPER_SHARED["train.steps_per_epoch"]
    return cfg.bc.steps + cfg.fqe.steps + epochs * steps_per_epoch


@pytest.mark.parametrize("preset", ["cpu", "debug", "paper"])
def test_a_baseline_trains_as_many_steps_as_cbops_pipeline_unless_told(preset: str) -> None:
    from cbop_torchrl.apps.api import compose_config

    def baseline_steps(*overrides: str) -> int:
        train = compose_config(["algo=iql", f"preset={preset}", *overrides], "baseline").train
        return train.epochs * (train.steps_per_epoch or 1000)  # null: the paper's 1000

    assert baseline_steps() == _pipeline_steps([f"preset={preset}"])
    assert baseline_steps("bc.steps=2000") == _pipeline_steps([f"preset={preset}", "bc.steps=2000"])
    assert baseline_steps("train.epochs=3") == 3 * (1000 if preset != "debug" else 20)  # given


def _banner_config(command: str, *overrides: str) -> RunConfig:
    from cbop_torchrl.apps.api import compose_config
    from cbop_torchrl.cli import config_values

    values = config_values(compose_config(["preset=debug", *overrides], command))
    values.pop("algo", None)
    values["estimator"]["psi"] = 0.0
    return load_config(values, lambda env: ("hopper", "hopper-demo"))[0]


def test_both_banners_state_the_budget_and_the_matching_baseline() -> None:
    from cbop_torchrl.apps.api import baseline_banner, run_banner

    def budget_lines(banner: str) -> str:
        return "\n".join(line for line in banner.splitlines() if "budget" in line)

    run_dir = Path("runs/x")
    default = baseline_banner(_banner_config("baseline", "algo=iql"), "iql", "d", run_dir)
    assert "train: 120 gradient steps (train.epochs=6 x train.steps_per_epoch=20)" in default
    assert "budget: the default, cbop-train's whole pipeline with these settings trains 120 " \
        "(BC 40 + FQE 40 + CBOP 40)" in default  # fmt: skip
    given = baseline_banner(_banner_config("baseline", "train.epochs=2"), "iql", "d", run_dir)
    assert "train: 40 gradient steps" in given
    assert "trains 120 (BC 40 + FQE 40 + CBOP 40); train.epochs=6 (the default)" in given
    # CBOP's banner names the baseline command with the same budget: its default ...
    cbop = budget_lines(run_banner(_banner_config("cbop"), "d", run_dir))
    assert "120 gradient steps in all (BC 40 + FQE 40 + CBOP 40)" in cbop
    assert cbop.endswith("cbop-baseline algo=iql preset=debug"), cbop
    # ... or, for a CBOP run of other settings, the override that matches it
    longer = budget_lines(run_banner(_banner_config("cbop", "train.epochs=4"), "d", run_dir))
    assert longer.endswith("cbop-baseline algo=iql preset=debug train.epochs=8"), longer


def test_evaluate_script_scores_a_td3bc_policy(sweep: Path, workspace: dict) -> None:
    done = run_program(  # in this process: what it prints is checked, not the process
        "evaluate",
        [f"checkpoint={sweep / 'td3bc' / 'policy.pt'}", "episodes=2", "max_steps=10"],
        {"CBOP_TORCHRL_CACHE": workspace["env"]["CBOP_TORCHRL_CACHE"]},
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "normalized score" in done.stdout and "Hopper-v4" in done.stdout


def test_a_standardizing_policy_file_carries_the_datasets_statistics(
    sweep: Path, workspace: dict
) -> None:
    from cbop_torchrl.modules.standardize import observation_statistics

    actor, _, meta = load_policy(sweep / "td3bc" / "policy.pt")
    settings = json.loads((sweep / "td3bc" / "results.json").read_text())["settings"]
    assert meta["observation_norm"] is True and meta["hidden_sizes"] == settings["hidden_sizes"]
    data, _ = load_dataset_with_info(str(workspace["dataset"]))
    loc, scale = observation_statistics(data)
    weights = actor.state_dict()
    assert torch.equal(weights["module.0.module.loc"], loc)
    assert torch.equal(weights["module.0.module.scale"], scale)
    trained = load_checkpoint(sweep / "td3bc" / "checkpoint.pt")["actor"]
    assert all(torch.equal(weights[k], v) for k, v in trained.items())


def _run_config(run: Path, workspace: dict, **agent: float) -> tuple:
    values = json.loads((run / "config.json").read_text())
    algo = AlgoConfig.from_dict(values.pop("algo"))
    values["agent"].update(agent)
    data, info = load_dataset_with_info(str(workspace["dataset"]))
    config, _ = load_config(values, lambda env: (info.family, info.name))
    return config, algo, info, data


def test_finished_run_is_not_retrained_and_other_settings_are_refused(
    sweep: Path, workspace: dict
) -> None:
    run = sweep / "bc"
    stamp = (run / "results.json").read_text()
    config, algo, info, data = _run_config(run, workspace)
    assert run_baseline(config, algo, info, data, run) == json.loads(stamp)
    assert (run / "results.json").read_text() == stamp  # not rewritten
    config, algo, info, data = _run_config(run, workspace, actor_lr=0.1)
    with pytest.raises(CheckpointError, match="other training settings"):
        run_baseline(config, algo, info, data, run)


def _obs_td(obs_dim: int):
    from tensordict import TensorDict

    return TensorDict({"observation": torch.randn(4, obs_dim)}, batch_size=[4])


def test_bad_algo_setting_is_a_clear_error(
    workspace: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(workspace["root"])  # where its run directory would go
    done = run_program(  # refused before any work: in this process
        "baseline",
        ["preset=debug", f"env={workspace['dataset']}", "progress=false", "algo=iql",
         "algo.expectile=1.5"],
        {"CBOP_TORCHRL_CACHE": workspace["env"]["CBOP_TORCHRL_CACHE"]},
    )  # fmt: skip
    assert done.returncode == 2
    assert "algo.expectile=1.5 must be a number in (0, 1)" in done.stderr


def test_the_reports_name_every_baseline_and_its_config() -> None:
    # The reports and benchmark tools read the names from the torch-free report module.
    from cbop_torchrl.evaluation.summaries import BASELINES

    assert BASELINES == ALGOS
    configs = ROOT / "cbop_torchrl" / "configs" / "algo"
    assert sorted(path.stem for path in configs.glob("*.yaml")) == sorted(ALGOS)


def test_algo_config_validation() -> None:
    with pytest.raises(BaselineConfigError, match="choose one of bc, td3bc, iql, cql"):
        AlgoConfig.from_dict({"name": "sac"})
    with pytest.raises(BaselineConfigError, match="unknown key"):
        AlgoConfig.from_dict({"name": "iql", "temprature": 3.0})
    assert AlgoConfig.from_dict({"name": "cql", "min_q_weight": 10.0}).min_q_weight == 10.0


@pytest.mark.parametrize("algo", ALGOS)
def test_optimizer_groups_partition_the_trainable_parameters(algo: str) -> None:
    config = RunConfig()
    config.agent.hidden_sizes = [8]
    for name in ("actor_lr", "critic_lr", "alpha_lr"):
        setattr(config.agent, name, 1e-3)
    sizes = DatasetInfo("hopper-x", "fp", 10, "hdf5", obs_dim=11, action_dim=3)
    parts = build_baseline(AlgoConfig(name=algo), config, sizes, torch.device("cpu"))
    grouped = [id(p) for _, params, _, _ in parts.groups for p in params]
    assert len(grouped) == len(set(grouped))  # no parameter in two groups
    trainable = {id(p) for p in parts.loss.parameters() if p.requires_grad}
    assert set(grouped) == trainable


def test_conservatism_numbers_for_q_learning_baselines(
    sweep: Path, workspace: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CBOP_TORCHRL_CACHE", workspace["env"]["CBOP_TORCHRL_CACHE"])
    assert analyze_baseline_run(sweep / "bc") is None  # no Q-function
    numbers = analyze_baseline_run(sweep / "cql", mc_states=2)["conservatism"]
    assert numbers["states"] == 2 and len(numbers["differences"]) == 2
    assert 1 <= numbers["episode_length_mean"] <= 50  # debug preset: eval.max_steps=50
    assert numbers["overestimation"] == pytest.approx(
        sum(numbers["differences"]) / 2, rel=1e-5, abs=1e-5
    )
