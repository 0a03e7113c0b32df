"""The speed goals: which this run measured, met or missed, by what and why."""

from __future__ import annotations

#: The speed goals for the figures of ``scripts/bench.py`` (``large_dataset.py`` has the
#: dataset-scale ones).
SPEED_GOALS = {
    "cpu_preset_steps_per_s": 20.0,  # CBOP stage at the CPU preset, 2 cores
    "host_syncs_per_step": 1,  # outside logging intervals
    "paper_target_bf16_peak_share": 0.5,  # of the bf16 matmul peak in the same rounds
}


def speed_goals(report: dict) -> dict[str, dict]:
    """Each goal this run measured: its value, whether it is met and, if not, by how much.

    ``miss`` is how far off the value is as a factor (goal / value for a floor, value / goal
    for a ceiling); ``why`` names the measured figures that explain a miss, so the JSON
    says on its own what it would take.
    """
    goals: dict[str, dict] = {}
    steps = report.get("cpu_preset_steps_per_s")
    if steps is not None:
        goal = SPEED_GOALS["cpu_preset_steps_per_s"]
        # Every path measured here, by CPU ms per step (compiled ones: --compile-cpu).
        cpu_ms = {
            f"default ({report.get('cpu_preset_rollout_dtype', 'float32')} rollouts)": report[
                "cpu_preset_cpu_ms_per_step"
            ],
            "fp32 rollouts": report.get("cpu_preset_cpu_ms_per_step_fp32"),
            "bf16 rollouts": report.get("cpu_preset_cpu_ms_per_step_bf16"),
            "compiled fp32": report.get("cpu_preset_cpu_ms_per_step_compiled"),
            "compiled bf16": report.get("cpu_preset_cpu_ms_per_step_compiled_bf16"),
        }
        cpu_ms = {k: v for k, v in cpu_ms.items() if v is not None}
        wall_ms = 1e3 / steps
        goals["cpu_preset_steps_per_s"] = {
            "goal": goal,
            "value": steps,
            "met": steps >= goal,
            "miss": goal / steps,
            "why": (
                f"the default step takes {wall_ms:.0f} ms of wall time and "
                f"{report['cpu_preset_cpu_ms_per_step']:.0f} ms of CPU time "
                f"({report['cpu_preset_cpu_ms_per_step'] / wall_ms:.2f} of {report['threads']} "
                f"threads busy on average); {goal:.0f} steps/s needs {1e3 / goal:.0f} ms of wall "
                "time. CPU ms per step: "
                + ", ".join(f"{k} {v:.0f}" for k, v in cpu_ms.items())
                + f"; matmul peak {report['peak_fp32_gflops']:.0f} GFLOP/s fp32, "
                f"{report['peak_bf16_gflops']:.0f} bf16"
            ),
        }
    syncs = report.get("host_syncs_per_step")
    if syncs is not None:
        goal = SPEED_GOALS["host_syncs_per_step"]
        goals["host_syncs_per_step"] = {
            "goal": goal,
            "value": syncs,
            "met": syncs <= goal,
            "miss": syncs / goal,
            "why": f"{syncs} host syncs counted in one step outside a logging interval",
        }
    paper = report.get("sizes", {}).get("paper")
    if paper is not None:
        goal = SPEED_GOALS["paper_target_bf16_peak_share"]
        share = paper["target_bf16_peak_share"]
        goals["paper_target_bf16_peak_share"] = {
            "goal": goal,
            "value": share,
            "met": share >= goal,
            "miss": goal / share,
            "why": (
                f"the bf16 target runs {paper['target_bf16_gflops']:.0f} GFLOP/s against a bf16 "
                f"matmul peak of {paper['peak_bf16_gflops']:.0f} in the same rounds (fp32 peak "
                f"{paper['peak_fp32_gflops']:.0f}: bf16 is "
                f"{paper['peak_bf16_gflops'] / paper['peak_fp32_gflops']:.1f}x fp32 here)"
            ),
        }
    for name, goal in report.get("large_dataset_goals", {}).items():
        value = report[f"large_dataset_{name}"]
        floor = name == "samples_per_s"
        goals[f"large_dataset_{name}"] = {
            "goal": goal["goal"],
            "value": value,
            "met": goal["met"],
            "miss": goal["goal"] / value if floor else value / goal["goal"],
        }
    return goals


def print_goals(goals: dict[str, dict]) -> None:
    print("\nspeed goals:")
    for name, goal in goals.items():
        verdict = "met" if goal["met"] else f"missed by {goal['miss']:.2f}x"
        print(f"  {name}: {goal['value']:.4g} (goal {goal['goal']:g}) {verdict}")
        if not goal["met"] and "why" in goal:
            print(f"    {goal['why']}")
