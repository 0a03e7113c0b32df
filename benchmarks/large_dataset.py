"""The pipeline on a D4RL-size dataset: load time, peak memory, sampling, dynamics epoch.

    python benchmarks/large_dataset.py                       # 2,000,000 walker2d-shaped rows
    python benchmarks/large_dataset.py --json benchmarks/bench_large_dataset.json
    python benchmarks/large_dataset.py --transitions 200000  # a quicker look

D4RL's full-replay sets hold one to two million transitions. This writes (once;
later runs reuse it) a D4RL-layout HDF5 file of ``--transitions`` rows with
walker2d's shapes and D4RL's dtypes (float32 ``observations [N, 17]``,
``next_observations [N, 17]``, ``actions [N, 6]``, ``rewards [N]``, bool
``terminals [N]``, ``timeouts [N]``; 1000-step episodes ending in a timeout,
random values) under ``--data-dir`` (default
``<cache>/bench/large_dataset``, outside the repository), writing 100
episodes at a time. Then, each in a fresh process so that its peak resident
memory is its own, through the project's loading code (``load_dataset``):

- ``large_dataset_load_s``: loading the file from an empty dataset cache
  (hashing, reading, validating, converting, caching); the same again from
  the cache is ``large_dataset_cached_load_s``;
- ``large_dataset_peak_rss_ratio``: the loading process's peak RSS (VmHWM)
  above its RSS after the imports, divided by the raw arrays' bytes; the
  whole process's peak over the raw bytes is ``large_dataset_process_peak_rss_ratio``;
- ``large_dataset_samples_per_s``: transitions/s drawn from the project's
  replay buffer (``make_replay_buffer``) at batch 256, as the CBOP stage does;
- ``large_dataset_dynamics_epoch_s``: one real epoch of ``train_dynamics``
  (``max_epochs=1``: split, standardization, one pass of every member over its
  bootstrap resample, holdout evaluation, elite selection) with the CPU
  preset's ensemble by default (7 members, 4 x 200, batch 256); its size
  (training rows, minibatch steps) is in the output. ``--dynamics-rows N``
  runs that epoch on the first N rows only and also reports it scaled to
  all rows (``large_dataset_dynamics_epoch_s_scaled``), for busy machines.

Wall-clock figures come with the process's CPU seconds (``*_cpu_s``,
``large_dataset_samples_per_cpu_s``): on shared cores the wall clock mostly
measures the other jobs. The load average is recorded.

The dataset-scale goals: load <= 60 s, peak RSS <= 3x the raw arrays, >= 50k
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
FILE_VERSION = 1
"""Part of the file's name: bump when :func:`write_file` changes so old files are not reused."""
SPECS = {
    "observations": (OBS_DIM, np.float32),
    "next_observations": (OBS_DIM, np.float32),
    "actions": (ACT_DIM, np.float32),
    "rewards": (None, np.float32),
    "terminals": (None, np.bool_),
    "timeouts": (None, np.bool_),
}
"""D4RL's keys, widths (None: one value per row) and dtypes."""


def raw_bytes(transitions: int) -> int:
    """Bytes of the raw arrays of a file of ``transitions`` rows."""
    return sum(transitions * (dim or 1) * np.dtype(dtype).itemsize for dim, dtype in SPECS.values())


