"""Bad input to every entry script: exit code 2, no traceback, the key named, in seconds.

Each case runs the real script in a subprocess from an empty working
directory (so a refused command is also checked to leave no run directory
behind). Every case is refused before any data is loaded or any stage runs:
the timeout is far below the seconds a debug run's first stage needs.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TIMEOUT_S = 60  # import time on a loaded 2-core machine; training would take far longer

CASES = [
    # (script, overrides, words the message must hold)
    ("cbop.py", ["estimator.termination=bogus"], ["termination", "zero_precision, absorb"]),
    ("cbop.py", ["estimator.rollout_dtype=float16"], ["estimator.rollout_dtype", "bfloat16"]),
    ("cbop.py", ["estimator.horizon=2.5"], ["estimator.horizon", "Integer"]),
    ("cbop.py", ["estimator.psi=abc"], ["estimator.psi", "Float"]),
    ("cbop.py", ["seed=abc"], ["seed", "Integer"]),
    ("cbop.py", ["estimatr.psi=1"], ["estimatr", "not in"]),
    ("cbop.py", ["logger=stdout"], ["logger/stdout", "csv", "tensorboard", "wandb"]),
    ("cbop.py", ["train.batch_size=-3"], ["train.batch_size=-3", "positive"]),
    ("cbop.py", ["estimator.psi=nan"], ["estimator.psi=nan", "not a number"]),
    ("cbop.py", ["logger.project="], ["logger.project", "empty"]),
    ("cbop.py", ["env=/nowhere/missing.hdf5"], ["missing.hdf5"]),
    ("cbop.py", ["device=cuda"], ["device=cuda", "device=auto", "device=cpu"]),
    ("baseline.py", ["algo=sac"], ["algo/sac", "td3bc", "iql", "cql"]),
    ("baseline.py", ["algo.alpha=abc"], ["algo.alpha", "Float"]),
    ("evaluate.py", [], ["checkpoint"]),
    ("evaluate.py", ["checkpoint=x.pt", "backend=threads"], ["backend", "serial, parallel"]),
    ("collect.py", ["medium_reference=x"], ["medium_reference", "best, d4rl"]),
    ("collect.py", ["sac.total_steps=lots"], ["sac.total_steps", "Integer"]),
    ("train_dynamics.py", ["dynamics.num_members=abc"], ["dynamics.num_members", "Integer"]),
]


def run_script(script: str, overrides: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "CBOP_TORCHRL_CACHE": str(cwd / "cache"), "CUDA_VISIBLE_DEVICES": ""}
    env.pop("HYDRA_FULL_ERROR", None)
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / script), *overrides],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
    )


@pytest.mark.parametrize(
    ("script", "overrides", "words"),
    CASES,
    ids=[f"{script}:{' '.join(overrides) or '(none)'}" for script, overrides, _ in CASES],
)
def test_bad_input_is_refused_with_exit_2(
    script: str, overrides: list[str], words: list[str], tmp_path: Path
) -> None:
    done = run_script(script, overrides, tmp_path)
    output = done.stdout + done.stderr
    assert done.returncode == 2, output
    assert "Traceback" not in output
    for word in words:
        assert word in output, (word, output)
    left = sorted(p.name for p in tmp_path.iterdir() if p.name != "cache")
    assert left == [], f"the refused command left {left} behind"
