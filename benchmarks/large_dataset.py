"""The pipeline on a D4RL-size dataset (issue 19): load time, peak memory, sampling, dynamics epoch.

    python benchmarks/large_dataset.py                       # 2,000,000 walker2d-shaped rows
    python benchmarks/large_dataset.py --json benchmarks/bench_large_dataset.json
    python benchmarks/large_dataset.py --transitions 200000  # a quicker look

D4RL's full-replay sets hold one to two million transitions. This writes a
D4RL-layout HDF5 file of ``--transitions`` rows with walker2d's shapes (17-dim
observations, 6-dim actions, 1000-step episodes ending in a timeout, random
values), then, each in a fresh process so that its peak resident memory is its
own:

- ``large_dataset_load_s``: ``load_dataset`` on the file from an empty cache
  (reading, validating, converting, caching), and the same again from the
  cache (``large_dataset_cached_load_s``);
- ``large_dataset_peak_rss_ratio``: the loading process's peak RSS growth
  over its RSS after the imports, divided by the raw arrays' size (the
  process's whole peak RSS is reported too);
- ``large_dataset_samples_per_s``: transitions/s drawn from the dataset's
  replay buffer at batch 256 (what the CBOP stage does every step);
- ``large_dataset_dynamics_epoch_s``: one dynamics-training epoch at the
  paper's sizes (30 members, 4 x 200, batch 256) over the training split,
  timed on ``--dynamics-steps`` minibatch steps of the project's epoch loop
  and scaled to the epoch's number of steps (stated in the output).

Goals (issue 19): load <= 60 s, peak RSS <= 3x the raw arrays, >= 50k
transitions/s at batch 256.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import h5py
import numpy as np

REPO = Path(__file__).resolve().parents[1]
OBS_DIM, ACT_DIM, EPISODE = 17, 6, 1000
GOALS = {"load_s": 60.0, "peak_rss_ratio": 3.0, "samples_per_s": 50_000.0}


def write_file(path: Path, transitions: int, seed: int = 0) -> int:
    """A D4RL-layout file of ``transitions`` rows; returns the raw arrays' size in bytes."""
    rng = np.random.default_rng(seed)
    chunk = 100 * EPISODE
    raw = 0
    with h5py.File(path, "w") as handle:
        specs = {
            "observations": (OBS_DIM, np.float32),
            "next_observations": (OBS_DIM, np.float32),
            "actions": (ACT_DIM, np.float32),
            "rewards": (None, np.float32),
            "terminals": (None, np.bool_),
            "timeouts": (None, np.bool_),
        }
        sets = {
            key: handle.create_dataset(
                key, (transitions,) if dim is None else (transitions, dim), dtype=dtype
            )
            for key, (dim, dtype) in specs.items()
        }
        for start in range(0, transitions, chunk):
            rows = min(chunk, transitions - start)
            obs = rng.standard_normal((rows + 1, OBS_DIM), dtype=np.float32)
            obs[:, 0] = 1.25 + 0.05 * obs[:, 0]  # a healthy walker's height
            sets["observations"][start : start + rows] = obs[:-1]
            sets["next_observations"][start : start + rows] = obs[1:]
            sets["actions"][start : start + rows] = rng.uniform(-1, 1, (rows, ACT_DIM)).astype(
                np.float32
            )
            sets["rewards"][start : start + rows] = rng.standard_normal(rows, dtype=np.float32)
            index = np.arange(start, start + rows)
            sets["timeouts"][start : start + rows] = (index % EPISODE) == EPISODE - 1
            sets["terminals"][start : start + rows] = False
        handle.create_dataset("metadata/env_id", data="Walker2d-v4")
        for dim, dtype in specs.values():
            raw += transitions * (dim or 1) * np.dtype(dtype).itemsize
    return raw


def _child(path: str, dynamics_steps: int) -> dict:
    """Runs in a fresh process: load, sample, dynamics steps; prints one JSON line."""
    import torch

    from cbop_torchrl.data import load_dataset_with_info, make_replay_buffer

    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", torch.get_num_threads())))
    rss_after_imports = _rss_mb()
    start = time.perf_counter()
    data, _info = load_dataset_with_info(path)
    load_s = time.perf_counter() - start
    peak_after_load = _peak_rss_mb()
    result = {
        "load_s": load_s,
        "rss_after_imports_mb": rss_after_imports,
        "peak_rss_mb": peak_after_load,
        "transitions": int(data.shape[0]),
    }
    if dynamics_steps == 0:
        return result
    buffer = make_replay_buffer(data, 256, seed=0)
    buffer.sample()
    draws, start = 0, time.perf_counter()
    while time.perf_counter() - start < 3.0:
        buffer.sample()
        draws += 1
    result["samples_per_s"] = draws * 256 / (time.perf_counter() - start)
    result.update(_dynamics_epoch(int(data.shape[0]), dynamics_steps))
    return result


