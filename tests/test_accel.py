"""The fast-path switch: eager by default, ``accelerate`` turns each path on, same results.

The eager classes (:mod:`cbop_torchrl.objectives`) run the networks as modules in float32;
:func:`cbop_torchrl.accel.accelerate` gives a loss or an estimator the fast paths in place.
Without a fused path (``fused_q=False``, float32) the accelerated step runs the eager
operations: bit for bit the same losses, gradients and parameters; with the fused paths
the same to float rounding. ``accel.CBOPLoss`` built directly equals an accelerated eager
loss bit for bit.
"""

from __future__ import annotations

import copy

import pytest
import torch
from batches import random_transitions
from torchrl.objectives import SACLoss, SoftUpdate

from cbop_torchrl import accel
from cbop_torchrl.accel.estimator import EstimatorFastPaths
from cbop_torchrl.accel.loss import LossFastPaths
from cbop_torchrl.modules.actor_critic import action_spec, make_actor, make_qvalue_ensemble
from cbop_torchrl.modules.dynamics import DynamicsModel, GaussianEnsemble
from cbop_torchrl.objectives import CBOPLoss, CBOPValueEstimator
from cbop_torchrl.objectives.cbop_update import cbop_update, make_optimizer

OBS, ACT, M, K, H = 5, 2, 3, 3, 2

pytestmark = pytest.mark.filterwarnings("ignore:No target network updater")


def _networks():
    torch.manual_seed(0)
    actor = make_actor(OBS, ACT, (16, 16))
    qnets = make_qvalue_ensemble(M, OBS, ACT, (16, 16))
    dynamics = DynamicsModel(GaussianEnsemble(OBS, ACT, K, (16,)), "none")
    return actor, qnets, dynamics


def _loss(cls: type = CBOPLoss, **kwargs) -> CBOPLoss:
    actor, qnets, dynamics = _networks()
    return cls(
        actor, qnets, dynamics, action_spec=action_spec(ACT), horizon=H, seed=0,
        alpha_init=0.5, **kwargs,
    )  # fmt: skip


def _steps(loss: CBOPLoss, steps: int = 3) -> tuple[list, dict]:
    """``steps`` CBOP updates: each step's losses and the final parameters."""
    target = SoftUpdate(loss, tau=0.05)
    optimizer = make_optimizer(loss, actor_lr=3e-4, critic_lr=1e-3, alpha_lr=3e-4)
    outputs = []
    for step in range(steps):
        torch.manual_seed(100 + step)
        batch = random_transitions((16,), OBS, ACT, seed=step)
        outputs.append(cbop_update(loss, optimizer, target, batch).clone())
    return outputs, copy.deepcopy(loss.state_dict())


def test_the_eager_classes_have_no_fast_path() -> None:
    loss = _loss()
    assert type(loss) is CBOPLoss and type(loss.value_estimator) is CBOPValueEstimator
    for obj in (loss, loss.value_estimator):
        assert not isinstance(obj, (LossFastPaths, EstimatorFastPaths))
        for name in ("_q_plan", "_actor_plan", "_mlp_plan", "rollout_dtype", "fast_paths"):
            assert not hasattr(obj, name), name
    with pytest.raises(TypeError):
        _loss(fused_q=True)  # a fast path's setting is accel's, not the eager loss's
    with pytest.raises(TypeError):
        CBOPValueEstimator(*(), **dict(zip(("actor_network", "qvalue_network", "dynamics"),
                           _networks(), strict=True)), rollout_dtype="bfloat16")  # fmt: skip


def test_accelerate_turns_each_path_on_in_place() -> None:
    loss = _loss()
    keys = list(loss.state_dict())
    estimator = loss.value_estimator
    assert accel.accelerate(loss, rollout_dtype="bf16", q_chunk_rows=7) is loss
    assert type(loss) is accel.CBOPLoss and type(estimator) is accel.CBOPValueEstimator
    assert loss.value_estimator is estimator and list(loss.state_dict()) == keys
    assert loss._q_plan is not None and loss._actor_plan is not None
    assert estimator._mlp_plan is not None and estimator._actor_plan is not None
    assert estimator._tensor_dynamics
    assert (estimator.rollout_dtype, estimator.q_chunk_rows) == (torch.bfloat16, 7)
    assert not estimator.compile and not estimator.whole_step_graph
    # Called again: the fast paths are replaced (no fused Q-ensemble, compile on).
    accel.accelerate(loss, accel.FastPaths(fused_q=False, compile=True, whole_step_graph=True))
    assert loss._q_plan is None and loss._actor_plan is None and estimator._mlp_plan is None
    assert estimator.rollout_dtype == torch.float32
    assert estimator.compile and estimator.whole_step_graph
    with pytest.raises(TypeError, match="not both"):
        accel.accelerate(loss, accel.FastPaths(), fused_q=False)
    with pytest.raises(TypeError, match="CBOPLoss or a CBOPValueEstimator"):
        accel.accelerate(torch.nn.Linear(2, 2))
    with pytest.raises(ValueError, match="q_chunk_rows"):
        accel.accelerate(loss, q_chunk_rows=0)


def test_compile_hands_out_the_compiled_target(monkeypatch: pytest.MonkeyPatch) -> None:
    """On a CPU ``compile`` hands ``torch.compile`` the target's tensor part (stubbed: the
    compiled numbers are tests/test_compile_cpu.py's); the eager estimator never does."""
    compiled = []
    monkeypatch.setattr(torch, "compile", lambda fn, **options: compiled.append(fn) or fn)
    loss = _loss()
    cpu = torch.device("cpu")
    estimator = loss.value_estimator
    assert estimator._target_function(cpu) == estimator._target_tensors
    accel.accelerate(loss, compile=True)
    estimator._target_function(cpu)
    assert compiled == [estimator._target_tensors]


