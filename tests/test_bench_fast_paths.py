"""The fast-path options of the estimator and the dynamics ensemble."""

from __future__ import annotations

import pytest
import torch

from cbop_torchrl.accel import CBOPLoss, CBOPValueEstimator
from cbop_torchrl.modules.actor_critic import action_spec, make_actor, make_qvalue_ensemble
from cbop_torchrl.modules.dynamics import DynamicsModel, GaussianEnsemble
from cbop_torchrl.modules.ensemble import EnsembleMLP

OBS, ACT = 11, 3  # hopper layout, so the real termination function applies


def hopper_models(K=3, M=3, seed=0):
    torch.manual_seed(seed)
    ensemble = GaussianEnsemble(OBS, ACT, num_members=K + 1, hidden_sizes=(16, 16))
    dynamics = DynamicsModel(ensemble, "hopper", elites=list(range(K, 0, -1)))
    actor = make_actor(OBS, ACT, (16,))
    qvalues = make_qvalue_ensemble(M, OBS, ACT, (16, 16))
    next_obs = 0.05 * torch.randn(9, OBS)
    next_obs[:, 0] = 1.25  # a healthy hopper height
    batch = {
        "next": {
            "observation": next_obs,
            "reward": torch.ones(9, 1),
            "terminated": torch.zeros(9, 1, dtype=torch.bool),
        }
    }
    from tensordict import TensorDict

    return actor, qvalues, dynamics, TensorDict(batch, batch_size=[9])


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_q_row_chunks_do_not_change_the_q_values(dtype):
    actor, qvalues, dynamics, _ = hopper_models()
    kwargs = dict(
        actor_network=actor, qvalue_network=qvalues, dynamics=dynamics, rollout_dtype=dtype
    )
    whole = CBOPValueEstimator(**kwargs, q_chunk_rows=None)
    chunked = CBOPValueEstimator(**kwargs, q_chunk_rows=3)
    obs, action = torch.randn(10, OBS), torch.rand(10, ACT)  # 3 + 3 + 3 + 1 rows
    params = whole._qvalue_params(None)
    q_whole = whole._q_values(obs, action, params)
    assert q_whole.shape == (3, 10) and q_whole.dtype == torch.float32
    torch.testing.assert_close(chunked._q_values(obs, action, params), q_whole)
    with torch.no_grad():  # as in the rollout: blocks written into reused buffers
        torch.testing.assert_close(chunked._q_values(obs, action, params), q_whole)
        torch.testing.assert_close(whole._q_values(obs, action, params), q_whole)


def test_bf16_q_output_layer_is_not_rounded_to_bf16():
    actor, qvalues, dynamics, _ = hopper_models()
    with torch.no_grad():
        for q in qvalues:
            q.module[-1].bias.fill_(100.0)  # a value bf16 resolves only to +-0.5
    est = CBOPValueEstimator(
        actor_network=actor, qvalue_network=qvalues, dynamics=dynamics, rollout_dtype="bfloat16"
    )
    q = est._q_values(torch.randn(32, OBS), torch.rand(32, ACT), est._qvalue_params(None))
    assert (q != q.bfloat16().float()).any()


def test_bad_chunk_size_is_explained():
    actor, qvalues, dynamics, _ = hopper_models()
    with pytest.raises(ValueError, match="q_chunk_rows"):
        CBOPValueEstimator(
            actor_network=actor, qvalue_network=qvalues, dynamics=dynamics, q_chunk_rows=0
        )


def test_compile_is_a_no_op_on_cpu_and_reaches_the_estimator(monkeypatch):
    """compile=True reaches the estimator; on a CPU the fused Q-ensemble is not compiled and
    the target is handed to torch.compile, stubbed here: inductor's C++ build and even
    dynamo's trace of the rollout take 30-40 s, and the compiled target's numbers are
    tests/test_compile_cpu.py's."""
    requested = []

    def recorded_compile(function, **options):
        requested.append(options)
        return function

    monkeypatch.setattr(torch, "compile", recorded_compile)
    actor, qvalues, dynamics, batch = hopper_models()
    targets = []
    for compile_q in (False, True):
        loss = CBOPLoss(
            actor,
            qvalues,
            dynamics,
            action_spec=action_spec(ACT),
            horizon=3,
            seed=1,
            compile=compile_q,
        )
        assert loss.value_estimator.compile is compile_q
        targets.append(loss.value_estimator.value_estimate(batch.clone()))
        assert loss.value_estimator._compiled_q is None  # nothing compiled on a CPU
        assert len(requested) == int(compile_q)  # the target only, and only with compile
    torch.testing.assert_close(targets[0], targets[1])


def test_selected_member_weights_are_cached_until_the_parameters_change():
    torch.manual_seed(0)
    mlp = EnsembleMLP(4, 5, 2, hidden_sizes=(8,))
    layer = mlp.layers[0]
    members = torch.tensor([3, 1])
    x = torch.randn(2, 6, 5)
    # With autograd on, nothing is cached: gradients reach the selected members.
    mlp(x, members).sum().backward()
    assert layer.weight.grad[members].abs().sum() > 0
    assert layer.weight.grad[[0, 2]].abs().sum() == 0
    with torch.no_grad():
        first = layer.member_params(members)
        assert layer.member_params(members)[0] is first[0]  # reused, no new gather
        before = mlp(x, members)
        layer.weight.add_(1.0)  # an in-place update (optimizer step, load_state_dict)
        updated = layer.member_params(members)
        assert updated[0] is not first[0]
        torch.testing.assert_close(updated[0], layer.weight[members])
        assert not torch.allclose(mlp(x, members), before)
        mlp.load_state_dict({k: torch.zeros_like(v) for k, v in mlp.state_dict().items()})
        assert mlp(x, members).abs().max() == 0


def test_autocast_uses_cached_bf16_weights_and_matches_a_bf16_computation():
    torch.manual_seed(0)
    mlp = EnsembleMLP(3, 5, 2, hidden_sizes=(8,), activation="relu")
    members = torch.tensor([2, 0])
    x = torch.randn(2, 4, 5)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        out = mlp(x, members)
        weight, _ = mlp.layers[0].member_params(members, torch.bfloat16)
        assert weight.dtype == torch.bfloat16
        assert mlp.layers[0].member_params(members, torch.bfloat16)[0] is weight
    assert out.dtype == torch.bfloat16
    hidden = x.bfloat16()
    for i, layer in enumerate(mlp.layers):
        hidden = torch.baddbmm(
            layer.bias[members].bfloat16(), hidden, layer.weight[members].bfloat16()
        )
        hidden = hidden.relu() if i == 0 else hidden
    torch.testing.assert_close(out, hidden)


def test_fused_q_ensemble_traces_as_one_graph_for_torch_compile():
    from cbop_torchrl.accel.fused_mlp import fused_mlp_ensemble, stack_mlp_weights

    actor, qvalues, dynamics, _ = hopper_models()
    est = CBOPValueEstimator(actor_network=actor, qvalue_network=qvalues, dynamics=dynamics)
    inputs = torch.randn(10, OBS + ACT)
    for dtype in (torch.float32, torch.bfloat16):
        layers = stack_mlp_weights(est._qvalue_params(None), est._mlp_plan, dtype)
        # fullgraph=True fails on any graph break; the eager backend needs no compiler.
        compiled = torch.compile(fused_mlp_ensemble, backend="eager", fullgraph=True)
        torch.testing.assert_close(
            compiled(inputs, layers, None), fused_mlp_ensemble(inputs, layers, None)
        )
