"""Pretraining side by side (``runs.pretrain_together``): the seeds' stages trained together.

Three debug-preset seeds pretrained together (:func:`~cbop_torchrl.trainers.pretrain_together.
pretrain_together`) leave in the cache, under the keys each run alone looks for, the models
the single-seed stages train (to float rounding, same early-stopping epochs and elites); a
seed already cached is not trained again; a joint pretraining stopped after one seed's
entry leaves no other entry, and its rerun trains the rest to the same models.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch
from d4rl_files import pipeline_workspace

from cbop_torchrl.apps.api import _load, compose_config
from cbop_torchrl.cli import config_values
from cbop_torchrl.trainers import pretrain_together as together
from cbop_torchrl.trainers.dynamics import dynamics_entry, load_or_train_dynamics
from cbop_torchrl.trainers.offline_run import resolve_run_task

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SEEDS = (0, 1, 2)
# An improvement rule by which the seeds stop at different epochs (one before the cap).
MAX_EPOCHS = 12
DYNAMICS = (f"dynamics.max_epochs={MAX_EPOCHS}", "dynamics.patience=3",
            "dynamics.improvement_threshold=0.02")  # fmt: skip
# Float rounding: a batched matmul over more members may round differently (on the CPU
# it has been bit for bit equal).
TOLERANCE = {"rtol": 1e-5, "atol": 1e-6}
NO_RUNS = [Path("/nonexistent")] * len(SEEDS)  # no run directory holds finished results


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The three seeds' run configs on the small hopper file, and its data."""
    workspace = pipeline_workspace(tmp_path_factory.mktemp("pretrain_together"))
    configs, info, data = [], None, None
    for seed in SEEDS:
        overrides = ["preset=debug", f"env={workspace['dataset']}", "progress=false",
                     f"seed={seed}", *DYNAMICS]  # fmt: skip
        config, info, data, _ = _load(config_values(compose_config(overrides)))
        configs.append(config)
    return {"configs": configs, "info": info, "data": data, "root": workspace["root"]}


def stage_view(runs: dict[str, Any]) -> tuple[Any, Any, str]:
    """The data, info and termination the runs' stages see (as ``run_pipeline`` makes them)."""
    task, specs, info = resolve_run_task(runs["configs"][0], runs["info"])
    return specs.to_agent_actions(runs["data"]), info, task.termination


def alone(runs: dict[str, Any], config: Any) -> dict[str, Any]:
    """The single run's dynamics stage (``offline.dynamics_stage``'s call): its metrics."""
    data, info, termination = stage_view(runs)
    return load_or_train_dynamics(data, info, config.dynamics, False, termination=termination)[1]


def entry(runs: dict[str, Any], config: Any) -> tuple[dict, dict]:
    """The cache entry the run with ``config`` looks for: ``model.pt``'s state, metrics."""
    directory = dynamics_entry(stage_view(runs)[1], config.dynamics)
    state = torch.load(directory / "model.pt", weights_only=True)
    return state, json.loads((directory / "metrics.json").read_text())


def use_cache(monkeypatch: pytest.MonkeyPatch, path: Path) -> None:
    monkeypatch.setenv("CBOP_TORCHRL_CACHE", str(path))