def test_without_a_fused_path_the_accelerated_step_is_the_eager_one_bit_for_bit() -> None:
    eager_out, eager_state = _steps(_loss())
    fast_out, fast_state = _steps(accel.accelerate(_loss(), fused_q=False))
    for eager, fast in zip(eager_out, fast_out, strict=True):
        assert list(fast.keys(True, True)) == list(eager.keys(True, True))
        for key, value in eager.items(True, True):
            assert torch.equal(fast.get(key), value), key
    for name, value in eager_state.items():
        assert torch.equal(fast_state[name], value), name


@pytest.mark.parametrize("rollout_dtype", ["float32", "bfloat16"])
def test_the_fused_paths_give_the_eager_step_to_rounding(rollout_dtype: str) -> None:
    eager_out, eager_state = _steps(_loss())
    fast = accel.accelerate(_loss(), rollout_dtype=rollout_dtype)
    assert fast._q_plan is not None and fast.value_estimator._mlp_plan is not None
    fast_out, fast_state = _steps(fast)
    tolerance = {"rtol": 1e-4, "atol": 1e-5} if rollout_dtype == "float32" else {
        "rtol": 0.05, "atol": 0.05}  # fmt: skip
    for eager, fast in zip(eager_out, fast_out, strict=True):
        for key in ("loss_actor", "loss_qvalue", "loss_alpha", "grad_norm"):
            torch.testing.assert_close(fast[key], eager[key], **tolerance)
    for name, value in eager_state.items():
        torch.testing.assert_close(fast_state[name], value, **tolerance)


def test_the_accelerated_class_equals_an_accelerated_eager_loss() -> None:
    built_out, built_state = _steps(_loss(accel.CBOPLoss, rollout_dtype="bfloat16"))
    switched_out, switched_state = _steps(accel.accelerate(_loss(), rollout_dtype="bfloat16"))
    for built, switched in zip(built_out, switched_out, strict=True):
        for key, value in built.items(True, True):
            assert torch.equal(switched.get(key), value), key
    for name, value in built_state.items():
        assert torch.equal(switched_state[name], value), name


@pytest.mark.parametrize(
    "settings",
    [{}, {"mode": "map"}, {"mode": "quantile"}, {"sampling": "independent"},
     {"mode": "fixed", "termination": "absorb"}],
    ids=["lcb", "map", "quantile", "independent", "fixed-absorb"],
)  # fmt: skip
def test_a_hand_built_estimator_is_eager_until_accelerated(settings: dict) -> None:
    """The SACLoss drop-in (docs/torchrl.md): ``from_sac_loss`` gives the eager estimator;
    accelerated it computes the same target (bit for bit without a fused path)."""
    actor, qnets, dynamics = _networks()
    sac = SACLoss(actor, qnets, num_qvalue_nets=M, action_spec=action_spec(ACT))
    batch = random_transitions((32,), OBS, ACT)
    targets = {}
    for name, fast in (("eager", None), ("vmap", {"fused_q": False}), ("fused", {})):
        estimator = CBOPValueEstimator.from_sac_loss(
            sac, dynamics, horizon=H, seed=0, alpha=0.0, **settings
        )
        assert type(estimator) is CBOPValueEstimator
        if fast is not None:
            accel.accelerate(estimator, **fast)
            assert isinstance(estimator, accel.CBOPValueEstimator)
        targets[name] = estimator.compute_target(batch.clone())[0]
    assert torch.equal(targets["vmap"], targets["eager"])
    torch.testing.assert_close(targets["fused"], targets["eager"], rtol=1e-5, atol=1e-5)


def test_a_subclass_of_the_eager_loss_keeps_its_own_methods() -> None:
    class Traced(CBOPLoss):
        calls = 0

        def edac_penalty(self, tensordict):
            Traced.calls += 1
            return super().edac_penalty(tensordict)

    loss = accel.accelerate(_loss(Traced))
    assert isinstance(loss, Traced) and isinstance(loss, LossFastPaths)
    assert type(loss).__name__ == "Traced" and loss._q_plan is not None
    loss.edac_penalty(random_transitions((4,), OBS, ACT))
    assert Traced.calls == 1
    assert type(accel.accelerate(_loss(Traced))) is type(loss)  # the class is made once


@pytest.mark.parametrize("rollout_dtype", ["float32", "bfloat16"])
def test_the_cbop_stage_builds_the_accelerated_loss_from_its_settings(rollout_dtype: str) -> None:
    """``cbop-train``'s loss has the fast paths its settings select (``estimator.rollout_dtype``,
    ``compile``)."""
    from test_config import composed, known_dataset

    from cbop_torchrl.config import load_config
    from cbop_torchrl.trainers import cbop_stage

    overrides = ["env=demo", "preset=debug", f"estimator.rollout_dtype={rollout_dtype}"]
    config, _ = load_config(composed(*overrides, "compile=true"), known_dataset)
    info = type("Info", (), {"obs_dim": OBS, "action_dim": ACT})()
    _, _, dynamics = _networks()
    loss, actor = cbop_stage.build_cbop_loss(config, info, dynamics, torch.device("cpu"))
    estimator = loss.value_estimator
    assert type(loss) is accel.CBOPLoss and type(estimator) is accel.CBOPValueEstimator
    assert loss.actor_network is actor and loss._q_plan is not None
    assert (
        estimator.rollout_dtype
        == {"float32": torch.float32, "bfloat16": torch.bfloat16}[rollout_dtype]
    )
    assert estimator.compile and estimator.q_chunk_rows == "auto"
