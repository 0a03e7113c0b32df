"""Smoke test of benchmarks/large_dataset.py at a small size (no timing is asserted)."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import h5py
import numpy as np

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "large_dataset.py"


def _module():
    spec = importlib.util.spec_from_file_location("large_dataset_bench", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_writes_a_d4rl_layout_file_once_and_reports_every_figure(tmp_path):
    bench = _module()
    data_dir, out = tmp_path / "files", tmp_path / "large.json"
    argv = ["--transitions", "3000", "--dynamics-members", "2", "--dynamics-rows", "2000"]
    argv += ["--data-dir", str(data_dir)]
    assert bench.main([*argv, "--json", str(out)]) == 0
    (path,) = data_dir.glob("*.hdf5")
    with h5py.File(path, "r") as handle:
        assert {key: handle[key].shape for key in bench.SPECS} == {
            "observations": (3000, 17),
            "next_observations": (3000, 17),
            "actions": (3000, 6),
            "rewards": (3000,),
            "terminals": (3000,),
            "timeouts": (3000,),
        }
        assert handle["observations"].dtype == np.float32 and handle["timeouts"][999]
        assert np.array_equal(handle["next_observations"][:999], handle["observations"][1:1000])
    report = json.loads(out.read_text())
    assert report["raw_arrays_mb"] * 2**20 == bench.raw_bytes(3000) == 3000 * (4 * 41 + 2)
    for key in ("load_s", "cached_load_s", "peak_rss_ratio", "samples_per_s", "dynamics_epoch_s"):
        assert report[f"large_dataset_{key}"] > 0, key
    assert report["large_dataset_dynamics_members"] == 2
    # The first 2000 rows minus 2 timeouts, minus a 20% holdout: the epoch's training rows.
    assert report["large_dataset_dynamics_rows"] == 2000
    assert report["large_dataset_dynamics_train_rows"] == 1998 - 399
    scaled = report["large_dataset_dynamics_epoch_s_scaled"]
    assert scaled == report["large_dataset_dynamics_epoch_s"] * 3000 / 2000
    assert report["write_s"] is not None

    mtime = path.stat().st_mtime_ns
    assert bench.dataset_file(data_dir, 3000) == (path, None)  # reused, not written again
    assert path.stat().st_mtime_ns == mtime
    assert bench.main(["--transitions", "10"]) == 2
