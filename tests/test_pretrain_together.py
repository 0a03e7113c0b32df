"""Pretraining side by side (``runs.pretrain_together``): the seeds' stages trained together.

Three debug-preset seeds pretrained together (:func:`~cbop_torchrl.trainers.pretrain_together.
pretrain_together`) leave in the cache, under the keys each run alone looks for, the
dynamics models, BC actors and FQE critics the single run's stages train (to float
rounding; the dynamics with the same early-stopping epochs, elites and holdout metrics),
and the run's stages find them; a seed already cached is not trained again; a joint
pretraining stopped after one seed's entry of a stage leaves no other entry of it, and
its rerun trains the rest to the same results.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from d4rl_files import pipeline_workspace

from benchmarks.pretrain_together import load_runs, measure, run_stage, stage_view
from cbop_torchrl.apps.api import compose_config, runs_given
from cbop_torchrl.cli import config_values
from cbop_torchrl.config.load import _runs_problems
from cbop_torchrl.config.runs import RunsConfig
from cbop_torchrl.trainers import pretrain_together as together
from cbop_torchrl.trainers.dynamics import train_dynamics
from cbop_torchrl.trainers.joint_dynamics import train_dynamics_together

SEEDS = (0, 1, 2)
# An improvement rule by which the seeds stop at different epochs (one before the cap).
MAX_EPOCHS = 12
DYNAMICS = (f"dynamics.max_epochs={MAX_EPOCHS}", "dynamics.patience=3",
            "dynamics.improvement_threshold=0.02")  # fmt: skip
# Float rounding: a batched matmul over more members may round differently (on the CPU
# it has been bit for bit equal).
TOLERANCE = {"rtol": 1e-5, "atol": 1e-6}
NO_RUNS = [Path("/nonexistent")] * len(SEEDS)  # no run directory holds finished results


@pytest.fixture(scope="module", autouse=True)
def one_thread_for_the_module() -> Any:
    """Tiny networks: one torch thread, for the module's fixtures too (set up before any
    function-scoped ``one_torch_thread``)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The three seeds' run configs on the small hopper file, and its data."""
    workspace = pipeline_workspace(tmp_path_factory.mktemp("pretrain_together"))
    runs = load_runs("debug", str(workspace["dataset"]), list(SEEDS), list(DYNAMICS))
    return {**runs, "root": workspace["root"]}


def pretrain(runs: dict[str, Any], run_dirs: list[Path]) -> dict[str, list[int]]:
    """The seeds' pretraining together on the CPU without capture, where
    :func:`run_stages`' runs alone train (the caller decides both)."""
    return together.pretrain_together(
        runs["configs"], runs["info"], runs["data"], run_dirs,
        device=torch.device("cpu"), cuda_graph=False,
    )  # fmt: skip


def run_stages(runs: dict[str, Any], config: Any) -> dict[str, bool]:
    """The single run's pretraining stages, called as ``run_pipeline`` calls them: whether
    each came from the cache."""
    return {stage: run_stage(runs, config, stage) for stage in together.STAGES}


def entry_dirs(runs: dict[str, Any], config: Any) -> dict[str, Path]:
    """The cache entries the run with ``config`` looks for, per stage."""
    jobs = {"dynamics": together.dynamics_job, "bc": together.bc_job, "fqe": together.fqe_job}
    data, info, termination = stage_view(runs)
    setup = together.Pretraining(info, data, termination, False, False)
    return {name: next(iter(job(setup, [config]).entries)) for name, job in jobs.items()}


FILES = {"dynamics": ("model.pt", "metrics.json"), "bc": ("result.pt",), "fqe": ("result.pt",)}


def entries(runs: dict[str, Any], config: Any) -> dict[str, dict]:
    """What the run's entries hold: the tensors and metrics of each stage."""
    held = {}
    for name, directory in entry_dirs(runs, config).items():
        held[name] = {
            file: json.loads((directory / file).read_text()) if file.endswith(".json")
            else torch.load(directory / file, weights_only=True)
            for file in FILES[name]
        }  # fmt: skip
    return held


def use_cache(monkeypatch: pytest.MonkeyPatch, path: Path) -> None:
    monkeypatch.setenv("CBOP_TORCHRL_CACHE", str(path))


