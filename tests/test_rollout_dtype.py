"""estimator.rollout_dtype=auto: bf16 only where it is fast and moves the targets little."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from cbop_torchrl.accel import CBOPValueEstimator
from cbop_torchrl.accel.rollout_dtype import native_bf16_matmul
from cbop_torchrl.modules.actor_critic import make_actor, make_qvalue_ensemble
from cbop_torchrl.modules.dynamics import DynamicsModel, GaussianEnsemble

OBS, ACT = 6, 2


def _estimator() -> CBOPValueEstimator:
    torch.manual_seed(0)
    return CBOPValueEstimator(
        actor_network=make_actor(OBS, ACT, (32,)),
        qvalue_network=make_qvalue_ensemble(3, OBS, ACT, (32,)),
        dynamics=DynamicsModel(GaussianEnsemble(OBS, ACT, 3, (32,)), "none"),
        horizon=3,
    )


def _batch(n: int = 64) -> TensorDict:
    g = torch.Generator().manual_seed(3)
    return TensorDict(
        {
            ("next", "observation"): torch.randn(n, OBS, generator=g),
            ("next", "reward"): torch.randn(n, 1, generator=g),
            ("next", "terminated"): torch.zeros(n, 1, dtype=torch.bool),
        },
        batch_size=[n],
    )


def test_bf16_error_is_measured_with_the_same_randomness_and_leaves_state_alone():
    estimator, batch = _estimator(), _batch()
    rng = torch.get_rng_state()
    error = estimator.measure_bf16_error(batch)
    assert torch.equal(torch.get_rng_state(), rng)
    assert estimator.rollout_dtype == torch.float32
    assert 0.0 < error < 0.2  # bf16 rounding moves the targets, but not by much
    assert estimator.measure_bf16_error(batch) == error  # same draws every time


@pytest.mark.parametrize("tolerance", [0.0, 1.0])
def test_selection_follows_hardware_and_tolerance(tolerance: float):
    estimator = _estimator()
    choice = estimator.select_rollout_dtype(_batch(), tolerance=tolerance)
    fast = choice["bf16_native"]
    assert (fast, choice["hardware"]) == native_bf16_matmul(torch.device("cpu"))
    expected = torch.bfloat16 if fast and tolerance > 0 else torch.float32
    assert estimator.rollout_dtype == expected
    assert (
        choice["rollout_dtype"] == {torch.bfloat16: "bfloat16", torch.float32: "float32"}[expected]
    )


def test_native_bf16_follows_the_cpu_features(monkeypatch: pytest.MonkeyPatch):
    """The choice reads the CPU's features, so it is the same on a busy machine."""
    cpu = torch.device("cpu")
    for amx, avx512_bf16, native in [
        (True, False, True),
        (False, True, True),
        (False, False, False),
    ]:
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda amx=amx: amx)
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda v=avx512_bf16: v)
        assert native_bf16_matmul(cpu)[0] is native
    assert native_bf16_matmul(torch.device("meta")) == (False, "meta device")
