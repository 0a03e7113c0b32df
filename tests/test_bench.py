"""Smoke test of scripts/bench.py at tiny sizes (no timing is asserted)."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bench.py"


@pytest.fixture(scope="module")
def bench():
    # Loading the script puts the repository root on sys.path: the tests that ask for it
    # import the benchmarks.speed modules.
    spec = importlib.util.spec_from_file_location("bench_script", SCRIPT)
    module = importlib.util.module_from_spec(spec)
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
    assert report["goals"] == {}  # tiny sizes measure none of the goals' figures


def test_reference_design_computes_the_same_kind_of_target(bench):
    """Same models: the reference design's y and the estimator's y agree in distribution."""
    import torch

    from benchmarks.speed.models import build_models
    from benchmarks.speed.reference import ReferenceTarget
    from cbop_torchrl.objectives.estimator import CBOPValueEstimator

    size = bench.TINY
    actor, qnets, dynamics, batch = build_models(size, torch.device("cpu"))
    ours = CBOPValueEstimator(
        actor_network=actor,
        qvalue_network=qnets,
        dynamics=dynamics,
        horizon=size.horizon,
        gamma=0.99,
        seed=0,
    )
    y_ours = ours.compute_target(batch)[0].squeeze(-1)
    y_ref = ReferenceTarget(actor, qnets, dynamics, size.horizon, 0.99)(batch)
    assert y_ref.shape == y_ours.shape
    # Different random draws, the same estimator: close relative to the target's scale.
    assert (y_ref - y_ours).abs().mean() < 0.05 * y_ours.abs().mean()


def test_cpu_preset_sizes_come_from_the_config(bench):
    import yaml

    size = bench.cpu_preset_size()
    assert size.particles <= size.dyn_members and size.members >= 2 and size.horizon >= 0
    preset_file = SCRIPT.parents[1] / "cbop_torchrl" / "configs" / "preset" / "cpu.yaml"
    preset = yaml.safe_load(preset_file.read_text())
    agent = preset["agent"]
    assert size.hidden == tuple(agent["hidden_sizes"])
    assert size.q_hidden == tuple(agent.get("critic_hidden_sizes") or agent["hidden_sizes"])


def test_deep_critics_size_changes_only_the_critics_and_the_batch(bench):
    from benchmarks.speed.models import build_models
    from benchmarks.speed.sizes import env_sizes, flop_counts

    cpu = bench.cpu_preset_size()
    deep = bench.cpu_deep_critics_size(cpu)
    assert (deep.batch, deep.q_hidden, deep.hidden) == (256, (256, 256, 256), cpu.hidden)
    assert (deep.members, deep.particles, deep.horizon) == (cpu.members, cpu.particles, cpu.horizon)
    actor, qnets, _, batch = build_models(deep, torch.device("cpu"))
    linear = [m for m in qnets[0].modules() if isinstance(m, torch.nn.Linear)]
    assert [m.out_features for m in linear] == [256, 256, 256, 1]
    actor_linear = [m for m in actor.modules() if isinstance(m, torch.nn.Linear)]
    assert len(actor_linear) == len(cpu.hidden) + 1
    assert batch.batch_size == torch.Size([256])
    dims = env_sizes(cpu.family)
    assert flop_counts(deep, *dims)["update"] > flop_counts(cpu, *dims)["update"]


def test_shallow_critics_size_is_the_preset_with_critics_as_wide_as_the_actor(bench):
    from benchmarks.speed.sizes import env_sizes, flop_counts

    cpu = bench.cpu_preset_size()
    shallow = bench.cpu_shallow_critics_size(cpu)
    assert (shallow.q_hidden, shallow.hidden, shallow.batch) == (cpu.hidden, cpu.hidden, cpu.batch)
    dims = env_sizes(cpu.family)
    assert flop_counts(shallow, *dims)["update"] < flop_counts(cpu, *dims)["update"]


def test_bad_arguments_are_explained(bench, capsys):
    assert bench.main(["--sizes", "huge"]) == 2
    assert "unknown size" in capsys.readouterr().err


def test_large_dataset_run_passes_the_dynamics_rows(bench, tmp_path, capsys):
    from benchmarks.speed.large_dataset_run import large_dataset_command

    out = tmp_path / "large.json"
    default = bench.parse_args(["--large-dataset", "2000000"])
    command = large_dataset_command(default.large_dataset, default.large_dataset_dynamics_rows, out)
    assert command[1].endswith("benchmarks/large_dataset.py")
    assert command[2:] == [
        "--transitions", "2000000", "--dynamics-rows", "200000", "--json", str(out),
    ]  # fmt: skip
    assert "--dynamics-rows" not in large_dataset_command(2000000, 0, out)
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


def test_goals_say_which_are_met_and_by_how_much_the_others_miss(bench):
    report = {
        "threads": 2,
        "peak_fp32_gflops": 170.0,
        "peak_bf16_gflops": 340.0,
        "cpu_preset_rollout_dtype": "float32",
        "cpu_preset_steps_per_s": 10.0,
        "cpu_preset_cpu_ms_per_step": 150.0,
        "cpu_preset_cpu_ms_per_step_fp32": 150.0,
        "cpu_preset_steps_per_s_bf16": 12.5,
        "cpu_preset_cpu_ms_per_step_bf16": 160.0,
        "cpu_preset_cpu_ms_per_step_compiled": 150.0,
        "host_syncs_per_step": 0,
        "sizes": {
            "paper": {
                "target_bf16_peak_share": 0.4,
                "target_bf16_gflops": 136.0,
                "peak_bf16_gflops": 340.0,
                "peak_fp32_gflops": 170.0,
            }
        },
        "large_dataset_load_s": 30.0,
        "large_dataset_peak_rss_ratio": 4.5,
        "large_dataset_samples_per_s": 100_000.0,
        "large_dataset_goals": {
            "load_s": {"goal": 60.0, "met": True},
            "peak_rss_ratio": {"goal": 3.0, "met": False},
            "samples_per_s": {"goal": 50_000.0, "met": True},
        },
    }
    goals = bench.speed_goals(report)
    steps = goals["cpu_preset_steps_per_s"]
    assert not steps["met"] and steps["miss"] == pytest.approx(2.0)
    assert "100 ms of wall time and 150 ms of CPU time (1.50 of 2 threads" in steps["why"]
    assert "needs 50 ms of wall time" in steps["why"]
    assert (
        "default (float32 rollouts) 150, fp32 rollouts 150, bf16 rollouts 160, compiled fp32 150;"
        in steps["why"]
    )
    assert "compiled bf16" not in steps["why"]  # not measured in this report
    assert goals["host_syncs_per_step"]["met"]
    share = goals["paper_target_bf16_peak_share"]
    assert not share["met"] and share["miss"] == pytest.approx(1.25)
    assert "2.0x fp32" in share["why"]
    assert goals["large_dataset_peak_rss_ratio"]["miss"] == pytest.approx(1.5)
    assert goals["large_dataset_samples_per_s"]["met"]
    assert goals["large_dataset_load_s"]["miss"] == pytest.approx(0.5)
    # A run that measured only some figures states only those goals.
    assert set(bench.speed_goals({"host_syncs_per_step": 3})) == {"host_syncs_per_step"}
