"""The learning benchmark's runs import the package of the checkout whose scripts they run."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from benchmarks import learning

FIND = "import importlib.util; print(importlib.util.find_spec('cbop_torchrl').origin)"


def test_a_run_imports_this_checkouts_package_over_another_on_the_path(
    tmp_path: Path, monkeypatch
) -> None:
    other = tmp_path / "other" / "cbop_torchrl"
    other.mkdir(parents=True)
    (other / "__init__.py").write_text("")
    # An interpreter whose path leads to another checkout's package first.
    monkeypatch.setenv("PYTHONPATH", str(other.parent))
    env = learning.child_environment(deadline=None, slice_steps=None)
    found = subprocess.run(
        [sys.executable, "-c", FIND], env=env, cwd=tmp_path, capture_output=True, text=True,
        check=True,
    ).stdout.strip()  # fmt: skip
    assert Path(found).resolve() == (learning.ROOT / "cbop_torchrl" / "__init__.py").resolve()
    assert env["PYTHONPATH"].split(":")[1] == str(other.parent)  # the rest of the path is kept


def test_the_slice_budget_reaches_the_child_and_a_stale_one_does_not(monkeypatch) -> None:
    monkeypatch.setenv(learning.DEADLINE_ENV, "1.0")
    monkeypatch.setenv(learning.STEPS_ENV, "7")
    env = learning.child_environment(deadline=None, slice_steps=None)
    assert learning.DEADLINE_ENV not in env and learning.STEPS_ENV not in env
    env = learning.child_environment(deadline=123.5, slice_steps=40)
    assert env[learning.DEADLINE_ENV] == "123.5" and env[learning.STEPS_ENV] == "40"
