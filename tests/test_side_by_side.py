"""Runs side by side (``runs.seeds``/``runs.psi``/``runs.set``): each run is the run alone.

Three debug-preset runs trained in one process (their seeds' pretraining together first,
then turn by turn, per CBOP gradient step) end with the weights, optimizer state,
config.json and scores of the same three runs trained one by one on that pretraining; a
job killed with SIGKILL resumes every run to those same weights; bad ``runs`` input is
refused with exit code 2 before any work.
"""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest
import torch
from d4rl_files import debug_cbop_command as cli
from d4rl_files import pipeline_workspace
from inprocess import run_program, train_cbop

from cbop_torchrl.config import ConfigError
from cbop_torchrl.config.runs import RunsConfig, expand_runs

ROOT = Path(__file__).resolve().parents[1]
RUNS = '["seed=0 estimator.psi=0.5","seed=0 estimator.psi=2","seed=1 estimator.psi=2"]'
RUN_NAMES = ["seed_0-estimator.psi_0.5", "seed_0-estimator.psi_2", "seed_1-estimator.psi_2"]
ALONE = [
    ["seed=0", "estimator.psi=0.5"],
    ["seed=0", "estimator.psi=2"],
    ["seed=1", "estimator.psi=2"],
]
SCORES = ("normalized_score_mean", "return_mean", "episode_returns", "gradient_steps",
          "expected_horizon_start", "expected_horizon_end", "settings")  # fmt: skip


def cache_env(workspace: dict) -> dict[str, str]:
    return {"CBOP_TORCHRL_CACHE": workspace["env"]["CBOP_TORCHRL_CACHE"]}


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> dict:
    return pipeline_workspace(tmp_path_factory.mktemp("side_by_side"))


