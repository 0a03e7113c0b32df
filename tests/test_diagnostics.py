"""Learning diagnostics (eval.diagnostics=true) and the curves table, on a tiny debug run."""

from __future__ import annotations

import json
import math
import runpy
import sys
from pathlib import Path

import pytest
import torch
from d4rl_files import write_d4rl_hdf5
from inprocess import run_program

from cbop_torchrl.evaluation.analysis import analyze_cbop_run
from cbop_torchrl.registry import get_family
from cbop_torchrl.trainers.conservatism import rollout_from_observations

ROOT = Path(__file__).resolve().parents[1]


def curves(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> int:
    """``python benchmarks/curves.py *argv`` in this process (its output is what is checked);
    returns its exit code."""
    monkeypatch.setattr(sys, "argv", [str(ROOT / "benchmarks" / "curves.py"), *argv])
    try:
        runpy.run_path(str(ROOT / "benchmarks" / "curves.py"), run_name="__main__")
    except SystemExit as exit_:
        return int(exit_.code or 0)
    return 0


def test_diagnostics_are_measured_at_every_evaluation(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    dataset = write_d4rl_hdf5(
        tmp_path / "hopper-medium-replay-tiny.hdf5",
        episode_lengths=[150] * 8,
        terminal_episodes=(0, 3),
        timeout_episodes=(1,),
    )
    run_dir = tmp_path / "run"
    argv = [
        "preset=debug", f"env={dataset}", f"hydra.run.dir={run_dir}", "progress=false",
        "eval.diagnostics=true", "eval.interval=20", "eval.episodes=2", "eval.max_steps=50",
        "eval.mc_states=3", "estimator.rollout_dtype=float32",  # auto's timing: not tested here
        "seed=1",  # the conservatism's states are the same for every seed (below)
    ]  # fmt: skip
    done = run_program("cbop", argv, {"CBOP_TORCHRL_CACHE": str(tmp_path / "cache")})
    assert done.returncode == 0, done.stderr[-3000:]
    results = json.loads((run_dir / "results.json").read_text())
    history = results["diagnostics_history"]
    total = results["gradient_steps"]
    # Before training (BC actor + FQE critic), at every interval, and at the end.
    assert [record["step"] for record in history] == [0, *range(20, total, 20), total]
    assert [record["step"] for record in results["eval_history"]][0] == 0
    for record in history:
        for key in ("q_pi", "q_data", "mc_start", "bc_logprob", "model_error_policy",
                    "horizon_std_0", "lcb_penalty"):  # fmt: skip
            assert math.isfinite(record[key]), (key, record)
        # Horizon 0 shares a' with the rollouts: no dynamics spread, gap 0 by definition.
        assert record["horizon_gap_0"] == 0.0
        weights = [record[f"horizon_weight_{h}"] for h in range(results["settings"]["horizon"] + 1)]
        assert abs(sum(weights) - 1.0) < 1e-4
        # The paper's Q - MC at dataset states; the soft critic's entropy part is what separates
        # the raw difference from the one without it (alpha > 0 in CBOP, so it is not zero).
        assert record["q_minus_mc_data"] == pytest.approx(
            record["q_data_states"] - record["mc_data_states"], abs=1e-3
        )
        assert record["q_minus_mc_data"] - record["q_minus_mc_data_no_entropy"] == pytest.approx(
            record["entropy_part_data"], abs=1e-3
        )
        assert record["entropy_part_data"] != 0.0
    # The BC actor is measured before any CBOP step changed it; training then moves it.
    assert history[0]["action_distance"] != history[-1]["action_distance"]
    # The summary's analysis measures the final checkpoint on the same dataset states as the
    # diagnostics (whatever the run's seed): its Q - MC is the curve's last point.
    analysis = analyze_cbop_run(run_dir, mc_states=3)["conservatism"]
    assert analysis["overestimation"] == pytest.approx(history[-1]["q_minus_mc_data"], abs=1e-4)

    capsys.readouterr()
    assert curves([str(run_dir)], monkeypatch) == 0
    table = capsys.readouterr().out
    rows = [line for line in table.splitlines() if line.startswith("| ") and "step" not in line]
    assert len(rows) == len(results["eval_history"])
    assert rows[0].startswith("| 0 |")

    assert curves([str(run_dir), "--keys", "q_pi"], monkeypatch) == 2
    refused = capsys.readouterr().err
    assert "--keys q_pi: not logged" in refused
    assert "diag/q_pi" in refused  # the names that would work


def test_rollout_sums_the_discounted_entropy_after_the_first_step() -> None:
    """``sum_{t>=1} gamma^t H(s_t)``: with H = 1 everywhere it is the geometric sum to the end."""
    import gymnasium

    family = get_family("hopper")
    env = gymnasium.make(family.gym_id)
    starts = torch.stack(
        [torch.as_tensor(env.reset(seed=s)[0], dtype=torch.float32) for s in (1, 2)]
    )
    env.close()

    def still_actor(td):
        return td.set("action", torch.zeros(td.shape[0], 3))

    returns, lengths, entropy = rollout_from_observations(
        still_actor, family, starts, 0.9, max_steps=30,
        entropy_fn=lambda obs: torch.ones(obs.shape[0]),
    )  # fmt: skip
    for row in range(2):
        steps = int(lengths[row])
        assert entropy[row].item() == pytest.approx(sum(0.9**t for t in range(1, steps)), rel=1e-5)
    plain_returns, _ = rollout_from_observations(still_actor, family, starts, 0.9, max_steps=30)
    torch.testing.assert_close(plain_returns, returns)
