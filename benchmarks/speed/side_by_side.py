"""Runs side by side (:mod:`cbop_torchrl.trainers.side_by_side`): step time and run-steps/s.

R runs of the CBOP stage's step (sample, guarded Adam step with the target update; on
CUDA captured as a CUDA graph, as training runs it) take turns in one process exactly as
``cbop-train runs.seeds=[...]`` interleaves them: one thread and one RNG state per run, on
CUDA one stream per run. Each run has its own random weights and batches.

- ``step_s``: seconds for one round (every run one gradient step); ``run_steps_per_s``:
  R / ``step_s``. Both as ratios to R = 1.
- On the CPU (``threads=1``), against two one-thread processes of one run each
  (``two_processes``): the run-steps/s each process measured over its own steps, summed.
  On 2 cores the two processes use both; runs in one process take turns on one.
- On CUDA at the paper's sizes, R = 1, 4, 12 and 24.

The figures are measured by ``python scripts/bench.py --side-by-side`` (and
``--device cuda``); ``tests/test_bench_side_by_side.py`` runs it at tiny sizes on the CPU.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import types
from collections.abc import Callable, Sequence
from functools import partial

import torch
from torchrl.objectives import SoftUpdate

from benchmarks.speed import REPO
from benchmarks.speed.measure import sync
from benchmarks.speed.models import build_models, preset_dataset
from benchmarks.speed.preset_step import preset_loss
from benchmarks.speed.sizes import PAPER, PAPER_HOPPER, TINY, Size, cpu_preset_size
from cbop_torchrl.accel import CBOPLoss
from cbop_torchrl.data import make_replay_buffer
from cbop_torchrl.modules.actor_critic import make_actor
from cbop_torchrl.objectives.cbop_update import cbop_update, make_optimizer
from cbop_torchrl.trainers.cbop_stage import GuardedOptimizationStepper
from cbop_torchrl.trainers.side_by_side import TakeTurns, train_in_turn

CPU_COUNTS = (1, 2, 4)
CUDA_COUNTS = (1, 4, 12, 24)


def run_step(size: Size, dynamics, device: torch.device, seed: int) -> Callable[[], None]:
    """One run's CBOP step at ``size`` (its own weights and batches, seed ``seed``)."""
    torch.manual_seed(seed)
    loss = preset_loss(CBOPLoss, make_actor, size, dynamics, device, "float32")
    optimizer = make_optimizer(loss, actor_lr=3e-4, critic_lr=3e-4, alpha_lr=3e-4)
    update = partial(cbop_update, loss, optimizer, SoftUpdate(loss, tau=0.005))
    captured = device.type == "cuda"
    stepper = GuardedOptimizationStepper(
        types.SimpleNamespace(describe_last=lambda: "none"), update=update,
        cuda_graph=captured, check_interval=1000 if captured else 1,
    )  # fmt: skip
    trainer = types.SimpleNamespace(compute_loss=loss, optimizer=optimizer, collected_frames=0)
    data = preset_dataset(size, device)
    buffer = make_replay_buffer(data, size.batch, device=device, seed=seed)

    def step() -> None:
        trainer.collected_frames += 1
        stepper.step(trainer, buffer.sample())

    return step


def time_side_by_side(
    size: Size, count: int, device: torch.device, steps: int, warmup: int = 4
) -> dict[str, float]:
    """``count`` runs in turn, ``warmup`` then ``steps`` gradient steps each."""
    _, _, dynamics, _ = build_models(size, device)
    steps_of = [run_step(size, dynamics, device, seed) for seed in range(count)]
    clock: dict[str, float] = {}

    def run(index: int, take_turns: TakeTurns) -> dict:
        for _ in range(warmup):
            steps_of[index]()
            take_turns()
        for step in range(steps):
            if index == 0 and step == 0:
                sync(device)
                clock["start"] = time.perf_counter()
            steps_of[index]()
            take_turns()
        sync(device)
        clock["end"] = time.perf_counter()  # the last run to end writes last
        return {}

    train_in_turn([partial(run, i) for i in range(count)], [str(i) for i in range(count)], device)
    step_s = (clock["end"] - clock["start"]) / steps
    return {"runs": count, "step_s": step_s, "run_steps_per_s": count / step_s}


