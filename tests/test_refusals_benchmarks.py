"""What the benchmark driver (``scripts/bench.py``) refuses: exit code 2 and the setting
named, before minutes of benchmarks."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
from refusal_inputs import unwritable_dir

ROOT = Path(__file__).resolve().parents[1]


def load_script(name: str):
    """A script of ``scripts/`` as a module, so its ``main(argv)`` runs in-process."""
    spec = importlib.util.spec_from_file_location(f"{name}_script", ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["--rounds", "0"], ["--rounds 0: give a positive integer"]),
        (["--json", "{unwritable}/bench.json"], ["cannot be written", "{unwritable_part}"]),
    ],
)
def test_bench_refuses_before_benchmarking(
    argv: list[str], words: list[str], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """A --json it cannot write is found before minutes of benchmarks, not after."""
    unwritable, blocking = unwritable_dir(tmp_path)
    values = {"unwritable": unwritable, "unwritable_part": blocking}
    assert load_script("bench").main([a.format(**values) for a in argv]) == 2
    error = capsys.readouterr().err
    for word in words:
        assert word.format(**values) in error, error