def write_file(path: Path, transitions: int, seed: int = 0) -> None:
    """Writes a D4RL-layout file of ``transitions`` rows, 100 episodes at a time.

    Written to a temporary name and renamed, so an interrupted write is never reused.
    """
    rng = np.random.default_rng(seed)
    chunk = 100 * EPISODE
    partial = path.with_name(f".{path.name}.{os.getpid()}.partial")
    with h5py.File(partial, "w") as handle:
        sets = {
            key: handle.create_dataset(
                key, (transitions,) if dim is None else (transitions, dim), dtype=dtype
            )
            for key, (dim, dtype) in SPECS.items()
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
    os.replace(partial, path)


def dataset_file(data_dir: Path, transitions: int) -> tuple[Path, float | None]:
    """The benchmark file in ``data_dir`` and its writing time (None: reused from before)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / f"walker2d-synthetic-{transitions}-v{FILE_VERSION}.hdf5"
    if path.is_file():
        return path, None
    start = time.perf_counter()
    write_file(path, transitions)
    return path, time.perf_counter() - start


def _child(path: str, dynamics_members: int, dynamics_rows: int | None) -> dict:
    """In a fresh process: load; with ``dynamics_members > 0`` also sampling, a dynamics epoch."""
    import torch

    from cbop_torchrl.data import load_dataset_with_info, make_replay_buffer

    torch.set_num_threads(int(os.environ.get("BENCH_THREADS", torch.get_num_threads())))
    rss_after_imports = _rss_mb()
    start, cpu = time.perf_counter(), time.process_time()
    data, _info = load_dataset_with_info(path)
    load_s = time.perf_counter() - start
    result = {
        "load_s": load_s,
        "load_cpu_s": time.process_time() - cpu,
        "rss_after_imports_mb": rss_after_imports,
        "peak_rss_mb": _peak_rss_mb(),
        "transitions": int(data.shape[0]),
    }
    if dynamics_members == 0:
        return result
    buffer = make_replay_buffer(data, 256, seed=0)
    buffer.sample()
    draws, start, cpu = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - start < 3.0:
        buffer.sample()
        draws += 1
    result["samples_per_s"] = draws * 256 / (time.perf_counter() - start)
    result["samples_per_cpu_s"] = draws * 256 / (time.process_time() - cpu)
    result.update(_dynamics_epoch(data, dynamics_members, dynamics_rows))
    return result


def _dynamics_epoch(data, members: int, rows: int | None) -> dict:
    """One real epoch of the dynamics stage (``train_dynamics`` with ``max_epochs=1``).

    With ``rows`` the epoch runs on the dataset's first ``rows`` rows and its time
    is also scaled to all rows (``dynamics_epoch_s_scaled``; an estimate: time
    per epoch grows with the number of minibatch steps, the holdout is capped).
    """
    from cbop_torchrl.trainers.dynamics import DynamicsConfig, train_dynamics

    config = DynamicsConfig(num_members=members, num_elites=min(5, members), max_epochs=1)
    subset = data if rows is None or rows >= data.shape[0] else data[:rows]
    cpu = time.process_time()
    _model, metrics = train_dynamics(subset, "walker2d", config, progress=False)
    result = {
        "dynamics_epoch_s": metrics["wall_time_s"],
        "dynamics_epoch_cpu_s": time.process_time() - cpu,
        "dynamics_members": members,
        "dynamics_rows": int(subset.shape[0]),
        "dynamics_train_rows": metrics["num_train"],
        "dynamics_steps_per_epoch": -(-metrics["num_train"] // config.batch_size),
        "dynamics_peak_rss_mb": _peak_rss_mb(),
    }
    if subset is not data:
        result["dynamics_epoch_s_scaled"] = metrics["wall_time_s"] * data.shape[0] / rows
    return result


def _rss_mb() -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux: VmHWM


def run_child(path: Path, cache: Path, dynamics_members: int, dynamics_rows: int | None) -> dict:
    env = {**os.environ, "CBOP_TORCHRL_CACHE": str(cache), "OMP_WAIT_POLICY": "PASSIVE"}
    done = subprocess.run(
        [
            sys.executable,
            __file__,
            "--child",
            str(path),
            "--dynamics-members",
            str(dynamics_members),
            *(["--dynamics-rows", str(dynamics_rows)] if dynamics_rows else []),
        ],
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
    parser.add_argument(
        "--data-dir",
        type=Path,
        help="where the generated file is kept and reused (default <cache>/bench/large_dataset)",
    )
    parser.add_argument(
        "--dynamics-members",
        type=int,
        default=7,
        help="ensemble members of the timed dynamics epoch (CPU preset 7, paper 30)",
    )
    parser.add_argument(
        "--dynamics-rows",
        type=int,
        help="time the dynamics epoch on the first N rows only and scale it (default: all rows)",
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(_child(args.child, args.dynamics_members, args.dynamics_rows)))
        return 0
    if args.transitions < EPISODE:
        print(f"--transitions must be at least {EPISODE} (one episode).", file=sys.stderr)
        return 2
    if args.dynamics_members < 1:
        print("--dynamics-members must be at least 1 (the CPU preset has 7).", file=sys.stderr)
        return 2
    if args.dynamics_rows is not None and args.dynamics_rows < EPISODE:
        print(f"--dynamics-rows must be at least {EPISODE} (or left out).", file=sys.stderr)
        return 2
    sys.path.insert(0, str(REPO))
    from cbop_torchrl.io import atomic_json_dump, cache_dir

    path, write_s = dataset_file(
        args.data_dir or cache_dir("bench", "large_dataset"), args.transitions
    )
    load_average = list(os.getloadavg())
    # A fresh dataset cache: the first child converts the file, the second reads the cache.
    with tempfile.TemporaryDirectory(prefix="cbop-large-") as tmp:
        first = run_child(path, Path(tmp), 0, None)
        cached = run_child(path, Path(tmp), args.dynamics_members, args.dynamics_rows)
    raw_mb = raw_bytes(args.transitions) / 2**20

    def growth_ratio(child: dict) -> float:
        return (child["peak_rss_mb"] - child["rss_after_imports_mb"]) / raw_mb

    report = {
        "command": " ".join(["python", "benchmarks/large_dataset.py", *(argv or sys.argv[1:])]),
        "transitions": args.transitions,
        "file": str(path),
        "raw_arrays_mb": raw_mb,
        "write_s": write_s,
        "large_dataset_load_s": first["load_s"],
        "large_dataset_load_cpu_s": first["load_cpu_s"],
        "large_dataset_cached_load_s": cached["load_s"],
        "large_dataset_peak_rss_ratio": growth_ratio(first),
        "large_dataset_cached_peak_rss_ratio": growth_ratio(cached),
        "large_dataset_process_peak_rss_ratio": first["peak_rss_mb"] / raw_mb,
        "large_dataset_peak_rss_mb": first["peak_rss_mb"],
        "large_dataset_rss_after_imports_mb": first["rss_after_imports_mb"],
        "large_dataset_samples_per_s": cached["samples_per_s"],
        "large_dataset_samples_per_cpu_s": cached["samples_per_cpu_s"],
        "large_dataset_dynamics_epoch_s": cached["dynamics_epoch_s"],
        "large_dataset_dynamics_epoch_cpu_s": cached["dynamics_epoch_cpu_s"],
        "large_dataset_dynamics_epoch_s_scaled": cached.get("dynamics_epoch_s_scaled"),
        "large_dataset_dynamics_rows": cached["dynamics_rows"],
        "large_dataset_dynamics_members": cached["dynamics_members"],
        "large_dataset_dynamics_train_rows": cached["dynamics_train_rows"],
        "large_dataset_dynamics_steps_per_epoch": cached["dynamics_steps_per_epoch"],
        "large_dataset_dynamics_peak_rss_mb": cached["dynamics_peak_rss_mb"],
        "load_average_start": load_average,
        "load_average_end": list(os.getloadavg()),
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
    written = "reused" if write_s is None else f"written in {write_s:.1f} s"
    print(
        f"{args.transitions} transitions ({raw_mb:.0f} MB of arrays; {path}, {written}); "
        f"load average {load_average[0]:.2f}\n"
        f"load from an empty cache: {first['load_s']:.1f} s ({first['load_cpu_s']:.1f} s of CPU)"
        f", peak RSS {first['peak_rss_mb']:.0f}"
        f" MB ({report['large_dataset_peak_rss_ratio']:.2f}x the arrays above the "
        f"{first['rss_after_imports_mb']:.0f} MB after imports, "
        f"{report['large_dataset_process_peak_rss_ratio']:.2f}x in all); from the cache: "
        f"{cached['load_s']:.1f} s ({report['large_dataset_cached_peak_rss_ratio']:.2f}x)\n"
        f"replay-buffer sampling at batch 256: {cached['samples_per_s']:.0f} transitions/s "
        f"({cached['samples_per_cpu_s']:.0f} per CPU second)\n"
        f"one dynamics epoch ({cached['dynamics_members']} members, 4 x 200, batch 256): "
        f"{cached['dynamics_epoch_s']:.0f} s ({cached['dynamics_epoch_cpu_s']:.0f} s of CPU) for "
        f"{cached['dynamics_train_rows']} training rows "
        f"(of {cached['dynamics_rows']}) = {cached['dynamics_steps_per_epoch']} minibatch steps"
        + (
            f", scaled to all {args.transitions} rows: {cached['dynamics_epoch_s_scaled']:.0f} s"
            if "dynamics_epoch_s_scaled" in cached
            else ""
        )
        + f"; peak RSS then {cached['dynamics_peak_rss_mb']:.0f} MB"
    )
    if args.json:
        atomic_json_dump(report, args.json)
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
