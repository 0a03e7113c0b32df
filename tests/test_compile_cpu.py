"""``compile=True`` on a CPU: the inductor-compiled CBOP target gives the eager numbers.

The compiled path (``CBOPValueEstimator._target_function``) runs the same
tensor code as one graph with eager random draws, so the losses and every
parameter's gradient of a CBOPLoss step must match the eager loss's up to float
rounding. Speed is measured by ``scripts/bench.py --compile-cpu``, not here.
"""

from __future__ import annotations

import pytest
import torch
from batches import random_transitions
from tensordict import TensorDict
from torchrl.objectives import SoftUpdate

from benchmarks.speed.size_timings import compiled_ops, dispatched_ops
from cbop_torchrl.accel import CBOPLoss
from cbop_torchrl.modules.actor_critic import action_spec, make_actor, make_qvalue_ensemble
from cbop_torchrl.modules.dynamics import DynamicsModel, GaussianEnsemble
from cbop_torchrl.trainers.update import GradientStep

OBS, ACT, M, H, K = 5, 2, 3, 2, 3

pytestmark = pytest.mark.filterwarnings("ignore:No target network updater")


def _batch(rows: int = 12) -> TensorDict:
    return random_transitions((rows,), OBS, ACT)


def _loss(compile: bool, rollout_dtype: str = "float32") -> CBOPLoss:
    torch.manual_seed(0)
    actor = make_actor(OBS, ACT, (16, 16))
    qnets = make_qvalue_ensemble(M, OBS, ACT, (16, 16))
    dynamics = DynamicsModel(GaussianEnsemble(OBS, ACT, K, (16,)), "none")
    return CBOPLoss(
        actor,
        qnets,
        dynamics,
        action_spec=action_spec(ACT),
        horizon=H,
        rollout_dtype=rollout_dtype,
        compile=compile,
    )


def _step(loss: CBOPLoss, batch) -> tuple[dict, dict]:
    torch.manual_seed(3)  # the rollout's random draws: the same stream for both losses
    out = loss(batch.clone())
    losses = {key: out[key] for key in ("loss_actor", "loss_qvalue", "loss_alpha")}
    sum(losses.values()).backward()
    grads = {name: p.grad.clone() for name, p in loss.named_parameters() if p.grad is not None}
    diagnostics = {key: out["cbop", key] for key in ("weights", "target_mean")}
    return {**losses, **diagnostics}, grads


def test_compiled_target_gives_the_eager_losses_and_gradients():
    batch = _batch()
    eager, compiled = _loss(compile=False), _loss(compile=True)
    for _ in range(2):  # the second call replays the compiled graph
        eager_out, eager_grads = _step(eager, batch)
        compiled_out, compiled_grads = _step(compiled, batch)
        assert compiled.value_estimator._compiled_target is not None  # the path was taken
        assert eager.value_estimator._compiled_target is None
        for key, value in eager_out.items():
            torch.testing.assert_close(compiled_out[key], value, rtol=1e-5, atol=1e-5)
        assert compiled_grads.keys() == eager_grads.keys() and len(eager_grads) > 0
        for name, grad in eager_grads.items():
            torch.testing.assert_close(compiled_grads[name], grad, rtol=1e-4, atol=1e-5)
        for loss in (eager, compiled):
            loss.zero_grad(set_to_none=True)


def test_the_compiled_target_in_the_gradient_step_gives_the_eager_parameters():
    """Loss, backward, fused Adam and the target update around the compiled target."""
    batch = _batch()
    initial = _loss(compile=False).state_dict()
    losses, steps = [], []
    for compile in (False, True):
        loss = _loss(compile=compile)
        optimizer = torch.optim.Adam(loss.parameters(), lr=1e-3, fused=True)
        losses.append(loss)
        steps.append(GradientStep(loss, optimizer, SoftUpdate(loss, tau=0.05)))
    for _ in range(2):
        for step in steps:
            torch.manual_seed(3)
            step(batch.clone())
    eager, compiled = losses
    assert compiled.value_estimator._compiled_target is not None
    moved = 0
    for key, value in eager.state_dict().items():
        torch.testing.assert_close(compiled.state_dict()[key], value, rtol=1e-4, atol=1e-5)
        moved += not torch.equal(value, initial[key])
    assert moved > 0  # the steps changed the parameters


def test_on_cuda_the_target_is_compiled_only_inside_a_whole_step_graph():
    """With compile on CUDA: the whole target by inductor in a captured step, else eager
    (the Q-ensemble then compiles with its own CUDA graphs). Nothing is compiled here."""
    estimator = _loss(compile=True).value_estimator
    cuda = torch.device("cuda")
    assert estimator._target_function(cuda) == estimator._target_tensors
    estimator.whole_step_graph = True
    assert estimator._target_function(cuda) != estimator._target_tensors
    assert estimator._compiled_target is not None


def test_the_compiled_counter_counts_each_generated_kernel_as_one_operation():
    """sin -> matmul -> cos: two generated kernels around one extern matmul (eager: 3)."""

    def function(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return (x.sin() @ w).cos()

    x, w = torch.randn(16, 32), torch.randn(32, 8)
    compiled = torch.compile(function, dynamic=False)
    assert compiled_ops(lambda: compiled(x, w)) == {"dispatched": 1, "kernels": 2, "total": 3}
    assert dispatched_ops(lambda: function(x, w)) == 3


def test_bf16_measurement_runs_eagerly():
    """``rollout_dtype=auto``'s one-off measurement in two dtypes compiles nothing."""
    loss = _loss(compile=True)
    error = loss.value_estimator.measure_bf16_error(_batch())
    assert 0 <= error < 0.05
    assert loss.value_estimator._compiled_target is None
    assert loss.value_estimator._eager_only is False


def test_missing_cpp_compiler_is_explained(monkeypatch):
    monkeypatch.delenv("CXX", raising=False)
    monkeypatch.setattr("shutil.which", lambda name: None)
    loss = _loss(compile=True)
    with pytest.raises(RuntimeError, match="needs a C\\+\\+ compiler.*compile=false"):
        loss.value_estimator.compute_target(_batch())
