"""The learning diagnostics' posterior uses the variance the run's target uses."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from tensordict import TensorDict

from cbop_torchrl.trainers.diagnostics import LearningDiagnostics


def horizon_record(unbiased: bool, returns: torch.Tensor) -> dict[str, float]:
    """``LearningDiagnostics._horizons`` on an estimator whose rollouts give ``returns``."""
    batch, horizons = returns.shape[:2]
    estimator = SimpleNamespace(
        rollout_returns=lambda next_obs: (returns, torch.ones(batch, horizons, dtype=bool), None),
        var_floor=1e-6,
        psi=2.0,
        unbiased_variance=unbiased,
    )
    diagnostics = SimpleNamespace(
        loss=SimpleNamespace(value_estimator=estimator),
        batch=TensorDict({("next", "observation"): torch.zeros(batch, 3)}, batch_size=[batch]),
    )
    return LearningDiagnostics._horizons(diagnostics)


def test_the_posterior_std_follows_the_runs_unbiased_variance() -> None:
    returns = torch.randn(6, 3, 4, 5, generator=torch.Generator().manual_seed(0))  # B, H+1, K, M
    population, unbiased = horizon_record(False, returns), horizon_record(True, returns)
    factor = (20 / 19) ** 0.5  # K*M = 20 samples per horizon
    for h in range(3):
        assert unbiased[f"horizon_std_{h}"] == pytest.approx(
            factor * population[f"horizon_std_{h}"], rel=1e-5
        )
    # Every horizon's variance scales alike, so the posterior's weights do not move.
    assert unbiased["horizon_weight_1"] == pytest.approx(population["horizon_weight_1"], rel=1e-5)
    assert unbiased["lcb_penalty"] > population["lcb_penalty"]
