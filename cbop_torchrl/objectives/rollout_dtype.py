"""The precision of CBOP's model rollouts: float32 or bfloat16, and when ``auto`` picks bf16.

:class:`~cbop_torchrl.objectives.estimator.CBOPValueEstimator` runs the rollout's
actor, dynamics and Q matmuls in ``rollout_dtype`` (the posterior stays in
float32). With ``estimator.rollout_dtype=auto`` it measures, once per run
(:func:`select_rollout_dtype`), whether bf16 matmuls are fast on the device
(:func:`bf16_matmul_speedup` against :data:`BF16_MIN_SPEEDUP`) and whether bf16
moves the targets on the run's data by at most :data:`BF16_TOLERANCE` of their
std (:func:`measure_bf16_error`).
"""

from __future__ import annotations

import time
from typing import Any

import torch
from tensordict import TensorDictBase

_DTYPES = {
    "float32": torch.float32,
    "fp32": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
}


def resolve_rollout_dtype(dtype: torch.dtype | str) -> torch.dtype:
    """``torch.float32`` or ``torch.bfloat16`` from that dtype or its name.

    Names: ``"float32"``/``"fp32"`` and ``"bfloat16"``/``"bf16"``.

    Raises:
        ValueError: any other name or dtype.
    """
    if isinstance(dtype, str):
        if dtype not in _DTYPES:
            raise ValueError(
                f"rollout_dtype {dtype!r} is not supported; use 'float32' (default) or "
                "'bfloat16' (rollout matmuls in bf16, posterior in fp32)."
            )
        dtype = _DTYPES[dtype]
    if dtype not in (torch.float32, torch.bfloat16):
        raise ValueError(
            f"rollout_dtype {dtype} is not supported; use torch.float32 or torch.bfloat16."
        )
    return dtype


#: ``rollout_dtype="auto"`` picks bf16 only if it moves the targets by at most this share of
#: their std (measured on the run's own data and networks,
#: :func:`select_rollout_dtype`).
BF16_TOLERANCE = 0.01
#: ... and if bf16 matmuls run at least this much faster than fp32 on the device.
BF16_MIN_SPEEDUP = 1.5


def bf16_matmul_speedup(device: torch.device, n: int = 512, repeats: int = 5) -> float:
    """fp32 time / bf16 time of an ``n x n`` matmul on ``device`` (best of ``repeats``).

    About 4x on CPUs with AMX-BF16, ~1x or below without native bf16 (emulated),
    2x or more on GPUs with bf16 tensor cores.
    """
    seconds = {}
    for dtype in (torch.float32, torch.bfloat16):
        a = torch.randn(n, n, device=device).to(dtype)
        best = float("inf")
        for _ in range(repeats + 1):
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            start = time.perf_counter()
            torch.mm(a, a)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            best = min(best, time.perf_counter() - start)
        seconds[dtype] = best
    return seconds[torch.float32] / seconds[torch.bfloat16]


@torch.no_grad()
def measure_bf16_error(estimator: Any, tensordict: TensorDictBase, seed: int = 0) -> float:
    """``mean|y_bf16 - y_fp32| / std(y_fp32)`` of ``estimator``'s targets on ``tensordict``.

    Both dtypes draw the same random numbers; the global RNG is forked (left untouched)
    and the estimator's ``rollout_dtype`` is restored.
    """
    previous, previous_eager = estimator.rollout_dtype, estimator._eager_only
    estimator._eager_only = True  # one-off calls in two dtypes: not worth two compilations
    targets = []
    try:
        for dtype in (torch.float32, torch.bfloat16):
            estimator.rollout_dtype = dtype
            device = tensordict.device or torch.device("cpu")
            devices = [device] if device.type == "cuda" else []
            with torch.random.fork_rng(devices=devices):
                torch.manual_seed(seed)
                targets.append(estimator.compute_target(tensordict)[0])
    finally:
        estimator.rollout_dtype, estimator._eager_only = previous, previous_eager
    y32, y16 = targets
    return float((y16 - y32).abs().mean() / y32.std().clamp_min(1e-12))


def select_rollout_dtype(
    estimator: Any, tensordict: TensorDictBase, tolerance: float = BF16_TOLERANCE
) -> dict[str, Any]:
    """Sets ``estimator.rollout_dtype`` to bf16 if fast here and accurate on this data, else fp32.

    bf16 is chosen when the device runs bf16 matmuls at least :data:`BF16_MIN_SPEEDUP` x
    faster than fp32 (:func:`bf16_matmul_speedup`) AND the targets on ``tensordict`` (a few
    batches of the dataset, with the current actor and Q-ensemble) move by at most
    ``tolerance`` x their std (:func:`measure_bf16_error`). Returns what was chosen and why.
    """
    device = tensordict.device or torch.device("cpu")
    speedup = bf16_matmul_speedup(device)
    error = measure_bf16_error(estimator, tensordict)
    fast, accurate = speedup >= BF16_MIN_SPEEDUP, error <= tolerance
    estimator.rollout_dtype = torch.bfloat16 if fast and accurate else torch.float32
    return {
        "rollout_dtype": "bfloat16" if estimator.rollout_dtype == torch.bfloat16 else "float32",
        "bf16_matmul_speedup": speedup,
        "bf16_target_rel_error": error,
        "bf16_tolerance": tolerance,
        "reason": (
            "bf16 matmuls are fast here and the targets move little"
            if fast and accurate
            else ("bf16 matmuls are not fast here" if not fast else "bf16 moves the targets")
        ),
    }


__all__ = [
    "BF16_MIN_SPEEDUP",
    "BF16_TOLERANCE",
    "bf16_matmul_speedup",
    "measure_bf16_error",
    "resolve_rollout_dtype",
    "select_rollout_dtype",
]
