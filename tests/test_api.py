"""The Python API: the README's example runs as written, and configs are the CLI's."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
from omegaconf import ValidationError

from cbop_torchrl import compose_config

README = Path(__file__).resolve().parents[1] / "README.md"


@pytest.fixture
def restore_torch_threads():
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def test_readme_python_api_example_runs(tmp_path, monkeypatch, capsys, restore_torch_threads):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.DOTALL)
    (example,) = [block for block in blocks if "compose_config" in block]
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(example, "README.md", "exec"), namespace)

    cfg, results, scores = namespace["cfg"], namespace["results"], namespace["scores"]
    written = json.loads((tmp_path / "runs" / "api-demo" / "results.json").read_text())
    for key in ("dataset", "seed", "gradient_steps", "normalized_score_mean", "preset"):
        assert results[key] == written[key], key
    assert results["seed"] == 1 and results["preset"] == "debug"
    assert results["gradient_steps"] == cfg.train.epochs * cfg.train.steps_per_epoch
    assert len(scores["returns"]) == 2
    assert scores["dataset"] == results["dataset"]
    printed = capsys.readouterr().out
    assert f"{results['normalized_score_mean']} {results['gradient_steps']}" in printed


def test_compose_config_is_typed_and_chooses_presets_like_the_cli() -> None:
    cfg = compose_config(["preset=debug", "estimator.psi=0.5"])
    assert (cfg.preset, cfg.estimator.psi, cfg.agent.num_qvalue_nets) == ("debug", 0.5, 3)
    with pytest.raises(ValidationError):
        cfg.seed = "one"
    assert compose_config(["env=hopper-medium-v2"]).preset == "paper"
    assert compose_config(["env=hopper-medium-v2", "preset=cpu"]).preset == "cpu"
    assert compose_config().preset == "cpu"
    baseline = compose_config(["algo=iql"], command="baseline")
    assert (baseline.algo.name, baseline.algo.expectile) == ("iql", 0.7)
    with pytest.raises(ValueError, match="command='nope' is not one of"):
        compose_config(command="nope")