@pytest.fixture(scope="module")
def single(runs: dict[str, Any]) -> list[dict[str, dict]]:
    """Each seed's stages alone, each seed in a cache of its own: the entries."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        held = []
        for config in runs["configs"]:
            use_cache(monkeypatch, runs["root"] / f"alone-{config.seed}")
            assert not any(run_stages(runs, config).values())
            held.append(entries(runs, config))
    return held


def tensors(value: Any, path: str = "") -> dict[str, torch.Tensor]:
    """Every tensor in a nested dict, by its path (the file's own SHA-256 record aside)."""
    if isinstance(value, torch.Tensor):
        return {path: value}
    if isinstance(value, dict):
        found = {}
        for key, item in value.items():
            found.update(tensors(item, f"{path}/{key}"))
        return found
    return {}


def assert_same_entries(expected: dict[str, dict], actual: dict[str, dict]) -> None:
    for stage, files in expected.items():
        for file, content in files.items():
            if file == "metrics.json":
                continue
            want, got = tensors(content), tensors(actual[stage][file])
            assert want.keys() == got.keys(), (stage, file)
            for name, value in want.items():
                torch.testing.assert_close(got[name], value, **TOLERANCE, msg=name)
    model, model_b = expected["dynamics"]["model.pt"], actual["dynamics"]["model.pt"]
    assert model["elites"] == model_b["elites"]
    metrics, metrics_b = expected["dynamics"]["metrics.json"], actual["dynamics"]["metrics.json"]
    for key in ("epochs", "elites", "num_train", "num_holdout"):
        assert metrics_b[key] == metrics[key], key
    for key in ("holdout_mse_per_member", "holdout_nll_per_member", "holdout_r2_mean"):
        torch.testing.assert_close(
            torch.tensor(metrics_b[key]), torch.tensor(metrics[key]), **TOLERANCE, msg=key
        )


def test_seeds_pretrained_together_are_each_seed_alone(
    runs: dict[str, Any], single: list[dict[str, dict]], tmp_path: Path
) -> None:
    configs = runs["configs"]
    run_dirs = [tmp_path / f"seed{seed}" for seed in SEEDS]
    trained = pretrain(runs, run_dirs)
    assert {stage: sorted(seeds) for stage, seeds in trained.items()} == {
        stage: list(SEEDS) for stage in together.STAGES
    }
    epochs = [held["dynamics"]["metrics.json"]["epochs"] for held in single]
    # one seed stops before the others: the joint ensemble goes on without it
    assert min(epochs) < max(epochs), f"the seeds stopped together ({epochs})"
    for config, expected in zip(configs, single, strict=True):
        assert_same_entries(expected, entries(runs, config))
        assert all(run_stages(runs, config).values())  # the run's own stages find them
    again = pretrain(runs, run_dirs)
    assert again == {stage: [] for stage in together.STAGES}


def test_a_cached_seed_is_not_trained_again(
    runs: dict[str, Any], single: list[dict[str, dict]]
) -> None:
    configs = runs["configs"]
    run_stages(runs, configs[1])
    files = [d / f for name, d in entry_dirs(runs, configs[1]).items() for f in FILES[name]]
    before = [(path.stat().st_mtime_ns, path.read_bytes()) for path in files]
    trained = pretrain(runs, NO_RUNS)
    assert {stage: sorted(seeds) for stage, seeds in trained.items()} == {
        stage: [SEEDS[0], SEEDS[2]] for stage in together.STAGES
    }
    assert [(path.stat().st_mtime_ns, path.read_bytes()) for path in files] == before
    for config, expected in zip(configs, single, strict=True):
        assert_same_entries(expected, entries(runs, config))


class Killed(BaseException):
    """Stands for a kill right after the first entry of a stage is written."""


@pytest.mark.parametrize(("writer", "stage"), [("store_dynamics", "dynamics"),
                                               ("_store_result", "bc")])  # fmt: skip
def test_a_stopped_joint_pretraining_resumes(
    runs: dict[str, Any], single: list[dict[str, dict]], monkeypatch: pytest.MonkeyPatch,
    writer: str, stage: str,
) -> None:  # fmt: skip
    configs = runs["configs"]
    store = getattr(together, writer)

    def store_then_die(*args: Any, **kwargs: Any) -> Any:
        store(*args, **kwargs)
        raise Killed

    monkeypatch.setattr(together, writer, store_then_die)
    with pytest.raises(Killed):
        pretrain(runs, NO_RUNS)
    directories = [entry_dirs(runs, config)[stage] for config in configs]
    written = [d for d in directories if (d / FILES[stage][0]).exists()]
    assert len(written) == 1  # the first seed written; the others have no file at all
    for directory in directories:
        leftovers = {p.name for p in directory.iterdir()} - {".lock", *FILES[stage]}
        assert not leftovers, leftovers

    monkeypatch.setattr(together, writer, store)
    trained = pretrain(runs, NO_RUNS)
    assert len(trained[stage]) == 2
    for config, expected in zip(configs, single, strict=True):
        assert_same_entries(expected, entries(runs, config))


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


def test_the_benchmark_measures_both_ways(runs: dict[str, Any], tmp_path: Path) -> None:
    report = measure({**runs, "configs": runs["configs"][:2]}, tmp_path)  # two seeds: quicker
    assert (
        set(report["wall_s"]["together"])
        == set(report["cpu_s"]["together"])
        == set(together.STAGES)
    )
    assert report["max_abs_difference"] <= TOLERANCE["atol"] * 10


def test_the_setting_is_on_by_default_and_ignored_by_a_single_run() -> None:
    assert RunsConfig.from_values({"seeds": [0, 1]}).pretrain_together is True
    assert (
        RunsConfig.from_values({"seeds": [0], "pretrain_together": False}).pretrain_together
        is False
    )
    assert not RunsConfig.from_values({"pretrain_together": False}).given  # no list: one run
    single = compose_config(["preset=debug", "runs.pretrain_together=false"])
    assert not runs_given(single)
    assert _runs_problems(config_values(single)["runs"]) == []


def test_the_authors_dynamics_options_train_together_too(runs: dict[str, Any]) -> None:
    """Shared log-variance bounds (one pair per seed), a resample per epoch, a reward net."""
    data, _, termination = stage_view(runs)
    configs = [
        dataclasses.replace(config.dynamics, shared_logvar_bounds=True,
                            bootstrap_per_epoch=True, separate_reward=True)
        for config in runs["configs"]
    ]  # fmt: skip
    joint = train_dynamics_together(data, termination, configs, progress=False)
    for config, (model, metrics) in zip(configs, joint, strict=True):
        expected, expected_metrics = train_dynamics(data, termination, config, progress=False)
        assert metrics["epochs"] == expected_metrics["epochs"]
        assert metrics["elites"] == expected_metrics["elites"]
        assert model.ensemble.max_logvar.shape == expected.ensemble.max_logvar.shape
        want = expected.ensemble.state_dict()
        for name, value in model.ensemble.state_dict().items():
            torch.testing.assert_close(value, want[name], **TOLERANCE, msg=name)
