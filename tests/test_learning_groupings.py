"""``benchmarks/learning.py --grouping``: one at a time, in processes, side by side; same runs.

Two seeds of the debug preset trained as one job of runs side by side end with the
checkpoints and summaries' scores of the same seeds trained as two processes at once (each
the run alone). ``auto`` follows a side-by-side measurement of this machine, and a rule without one.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from d4rl_files import write_d4rl_hdf5

from benchmarks import learning
from benchmarks.learning_grouping import choose_grouping

ROOT = Path(__file__).resolve().parents[1]
DATASET = "hopper-medium-replay-gen"

pytestmark = pytest.mark.usefixtures("no_repository_copies")


def bench_args(root: Path, *extra: str) -> list[str]:
    return [
        *("--datasets", DATASET, "--algos", "cbop", "--seeds", "0", "1", "--preset", "debug"),
        *("--epochs", "2", "--steps-per-epoch", "10", "--eval-interval", "10", "--no-analysis"),
        *("--results", str(root / "results"), "--runs", str(root / "runs")),
        *("--start-states", "0"),
        *extra,
        "estimator.rollout_dtype=float32",
    ]


def test_seeds_side_by_side_equal_the_same_seeds_in_processes(
    tmp_path: Path, isolated_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In processes each run is its own process, the command it has one at a time (plus the
    thread count, given here to both); side by side, the seeds share one job."""
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # the runs' processes import this checkout
    write_d4rl_hdf5(
        isolated_cache / "generated" / f"{DATASET}.hdf5",
        episode_lengths=(150,) * 8,
        terminal_episodes=(0, 3),
    )
    groupings = {
        "processes": ("--grouping", "processes", "--workers", "2"),
        "side-by-side": ("--side-by-side",),
    }
    for name, words in groupings.items():
        assert learning.main(bench_args(tmp_path / name, "--threads", "1", *words)) == 0
    for seed in (0, 1):
        runs = {name: next((tmp_path / name / "runs").glob(f"{DATASET}/*/debug/cbop-debug/"
                                                            f"seed{seed}"))
                for name in groupings}  # fmt: skip
        expected, actual = (torch.load(runs[name] / "checkpoint.pt", weights_only=True)
                            for name in groupings)  # fmt: skip
        for key, value in expected["loss_module"].items():
            assert torch.equal(value, actual["loss_module"][key]), (seed, key)
        summaries = [json.loads((tmp_path / name / "results" / DATASET / "cbop-debug"
                                 / f"seed{seed}.json").read_text())
                     for name in groupings]  # fmt: skip
        assert summaries[0]["final_normalized_score"] == summaries[1]["final_normalized_score"]
        assert summaries[0]["command"].endswith("threads=1 estimator.rollout_dtype=float32")
        assert "runs.seeds=[0,1]" in summaries[1]["command"]


@pytest.mark.parametrize("words", [("--side-by-side",), ("--grouping", "processes")])
def test_whole_run_groupings_are_refused_with_slices(
    words: tuple[str, ...], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as stopped:
        learning.parse_args([*words, "--slice-steps", "10"])
    assert stopped.value.code == 2
    assert "trains whole runs; drop --max-minutes/--slice-steps" in capsys.readouterr().err


CPU = {"device": "cpu", "nproc": 2, "cpu_model": "Some CPU", "gpu": None}
GPU = {"device": "cuda", "nproc": 16, "cpu_model": "Some CPU", "gpu": "Some GPU"}


def report(machine: dict, side_by_side: list[float], two_processes: float | None) -> dict:
    """A side-by-side record with these run-steps/s for R = 1, 2, ... and two processes."""
    rows = [{"runs": r, "run_steps_per_s": v} for r, v in enumerate(side_by_side, 1)]
    entry: dict = {"side_by_side": rows}
    if two_processes is not None:
        entry["two_processes"] = {"processes": 2, "run_steps_per_s": two_processes}
    return {"machine": machine, "command": "python scripts/bench.py --side-by-side",
            "sizes": {"cpu": entry}}  # fmt: skip


def test_auto_follows_the_measurement_of_a_machine_like_this_one() -> None:
    slower_in_turn = report(CPU, [100.0, 96.0, 95.0], two_processes=190.0)
    faster_in_turn = report(CPU, [100.0, 210.0, 260.0], two_processes=190.0)
    assert choose_grouping("auto", False, [slower_in_turn], CPU)[0] == "processes"
    assert choose_grouping("auto", False, [faster_in_turn], CPU)[0] == "side-by-side"
    # A GPU's record has no processes' figure: side by side only if it beats one run alone.
    assert choose_grouping("auto", False, [report(GPU, [100.0, 350.0], None)], GPU)[0] == (
        "side-by-side"
    )
    assert choose_grouping("auto", False, [report(GPU, [100.0, 90.0], None)], GPU)[0] == "one"


def test_auto_without_a_matching_measurement_uses_the_rule() -> None:
    other_cpu = report({**CPU, "cpu_model": "Another CPU"}, [100.0, 300.0], two_processes=190.0)
    assert choose_grouping("auto", False, [other_cpu], CPU)[0] == "processes"
    assert choose_grouping("auto", False, [], {**CPU, "nproc": 1})[0] == "one"
    assert choose_grouping("auto", False, [], GPU)[0] == "side-by-side"
    assert choose_grouping("auto", True, [], GPU)[0] == "one"  # slices: one at a time
    assert choose_grouping("processes", False, [], GPU) == ("processes", "asked for")
