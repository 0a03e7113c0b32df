"""``benchmarks/learning.py --side-by-side``: a CBOP variant's seeds as one job, same runs.

Two seeds of the debug preset trained as one job of runs side by side end with the
checkpoints and summaries' scores of the same seeds trained one process each.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from d4rl_files import write_d4rl_hdf5

from benchmarks import learning

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


def test_seeds_side_by_side_equal_seeds_one_by_one(
    tmp_path: Path, isolated_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # the runs' processes import this checkout
    write_d4rl_hdf5(
        isolated_cache / "generated" / f"{DATASET}.hdf5",
        episode_lengths=(150,) * 8,
        terminal_episodes=(0, 3),
    )
    alone, together = tmp_path / "alone", tmp_path / "together"
    assert learning.main(bench_args(alone)) == 0
    assert learning.main(bench_args(together, "--side-by-side")) == 0
    for seed in (0, 1):
        runs = [next((root / "runs").glob(f"{DATASET}/*/debug/cbop-debug/seed{seed}"))
                for root in (alone, together)]  # fmt: skip
        expected, actual = (torch.load(r / "checkpoint.pt", weights_only=True) for r in runs)
        for key, value in expected["loss_module"].items():
            assert torch.equal(value, actual["loss_module"][key]), (seed, key)
        summaries = [json.loads((root / "results" / DATASET / "cbop-debug" / f"seed{seed}.json")
                                .read_text()) for root in (alone, together)]  # fmt: skip
        assert summaries[0]["final_normalized_score"] == summaries[1]["final_normalized_score"]
        assert "runs.seeds=[0,1]" in summaries[1]["command"]


def test_side_by_side_is_refused_with_slices(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        learning.parse_args(["--side-by-side", "--slice-steps", "10"])
    assert stopped.value.code == 2
    assert "--side-by-side trains whole jobs" in capsys.readouterr().err
