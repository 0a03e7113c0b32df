"""The precision of CBOP's model rollouts: float32 or bfloat16, and when ``auto`` picks bf16.

The accelerated :class:`~cbop_torchrl.accel.CBOPValueEstimator` runs the rollout's
actor, dynamics and Q matmuls in ``rollout_dtype`` (the posterior stays in
float32). With ``estimator.rollout_dtype=auto`` it decides, once per run
(:func:`select_rollout_dtype`), by the hardware whether the device multiplies bf16
natively (:func:`native_bf16_matmul`) and by a measurement whether bf16 moves the
targets on the run's data by at most :data:`BF16_TOLERANCE` of their std
(:func:`measure_bf16_error`). Both are repeatable: a run's choice does not depend on
how busy the machine is.
"""

from __future__ import annotations

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


def native_bf16_matmul(device: torch.device) -> tuple[bool, str]:
    """Whether ``device`` multiplies bf16 matrices in hardware, and what says so.

    A CUDA GPU of compute capability 8.0 or more (bf16 tensor cores); a CPU with
    AMX-BF16 or AVX512-BF16 (oneDNN's bf16 kernels). Elsewhere bf16 matmuls are
    emulated and slower than fp32. Decided by the hardware, not by a timing, so that a
    loaded machine chooses as a quiet one does.
    """
    if device.type == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        return major >= 8, f"CUDA compute capability {major}.{minor}"
    if device.type == "cpu":
        # torch.cpu's feature probes are underscored but are what torch itself consults
        # (its own bf16 tests); no public API names these CPU features.
        if torch.cpu._is_amx_tile_supported():
            return True, "CPU with AMX-BF16"
        if torch.cpu._is_avx512_bf16_supported():
            return True, "CPU with AVX512-BF16"
        return False, "CPU without AMX-BF16 or AVX512-BF16"
    return False, f"{device.type} device"


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
    """Sets ``estimator.rollout_dtype`` to bf16 if native here and accurate on this data, else fp32.

    bf16 is chosen when the device multiplies bf16 in hardware (:func:`native_bf16_matmul`)
    AND the targets on ``tensordict`` (a few batches of the dataset, with the current actor
    and Q-ensemble) move by at most ``tolerance`` x their std (:func:`measure_bf16_error`).
    Returns what was chosen and why.
    """
    device = tensordict.device or torch.device("cpu")
    fast, hardware = native_bf16_matmul(device)
    error = measure_bf16_error(estimator, tensordict)
    accurate = error <= tolerance
    estimator.rollout_dtype = torch.bfloat16 if fast and accurate else torch.float32
    return {
        "rollout_dtype": "bfloat16" if estimator.rollout_dtype == torch.bfloat16 else "float32",
        "bf16_native": fast,
        "hardware": hardware,
        "bf16_target_rel_error": error,
        "bf16_tolerance": tolerance,
        "reason": (
            "bf16 matmuls are native here and the targets move little"
            if fast and accurate
            else ("bf16 matmuls are not native here" if not fast else "bf16 moves the targets")
        ),
    }


__all__ = [
    "BF16_TOLERANCE",
    "measure_bf16_error",
    "native_bf16_matmul",
    "resolve_rollout_dtype",
    "select_rollout_dtype",
]
