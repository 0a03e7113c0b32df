"""benchmarks/gpu_session.sh's grid job (GRID=<set>, benchmarks/gpu_grid.sh) on the CPU.

The job a lent GPU runs: one set's psi grid x seeds with snapshots and no evaluation during
training, the snapshots back in one archive. Here at the debug preset with ``device=cpu``, two
psi values x two seeds on a tiny file in D4RL's format, side by side in one process as on the
GPU, one seed (runs of two seeds side by side: tests/test_side_by_side.py), and one run
through the fallback, one process per run. The archive is then unpacked elsewhere and scored with
``cbop-score`` against another cache (the run's recorded data path is not there), and the
seed summaries are read by ``benchmarks/learning.py``'s rows writer.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

from d4rl_files import write_d4rl_hdf5
from inprocess import run_program

from benchmarks import learning, psi_grid
from cbop_torchrl.trainers.snapshots import snapshot_steps

ROOT = Path(__file__).resolve().parents[1]
DATASET = "hopper-medium-gen"  # a set the repository keeps no copy of
RETURNED_NAME = re.compile(r"^[A-Za-z0-9._-]+$")


def grid_env(tmp_path: Path, cache: Path, **settings: str) -> dict[str, str]:
    """gpu_session.sh's environment for a debug-preset grid job of ``DATASET`` on the CPU."""
    return {
        **os.environ,
        "PYTHON": sys.executable,
        "PYTHONPATH": str(ROOT),  # this checkout's package, whatever is installed
        "CBOP_TORCHRL_CACHE": str(cache),
        "STATE": str(tmp_path / "state"),
        "OUT": str(tmp_path / "out"),
        "SKIP": "install tests bench",
        "GRID": DATASET,
        "PRESET": "debug",
        "PSIS": "2 5",
        "SEEDS": "0",
        "SNAPSHOT_INTERVAL": "20",
        "RUN_THREADS": "1",
        "OVERRIDES": "device=cpu estimator.rollout_dtype=float32",
        **settings,
    }


def run_grid_job(env: dict[str, str]) -> str:
    """Runs the job; its log (grid.log, brought back under ``OUT``)."""
    done = subprocess.run(
        ["bash", str(ROOT / "benchmarks" / "gpu_session.sh")],
        env=env, capture_output=True, text=True, timeout=900, cwd=ROOT,
    )  # fmt: skip
    out = Path(env["OUT"])
    log = (out / "grid.log").read_text() if (out / "grid.log").is_file() else done.stdout
    assert done.returncode == 0, log + done.stderr[-3000:]
    return log


def test_the_grid_job_brings_back_snapshots_that_score_into_rows(
    tmp_path: Path, isolated_cache: Path
) -> None:
    data = isolated_cache / "generated" / f"{DATASET}.hdf5"
    write_d4rl_hdf5(data, episode_lengths=(150,) * 8, terminal_episodes=(0, 3))
    log = run_grid_job(grid_env(tmp_path, isolated_cache))
    assert "2 runs side by side" in log, log
    out = tmp_path / "out"
    returned = [path for path in out.rglob("*") if path.is_file()]
    assert len(returned) <= 8 and all(RETURNED_NAME.match(path.name) for path in returned)

    unpacked = tmp_path / "unpacked"
    with tarfile.open(out / "grid.tgz") as archive:
        archive.extractall(unpacked, filter="data")
    runs = sorted(path.name for path in (unpacked / DATASET).iterdir() if path.is_dir())
    assert runs == ["psi2-seed0", "psi5-seed0"]
    for name in runs:
        run = unpacked / DATASET / name
        assert snapshot_steps(run) == [20, 40]
        assert (run / "results.json").is_file() and not (run / "checkpoint.pt").exists()
        config = json.loads((run / "config.json").read_text())
        assert config["eval"]["interval"] == 0 and config["device"] == "cpu"
        results = json.loads((run / "results.json").read_text())
        assert [r["step"] for r in results["eval_history"]] == [40]  # only the end-of-run one

    # Scored on "another machine": a cache holding the set's file, not the job's path.
    elsewhere = tmp_path / "cpu-cache"
    (elsewhere / "generated").mkdir(parents=True)
    shutil.move(data, elsewhere / "generated" / data.name)
    shutil.rmtree(tmp_path / "state")
    results = tmp_path / "results"
    scored = run_program(
        "score", [f"paths={unpacked / DATASET}", f"results={results}"],
        {"CBOP_TORCHRL_CACHE": str(elsewhere)},
    )  # fmt: skip
    assert scored.returncode == 0, scored.stderr[-3000:]
    assert scored.stdout.count("snapshot at step") == 4
    for psi in (2, 5):
        seeds = sorted(p.name for p in (results / DATASET / f"cbop-debug-psi{psi}").iterdir())
        assert seeds == ["seed0.json"]
    config = json.loads((unpacked / DATASET / runs[0] / "config.json").read_text())
    moved = json.loads((unpacked / DATASET / runs[0] / "env_recorded.json").read_text())
    assert moved["env"] == str(data)
    assert config["env"] == str(elsewhere / "generated" / data.name)
    rows = json.loads(learning.write_rows(results, DATASET).read_text())["rows"]
    assert {row["variant"] for row in rows} == {"cbop-debug-psi2", "cbop-debug-psi5"}
    assert all(len(row["final_per_seed"]) == 1 for row in rows)

    # FQE selection from the last snapshot's actor (policy.pt, written from it by the scorer:
    # the archive brings no policy), into the preset's own selection file
    for name in runs:
        assert (unpacked / DATASET / name / "policy.pt").is_file()
    selection = psi_grid.select(results, DATASET, 1, "debug")
    assert selection["missing_psi"] == [0.5, 3.0] and selection["selected_psi"] is None
    per_run = selection["fqe_per_run"]
    assert sorted(per_run) == [f"cbop-debug-psi{p}/seed0" for p in (2, 5)]
    for entry in per_run.values():
        assert entry["policy_step"] == 40 and Path(entry["run_dir"]).parent == unpacked / DATASET
    assert (results / DATASET / "psi_selection-debug.json").is_file()
    assert not (results / DATASET / "psi_selection.json").exists()


def test_without_runs_side_by_side_the_grid_runs_one_process_per_run(
    tmp_path: Path, isolated_cache: Path
) -> None:
    data = isolated_cache / "generated" / f"{DATASET}.hdf5"
    write_d4rl_hdf5(data, episode_lengths=(150,) * 8, terminal_episodes=(0, 3))
    log = run_grid_job(grid_env(tmp_path, isolated_cache, PSIS="2", SEEDS="1", SIDE_BY_SIDE="0"))
    assert "1 runs one after another" in log and "psi 2 seed 1: finished" in log, log
    unpacked = tmp_path / "unpacked"
    with tarfile.open(tmp_path / "out" / "grid.tgz") as archive:
        archive.extractall(unpacked, filter="data")
    run = unpacked / DATASET / "psi2-seed1"
    assert [p.name for p in (unpacked / DATASET).iterdir() if p.is_dir()] == [run.name]
    assert snapshot_steps(run) == [20, 40] and (run / "results.json").is_file()