def _dynamics_epoch(rows: int, steps: int) -> dict:
    sys.path.insert(0, str(REPO / "scripts"))
    import bench

    from cbop_torchrl.trainers.dynamics import DynamicsConfig

    measured = bench.bench_dynamics_training(bench.torch.device("cpu"), bench.PAPER, steps)
    config = DynamicsConfig()
    holdout = min(int(config.holdout_ratio * rows), config.max_holdout)
    epoch_steps = -(-(rows - holdout) // config.batch_size)
    return {
        "dynamics_ms_per_step": measured["dynamics_train_ms_per_step"],
        "dynamics_steps_per_epoch": epoch_steps,
        "dynamics_epoch_s": measured["dynamics_train_ms_per_step"] * epoch_steps / 1e3,
    }


def _rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


def run_child(path: Path, cache: Path, dynamics_steps: int) -> dict:
    env = {**os.environ, "CBOP_TORCHRL_CACHE": str(cache), "OMP_WAIT_POLICY": "PASSIVE"}
    done = subprocess.run(
        [sys.executable, __file__, "--child", str(path), "--dynamics-steps", str(dynamics_steps)],
        env=env,
        capture_output=True,
        text=True,
    )
    if done.returncode != 0:
        raise SystemExit(f"the loading process failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--transitions", type=int, default=2_000_000)
    parser.add_argument("--json", type=Path, help="write the figures to this JSON file")
    parser.add_argument("--dynamics-steps", type=int, default=20)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(_child(args.child, args.dynamics_steps)))
        return 0
    if args.transitions < EPISODE:
        print(f"--transitions must be at least {EPISODE} (one episode).", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="cbop-large-") as tmp:
        path = Path(tmp) / "walker2d-large-synthetic.hdf5"
        start = time.perf_counter()
        raw = write_file(path, args.transitions)
        write_s = time.perf_counter() - start
        first = run_child(path, Path(tmp) / "cache", dynamics_steps=0)
        cached = run_child(path, Path(tmp) / "cache", dynamics_steps=args.dynamics_steps)
    raw_mb = raw / 2**20
    growth = first["peak_rss_mb"] - first["rss_after_imports_mb"]
    report = {
        "command": " ".join(["python", "benchmarks/large_dataset.py", *(argv or sys.argv[1:])]),
        "transitions": args.transitions,
        "raw_arrays_mb": raw_mb,
        "write_s": write_s,
        "large_dataset_load_s": first["load_s"],
        "large_dataset_cached_load_s": cached["load_s"],
        "large_dataset_peak_rss_ratio": growth / raw_mb,
        "large_dataset_peak_rss_mb": first["peak_rss_mb"],
        "large_dataset_rss_after_imports_mb": first["rss_after_imports_mb"],
        "large_dataset_cached_peak_rss_ratio": (
            cached["peak_rss_mb"] - cached["rss_after_imports_mb"]
        )
        / raw_mb,
        "large_dataset_samples_per_s": cached["samples_per_s"],
        "large_dataset_dynamics_epoch_s": cached["dynamics_epoch_s"],
        "large_dataset_dynamics_ms_per_step": cached["dynamics_ms_per_step"],
        "large_dataset_dynamics_steps_per_epoch": cached["dynamics_steps_per_epoch"],
        "load_average": list(os.getloadavg()),
    }
    report["goals"] = {
        "load_s": {"goal": GOALS["load_s"], "met": report["large_dataset_load_s"] <= 60.0},
        "peak_rss_ratio": {
            "goal": GOALS["peak_rss_ratio"],
            "met": report["large_dataset_peak_rss_ratio"] <= GOALS["peak_rss_ratio"],
        },
        "samples_per_s": {
            "goal": GOALS["samples_per_s"],
            "met": report["large_dataset_samples_per_s"] >= GOALS["samples_per_s"],
        },
    }
    print(
        f"{args.transitions} transitions ({raw_mb:.0f} MB of arrays, written in {write_s:.1f} s)\n"
        f"load from an empty cache: {first['load_s']:.1f} s, peak RSS {first['peak_rss_mb']:.0f}"
        f" MB ({report['large_dataset_peak_rss_ratio']:.2f}x the arrays above the "
        f"{first['rss_after_imports_mb']:.0f} MB after imports); from the cache: "
        f"{cached['load_s']:.1f} s ({report['large_dataset_cached_peak_rss_ratio']:.2f}x)\n"
        f"replay-buffer sampling at batch 256: {cached['samples_per_s']:.0f} transitions/s\n"
        f"dynamics epoch (paper sizes): {cached['dynamics_epoch_s']:.0f} s = "
        f"{cached['dynamics_steps_per_epoch']} steps x {cached['dynamics_ms_per_step']:.1f} ms "
        f"(timed on {args.dynamics_steps} steps)"
    )
    if args.json:
        sys.path.insert(0, str(REPO))
        from cbop_torchrl.utils import atomic_json_dump

        atomic_json_dump(report, args.json)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
