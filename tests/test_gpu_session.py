"""benchmarks/gpu_session.sh's slices: one run per (set, seed), all at once, in one archive.

The script is what a lent GPU machine runs (docs/gpu.md); here its slices step runs on the
CPU with the debug preset, two runs side by side, on a tiny file in D4RL's format. What
comes back must fit the lent machine's limits (at most 8 files, plain names, at most two
folders down) and hold every run's curves, slice history, output and summary.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

from d4rl_files import write_d4rl_hdf5

ROOT = Path(__file__).resolve().parents[1]
# A set the repository keeps no copy of (benchmarks/set_files.py), so the driver reads the
# tiny file each test writes into the cache.
DATASET = "hopper-medium-gen"
RETURNED_NAME = re.compile(r"^[A-Za-z0-9._-]+$")


def run_session(tmp_path: Path, cache: Path, **settings: str) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "PYTHON": sys.executable,
        "CBOP_TORCHRL_CACHE": str(cache),
        "STATE": str(tmp_path / "state"),
        "OUT": str(tmp_path / "out"),
        "SKIP": "install tests bench",
        "PRESET": "debug",
        "STEPS": "20",
        "STEPS_PER_EPOCH": "10",
        "EVAL_INTERVAL": "10",
        "START_STATES": "0",
        "RUN_THREADS": "1",
        "OVERRIDES": "estimator.rollout_dtype=float32",
        "DATASETS": DATASET,
        **settings,
    }
    return subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu_session.sh")],
        env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip


def test_runs_side_by_side_come_back_in_one_archive_each_under_its_label(
    tmp_path: Path, isolated_cache: Path
) -> None:
    """Three runs at once (seed 0 as the preset has it; seed 1 with its own override, as a psi
    grid gives each run its own; a baseline, IQL, by its word's algo=) after a failed CUDA
    test call: each has its own directory,
    log, summary and folder in the one archive, named after its overrides, and trains the
    eager step (a captured step is refused without CUDA, so the runs finish only if the
    script drops it)."""
    write_d4rl_hdf5(
        isolated_cache / "generated" / f"{DATASET}.hdf5",
        episode_lengths=(150,) * 8,
        terminal_episodes=(0, 3),
    )
    (tmp_path / "state").mkdir()
    (tmp_path / "state" / "tests.failed").touch()  # as a failed CUDA test call leaves it
    done = run_session(
        tmp_path, isolated_cache,
        RUNS=f"{DATASET}:0 {DATASET}:1:estimator.psi=3 {DATASET}:0:algo=iql",
        OVERRIDES="estimator.rollout_dtype=float32 cuda_graph=true",
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    log = (tmp_path / "out" / "gpu_session.log").read_text()
    assert "3 run(s) at once" in log
    assert "the CUDA tests failed: the slices run the eager step (cuda_graph=false)" in log
    labels = {"seed0": "cbop-debug", "seed1-psi3": "cbop-debug-psi3", "iql-seed0": "iql-debug"}
    for label in labels:
        assert f"{DATASET} {label.replace('seed', 'seed ', 1)}: [bench] finished" in log, log

    out = tmp_path / "out"
    returned = [path for path in out.rglob("*") if path.is_file()]
    assert len(returned) <= 8
    assert all(RETURNED_NAME.match(path.name) for path in returned)
    assert all(len(path.relative_to(out).parts) <= 3 for path in returned)

    unpacked = tmp_path / "unpacked"
    with tarfile.open(out / "runs.tgz") as archive:
        archive.extractall(unpacked, filter="data")
    for (label, variant), seed in zip(labels.items(), (0, 1, 0), strict=True):
        run = unpacked / DATASET / label
        summary = json.loads((run / "summary.json").read_text())
        # CBOP's 20 steps; the baseline's are CBOP's whole pipeline's (debug: BC 40 + FQE 40)
        assert summary["seed"] == seed
        assert summary["gradient_steps"] == (20 if variant.startswith("cbop") else 100)
        assert summary["variant"] == variant and summary["algo"] == variant.split("-")[0]
        assert ("estimator.psi=3" in summary["command"]) == (seed == 1)
        assert "finished" in (run / "run.log").read_text()
        assert [s["outcome"] for s in json.loads((run / "slices.json").read_text())] == ["finished"]
        scores = next(run.glob("logs/*/scalars/eval/normalized_score.csv")).read_text()
        assert scores.splitlines()[-1].startswith(f"{summary['gradient_steps']},")
        assert not list(run.rglob("checkpoint.pt"))


def test_a_runs_word_without_a_seed_is_refused(tmp_path: Path, isolated_cache: Path) -> None:
    done = run_session(tmp_path, isolated_cache, RUNS=f"{DATASET}:estimator.psi=2")
    assert done.returncode == 2
    assert "is not set:seed[:override...]" in done.stdout


def test_a_set_without_its_file_stops_with_exit_code_2_and_says_where_to_put_it(
    tmp_path: Path, isolated_cache: Path
) -> None:
    """A set the repository keeps no copy of, with no file in the data folder."""
    done = run_session(
        tmp_path, isolated_cache, DATASETS="walker2d-medium-gen", DATA_DIR=str(tmp_path)
    )
    assert done.returncode == 2
    assert "no file for walker2d-medium-gen" in done.stdout
    assert "docs/gpu.md" in done.stdout
