"""The settings of CBOP's value estimator: what the target computes and how it runs.

:class:`CBOPSettings` holds every keyword of
:class:`~cbop_torchrl.objectives.estimator.CBOPValueEstimator` but its networks and
parameter sources, checks them once and gives them their types.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from cbop_torchrl.config.choices import FIXED_WEIGHTINGS, MODES, SAMPLINGS, TERMINATIONS
from cbop_torchrl.objectives.posterior import VAR_FLOOR
from cbop_torchrl.objectives.rollout_dtype import resolve_rollout_dtype


@dataclass(frozen=True)
class CBOPSettings:
    """What a :class:`CBOPValueEstimator` computes and how: every constructor keyword.

    Args:
        gamma: discount.
        horizon: rollout length H (``0`` gives the model-free target).
        psi: LCB coefficient (``lcb`` and ``fixed`` modes).
        mode: ``"lcb"`` (CBOP), ``"map"`` (STEVE: posterior mean), ``"fixed"``
            (fixed horizon weights, then the LCB of the K*M weighted samples)
            or ``"quantile"`` (DiMVE: a quantile of all pooled samples).
        fixed_weighting: ``"uniform"`` or ``"lambda"`` (``mode="fixed"``).
        lmbda: lambda of the lambda-weighting.
        quantile: the DiMVE quantile (``mode="quantile"``).
        termination: ``"zero_precision"`` (default, as in the reference code) or
            ``"absorb"``, see :mod:`~cbop_torchrl.objectives.cbop_target`.
        sampling: ``"shared"`` (default) or ``"independent"`` rollouts per horizon
            (``H (H+1) / 2`` dynamics steps per particle instead of H), see
            :mod:`~cbop_torchrl.objectives.cbop_target`. The authors' code has both
            (``indep_sampling``); its README command, which reproduces the paper, uses
            the shared one.
        rollout_dtype: ``torch.float32`` (default) or ``torch.bfloat16`` (or their
            names): run the actor, dynamics and Q matmuls under ``torch.autocast``; the
            action distribution, returns and posterior stay in float32.
        num_particles: K; defaults to the dynamics model's ``num_elites``.
        seed: if given, every call draws its randomness (actions, model noise
            without an explicit generator) from a private stream seeded with
            it, leaving the global RNG untouched: two estimators with the same
            seed produce the same targets whatever else consumed random numbers.
        obs_key, action_key: observation/action keys of the actor, Q and dynamics.
        q_value_key: the Q-network's output key.
        var_floor: floor of the per-horizon variance (see :data:`VAR_FLOOR`).
        unbiased_variance: the per-horizon variance over the K*M samples with the ``n - 1``
            divisor (the authors' code) instead of the population one (the paper's).
        deactivate_vmap: run the Q-ensemble with a Python loop (debugging only).
        fused_q: when the Q-network is a plain MLP on ``cat(observation, action)``
            (a ``ValueOperator`` over Linear/ReLU/Tanh/SiLU layers, as
            :func:`make_qvalue` builds), evaluate the ensemble with one fused
            ``baddbmm`` + in-place activation per layer
            (:mod:`cbop_torchrl.objectives.fast_paths`) instead of ``vmap``, and
            sample a plain actor's actions with its matmuls directly. Any other
            network runs as a module.
        q_chunk_rows: rows per block of the fused Q-ensemble (``None``: all at
            once; ``"auto"``: 8,192 on a CPU, 65,536 on CUDA, where the paper's
            51k rows are one block and the step launches fewer kernels). Bounds its
            activations to ``M x q_chunk_rows x width`` (at the paper's sizes all 51k
            rows at once need 1 GB per layer in fp32 at M = 20). Results do not depend
            on it beyond float rounding.
        compile: on CUDA, run the fused Q-ensemble through ``torch.compile``
            with ``mode="reduce-overhead"`` (CUDA graphs: the per-layer kernels
            are replayed without launch overhead). On CPU, compile the whole
            target's tensor part (rollout, returns, posterior; one graph) with
            inductor, static shapes: the matmuls stay the same, the small
            elementwise ops between them fuse. It needs a C++ compiler, costs
            a compilation at the first call (much less once inductor's cache
            holds the graph) and recompiles for a new batch size or
            ``rollout_dtype``; random draws are eager ones (``fallback_random``),
            so targets equal the eager ones up to float rounding
            (``scripts/bench.py --compile-cpu`` measures it).

    Raises:
        ValueError: a choice outside its list or a number outside its range.
    """

    gamma: float = 0.99
    horizon: int = 10
    psi: float = 1.0
    mode: str = "lcb"
    fixed_weighting: str = "uniform"
    lmbda: float = 0.9
    quantile: float = 0.3085
    termination: str = "zero_precision"
    sampling: str = "shared"
    rollout_dtype: torch.dtype | str = torch.float32
    num_particles: int | None = None
    seed: int | None = None
    obs_key: str = "observation"
    action_key: str = "action"
    q_value_key: str = "state_action_value"
    var_floor: float = VAR_FLOOR
    unbiased_variance: bool = False
    deactivate_vmap: bool = False
    fused_q: bool = True
    q_chunk_rows: int | str | None = "auto"
    compile: bool = False

    def __post_init__(self) -> None:
        for name, allowed in (
            ("mode", MODES),
            ("termination", TERMINATIONS),
            ("sampling", SAMPLINGS),
            ("fixed_weighting", FIXED_WEIGHTINGS),
        ):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}; got {getattr(self, name)!r}.")
        horizon, rows = self.horizon, self.q_chunk_rows
        if int(horizon) != horizon or horizon < 0:
            raise ValueError(f"horizon must be a non-negative integer; got {horizon!r}.")
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"gamma must be in [0, 1]; got {self.gamma}.")
        if (
            rows is not None
            and rows != "auto"
            and (isinstance(rows, str) or int(rows) != rows or rows < 1)
        ):
            raise ValueError(
                f"q_chunk_rows must be a positive integer, None (no chunking) or 'auto'; "
                f"got {rows!r}."
            )
        if self.mode == "quantile" and not 0.0 < self.quantile <= 1.0:
            raise ValueError(f"quantile must be in (0, 1]; got {self.quantile}.")
        normal = {
            "gamma": float(self.gamma), "horizon": int(horizon), "psi": float(self.psi),
            "quantile": float(self.quantile), "var_floor": float(self.var_floor),
            "rollout_dtype": resolve_rollout_dtype(self.rollout_dtype),
            "q_chunk_rows": rows if rows in (None, "auto") else int(rows),
            "compile": bool(self.compile), "unbiased_variance": bool(self.unbiased_variance),
        }  # fmt: skip
        for name, value in normal.items():
            object.__setattr__(self, name, value)

    def for_dynamics(self, dynamics: Any) -> CBOPSettings:
        """These settings with ``num_particles`` set (default: ``dynamics.num_elites``)."""
        if self.num_particles is not None:
            return dataclasses.replace(self, num_particles=int(self.num_particles))
        num_particles = getattr(dynamics, "num_elites", None)
        if num_particles is None:
            raise ValueError(
                "num_particles was not given and the dynamics model has no `num_elites`; "
                "pass num_particles=K (particle k is propagated by elite k)."
            )
        return dataclasses.replace(self, num_particles=int(num_particles))


__all__ = ["CBOPSettings", "FIXED_WEIGHTINGS", "MODES", "SAMPLINGS", "TERMINATIONS"]
