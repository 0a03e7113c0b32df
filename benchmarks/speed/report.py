"""The figures printed to the terminal, read from the report the JSON holds."""

from __future__ import annotations

import math

from benchmarks.speed.measure import CPU_FLAGS
from benchmarks.speed.sizes import Size


def print_host(report: dict) -> None:
    """The host's CPU and flags, the device, the threads, the load and the matmul peaks."""
    load = report["load_average_start"]
    cpu_flags = [flag for flag in CPU_FLAGS if report.get(f"cpu_has_{flag}")]
    print(
        f"CPU {report.get('cpu_model', 'unknown')} (flags: {', '.join(cpu_flags) or 'none'} of "
        f"{', '.join(CPU_FLAGS)}; torch dispatch {report['torch_cpu_capability']})"
    )
    print(
        f"device {report['device']}, {report['threads']} threads, load average {load[0]:.2f}; "
        f"matmul peak {report['peak_fp32_gflops']:.0f} GFLOP/s fp32, "
        f"{report['peak_bf16_gflops']:.0f} bf16"
    )


def print_size(result: dict) -> None:
    size = result["size"]
    critics = size.get("critic_hidden")  # absent from JSON written before critic widths
    widths = f"actor {size['hidden']} critics {critics}" if critics else f"hidden {size['hidden']}"
    print(
        f"\n== {size['name']}: B {size['batch']} K {size['particles']} M {size['members']} "
        f"H {size['horizon']} {widths} dynamics {size['dyn_hidden']} "
        f"(target {result['target_gflop']:.1f} GFLOP)"
    )
    print(
        f"matmul peak in the same rounds: {result['peak_fp32_gflops']:.0f} GFLOP/s fp32, "
        f"{result['peak_bf16_gflops']:.0f} bf16 (% peak: target_bf16 against bf16, others fp32)"
    )
    print(f"{'':28}{'ms/call':>10}{'GFLOP/s':>10}{'% peak':>8}{'% bf16':>8}{'vs ref':>8}")
    names = ("reference_target", "target_fp32", "target_bf16", "target_tf32", "update")
    captured = ("step_eager", "step_captured", "step_bf16_eager", "step_bf16_captured")
    captured += ("step_bf16_captured_compiled",)
    for name in (*names, "update_bf16", "sac_update", *captured):
        if name + "_ms" not in result:  # a report from before update_bf16 was timed
            continue
        print(
            f"{name:28}{result[name + '_ms']:10.2f}{result[name + '_gflops']:10.1f}"
            f"{100 * result[name + '_peak_share']:8.1f}"
            f"{100 * result.get(name + '_bf16_peak_share', math.nan):8.2f}"
            f"{result[name + '_speedup_vs_reference']:7.2f}x"
        )
    print(
        f"bf16 target: mean|dy|/std(y) = {100 * result['target_bf16_rel_error']:.3f}% "
        f"(of the bootstrap's std: {100 * result['target_bf16_rel_error_bootstrap']:.3f}%; "
        f"y = {result['target_mean']:.1f} +- {result['target_std']:.1f}); "
        f"update / fp32 target = {result['update_over_target_fp32']:.2f}"
    )
    if "step_dispatched_ops" in result:
        print(
            f"TF32 target: mean|dy|/std(y) = {100 * result['target_tf32_rel_error']:.3f}%; "
            f"the whole step captured as one CUDA graph: {result['step_captured_speedup']:.1f}x "
            f"(fp32), {result['step_bf16_captured_speedup']:.1f}x (bf16) the eager step, which "
            f"dispatches {result['step_dispatched_ops']} operations"
        )
        if "step_compile_seconds" in result:
            print(
                f"with compile=true: {result['step_bf16_captured_compiled_speedup']:.1f}x the "
                f"eager bf16 step; compiling and capturing it took "
                f"{result['step_compile_seconds']:.0f} s"
            )
    elif "update_dispatched_ops" in result:
        print(f"one eager bf16 update dispatches {result['update_dispatched_ops']} operations")


def print_preset_steps(report: dict) -> None:
    """The CBOP stage's step at the CPU preset (:mod:`benchmarks.speed.preset_step`)."""
    print(
        f"\nCBOP stage at the CPU preset: {report['cpu_preset_steps_per_s']:.1f} gradient "
        f"steps/s now (default: rollout_dtype=auto chose "
        f"{report['cpu_preset_rollout_dtype']}), {report['cpu_preset_steps_per_s_fp32']:.1f} "
        f"with fp32 rollouts, {report['cpu_preset_steps_per_s_bf16']:.1f} with bf16 "
        f"rollouts, {report.get('cpu_preset_steps_per_s_before', math.nan):.1f} before "
        f"({report['cpu_preset_before_commit']}); host syncs per step "
        f"{report['host_syncs_per_step']} now, "
        f"{report.get('host_syncs_per_step_before', 'n/a')} before"
    )
    print(
        f"CPU time per step (all threads): {report['cpu_preset_cpu_ms_per_step']:.1f} ms now, "
        f"{report['cpu_preset_cpu_ms_per_step_fp32']:.1f} with fp32 rollouts, "
        f"{report['cpu_preset_cpu_ms_per_step_bf16']:.1f} with bf16 rollouts, "
        f"{report.get('cpu_preset_cpu_ms_per_step_before', math.nan):.1f} before, "
        f"{report.get('cpu_preset_cpu_ms_per_step_previous', math.nan):.1f} at "
        f"{report.get('cpu_preset_previous_commit')} "
        f"({report.get('cpu_preset_steps_per_s_previous', math.nan):.1f} steps/s)"
    )


def print_compiled(report: dict) -> None:
    """The compiled step against the eager one (:mod:`benchmarks.speed.compile_cpu`)."""
    for suffix, label in (("", "fp32"), ("_bf16", "bf16")):
        print(
            f"torch.compile of the target ({label} rollouts): CPU time per step "
            f"{report['cpu_preset_cpu_ms_per_step_compiled' + suffix]:.1f} ms compiled, "
            f"{report['cpu_preset_cpu_ms_per_step_eager' + suffix]:.1f} eager; compile "
            f"{report['compile_s' + suffix]:.0f} s ({report['compile_cpu_s' + suffix]:.0f} s "
            f"CPU) from an empty cache; |dy| max "
            f"{report['compiled_target_max_abs_diff' + suffix]:.2e}, mean/std(y) "
            f"{report['compiled_target_rel_diff' + suffix]:.2e}; pays within "
            f"{report['compile_main_job_steps']} steps: "
            f"{report['compile_pays_in_main_job' + suffix]}"
        )
    print(
        f"compile from the filled cache: {report['compile_s_warm']:.0f} s "
        f"({report['compile_cpu_s_warm']:.0f} s CPU)"
    )


def print_extras(report: dict, dyn_size: Size) -> None:
    """Dynamics-training and evaluation throughput (:mod:`benchmarks.speed.extras`)."""
    dynamics, evaluation = report["dynamics_training"], report["evaluation"]
    print(
        f"\ndynamics training ({dyn_size.dyn_members} members, {dyn_size.dyn_hidden}): "
        f"{dynamics['dynamics_train_samples_per_s']:.0f} samples/s, "
        f"{dynamics['dynamics_train_gflops']:.1f} GFLOP/s"
    )
    print(
        f"evaluation (hopper, {evaluation['eval_num_envs']} episodes): vectorized "
        f"{evaluation['eval_vectorized_steps_per_s']:.0f} env steps/s, one env at a time "
        f"{evaluation['eval_single_env_steps_per_s']:.0f}"
    )
