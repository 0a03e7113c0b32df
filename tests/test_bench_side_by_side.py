"""The runs-side-by-side benchmark (``scripts/bench.py --side-by-side``) at tiny sizes on the CPU.

No timing is asserted: the figures' layout, their ratios to R = 1, and that the CUDA
configuration (R = 1, 4, 12, 24) runs end to end on ``device=cpu``.
"""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import torch

from benchmarks.learning_grouping import choose_grouping, faster_in_record, this_machine
from benchmarks.speed.side_by_side import CUDA_COUNTS, bench_side_by_side
from benchmarks.speed.sizes import TINY

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bench.py"


def load_bench():
    spec = importlib.util.spec_from_file_location("bench_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def check_rows(rows: list[dict], counts: tuple[int, ...]) -> None:
    assert [row["runs"] for row in rows] == list(counts)
    assert rows[0]["step_s_ratio"] == rows[0]["run_steps_per_s_ratio"] == 1.0
    for row in rows:
        assert math.isfinite(row["step_s"]) and row["step_s"] > 0
        assert math.isclose(row["run_steps_per_s"], row["runs"] / row["step_s"])
        assert math.isclose(row["step_s_ratio"], row["step_s"] / rows[0]["step_s"])


def test_the_cpu_benchmark_writes_runs_and_two_processes(tmp_path: Path) -> None:
    out = tmp_path / "side_by_side.json"
    argv = ["--side-by-side", "--sizes", "tiny", "--side-by-side-steps", "2", "--json", str(out)]
    assert load_bench().main(argv) == 0
    report = json.loads(out.read_text())
    assert report["device"] == "cpu" and report["steps"] == 2
    entry = report["sizes"]["tiny"]
    check_rows(entry["side_by_side"], (1, 2, 4))
    other = entry["two_processes"]
    assert other["processes"] == 2 and other["run_steps_per_s"] > 0
    ratio = other["run_steps_per_s"] / entry["side_by_side"][0]["run_steps_per_s"]
    assert math.isclose(other["run_steps_per_s_ratio"], ratio)
    # The record names this machine, so `learning.py --grouping auto` here follows it.
    here = this_machine("cpu")
    assert report["machine"] == here
    assert choose_grouping("auto", False, [report], here) == (
        faster_in_record(report),
        f"measured faster here ({report['command']})",
    )


def test_the_cuda_configuration_runs_on_the_cpu() -> None:
    report = bench_side_by_side(
        torch.device("cpu"), 1, sizes=(TINY,), counts=CUDA_COUNTS, processes=False
    )
    check_rows(report["sizes"]["tiny"]["side_by_side"], CUDA_COUNTS)
    assert "two_processes" not in report["sizes"]["tiny"]


def test_a_bad_step_count_is_refused(capsys) -> None:
    assert load_bench().main(["--side-by-side", "--side-by-side-steps", "0"]) == 2
    assert "--side-by-side-steps 0" in capsys.readouterr().err
