"""The examples in examples/ run and show what their docstrings promise."""

from __future__ import annotations

import importlib.util
import math
import sys
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_sacloss_example_shows_a_meaningful_expected_horizon_and_the_diagnostics(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("CBOP_TORCHRL_CACHE", str(tmp_path / "cache"))
    path = ROOT / "examples" / "sacloss_with_cbop_target.py"
    spec = importlib.util.spec_from_file_location("sacloss_example", path)
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    shown = example.main(steps=3, horizon=3, num_qvalue_nets=3)
    # A fitted model keeps imagined states valid, so horizons beyond 0 carry weight.
    assert 0.05 < shown["expected_horizon"] < 3
    assert len(shown["weights"]) == 4 and abs(sum(shown["weights"]) - 1) < 0.01
    assert not any(key.startswith("cbop") for key in shown["sac_keys"])
    assert {"cbop/expected_horizon", "cbop/weights"} <= set(shown["cbop_keys"])
    out = capsys.readouterr()
    assert "E[h] = " in out.out and "No target network updater" not in out.err


TINY_FLAGS = (
    "--dynamics-members 3 --dynamics-elites 2 --dynamics-hidden 32 --dynamics-epochs 1 "
    "--hidden-size 32 --num-qvalue-nets 3 --batch-size 64 --bc-steps 20 --fqe-steps 20 "
    "--cbop-steps 20 --horizon 2 --log-interval 10 --eval-episodes 2 --eval-max-steps 50"
).split()


@pytest.mark.usefixtures("one_torch_thread")
def test_minimal_cbop_example_trains_every_stage_and_scores_the_cbop_actor(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    path = ROOT / "examples" / "cbop_minimal.py"
    assert len(path.read_text().splitlines()) <= 300  # one file a newcomer reads in a sitting
    spec = importlib.util.spec_from_file_location("cbop_minimal", path)
    example = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "cbop_minimal", example)  # its dataclass looks itself up
    spec.loader.exec_module(example)
    config = example.parse_config(TINY_FLAGS)
    assert (config.cbop_steps, config.horizon, config.psi) == (20, 2, 2.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        shown = example.main(config)
    assert not [w for w in caught if w.filename == str(path)]  # a clean first run for a reader
    out = capsys.readouterr().out
    # The critic regressed on CBOP's target: its diagnostics were logged at steps 10 and 20,
    # and with a fitted model some weight lies beyond the model-free h = 0.
    assert len(shown["expected_horizon"]) == 2
    assert all(0.0 < e_h <= 2.0 for e_h in shown["expected_horizon"]), shown
    assert "E[h]" in out and "of H = 2" in out
    assert len(shown["critic_losses"]) == 20
    # The actor SACLoss trained is the BC actor itself, and CBOP moved it.
    assert shown["actor_change"] > 0
    for key in ("bc_normalized_score", "normalized_score"):
        assert math.isfinite(shown[key]), shown
    assert f"CBOP actor: normalized score {shown['normalized_score']:.1f}" in out
