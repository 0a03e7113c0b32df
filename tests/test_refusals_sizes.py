"""Sizes that cannot fit are refused before any work: the memory estimate of a run
(``cbop_torchrl.trainers.memory``) names the estimate and the setting to lower, for
``cbop-train`` before its first stage and ``cbop-train-dynamics`` before training; the
default and paper presets are estimated well within a laptop.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from d4rl_files import pipeline_workspace

from cbop_torchrl.apps.api import compose_config
from cbop_torchrl.cli import config_values, run_entry
from cbop_torchrl.config import load_config
from cbop_torchrl.registry import get_family
from cbop_torchrl.trainers import memory


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