@pytest.fixture(scope="module")
def single(runs: dict[str, Any]) -> list[tuple[dict, dict]]:
    """Each seed's dynamics stage alone, each in a cache of its own: the entries."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        entries = []
        for config in runs["configs"]:
            use_cache(monkeypatch, runs["root"] / f"alone-{config.seed}")
            assert alone(runs, config)["cached"] is False
            entries.append(entry(runs, config))
    return entries


def assert_same_model(expected: tuple[dict, dict], actual: tuple[dict, dict]) -> None:
    (state, metrics), (state_b, metrics_b) = expected, actual
    assert state["elites"] == state_b["elites"]
    assert state["architecture"] == state_b["architecture"]
    assert state["state_dict"].keys() == state_b["state_dict"].keys()
    for name, value in state["state_dict"].items():
        torch.testing.assert_close(state_b["state_dict"][name], value, **TOLERANCE, msg=name)
    assert metrics_b["epochs"] == metrics["epochs"]
    assert metrics_b["elites"] == metrics["elites"]
    assert metrics_b["num_train"] == metrics["num_train"]
    assert metrics_b["num_holdout"] == metrics["num_holdout"]
    for key in ("holdout_mse_per_member", "holdout_nll_per_member", "holdout_r2_mean"):
        torch.testing.assert_close(
            torch.tensor(metrics_b[key]), torch.tensor(metrics[key]), **TOLERANCE, msg=key
        )


def test_seeds_pretrained_together_are_each_seed_alone(
    runs: dict[str, Any], single: list[tuple[dict, dict]], tmp_path: Path
) -> None:
    configs = runs["configs"]
    run_dirs = [tmp_path / f"seed{seed}" for seed in SEEDS]
    trained = together.pretrain_together(configs, runs["info"], runs["data"], run_dirs)
    assert sorted(trained["dynamics"]) == list(SEEDS)
    epochs = [metrics["epochs"] for _, metrics in single]
    # one seed stops before the others: the joint ensemble goes on without it
    assert min(epochs) < max(epochs), f"the seeds stopped together ({epochs})"
    for config, expected in zip(configs, single, strict=True):
        assert_same_model(expected, entry(runs, config))
        assert alone(runs, config)["cached"] is True  # the run's own stage finds it
    again = together.pretrain_together(configs, runs["info"], runs["data"], run_dirs)
    assert again["dynamics"] == []


def test_a_cached_seed_is_not_trained_again(
    runs: dict[str, Any], single: list[tuple[dict, dict]]
) -> None:
    configs = runs["configs"]
    alone(runs, configs[1])
    directory = dynamics_entry(stage_view(runs)[1], configs[1].dynamics)
    before = (directory / "model.pt").stat().st_mtime_ns, (directory / "model.pt").read_bytes()
    trained = together.pretrain_together(configs, runs["info"], runs["data"], NO_RUNS)
    assert sorted(trained["dynamics"]) == [SEEDS[0], SEEDS[2]]
    after = (directory / "model.pt").stat().st_mtime_ns, (directory / "model.pt").read_bytes()
    assert after == before
    for config, expected in zip(configs, single, strict=True):
        assert_same_model(expected, entry(runs, config))


class Killed(BaseException):
    """Stands for a kill right after the first entry is written."""


def test_a_stopped_joint_pretraining_resumes(
    runs: dict[str, Any], single: list[tuple[dict, dict]], monkeypatch: pytest.MonkeyPatch
) -> None:
    configs, info = runs["configs"], stage_view(runs)[1]
    store = together.store_dynamics

    def store_then_die(*args: Any, **kwargs: Any) -> Any:
        store(*args, **kwargs)
        raise Killed

    monkeypatch.setattr(together, "store_dynamics", store_then_die)
    with pytest.raises(Killed):
        together.pretrain_together(configs, runs["info"], runs["data"], NO_RUNS)
    directories = [dynamics_entry(info, config.dynamics) for config in configs]
    written = [d for d in directories if (d / "model.pt").exists()]
    assert len(written) == 1  # the first seed to stop; the others have no file at all
    for directory in directories:
        leftovers = {p.name for p in directory.iterdir()} - {".lock", "model.pt", "metrics.json"}
        assert not leftovers, leftovers

    monkeypatch.setattr(together, "store_dynamics", store)
    trained = together.pretrain_together(configs, runs["info"], runs["data"], NO_RUNS)
    assert len(trained["dynamics"]) == 2
    for config, expected in zip(configs, single, strict=True):
        assert_same_model(expected, entry(runs, config))


def test_a_finished_run_needs_no_pretraining(runs: dict[str, Any], tmp_path: Path) -> None:
    config = runs["configs"][0]
    run_dir = tmp_path / "finished"
    run_dir.mkdir()
    (run_dir / "checkpoint.pt").write_bytes(b"")
    results = {"gradient_steps": config.train.total_steps}
    (run_dir / "results.json").write_text(json.dumps(results))
    assert together.finished_run(config, run_dir)
    (run_dir / "results.json").write_text(json.dumps({"gradient_steps": 1}))
    assert not together.finished_run(config, run_dir)  # another budget: it goes on
