"""Refusals of the report, evaluation, checkpoints and sizes: a report needs no cache, an
evaluation replaces only its own output, no file makes gymnasium import code, and edited
policies and sizes that cannot fit are refused.

One finished debug CBOP run (module fixture, trained in this process: tests/inprocess.py)
feeds the report and evaluation cases; the others refuse before any work.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from d4rl_files import debug_cbop_command, pipeline_workspace
from inprocess import train_cbop

from cbop_torchrl.apps import evaluate as evaluate_app
from cbop_torchrl.apps import report as report_app
from cbop_torchrl.apps.api import compose_config
from cbop_torchrl.cli import config_values, run_entry
from cbop_torchrl.config import load_config
from cbop_torchrl.data.info import DatasetInfo
from cbop_torchrl.envs import EVALUATION_FORMAT, TaskError, resolve_task
from cbop_torchrl.evaluation.analysis import load_run_config
from cbop_torchrl.evaluation.summaries import ReportError, load_summaries, summarize_run
from cbop_torchrl.registry import get_family
from cbop_torchrl.trainers import memory
from cbop_torchrl.trainers.checkpoint import CheckpointError, load_policy, seal

ROOT = Path(__file__).resolve().parents[1]
ZEN = "Beautiful is better than ugly"  # what `import this` prints


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """A finished debug CBOP run, trained in this process (only its outputs are read):
    ``{"root", "dataset", "env", "run"}``."""
    root = tmp_path_factory.mktemp("relio")
    workspace = pipeline_workspace(root)
    run = root / "run"
    train_cbop(debug_cbop_command(workspace, run)[2:], run, workspace["env"])
    return {**workspace, "run": run}


def _one_error(done: subprocess.CompletedProcess) -> str:
    """The single ``error:`` paragraph of a refused command (exit code 2, no traceback)."""
    output = done.stdout + done.stderr
    assert done.returncode == 2, output
    assert "Traceback" not in output, output
    errors = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1, output
    return errors[0]


def _edited_policy(finished_run: dict, tmp_path: Path, edit) -> Path:
    """A copy of the run's ``policy.pt`` changed by ``edit(state)`` (a hostile file: its
    integrity digest is made again, as a deliberate edit would, so the checks of its content
    are what refuses it)."""
    state = torch.load(finished_run["run"] / "policy.pt", weights_only=True)
    edit(state)
    path = tmp_path / "policy.pt"
    torch.save(seal(state), path)
    return path


# ------------------------------------------------------------------------------- the report


def test_report_on_a_finished_run_needs_nothing_from_a_cleared_cache(
    finished_run: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    cache = Path(finished_run["env"]["CBOP_TORCHRL_CACHE"])
    assert any(cache.iterdir())  # the run cached its dataset and dynamics model
    empty_cache = tmp_path / "cleared_cache"  # as after `rm -rf` of the cache (README: safe)
    empty_cache.mkdir()
    monkeypatch.setenv("CBOP_TORCHRL_CACHE", str(empty_cache))
    monkeypatch.chdir(tmp_path)
    code = report_app.main([f"paths={finished_run['run']}", "out=report"])
    assert code == 0, capsys.readouterr().err
    out = tmp_path / "report"
    assert "| hopper-medium-replay-tiny | cbop | 1 (0) | 40 |" in (out / "results.md").read_text()
    # the checkpoint-based analysis ran (it rebuilt what it needed from the data file)
    assert (out / "rh_hopper-medium-replay-tiny_cbop.png").read_bytes()[:4] == b"\x89PNG"
    assert "| hopper-medium-replay-tiny | cbop |" in (out / "conservatism.md").read_text()


def _summary_folder(finished_run: dict, root: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Two seeds' summaries of the finished run in ``root/results``."""
    monkeypatch.setenv("CBOP_TORCHRL_CACHE", finished_run["env"]["CBOP_TORCHRL_CACHE"])
    summary = summarize_run(finished_run["run"], analysis=False)
    folder = root / "results" / "tiny" / "cbop"
    folder.mkdir(parents=True)
    for seed in (0, 1):
        (folder / f"seed{seed}.json").write_text(json.dumps({**summary, "seed": seed}))
    return root / "results"


