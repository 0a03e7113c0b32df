"""The measuring tools: the host's CPU facts, interleaved timing and the matmul peak, and
how far one target is from another."""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
from tensordict import TensorDictBase

#: CPU flags that decide the bf16 figures: AMX tiles run bf16 matmuls at several times the
#: fp32 rate; avx512_bf16 alone at about twice; without either bf16 is emulated.
CPU_FLAGS = ("amx_bf16", "amx_tile", "avx512_bf16", "avx512f")


def host_cpu_info(cpuinfo: Path = Path("/proc/cpuinfo")) -> dict:
    """``cpu_model`` and ``cpu_has_<flag>`` for :data:`CPU_FLAGS`, from ``cpuinfo`` (Linux).

    Keys are absent where the file is missing or has no such line (other systems),
    so figures from different hosts can be told apart without guessing.
    ``torch_cpu_capability`` is the instruction set torch's CPU kernels dispatch to.
    """
    info: dict = {"torch_cpu_capability": torch.backends.cpu.get_cpu_capability()}
    try:
        text = cpuinfo.read_text()
    except OSError:
        return info
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() not in fields:  # the first processor's lines
            fields[key.strip()] = value.strip()
    if "model name" in fields:
        info["cpu_model"] = fields["model name"]
    if "flags" in fields:
        flags = set(fields["flags"].split())
        info.update({f"cpu_has_{flag}": flag in flags for flag in CPU_FLAGS})
    return info


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


def relative_error(
    y: torch.Tensor, reference: torch.Tensor, scale: torch.Tensor | None = None
) -> float:
    """``mean|y - reference| / std(scale)``; ``scale`` defaults to ``reference``."""
    scale = reference if scale is None else scale
    return float((y - reference).abs().mean() / scale.std().clamp_min(1e-12))


def seeded_target(estimator, batch: TensorDictBase, seed: int = 0) -> torch.Tensor:
    """``estimator``'s target ``y`` for ``batch`` after ``torch.manual_seed(seed)``; RNG kept."""
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        return estimator.compute_target(batch)[0]
