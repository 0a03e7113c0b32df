"""No file makes gymnasium import code: a module-qualified gym id (``module:Env-v0``) read
from a checkpoint, a stored run config or a dataset's metadata is refused, and runs only when
given on the command line, where the user trusts it.

The files are edited copies of a finished run's (conftest's ``finished_run``); ``this`` (the
module that prints the Zen of Python when imported) shows whether an import happened.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest
from refusal_inputs import edited_policy
from refusals import evaluate_in

from cbop_torchrl.data.info import DatasetInfo
from cbop_torchrl.envs import TaskError, resolve_task
from cbop_torchrl.evaluation.analysis import load_run_config
from cbop_torchrl.trainers.checkpoint import CheckpointError, load_policy

ZEN = "Beautiful is better than ugly"  # what `import this` prints


def test_a_module_qualified_gym_id_in_a_checkpoint_is_refused_unless_given_on_the_command_line(
    finished_run: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    def zen(state: dict) -> None:
        state["policy"]["task"]["gym_id"] = "this:Zen-v0"

    policy = edited_policy(finished_run, tmp_path, zen)
    assert "this" not in sys.modules
    assert evaluate_in(tmp_path, monkeypatch, f"checkpoint={policy}") == 2
    captured = capsys.readouterr()
    assert "'this:Zen-v0'" in captured.err and "task.gym_id=this:Zen-v0" in captured.err
    assert "Traceback" not in captured.err
    assert "this" not in sys.modules and ZEN not in captured.out  # never imported

    # Given on the command line, the user trusts it: gymnasium imports `this` (the Zen
    # is printed) and then finds no Zen-v0 there.
    argv = [f"checkpoint={policy}", "task.gym_id=this:Zen-v0"]
    assert evaluate_in(tmp_path, monkeypatch, *argv) == 2
    captured = capsys.readouterr()
    assert "gymnasium cannot make task.gym_id=this:Zen-v0" in captured.err
    assert ZEN in captured.out


def test_a_trusted_module_qualified_gym_id_evaluates(
    finished_run: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    module = tmp_path / "my_envs.py"
    module.write_text(
        "import gymnasium\n"
        "gymnasium.register('MyHopper-v0', entry_point="
        "'gymnasium.envs.mujoco.hopper_v4:HopperEnv', max_episode_steps=1000)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))

    def mine(state: dict) -> None:
        state["policy"]["task"]["gym_id"] = "my_envs:MyHopper-v0"

    policy = edited_policy(finished_run, tmp_path, mine)
    with pytest.raises(CheckpointError, match="my_envs"):
        load_policy(policy)
    assert "my_envs" not in sys.modules
    argv = [f"checkpoint={policy}", "task.gym_id=my_envs:MyHopper-v0", "episodes=1",
            "max_steps=5"]  # fmt: skip
    assert evaluate_in(tmp_path, monkeypatch, *argv) == 0, capsys.readouterr().err
    assert "on my_envs:MyHopper-v0" in capsys.readouterr().out


def test_module_qualified_ids_in_stored_configs_and_dataset_metadata_are_refused(
    finished_run: dict, tmp_path: Path, capsys
) -> None:
    run = tmp_path / "run"
    shutil.copytree(finished_run["run"], run)
    config = json.loads((run / "config.json").read_text())
    config["task"]["gym_id"] = "this:Zen-v0"
    (run / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="this:Zen-v0.*analysis=false"):
        load_run_config(run)

    info = DatasetInfo(name="mine", fingerprint="f", num_transitions=10, source_kind="hdf5",
                       obs_dim=11, action_dim=3, env_id="this:Zen-v0")  # fmt: skip
    with pytest.raises(TaskError, match="task.gym_id=this:Zen-v0"):
        resolve_task(None, info)
    assert ZEN not in capsys.readouterr().out