def test_a_truncated_summary_is_an_error_naming_the_file_not_a_missing_seed(
    finished_run: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    folder = _summary_folder(finished_run, tmp_path, monkeypatch)
    assert len(load_summaries([folder])) == 2
    seed1 = folder / "tiny" / "cbop" / "seed1.json"
    text = seed1.read_text()
    seed1.write_text(text[: len(text) // 2])  # a copy cut short
    with pytest.raises(ReportError, match="seed1.json"):
        load_summaries([folder])

    monkeypatch.chdir(tmp_path)
    assert report_app.main([f"paths={folder}", "out=report"]) == 2
    err = capsys.readouterr().err
    assert "seed1.json" in err and "truncated or damaged" in err
    assert not (tmp_path / "report").exists()

    run = tmp_path / "run"
    shutil.copytree(finished_run["run"], run)
    results = json.loads((run / "results.json").read_text())
    del results["seed"]
    (run / "results.json").write_text(json.dumps(results))
    with pytest.raises(ReportError, match=r"results\.json.*lacks seed"):
        load_summaries([run], analysis=False)
    (run / "results.json").write_text(json.dumps(results)[:50])
    with pytest.raises(ReportError, match=r"cannot read .*results\.json"):
        load_summaries([run], analysis=False)

    summary = json.loads(text)
    del summary["final_normalized_score"]  # parses, but is no longer a whole summary
    seed1.write_text(json.dumps(summary))
    with pytest.raises(ReportError, match=r"seed1\.json.*final_normalized_score"):
        load_summaries([folder])


def test_report_without_matplotlib_names_the_extra_and_writes_nothing(
    finished_run: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` now fails
    monkeypatch.chdir(tmp_path)
    assert report_app.main([f"paths={finished_run['run']}", "out=report"]) == 2
    err = capsys.readouterr().err
    assert 'pip install "cbop-torchrl[report]"' in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == []  # no results.csv/md, no runs.csv


# ------------------------------------------------------------------------ evaluate's output


def _evaluate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *argv: str) -> int:
    monkeypatch.chdir(tmp_path)
    return run_entry(evaluate_app.main, list(argv))


def test_evaluate_never_replaces_a_file_it_did_not_write(
    finished_run: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    checkpoint = finished_run["run"] / "checkpoint.pt"
    before = checkpoint.read_bytes()
    user_file = tmp_path / "notes.txt"
    user_file.write_text("mine\n")
    results = finished_run["run"] / "results.json"
    results_before = results.read_text()
    cases = [
        (checkpoint, "is the checkpoint being evaluated"),
        (user_file, "is not an evaluation output of cbop-evaluate"),
        (results, "is not an evaluation output of cbop-evaluate"),
        (tmp_path, "is a directory; output= takes the path of a JSON file"),
    ]
    for output, words in cases:
        code = _evaluate(tmp_path, monkeypatch, f"checkpoint={checkpoint}", f"output={output}")
        err = capsys.readouterr().err
        assert code == 2, err
        assert words in err and "Traceback" not in err, err
    assert checkpoint.read_bytes() == before
    assert user_file.read_text() == "mine\n" and results.read_text() == results_before

    # a previous output of this program is replaced
    output = tmp_path / "eval.json"
    argv = [f"checkpoint={checkpoint}", f"output={output}", "episodes=1", "max_steps=5"]
    assert _evaluate(tmp_path, monkeypatch, *argv) == 0, capsys.readouterr().err
    assert json.loads(output.read_text())["format"] == EVALUATION_FORMAT
    assert _evaluate(tmp_path, monkeypatch, *argv, "seed=1") == 0, capsys.readouterr().err
    assert json.loads(output.read_text())["episodes"] == 1


def test_evaluate_refuses_more_episodes_than_fit_before_making_any_environment(
    finished_run: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    import cbop_torchrl.envs.gym as gym_module

    def no_env(*args, **kwargs):
        raise AssertionError("an environment was made before the size check")

    monkeypatch.setattr(gym_module, "SerialEnv", no_env)
    checkpoint = finished_run["run"] / "policy.pt"
    assert _evaluate(tmp_path, monkeypatch, f"checkpoint={checkpoint}", "episodes=100000") == 2
    err = capsys.readouterr().err
    assert "episodes=100000 (at most about" in err and "available memory" in err, err
    assert "closed environment" not in err


def test_an_out_of_memory_error_while_evaluating_is_reported_not_a_closed_environment(
    finished_run: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    import cbop_torchrl.envs as envs

    def out_of_memory(*args, **kwargs):
        raise MemoryError("mj_makeData: could not allocate memory")  # before any env started

    monkeypatch.setattr(envs, "evaluate_policy", out_of_memory)
    checkpoint = finished_run["run"] / "policy.pt"
    assert _evaluate(tmp_path, monkeypatch, f"checkpoint={checkpoint}", "episodes=2") == 2
    err = capsys.readouterr().err
    assert "ran out of memory with episodes=2" in err and "could not allocate" in err, err
    assert "closed environment" not in err and "Traceback" not in err


# ------------------------------------------------------ no file makes gymnasium import code


def test_a_module_qualified_gym_id_in_a_checkpoint_is_refused_unless_given_on_the_command_line(
    finished_run: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    def zen(state: dict) -> None:
        state["policy"]["task"]["gym_id"] = "this:Zen-v0"

    policy = _edited_policy(finished_run, tmp_path, zen)
    assert "this" not in sys.modules
    assert _evaluate(tmp_path, monkeypatch, f"checkpoint={policy}") == 2
    captured = capsys.readouterr()
    assert "'this:Zen-v0'" in captured.err and "task.gym_id=this:Zen-v0" in captured.err
    assert "Traceback" not in captured.err
    assert "this" not in sys.modules and ZEN not in captured.out  # never imported

    # Given on the command line, the user trusts it: gymnasium imports `this` (the Zen
    # is printed) and then finds no Zen-v0 there.
    argv = [f"checkpoint={policy}", "task.gym_id=this:Zen-v0"]
    assert _evaluate(tmp_path, monkeypatch, *argv) == 2
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

    policy = _edited_policy(finished_run, tmp_path, mine)
    with pytest.raises(CheckpointError, match="my_envs"):
        load_policy(policy)
    assert "my_envs" not in sys.modules
    argv = [f"checkpoint={policy}", "task.gym_id=my_envs:MyHopper-v0", "episodes=1",
            "max_steps=5"]  # fmt: skip
    assert _evaluate(tmp_path, monkeypatch, *argv) == 0, capsys.readouterr().err
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


# ----------------------------------------------------- edited policies and impossible sizes


def test_an_edited_policy_with_nan_weights_or_equal_reference_scores_is_refused(
    finished_run: dict, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    def nan_weights(state: dict) -> None:
        name = next(iter(state["actor"]))
        state["actor"][name] = torch.full_like(state["actor"][name], float("nan"))

    policy = _edited_policy(finished_run, tmp_path, nan_weights)
    assert _evaluate(tmp_path, monkeypatch, f"checkpoint={policy}") == 2
    err = capsys.readouterr().err
    assert "non-finite weights" in err and "Traceback" not in err, err

    def equal_scores(state: dict) -> None:
        state["policy"]["task"]["ref_min_score"] = 100.0
        state["policy"]["task"]["ref_max_score"] = 100.0

    policy = _edited_policy(finished_run, tmp_path, equal_scores)
    assert _evaluate(tmp_path, monkeypatch, f"checkpoint={policy}") == 2
    err = capsys.readouterr().err
    assert "must be finite and differ" in err and "Traceback" not in err, err


def _run_config(
    overrides: list[str], family: str = "hopper", name: str = "hopper-medium-replay-gen"
):
    values = config_values(compose_config(overrides))
    config, _ = load_config(values, lambda env: (get_family(family), name))
    return config


def test_the_default_and_paper_presets_are_estimated_well_within_a_laptop() -> None:
    for overrides, family, name in [
        ([], "hopper", "hopper-medium-replay-gen"),
        (["preset=debug"], "hopper", "hopper-medium-replay-gen"),
        (["env=hopper-medium-replay-v2"], "hopper", "hopper-medium-replay-v2"),
        (["env=walker2d-medium-v2"], "walker2d", "walker2d-medium-v2"),
    ]:
        config = _run_config(overrides, family, name)
        estimate = memory.run_estimate(config, 17, 6)
        assert 0 < estimate.total < 1.5 * 2**30, (overrides, estimate.describe())


def test_sizes_that_cannot_fit_are_refused_naming_the_estimate_and_the_setting(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(memory, "available_memory", lambda device: (8 * 2**30, "available x"))
    memory.check_run_fits(_run_config([]), 11, 3, "cpu")  # the default fits in 8 GB
    for override, setting in [
        ("agent.num_qvalue_nets=100000", "agent.num_qvalue_nets"),
        ("agent.hidden_sizes=[100000,100000]", "agent.hidden_sizes"),
        ("train.batch_size=10000000", "train.batch_size"),
    ]:
        with pytest.raises(memory.MemoryLimitError) as error:
            memory.check_run_fits(_run_config([override]), 11, 3, "cpu")
        text = str(error.value)
        assert "GB" in text and "8.0 GB of available x" in text and setting in text, text
    with pytest.raises(memory.MemoryLimitError, match="estimator.horizon=100000 model steps"):
        memory.check_run_fits(_run_config(["estimator.horizon=100000"]), 11, 3, "cpu")


@pytest.mark.parametrize(
    ("override", "words"),
    [
        ("agent.num_qvalue_nets=100000", ["agent.num_qvalue_nets", "GB", "Lower"]),
        ("estimator.horizon=100000", ["estimator.horizon=100000", "longer than any episode"]),
        ("agent.hidden_sizes=[100000,100000]", ["agent.hidden_sizes", "GB", "Lower"]),
    ],
)
def test_cbop_train_refuses_impossible_sizes_before_any_stage(
    tmp_path: Path, override: str, words: list[str], monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    from cbop_torchrl.apps import cbop as cbop_app

    workspace = pipeline_workspace(tmp_path, episode_lengths=(40,) * 4)
    run = tmp_path / "run"
    monkeypatch.chdir(tmp_path)
    argv = [f"env={workspace['dataset']}", f"hydra.run.dir={run}", "progress=false", override]
    assert run_entry(cbop_app.main, argv) == 2
    captured = capsys.readouterr()
    errors = [line for line in captured.err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in captured.err, captured.err
    for word in words:
        assert word in errors[0], errors[0]
    assert "[cbop]" not in captured.out  # refused before the banner and any stage
    assert not run.exists()


def test_train_dynamics_refuses_an_ensemble_that_cannot_fit_before_training(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    from cbop_torchrl.apps import train_dynamics as dynamics_app

    workspace = pipeline_workspace(tmp_path, episode_lengths=(40,) * 4)
    out = tmp_path / "out"
    monkeypatch.chdir(tmp_path)
    argv = [f"env={workspace['dataset']}", f"output_dir={out}", "dynamics.num_members=100000"]
    assert run_entry(dynamics_app.main, argv) == 2
    captured = capsys.readouterr()
    errors = [line for line in captured.err.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in captured.err, captured.err
    assert "dynamics.num_members" in errors[0] and "GB" in errors[0], errors[0]
    assert not (out / "dynamics.pt").exists()