@pytest.fixture(scope="module")
def job(workspace: dict) -> Path:
    """Three runs side by side through ``scripts/cbop.py`` (its own fresh cache)."""
    job_dir = workspace["root"] / "job"
    done = run_program(
        "cbop", cli(workspace, job_dir, f"runs.set={RUNS}")[2:], cache_env(workspace)
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.count("[cbop] results:") == 3
    return job_dir


@pytest.fixture(scope="module")
def alone(tmp_path_factory: pytest.TempPathFactory, workspace: dict, job: Path) -> list[Path]:
    """The same three runs one by one, each in a process state of its own making, on the
    pretraining the job cached (its seeds' pretraining trained together equals each seed's
    alone to float rounding, tests/test_pretrain_together.py; the runs' turns are checked
    here bit for bit)."""
    other = pipeline_workspace(tmp_path_factory.mktemp("alone"))
    run_dirs = []
    for index, overrides in enumerate(ALONE):
        run_dir = other["root"] / f"alone{index}"
        command = cli(workspace, run_dir, *overrides)[2:]  # the job's data file
        train_cbop(command, run_dir, cache_env(workspace))
        run_dirs.append(run_dir)
    return run_dirs


def trainer_state(run_dir: Path) -> dict:
    return torch.load(run_dir / "checkpoint.pt", weights_only=True)


def assert_same_training(expected_dir: Path, actual_dir: Path) -> None:
    expected, actual = trainer_state(expected_dir), trainer_state(actual_dir)
    assert expected["loss_module"].keys() == actual["loss_module"].keys()
    for key, value in expected["loss_module"].items():
        assert torch.equal(value, actual["loss_module"][key]), key
    for index, state in expected["optimizer"]["state"].items():
        for name, value in state.items():
            assert torch.equal(value, actual["optimizer"]["state"][index][name]), (index, name)
    assert expected["trainer_loop"]["optim_steps"] == actual["trainer_loop"]["optim_steps"] == 40
    sampler, rng = expected["sampler_generator"], expected["rng"]  # batches and global draws
    assert torch.equal(sampler, actual["sampler_generator"])
    assert torch.equal(rng["torch_cpu"], actual["rng"]["torch_cpu"])
    assert rng["python"] == actual["rng"]["python"]


def test_each_run_side_by_side_is_the_run_alone(job: Path, alone: list[Path]) -> None:
    runs = sorted(p.name for p in job.iterdir() if p.is_dir() and not p.name.startswith("."))
    assert runs == RUN_NAMES  # beside Hydra's record of the job's command (.hydra/)
    for name, alone_dir in zip(RUN_NAMES, alone, strict=True):
        run_dir = job / name
        assert_same_training(alone_dir, run_dir)
        side, single = (json.loads((d / "results.json").read_text()) for d in (run_dir, alone_dir))
        for key in SCORES:
            assert side[key] == single[key], (name, key)
        assert side["eval_history"] == single["eval_history"], name
        config, config_alone = (
            json.loads((d / "config.json").read_text()) for d in (run_dir, alone_dir)
        )
        assert config == config_alone, name
    # the two seed-0 runs differ (psi), and they shared seed 0's pretrained models
    first, second = (json.loads((job / n / "results.json").read_text()) for n in RUN_NAMES[:2])
    assert first["episode_returns"] != second["episode_returns"] or (
        first["expected_horizon_end"] != second["expected_horizon_end"]
    )
    # seeds 0 and 1 were pretrained together before the runs took turns: every run found
    # its dynamics model, BC actor and FQE critic in the cache
    for name in RUN_NAMES:
        stages = json.loads((job / name / "results.json").read_text())["stages"]
        assert stages["dynamics_cached"] and stages["bc_cached"] and stages["fqe_cached"], name


def test_a_killed_job_resumes_every_run(workspace: dict, job: Path) -> None:
    job_dir = workspace["root"] / "killed"
    command = cli(workspace, job_dir, f"runs.set={RUNS}")
    env = {**workspace["env"], "PYTHONPATH": str(ROOT)}  # this checkout's package
    process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    checkpoints = [job_dir / name / "checkpoint.pt" for name in RUN_NAMES]
    deadline = time.monotonic() + 300
    while (
        not all(path.exists() for path in checkpoints)
        and process.poll() is None
        and time.monotonic() < deadline
    ):
        time.sleep(0.02)
    assert process.poll() is None, process.stderr.read().decode()[-3000:]
    process.send_signal(signal.SIGKILL)
    process.wait()
    killed_at = [torch.load(path, weights_only=True)["step"] for path in checkpoints]
    assert all(step < 40 for step in killed_at), f"the job finished before the kill: {killed_at}"

    resumed = run_program("cbop", command[2:], cache_env(workspace))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    for name, step in zip(RUN_NAMES, killed_at, strict=True):
        results = json.loads((job_dir / name / "results.json").read_text())
        assert results["resumed_from_step"] == step, name
        assert_same_training(job / name, job_dir / name)
        expected = json.loads((job / name / "results.json").read_text())
        assert results["episode_returns"] == expected["episode_returns"], name


@pytest.mark.parametrize(
    ("runs", "expected"),
    [
        ('runs.set=["agent.num_qvalue_nets=5","agent.num_qvalue_nets=3"]',
         "agent.num_qvalue_nets, which changes the shape"),
        ("runs.psi=[2,2.0]", "would both write to the run directory 'psi2'"),
        ("runs.seeds=[]", "runs.seeds=[] lists no run"),
        ('runs.set=["device=cpu"]', "device, which is a setting of the whole process"),
        ('runs.set=["agent.bogus=1"]', "agent.bogus=1 cannot be set (no such key)"),
        ("runs.psi=[2,-1]", "estimator.psi"),
    ],
)  # fmt: skip
def test_bad_runs_are_refused_before_any_work(workspace: dict, runs: str, expected: str) -> None:
    job_dir = workspace["root"] / "refused"
    cache = workspace["root"] / "refused-cache"
    done = run_program(
        "cbop", cli(workspace, job_dir, runs)[2:], {"CBOP_TORCHRL_CACHE": str(cache)}
    )
    assert done.returncode == 2, done.stderr[-3000:]
    message = done.stderr.strip()
    assert message.startswith("error: ") and expected in message, message
    assert "\n" not in message, message  # one paragraph
    assert not job_dir.exists(), "a refused job left its directory"
    assert not any(cache.rglob("*.pt")), "a refused job trained something"


def test_baseline_refuses_a_runs_section(workspace: dict) -> None:
    run_dir = workspace["root"] / "baseline"
    args = ["algo=bc", "preset=debug", f"env={workspace['dataset']}", f"hydra.run.dir={run_dir}",
            "progress=false", "runs.seeds=[0,1]"]  # fmt: skip
    done = run_program("baseline", args, cache_env(workspace))
    assert done.returncode == 2 and "runs.seeds asks for several runs" in done.stderr, done.stderr


def test_runs_expand_to_the_product_with_one_directory_each() -> None:
    specs = expand_runs(RunsConfig(seeds=[0, 1, 2], psi=[0.5, 2, 3, 5]))
    assert len(specs) == 12
    assert [s.name for s in specs[:5]] == [
        "psi0.5-seed0", "psi2-seed0", "psi3-seed0", "psi5-seed0", "psi0.5-seed1",
    ]  # fmt: skip
    assert specs[1].overrides == (("estimator.psi", 2.0), ("seed", 0))
    assert [s.name for s in expand_runs(RunsConfig(seeds=[3, 4]))] == ["seed3", "seed4"]
    assert [s.name for s in expand_runs(RunsConfig(psi=[0.5]))] == ["psi0.5"]
    assert not RunsConfig().given
    with pytest.raises(ConfigError, match="not a plain key=value override"):
        expand_runs(RunsConfig(set=["~agent.eta"]))
