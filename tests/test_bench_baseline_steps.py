"""``python -m benchmarks.speed.baseline_steps``: every baseline's step at its recipe, timed.

Runs at tiny sizes here (``--hidden 8 --batch 8``); the figures are the benchmark's to
print, not the test's to judge."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from benchmarks.speed import baseline_steps
from cbop_torchrl.baselines import ALGOS


def test_every_baseline_is_timed_against_bc_and_written(tmp_path: Path, capsys) -> None:
    out = tmp_path / "steps.json"
    args = ["--rounds", "1", "--steps-per-round", "1", "--hidden", "8", "--batch", "8",
            "--profile-steps", "1", "--run-steps", "1000", "--out", str(out)]  # fmt: skip
    assert baseline_steps.main(args) == 0
    printed = capsys.readouterr().out
    result = json.loads(out.read_text())
    assert sorted(result["algos"]) == sorted([*ALGOS, "cql-vmap"]) and result["reference"] == "bc"
    # the recipe's auto on a CPU, and the batched pass beside it
    critics = [result["algos"][name]["critics"] for name in ("cql", "cql-vmap")]
    assert critics == ["loop", "vmap"]
    assert result["algos"]["bc"]["ratio_to_reference"] == 1.0
    for name, row in result["algos"].items():
        assert row["batch_size"] == 8 and row["hidden_sizes"] == [8]
        assert row["step_ms"] > 0 and 0 <= row["matmul_share"] <= 1
        assert row["run_hours"] == pytest.approx(row["step_ms"] * 1000 / 3.6e6)
        assert any(line.startswith(f"{name} ") for line in printed.splitlines())
    assert "x the batched (vmap) step" in printed


def test_the_recipes_sizes_are_the_algo_configs() -> None:
    cql = baseline_steps.recipe("cql")
    assert (cql.batch_size, list(cql.hidden_sizes), cql.num_random) == (256, [256, 256, 256], 10)
    assert list(baseline_steps.recipe("cql", hidden=[8], batch=8).hidden_sizes) == [8]


def test_a_count_below_one_is_refused(capsys) -> None:
    with pytest.raises(SystemExit) as exit_:
        baseline_steps.main(["--rounds", "0"])
    assert exit_.value.code == 2
    assert "--rounds" in capsys.readouterr().err
