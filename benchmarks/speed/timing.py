"""How the benchmark times: interleaved rounds of medians, and the machine's matmul peak."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable

import torch


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_interleaved(
    calls: dict[str, Callable[[], object]],
    rounds: int,
    device: torch.device,
    cpu_seconds: dict[str, float] | None = None,
) -> dict[str, float]:
    """Median seconds per call of each callable; one warm-up, then ``rounds`` interleaved rounds.

    With ``cpu_seconds`` given, it also receives each call's median CPU time of
    this process (all its threads): on a shared machine, where other jobs take
    the cores, that moves much less than the wall-clock time.
    """
    samples: dict[str, list[float]] = {name: [] for name in calls}
    cpu_samples: dict[str, list[float]] = {name: [] for name in calls}
    for fn in calls.values():  # warm-up (allocator, autotuning, compilation)
        fn()
    sync(device)
    for _ in range(rounds):
        for name, fn in calls.items():
            start, cpu_start = time.perf_counter(), time.process_time()
            fn()
            sync(device)
            samples[name].append(time.perf_counter() - start)
            cpu_samples[name].append(time.process_time() - cpu_start)
    if cpu_seconds is not None:
        cpu_seconds.update({name: statistics.median(v) for name, v in cpu_samples.items()})
    return {name: statistics.median(values) for name, values in samples.items()}


def matmul_peak(dtype: torch.dtype, n: int, device: torch.device, rounds: int) -> float:
    """Best GFLOP/s of an ``n x n`` matmul in ``dtype``."""
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    torch.mm(a, b)
    best = math.inf
    for _ in range(rounds):
        sync(device)
        start = time.perf_counter()
        torch.mm(a, b)
        sync(device)
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best / 1e9
