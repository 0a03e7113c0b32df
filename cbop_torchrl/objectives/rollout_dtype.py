"""The precision of CBOP's model rollouts: float32 or bfloat16, and when ``auto`` picks bf16.

:class:`~cbop_torchrl.objectives.estimator.CBOPValueEstimator` runs the rollout's
actor, dynamics and Q matmuls in ``rollout_dtype`` (the posterior stays in
float32). With ``estimator.rollout_dtype=auto`` it measures, once per run,
whether bf16 matmuls are fast on the device (:func:`bf16_matmul_speedup`
against :data:`BF16_MIN_SPEEDUP`) and whether bf16 moves the targets on the
run's data by at most :data:`BF16_TOLERANCE` of their std.
"""

from __future__ import annotations

import time

import torch

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
#: :meth:`~cbop_torchrl.objectives.estimator.CBOPValueEstimator.select_rollout_dtype`).
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


__all__ = [
    "BF16_MIN_SPEEDUP",
    "BF16_TOLERANCE",
    "bf16_matmul_speedup",
    "resolve_rollout_dtype",
]
