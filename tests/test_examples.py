"""The examples in examples/ run and show what their docstrings promise."""

from __future__ import annotations

import importlib.util
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