def two_processes(size_name: str, steps: int) -> dict[str, float]:
    """Two one-thread processes of one run each, started together: run-steps/s summed."""
    command = [sys.executable, "-m", "benchmarks.speed.side_by_side", size_name, str(steps)]
    workers = [
        subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, text=True) for _ in range(2)
    ]
    measured = [json.loads(worker.communicate()[0].strip().splitlines()[-1]) for worker in workers]
    if any(worker.returncode for worker in workers):
        raise RuntimeError(f"a worker process failed: {[w.returncode for w in workers]}")
    return {
        "processes": 2,
        "step_s": max(m["step_s"] for m in measured),
        "run_steps_per_s": sum(m["run_steps_per_s"] for m in measured),
    }


def ratios(rows: Sequence[dict[str, float]]) -> list[dict[str, float]]:
    """Each row with its step time and run-steps/s as ratios to the first row's (R = 1)."""
    first = rows[0]
    return [
        {
            **row,
            "step_s_ratio": row["step_s"] / first["step_s"],
            "run_steps_per_s_ratio": row["run_steps_per_s"] / first["run_steps_per_s"],
        }
        for row in rows
    ]


def bench_side_by_side(
    device: torch.device,
    steps: int,
    sizes: Sequence[Size] | None = None,
    counts: Sequence[int] | None = None,
    processes: bool = True,
) -> dict:
    """Step time and run-steps/s of R runs side by side, per size (ratios to R = 1).

    Defaults: on CUDA the paper's sizes and R = 1, 4, 12, 24; on the CPU the CPU preset's
    size, R = 1, 2, 4 and two one-thread processes (``processes``).
    """
    cuda = device.type == "cuda"
    sizes = sizes or ((PAPER, PAPER_HOPPER) if cuda else (cpu_preset_size(),))
    counts = counts or (CUDA_COUNTS if cuda else CPU_COUNTS)
    report: dict = {"device": str(device), "steps": steps, "sizes": {}}
    for size in sizes:
        rows = ratios([time_side_by_side(size, count, device, steps) for count in counts])
        entry: dict = {"side_by_side": rows}
        if processes and not cuda:
            other = two_processes(size.name, steps)
            other["run_steps_per_s_ratio"] = other["run_steps_per_s"] / rows[0]["run_steps_per_s"]
            entry["two_processes"] = other
        report["sizes"][size.name] = entry
    return report


def print_side_by_side(report: dict) -> None:
    """The figures, as ratios to one run alone."""
    print(f"\nruns side by side on {report['device']} ({report['steps']} steps per run)")
    for name, entry in report["sizes"].items():
        print(f"  {name}:")
        for row in entry["side_by_side"]:
            print(
                f"    R = {row['runs']:>2}: step {row['step_s'] * 1e3:8.2f} ms "
                f"({row['step_s_ratio']:.2f}x R=1), {row['run_steps_per_s']:8.1f} run-steps/s "
                f"({row['run_steps_per_s_ratio']:.2f}x R=1)"
            )
        if "two_processes" in entry:
            other = entry["two_processes"]
            print(
                f"    two one-thread processes: {other['run_steps_per_s']:8.1f} run-steps/s "
                f"({other['run_steps_per_s_ratio']:.2f}x one run in one process)"
            )


def _worker(size_name: str, steps: int) -> None:
    """One process of :func:`two_processes`: one run, one thread; prints its figures."""
    torch.set_num_threads(1)
    known = {"cpu": cpu_preset_size(), "tiny": TINY}
    print(json.dumps(time_side_by_side(known[size_name], 1, torch.device("cpu"), steps)))


if __name__ == "__main__":
    _worker(sys.argv[1], int(sys.argv[2]))
