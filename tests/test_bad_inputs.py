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
    # (script, overrides, words the message must hold); one subprocess each (~3 s of imports
    # on an idle machine), so the type/choice cases of the schema itself are tested in-process
    # in tests/test_config.py and only one per kind of refusal runs here.
    ("cbop.py", ["estimator.termination=bogus"], ["termination", "zero_precision, absorb"]),
    ("cbop.py", ["train.batch_size=-3"], ["train.batch_size=-3", "positive"]),
    ("cbop.py", ["device=cuda"], ["device=cuda", "device=auto", "device=cpu"]),
    ("baseline.py", ["algo=sac"], ["algo/sac", "td3bc", "iql", "cql"]),
    ("evaluate.py", [], ["checkpoint"]),
    ("collect.py", ["medium_reference=x"], ["medium_reference", "best, d4rl"]),
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
