"""Smoke test of scripts/bench.py at tiny sizes (no timing is asserted)."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bench.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_quick_tiny_run_writes_every_figure(bench, tmp_path, monkeypatch):
    monkeypatch.setenv("CBOP_TORCHRL_CACHE", str(tmp_path / "cache"))
    out = tmp_path / "bench.json"
    assert bench.main(["--quick", "--sizes", "tiny", "--rounds", "1", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    for key in ("peak_fp32_gflops", "peak_bf16_gflops"):
        assert report[key] > 0
    tiny = report["sizes"]["tiny"]
    for name in ("reference_target", "target_fp32", "target_bf16", "update", "sac_update"):
        assert tiny[f"{name}_ms"] > 0 and math.isfinite(tiny[f"{name}_gflops"])
    assert 0 <= tiny["target_bf16_rel_error"] < 0.05
    assert report["dynamics_training"]["dynamics_train_samples_per_s"] > 0
    assert report["evaluation"]["eval_vectorized_steps_per_s"] > 0


def test_reference_design_computes_the_same_kind_of_target(bench):
    """Same models: the reference design's y and the estimator's y agree in distribution."""
    import torch

    from cbop_torchrl.objectives.estimator import CBOPValueEstimator

    size = bench.TINY
    actor, qnets, dynamics, batch = bench.build_models(size, torch.device("cpu"))
    ours = CBOPValueEstimator(
        actor_network=actor,
        qvalue_network=qnets,
        dynamics=dynamics,
        horizon=size.horizon,
        gamma=0.99,
        seed=0,
    )
    y_ours = ours.compute_target(batch)[0].squeeze(-1)
    y_ref = bench.ReferenceTarget(actor, qnets, dynamics, size.horizon, 0.99)(batch)
    assert y_ref.shape == y_ours.shape
    # Different random draws, the same estimator: close relative to the target's scale.
    assert (y_ref - y_ours).abs().mean() < 0.05 * y_ours.abs().mean()


def test_cpu_preset_sizes_come_from_the_config(bench):
    size = bench.cpu_preset_size()
    assert size.particles <= size.dyn_members and size.members >= 2 and size.horizon >= 0


def test_bad_arguments_are_explained(bench, capsys):
    assert bench.main(["--sizes", "huge"]) == 2
    assert "unknown size" in capsys.readouterr().err


def test_large_dataset_run_passes_the_dynamics_rows(bench, tmp_path, capsys):
    out = tmp_path / "large.json"
    default = bench.parse_args(["--large-dataset", "2000000"])
    command = bench.large_dataset_command(
        default.large_dataset, default.large_dataset_dynamics_rows, out
    )
    assert command[1].endswith("benchmarks/large_dataset.py")
    assert command[2:] == [
        "--transitions", "2000000", "--dynamics-rows", "200000", "--json", str(out),
    ]  # fmt: skip
    assert "--dynamics-rows" not in bench.large_dataset_command(2000000, 0, out)
    assert bench.main(["--large-dataset", "5000", "--large-dataset-dynamics-rows", "10"]) == 2
    assert "--large-dataset-dynamics-rows 10: give at least 1000" in capsys.readouterr().err


def test_host_cpu_flags_are_read_from_cpuinfo(bench, tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(
        "processor\t: 0\nmodel name\t: Some Xeon\nflags\t\t: fpu avx512f amx_tile amx_bf16\n\n"
        "processor\t: 1\nmodel name\t: Some Xeon\nflags\t\t: fpu avx512f amx_tile amx_bf16\n"
    )
    info = bench.host_cpu_info(cpuinfo)
    assert info["cpu_model"] == "Some Xeon"
    assert info["cpu_has_amx_bf16"] and info["cpu_has_amx_tile"] and info["cpu_has_avx512f"]
    assert info["cpu_has_avx512_bf16"] is False
    missing = bench.host_cpu_info(tmp_path / "absent")  # not Linux: keys absent, not guessed
    assert "cpu_model" not in missing and "cpu_has_amx_bf16" not in missing
    assert missing["torch_cpu_capability"]
