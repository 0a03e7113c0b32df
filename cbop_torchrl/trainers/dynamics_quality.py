"""What a trained dynamics ensemble is worth: its training rows, holdout fit and finiteness.

The rows a model trains on (:func:`dynamics_rows`), its elites' fit on held-out rows
(:func:`holdout_metrics`) and the check that refuses to cache a diverged model
(:func:`check_trained_dynamics`), for :mod:`cbop_torchrl.trainers.dynamics` (one ensemble)
and :mod:`cbop_torchrl.trainers.joint_dynamics` (several seeds' in one).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
from tensordict import TensorDictBase

from cbop_torchrl.config import DynamicsConfig
from cbop_torchrl.modules.dynamics import DynamicsModel
from cbop_torchrl.trainers.checkpoint import NonFiniteLossError

EVAL_CHUNK = 2048  # holdout rows per evaluation call (bounds activation memory)


@dataclass
class _Split:
    """Raw ``obs [N, O]``, ``action [N, A]``, ``target [N, O + 1]`` rows of one split."""

    obs: torch.Tensor
    action: torch.Tensor
    target: torch.Tensor


def dynamics_rows(dataset_td: TensorDictBase) -> _Split:
    """The rows usable for model training: ``dynamics_mask`` True, targets ``[s' - s, r]``."""
    keys = ["observation", "action", ("next", "observation"), ("next", "reward"), "dynamics_mask"]
    missing = [key for key in keys if key not in dataset_td.keys(include_nested=True)]
    if missing:
        raise KeyError(
            f"the dataset TensorDict lacks {missing}; build it with "
            "cbop_torchrl.data.load_dataset, which provides observation, action, "
            "('next', 'observation'), ('next', 'reward') and dynamics_mask"
        )
    mask = dataset_td.get("dynamics_mask").reshape(-1)
    obs = dataset_td.get("observation")[mask].float()
    action = dataset_td.get("action")[mask].float()
    next_obs = dataset_td.get(("next", "observation"))[mask].float()
    reward = dataset_td.get(("next", "reward"))[mask].float().reshape(-1, 1)
    return _Split(obs, action, torch.cat([next_obs - obs, reward], dim=-1))


@torch.no_grad()
def holdout_metrics(model: DynamicsModel, holdout: _Split) -> dict[str, Any]:
    """Fit quality of the elites on raw-unit holdout rows.

    ``holdout_r2_mean``: mean over elites and output dims of ``1 - MSE/Var``;
    ``holdout_r2_per_dim``: the same averaged over elites only (delta obs
    dims, then reward); ``coverage_2sigma``: share of (elite, row, dim)
    targets within the member's predicted mean +- 2 std.
    """
    device = holdout.target.device
    inside = torch.zeros((), device=device)
    sq_err = torch.zeros(model.num_elites, holdout.target.shape[1], device=device)
    chunks = (split.split(EVAL_CHUNK) for split in (holdout.obs, holdout.action, holdout.target))
    for obs, action, target in zip(*chunks, strict=True):
        mean, std = model.ensemble.predict(obs, action, model.elite_indices, per_member=False)
        err = target - mean
        sq_err += err.pow(2).sum(1)
        inside += (err.abs() <= 2 * std).sum()
    n = holdout.target.shape[0]
    variance = holdout.target.var(0, unbiased=False).clamp_min(1e-12)
    r2 = 1 - sq_err / n / variance  # [K, O + 1]
    return {
        "holdout_r2_mean": r2.mean().item(),
        "holdout_r2_per_dim": r2.mean(0).tolist(),
        "coverage_2sigma": (inside / (n * model.num_elites * variance.numel())).item(),
    }


def non_finite_parts(model: DynamicsModel, metrics: dict[str, Any] | None = None) -> list[str]:
    """What of a trained model is NaN/inf: its elites' parameters, its normalizer, its
    holdout metrics (``holdout_r2_mean``, ``holdout_mse_elites``); empty when all is finite."""
    ensemble = model.ensemble
    elites = torch.as_tensor(model.elite_indices, device=next(ensemble.parameters()).device)
    bad = [
        f"parameter {name}"
        for name, param in ensemble.named_parameters()
        if not bool(torch.isfinite(_elite_part(param.detach(), elites)).all())
    ]
    bad += [
        f"buffer {name}"
        for name, buffer in ensemble.named_buffers()
        if buffer.is_floating_point() and not bool(torch.isfinite(buffer).all())
    ]
    for key in ("holdout_r2_mean", "holdout_mse_elites"):
        value = (metrics or {}).get(key)
        if value is not None and not math.isfinite(float(value)):
            bad.append(f"{key}={value}")
    return bad


def _elite_part(param: torch.Tensor, elites: torch.Tensor) -> torch.Tensor:
    """The elites' slices of a ``[E, ...]`` parameter; a shared ``[1, ...]`` one whole."""
    return param if param.shape[0] == 1 else param.index_select(0, elites)


def check_trained_dynamics(
    model: DynamicsModel,
    metrics: dict[str, Any],
    config: DynamicsConfig,
    dataset_td: TensorDictBase,
) -> None:
    """Raises :class:`NonFiniteLossError` when the trained model is not finite (before caching).

    A diverged model must never be cached: every later run with the same data
    and settings would read it and fail far from the cause.
    """
    bad = non_finite_parts(model, metrics)
    if not bad:
        return
    shown = ", ".join(bad[:4]) + (", ..." if len(bad) > 4 else "")
    rows = dynamics_rows(dataset_td)
    scale = max(float(rows.obs.abs().max()), float(rows.target.abs().max()))
    raise NonFiniteLossError(
        f"the dynamics model diverged: after {metrics.get('epochs', '?')} epochs these are "
        f"not finite (NaN or inf): {shown}; it was neither cached nor saved. The usual "
        f"causes are a learning rate too large for the data (dynamics.lr={config.lr:g}; "
        f"the default is {DynamicsConfig().lr:g}) or data of a very large scale (the "
        f"largest observation or target magnitude is {scale:.3g}). Run again with a "
        f"smaller learning rate, e.g. dynamics.lr={smaller_lr(config.lr, DynamicsConfig().lr):g}"
        ", or rescale the data."
    )


def smaller_lr(current: float, default: float) -> float:
    """A learning rate to suggest after a divergence: the default when the current one is
    larger, else a tenth of the current one (never the value that just diverged)."""
    return default if current > default else current / 10


__all__ = [
    "EVAL_CHUNK",
    "check_trained_dynamics",
    "dynamics_rows",
    "holdout_metrics",
    "non_finite_parts",
    "smaller_lr",
]
