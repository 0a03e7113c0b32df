"""Any gymnasium MuJoCo task trains and evaluates from its data: the ``task.*`` settings.

The end-to-end tests write a D4RL-layout file recorded on Swimmer-v4, a task
the registry has no entry for, and run the entry scripts on it with nothing
but ``task.gym_id`` and ``task.termination`` (and psi, which the paper gives
for its D4RL datasets only).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import gymnasium
import h5py
import numpy as np
import pytest
import torch
from d4rl_files import write_d4rl_hdf5
from inprocess import Finished, run_program
from torchrl.envs import ActionScaling, Compose

from cbop_torchrl.data import dataset_info, load_dataset_with_info
from cbop_torchrl.envs import (
    TaskConfig,
    TaskError,
    check_data_fits_env,
    make_env,
    read_env_specs,
    resolve_task,
)
from cbop_torchrl.envs.task import collection_task, override_task
from cbop_torchrl.registry import families, get_family

ROOT = Path(__file__).resolve().parents[1]
UNKNOWN_GYM_ID = "Swimmer-v4"


def record_gym_episodes(
    path: Path, gym_id: str, episodes: int = 4, length: int = 40, seed: int = 0
) -> Path:
    """Writes a D4RL-layout file of random-action episodes on ``gym_id``, each cut by a timeout."""
    env = gymnasium.make(gym_id)
    env.action_space.seed(seed)
    columns: dict[str, list] = {key: [] for key in ("obs", "next", "act", "rew", "term", "time")}
    for episode in range(episodes):
        obs, _ = env.reset(seed=seed + episode)
        for step in range(length):
            action = env.action_space.sample()
            next_obs, reward, terminated, truncated, _ = env.step(action)
            timeout = (step == length - 1 or truncated) and not terminated
            for key, value in zip(
                columns, (obs, next_obs, action, reward, terminated, timeout), strict=True
            ):
                columns[key].append(value)
            obs = next_obs
            if terminated or timeout:
                break
    env.close()
    with h5py.File(path, "w") as handle:
        handle["observations"] = np.asarray(columns["obs"], np.float32)
        handle["next_observations"] = np.asarray(columns["next"], np.float32)
        handle["actions"] = np.asarray(columns["act"], np.float32)
        handle["rewards"] = np.asarray(columns["rew"], np.float32)
        handle["terminals"] = np.asarray(columns["term"], bool)
        handle["timeouts"] = np.asarray(columns["time"], bool)
    return path


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> dict:
    root = tmp_path_factory.mktemp("tasks")
    dataset = record_gym_episodes(root / "swimmer-random-tiny.hdf5", UNKNOWN_GYM_ID)
    env = {**os.environ, "CBOP_TORCHRL_CACHE": str(root / "cache"), "WANDB_MODE": "offline"}
    return {"root": root, "dataset": dataset, "env": env}


def run(workspace: dict, script: str, *overrides: str) -> Finished:
    """``python scripts/<script> *overrides``, run in this process (the tests check what the
    programs print, write and exit with; a subprocess would add ~7 s of imports a run)."""
    cache = {"CBOP_TORCHRL_CACHE": workspace["env"]["CBOP_TORCHRL_CACHE"]}
    return run_program(script.removesuffix(".py"), overrides, cache)


def train(workspace: dict, script: str, run_name: str, *overrides: str):
    return run(
        workspace,
        script,
        "preset=debug",
        f"env={workspace['dataset']}",
        f"hydra.run.dir={workspace['root'] / run_name}",
        "progress=false",
        *overrides,
    )


NEW_TASK = (f"task.gym_id={UNKNOWN_GYM_ID}", "task.termination=none")
FP32 = "estimator.rollout_dtype=float32"  # auto's bf16 timing (~5 s a run) is not tested here


@pytest.fixture(scope="module")
def cbop_run(workspace: dict) -> Path:
    done = train(workspace, "cbop.py", "cbop", *NEW_TASK, "estimator.psi=1.0", FP32)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "no normalized score" in done.stdout
    assert "model rollouts on Swimmer-v4 never terminate" in done.stderr  # the none warning
    return workspace["root"] / "cbop"


def test_the_registry_does_not_know_the_task() -> None:
    assert UNKNOWN_GYM_ID not in {task.gym_id for task in families().values()}


def test_cbop_trains_and_evaluates_an_unknown_task_from_its_data(cbop_run: Path) -> None:
    results = json.loads((cbop_run / "results.json").read_text())
    assert results["gym_id"] == UNKNOWN_GYM_ID and results["env_family"] == UNKNOWN_GYM_ID
    assert (results["obs_dim"], results["action_dim"]) == (8, 2)  # read from the data
    assert results["task"]["termination"] == "none"
    assert results["normalized_score_mean"] is None and results["normalized_score_std"] is None
    assert "no normalized score" in results["normalized_score_note"]
    assert len(results["episode_returns"]) == results["episodes"] == 2
    assert results["return_mean"] == pytest.approx(np.mean(results["episode_returns"]))
    assert all(record["normalized_score_mean"] is None for record in results["eval_history"])
    assert (cbop_run / "policy.pt").is_file()


def test_reference_scores_give_a_normalized_score(workspace: dict, cbop_run: Path) -> None:
    done = train(
        workspace, "cbop.py", "cbop-ref", *NEW_TASK, "estimator.psi=1.0", FP32,
        "task.ref_min_score=-10", "task.ref_max_score=40",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((workspace["root"] / "cbop-ref" / "results.json").read_text())
    expected = [100 * (r + 10) / 50 for r in results["episode_returns"]]
    assert results["normalized_score_mean"] == pytest.approx(np.mean(expected))
    assert "normalized_score_note" not in results
    # same data, seed and settings: the reference scores only change the reporting
    unnormalized = json.loads((cbop_run / "results.json").read_text())
    assert results["episode_returns"] == unnormalized["episode_returns"]


def test_psi_is_asked_for_with_a_command_that_works(workspace: dict) -> None:
    done = train(workspace, "cbop.py", "no-psi", *NEW_TASK)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "the paper has no psi" in done.stderr and "estimator.psi=2.0" in done.stderr


def test_baseline_trains_on_the_unknown_task(workspace: dict) -> None:
    done = train(workspace, "baseline.py", "td3bc", "algo=td3bc", *NEW_TASK)
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((workspace["root"] / "td3bc" / "results.json").read_text())
    assert results["gym_id"] == UNKNOWN_GYM_ID and results["normalized_score_mean"] is None
    assert len(results["episode_returns"]) == 2


def test_evaluate_uses_the_recorded_task_and_accepts_task_keys(
    workspace: dict, cbop_run: Path
) -> None:
    out = workspace["root"] / "evaluation.json"
    done = run(
        workspace, "evaluate.py", f"checkpoint={cbop_run / 'policy.pt'}", "episodes=2",
        "max_steps=30", f"output={out}",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"on {UNKNOWN_GYM_ID}" in done.stdout and "no normalized score" in done.stdout
    assert json.loads(out.read_text())["normalized_score_mean"] is None
    done = run(
        workspace, "evaluate.py", f"checkpoint={cbop_run / 'policy.pt'}", "episodes=2",
        "max_steps=30", f"output={out}", "task.ref_min_score=0", "task.ref_max_score=100",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(out.read_text())
    assert summary["normalized_score_mean"] == pytest.approx(summary["return_mean"])
    wrong = run(
        workspace, "evaluate.py", f"checkpoint={cbop_run / 'policy.pt'}", "task.gym_id=Hopper-v4"
    )
    assert wrong.returncode == 2 and "Traceback" not in wrong.stderr
    assert "[8]" in wrong.stderr and "[11]" in wrong.stderr


def test_a_size_mismatch_names_both_shapes_and_exits_2(workspace: dict) -> None:
    done = train(workspace, "cbop.py", "mismatch", "task.gym_id=Hopper-v4", "estimator.psi=1.0")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    message = done.stderr
    assert "observations of shape [N, 8]" in message and "actions of shape [N, 2]" in message
    assert "observation_spec has shape [11]" in message and "action_spec shape [3]" in message


def test_an_unnamed_task_asks_for_task_gym_id_with_a_working_command(workspace: dict) -> None:
    # one CBOP epoch and one evaluation episode: the suggestion is rerun as a subprocess
    short = ("train.epochs=1", "eval.episodes=1")
    done = train(workspace, "cbop.py", "unnamed", "estimator.psi=1.0", FP32, *short)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "family=" not in done.stderr
    # the command run, with the task named, for the console script (no scripts/ in a wheel)
    suggested = shlex.split(done.stderr.split("`")[1])
    assert Path(suggested[0]).name == "cbop-train"
    assert f"env={workspace['dataset']}" in suggested and "task.gym_id=Swimmer-v4" in suggested
    assert "preset=debug" in suggested and "estimator.psi=1.0" in suggested
    assert all(override in suggested for override in short)
    redone = subprocess.run(suggested, env=workspace["env"], capture_output=True, text=True)
    assert redone.returncode == 0, redone.stderr[-3000:]  # the suggestion works as printed
    assert (workspace["root"] / "unnamed" / "results.json").is_file()


# ------------------------------------------------------------------ resolution (no training)


def test_known_families_need_no_settings_and_the_command_line_wins(tmp_path: Path) -> None:
    info = dataset_info(write_d4rl_hdf5(tmp_path / "walker2d-medium-tiny.hdf5", "walker2d"))
    assert resolve_task(None, info) == get_family("walker2d")
    task = resolve_task({"ref_min_score": 0, "ref_max_score": 10, "termination": "none"}, info)
    assert (task.gym_id, task.ref_max_score, task.termination) == ("Walker2d-v4", 10.0, "none")
    # a known gym id brings its family's constants to a file with any name
    other = dataset_info(write_d4rl_hdf5(tmp_path / "mine.hdf5", "hopper"))
    assert resolve_task(TaskConfig(gym_id="Hopper-v4"), other) == get_family("hopper")


def test_recorded_gym_id_and_bad_task_settings(tmp_path: Path) -> None:
    path = write_d4rl_hdf5(tmp_path / "robot.hdf5", "swimmer", metadata={"env_id": "Swimmer-v4"})
    info = dataset_info(path)
    with pytest.raises(TaskError, match="no termination function is known") as error:
        resolve_task(None, info)
    assert "Pass task.termination=none" in str(error.value)
    task = resolve_task({"termination": "none"}, info)
    assert task.gym_id == "Swimmer-v4" and not task.has_reference_scores
    check_data_fits_env(info, read_env_specs(task), task)
    with pytest.raises(TaskError, match="give both"):
        resolve_task({"termination": "none", "ref_min_score": 1.0}, info)
    with pytest.raises(TaskError, match="not a registered termination function"):
        resolve_task({"termination": "swimmer"}, info)
    with pytest.raises(TaskError, match="gymnasium cannot make task.gym_id=Nope-v4"):
        read_env_specs(resolve_task({"gym_id": "Nope-v4", "termination": "none"}, info))


def test_ant_data_picks_the_observation_layout_it_was_recorded_in(tmp_path: Path) -> None:
    """Ant-v4 gives 27 observations, or 111 with contact forces (D4RL's layout): the data's
    width decides, under the family's name and under task.gym_id=Ant-v4 alike; an explicit
    +task.gym_kwargs.use_contact_forces still wins."""
    full = dataset_info(write_d4rl_hdf5(tmp_path / "ant-medium-tiny.hdf5", "ant"))
    short = dataset_info(write_d4rl_hdf5(tmp_path / "ant-short.hdf5", "ant", obs_dim=27))
    assert (full.family, full.obs_dim, full.action_dim) == ("ant", 111, 8)
    assert (short.family, short.obs_dim) == ("ant", 27)
    for info, contact_forces in ((full, True), (short, False)):
        for config in (None, {"gym_id": "Ant-v4"}):
            task = resolve_task(config, info)
            assert task.gym_kwargs["use_contact_forces"] is contact_forces
            assert task.ref_min_score == -325.6 and task.termination == "ant"
            specs = read_env_specs(task)
            assert specs.observation_shape == (info.obs_dim,) and specs.action_shape == (8,)
            check_data_fits_env(info, specs, task)
    forced = resolve_task({"gym_kwargs": {"use_contact_forces": True}}, short)
    with pytest.raises(TaskError, match=r"\[N, 27\].*\[111\].*use_contact_forces"):
        check_data_fits_env(short, read_env_specs(forced), forced)


def test_another_action_box_is_rescaled_in_the_env_and_in_the_data(tmp_path: Path) -> None:
    """InvertedPendulum-v4 acts in [-3, 3]: the agent's [-1, 1] maps onto it both ways."""
    path = record_gym_episodes(tmp_path / "pendulum.hdf5", "InvertedPendulum-v4", 2, 10)
    data, info = load_dataset_with_info(path)
    task = resolve_task({"gym_id": "InvertedPendulum-v4", "termination": "none"}, info)
    specs = read_env_specs(task)
    check_data_fits_env(info, specs, task)
    assert (specs.action_low, specs.action_high) == ((-3.0,), (3.0,)) and specs.rescales_actions
    scaled = specs.to_agent_actions(data)
    assert torch.allclose(scaled["action"], data["action"] / 3)
    assert torch.allclose(scaled["next", "action"], data["next", "action"] / 3)
    assert not torch.equal(scaled["action"], data["action"])  # the input is left alone
    assert specs.fingerprint_suffix() == "-actions[-3,3]"

    env, raw = make_env(task), gymnasium.make("InvertedPendulum-v4")
    box = env.action_spec.space
    assert (box.low.tolist(), box.high.tolist()) == ([-1.0], [1.0])
    start = env.reset()
    raw.reset(seed=0)
    simulator = env.base_env._env.unwrapped.data  # put the raw env in the same state
    raw.unwrapped.set_state(simulator.qpos.copy(), simulator.qvel.copy())
    agent_step = env.step(start.set("action", torch.tensor([0.5])))
    raw_next, *_ = raw.step(np.array([1.5]))
    assert np.allclose(agent_step["next", "observation"].numpy(), raw_next, atol=1e-6)
    raw.close()
    hopper = make_env(get_family("hopper"))  # a [-1, 1] box gets no extra transform
    assert not isinstance(hopper.transform, Compose)  # DoubleToFloat alone, no ActionScaling
    assert any(isinstance(t, ActionScaling) for t in env.transform)
    hopper.close()
    env.close()


def test_cbop_and_evaluate_on_a_task_with_another_action_box(workspace: dict) -> None:
    path = record_gym_episodes(workspace["root"] / "pendulum-tiny.hdf5", "InvertedPendulum-v4")
    task = ("task.gym_id=InvertedPendulum-v4", "task.termination=none", "estimator.psi=1.0", FP32)
    # random pendulum episodes fall within a few steps: ~24 rows, less than the debug batches
    batches = ("bc.batch_size=16", "fqe.batch_size=16", "train.batch_size=16")
    done = run(
        workspace, "cbop.py", "preset=debug", f"env={path}", "progress=false",
        f"hydra.run.dir={workspace['root'] / 'pendulum'}", *task, *batches,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((workspace["root"] / "pendulum" / "results.json").read_text())
    assert results["gym_id"] == "InvertedPendulum-v4" and results["action_dim"] == 1
    assert all(n > 0 for n in results["episode_returns"])  # +1 per step alive
    policy = workspace["root"] / "pendulum" / "policy.pt"
    evaluated = run(workspace, "evaluate.py", f"checkpoint={policy}", "episodes=2")
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert "on InvertedPendulum-v4" in evaluated.stdout


def test_evaluate_and_collect_task_overrides() -> None:
    hopper = get_family("hopper")
    assert override_task(hopper, None) == hopper
    scored = override_task(hopper, {"ref_min_score": 0, "ref_max_score": 1})
    assert scored.ref_max_score == 1.0 and scored.gym_id == "Hopper-v4"
    swimmer = collection_task("swimmer", {"gym_id": "Swimmer-v4"})
    assert (swimmer.name, swimmer.gym_id, swimmer.termination) == ("swimmer", "Swimmer-v4", "none")
    with pytest.raises(TaskError, match="task.gym_id=Swimmer-v4 kind=random"):
        collection_task("swimmer", None)


def test_the_report_refuses_a_run_without_normalized_score(cbop_run: Path) -> None:
    from cbop_torchrl.evaluation.summaries import ReportError, summarize_run

    with pytest.raises(ReportError, match="no normalized score .*task.ref_min_score"):
        summarize_run(cbop_run, analysis=False)


def test_select_psi_ranks_by_return_and_takes_task_reference_scores(
    workspace: dict, cbop_run: Path
) -> None:
    import shutil

    sweep = workspace["root"] / "sweep"
    shutil.copytree(cbop_run, sweep / "psi1", ignore=shutil.ignore_patterns("selection_fqe"))
    common = ("select_psi.py", f"sweep_dir={sweep}", "steps=10", "progress=false", "threads=1")
    ret = json.loads((cbop_run / "results.json").read_text())["return_mean"]
    done = run(workspace, *common)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"{ret:.1f}" in done.stdout  # no reference scores: the online score is the return
    done = run(workspace, *common, "task.ref_min_score=-10", "task.ref_max_score=10")
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"{100 * (ret + 10) / 20:.1f}" in done.stdout


def test_select_psi_task_arguments_are_checked(capsys: pytest.CaptureFixture) -> None:
    from cbop_torchrl.apps import select_psi as module

    config = module.check_task({"ref_min_score": 0, "ref_max_score": 360})
    assert (config.ref_min_score, config.ref_max_score) == (0, 360)
    with pytest.raises(module.SweepError, match="give both"):
        module.check_task({"ref_min_score": 3})
    # the schema refuses an unknown task key before any run is read
    assert module.main(["sweep_dir=no_sweep", "task.foo=1"]) == 2
    error = capsys.readouterr().err
    assert "task.foo" in error and "ref_min_score" in error and "no_sweep" not in error


def test_a_suggested_command_is_the_users_own_with_the_task_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """From a program: its command line with task.* set (psi for cbop-train only, the
    others have no estimator); from Python: a cbop-train command."""
    from cbop_torchrl.envs.task import example_command
    from cbop_torchrl.runtime import program_command, running_program, set_running_program

    path = write_d4rl_hdf5(tmp_path / "robot.hdf5", "swimmer")
    info = dataset_info(path)
    typed = [f"env={path}", "output_dir=out", "task.gym_id=Bad-v0"]
    monkeypatch.setattr(sys, "argv", ["cbop-train-dynamics", *typed])
    assert running_program() is None
    set_running_program("cbop-train-dynamics")
    try:
        command = example_command(info, "Swimmer-v4")
    finally:
        set_running_program(None)
    assert command == (
        f"{program_command('cbop-train-dynamics')} env={path} output_dir=out "
        "task.gym_id=Swimmer-v4 task.termination=none"
    )
    assert example_command(info, "Swimmer-v4") == (
        f"{program_command('cbop-train')} env={path} task.gym_id=Swimmer-v4 "
        "task.termination=none estimator.psi=1.0"
    )
