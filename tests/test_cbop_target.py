"""The CBOP target, written as pure tensor functions, equals the estimator it replaced.

The reference is :class:`CBOPValueEstimator` as it was before its maths moved to
:mod:`cbop_torchrl.objectives.cbop_target` (:data:`TARGET_BASE_COMMIT`, loaded from git):
at the CPU preset's sizes the targets and diagnostics are the same, bit for bit, for every
mode, both samplings and terminations, fp32 and bf16 rollouts, a plain actor (its direct
matmuls) and a module actor. Without git (an installed copy) the comparison is skipped.
"""

from __future__ import annotations

import dataclasses

import pytest
import torch

from benchmarks.speed.models import build_models
from benchmarks.speed.preset_step import load_before_modules
from benchmarks.speed.sizes import cpu_preset_size
from cbop_torchrl.accel import CBOPValueEstimator
from cbop_torchrl.objectives import cbop_target
from cbop_torchrl.objectives.estimator import CBOPSettings

#: The last commit before the CBOP target moved out of the estimator.
TARGET_BASE_COMMIT = "0ee16ee"
SIZE = dataclasses.replace(cpu_preset_size(), batch=64)


@pytest.fixture(scope="module")
def base_estimator():
    modules = load_before_modules(
        TARGET_BASE_COMMIT,
        (
            # the commit's own rollout_dtype and fused_mlp: its estimator imports names since
            # removed or moved
            ("objectives.rollout_dtype", "cbop_torchrl/objectives/rollout_dtype.py"),
            ("modules.fused_mlp", "cbop_torchrl/modules/fused_mlp.py"),
            ("objectives.estimator", "cbop_torchrl/objectives/estimator.py"),
        ),
    )
    if modules is None:
        pytest.skip(f"git cannot show {TARGET_BASE_COMMIT} here")
    return modules["objectives.estimator"].CBOPValueEstimator


@pytest.fixture(scope="module")
def models():
    return build_models(SIZE, torch.device("cpu"))


CASES = [
    {},
    {"rollout_dtype": "bfloat16"},
    {"mode": "map"},
    {"mode": "fixed", "fixed_weighting": "lambda", "lmbda": 0.8},
    {"mode": "quantile"},
    {"sampling": "independent"},
    {"sampling": "independent", "rollout_dtype": "bfloat16", "termination": "absorb"},
    {"termination": "absorb", "psi": 0.5},
    {"horizon": 0},
    {"fused_q": False},
]


@pytest.mark.parametrize("options", CASES, ids=[str(case) or "default" for case in CASES])
def test_the_target_equals_the_estimator_before_the_move(base_estimator, models, options):
    actor, qnets, dynamics, batch = models
    settings = {"horizon": SIZE.horizon, "psi": 1.0, "alpha": 0.2, **options}
    estimators = [
        cls(actor_network=actor, qvalue_network=qnets, dynamics=dynamics, **settings)
        for cls in (base_estimator, CBOPValueEstimator)
    ]
    for seed in range(2):
        results = []
        for estimator in estimators:
            torch.manual_seed(seed)
            results.append(estimator.compute_target(batch.clone()))
        (expected, expected_diag), (got, got_diag) = results
        assert torch.equal(got, expected), seed
        assert set(got_diag.keys()) == set(expected_diag.keys())
        for key, value in expected_diag.items():
            assert torch.equal(got_diag.get(key), value), (seed, key)


def test_the_settings_object_and_the_keywords_build_the_same_estimator(models):
    actor, qnets, dynamics, _ = models
    settings = CBOPSettings(horizon=3, psi=0.5, mode="map", sampling="independent")
    by_object = CBOPValueEstimator(
        actor_network=actor, qvalue_network=qnets, dynamics=dynamics, settings=settings
    )
    by_keywords = CBOPValueEstimator(
        actor_network=actor, qvalue_network=qnets, dynamics=dynamics,
        horizon=3, psi=0.5, mode="map", sampling="independent",
    )  # fmt: skip
    assert by_object.settings == by_keywords.settings
    assert (by_object.horizon, by_object.psi, by_object.mode) == (3, 0.5, "map")
    assert by_object.num_particles == SIZE.particles
    with pytest.raises(ValueError, match="mode must be one of"):
        CBOPSettings(mode="nope")
    with pytest.raises(TypeError):
        CBOPValueEstimator(
            actor_network=actor, qvalue_network=qnets, dynamics=dynamics, settings=settings,
            horizon=2,
        )  # fmt: skip


def test_the_lcb_is_the_posterior_mean_less_psi_sigmas() -> None:
    """The one test of the LCB formula on tensors (the estimator's and the loss's tests
    check that they bootstrap from it: tests/test_cbop.py, tests/test_update_equivalence.py)."""
    returns = torch.randn(5, 4, 3, 6)
    value, post, sigma = cbop_target.horizon_value(returns, None, "lcb", psi=2.0)
    assert torch.equal(sigma, post.var.sqrt())
    assert torch.equal(value, post.mean - 2.0 * sigma)
    assert torch.all(sigma > 0) and torch.all(value < post.mean)
    map_value, _, _ = cbop_target.horizon_value(returns, None, "map", psi=2.0)
    assert torch.equal(map_value, post.mean)
    lcb_psi_zero, _, _ = cbop_target.horizon_value(returns, None, "lcb", psi=0.0)
    assert torch.equal(lcb_psi_zero, map_value)
