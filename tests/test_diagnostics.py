"""Learning diagnostics (eval.diagnostics=true) and the curves table, on a tiny debug run."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

from d4rl_files import write_d4rl_hdf5

ROOT = Path(__file__).resolve().parents[1]


def test_diagnostics_are_measured_at_every_evaluation(tmp_path: Path) -> None:
    dataset = write_d4rl_hdf5(
        tmp_path / "hopper-medium-replay-tiny.hdf5",
        episode_lengths=[150] * 8,
        terminal_episodes=(0, 3),
        timeout_episodes=(1,),
    )
    run_dir = tmp_path / "run"
    env = {**os.environ, "CBOP_TORCHRL_CACHE": str(tmp_path / "cache")}
    command = [
        sys.executable, str(ROOT / "scripts" / "cbop.py"), "preset=debug", f"env={dataset}",
        f"hydra.run.dir={run_dir}", "progress=false", "eval.diagnostics=true",
        "eval.interval=20", "eval.episodes=2", "eval.max_steps=50",
    ]  # fmt: skip
    subprocess.run(command, env=env, check=True, capture_output=True, text=True, timeout=300)
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
    # The BC actor is measured before any CBOP step changed it; training then moves it.
    assert history[0]["action_distance"] != history[-1]["action_distance"]

    table = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "curves.py"), str(run_dir)],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    rows = [line for line in table.splitlines() if line.startswith("| ") and "step" not in line]
    assert len(rows) == len(results["eval_history"])
    assert rows[0].startswith("| 0 |")

    refused = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "curves.py"), str(run_dir), "--keys", "q_pi"],
        capture_output=True, text=True,
    )  # fmt: skip
    assert refused.returncode == 2 and "--keys q_pi: not logged" in refused.stderr
    assert "diag/q_pi" in refused.stderr  # the names that would work
