"""The settings of CBOP's value estimator: what the target computes.

:class:`CBOPSettings` holds every keyword of
:class:`~cbop_torchrl.objectives.estimator.CBOPValueEstimator` but its networks and
parameter sources, checks them once and gives them their types. How fast the target runs
(fused Q-ensembles, bf16 rollouts, torch.compile) is not among them: those are the
settings of :mod:`cbop_torchrl.accel` (:class:`~cbop_torchrl.accel.FastPaths`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from cbop_torchrl.config.choices import FIXED_WEIGHTINGS, MODES, SAMPLINGS, TERMINATIONS
from cbop_torchrl.objectives.posterior import VAR_FLOOR


@dataclass(frozen=True)
class CBOPSettings:
    """What a :class:`CBOPValueEstimator` computes: every constructor keyword.

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
    num_particles: int | None = None
    seed: int | None = None
    obs_key: str = "observation"
    action_key: str = "action"
    q_value_key: str = "state_action_value"
    var_floor: float = VAR_FLOOR
    unbiased_variance: bool = False
    deactivate_vmap: bool = False

    def __post_init__(self) -> None:
        for name, allowed in (
            ("mode", MODES),
            ("termination", TERMINATIONS),
            ("sampling", SAMPLINGS),
            ("fixed_weighting", FIXED_WEIGHTINGS),
        ):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {allowed}; got {getattr(self, name)!r}.")
        horizon = self.horizon
        if int(horizon) != horizon or horizon < 0:
            raise ValueError(f"horizon must be a non-negative integer; got {horizon!r}.")
        if not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"gamma must be in [0, 1]; got {self.gamma}.")
        if self.mode == "quantile" and not 0.0 < self.quantile <= 1.0:
            raise ValueError(f"quantile must be in (0, 1]; got {self.quantile}.")
        normal = {
            "gamma": float(self.gamma), "horizon": int(horizon), "psi": float(self.psi),
            "quantile": float(self.quantile), "var_floor": float(self.var_floor),
            "unbiased_variance": bool(self.unbiased_variance),
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
