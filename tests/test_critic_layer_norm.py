"""LayerNorm critics (``layer_norm=True``, beyond the paper) and their fused ensemble paths."""

from __future__ import annotations

import copy

import pytest
import torch
from batches import random_transitions
from tensordict import TensorDict
from torch import nn
from torch.nn import functional as F
from torchrl.modules import MLP

from cbop_torchrl.accel import CBOPLoss
from cbop_torchrl.accel.fused_mlp import (
    LayerNormSpec,
    fused_mlp_ensemble,
    plain_mlp_plan,
    stack_mlp_weights,
    stacked_mlp_forward,
)
from cbop_torchrl.config import FQEConfig
from cbop_torchrl.modules.actor_critic import (
    action_spec,
    make_actor,
    make_qvalue,
    make_qvalue_ensemble,
)
from cbop_torchrl.modules.dynamics import DynamicsModel, GaussianEnsemble
from cbop_torchrl.trainers import pretrain

OBS, ACT, M = 5, 2, 4
HIDDEN = (16, 12)
KEYS = ("observation", "action", "state_action_value")

pytestmark = pytest.mark.filterwarnings("ignore:No target network updater")


def ln_ensemble(seed: int = 0, members: int = M) -> list:
    """A LayerNorm Q-ensemble whose LayerNorm scales and shifts are not the identity."""
    torch.manual_seed(seed)
    qnets = make_qvalue_ensemble(members, OBS, ACT, HIDDEN, layer_norm=True)
    with torch.no_grad():
        for net in qnets:
            for layer in net.module:
                if isinstance(layer, nn.LayerNorm):
                    layer.weight.uniform_(0.5, 1.5)
                    layer.bias.uniform_(-0.5, 0.5)
    return qnets


def member_loop(qnets: list, inputs: torch.Tensor) -> torch.Tensor:
    """``[M, R]``: each member's own module on ``inputs`` ``[R, in]`` (or ``[M, R, in]``)."""
    rows = [inputs if inputs.dim() == 2 else inputs[m] for m in range(len(qnets))]
    return torch.stack([net.module(x).squeeze(-1) for net, x in zip(qnets, rows, strict=True)])


@pytest.mark.parametrize("init", ["torch", "authors"])
def test_layer_norm_order_and_default_unchanged(init: str) -> None:
    # The default builds what the function built before: TorchRL's MLP, same names, same draws.
    torch.manual_seed(3)
    expected = MLP(
        in_features=OBS + ACT, out_features=1, num_cells=list(HIDDEN), activation_class=nn.ReLU
    )
    if init == "authors":
        from cbop_torchrl.modules.actor_critic import authors_q_init

        authors_q_init(expected)
    torch.manual_seed(3)
    plain = make_qvalue(OBS, ACT, HIDDEN, init=init, layer_norm=False)
    assert list(plain.module.state_dict()) == list(expected.state_dict())
    torch.testing.assert_close(plain.module.state_dict(), expected.state_dict(), rtol=0, atol=0)
    assert not any(isinstance(layer, nn.LayerNorm) for layer in plain.module)

    torch.manual_seed(3)
    normed = make_qvalue(OBS, ACT, HIDDEN, init=init, layer_norm=True)
    kinds = [type(layer) for layer in normed.module]
    assert kinds == [nn.Linear, nn.LayerNorm, nn.ReLU] * len(HIDDEN) + [nn.Linear]
    norms = [layer for layer in normed.module if isinstance(layer, nn.LayerNorm)]
    assert [norm.normalized_shape for norm in norms] == [(w,) for w in HIDDEN]
    assert all(norm.elementwise_affine for norm in norms)
    # A LayerNorm draws nothing: the Linear layers get the plain network's weights.
    linears = [layer for layer in normed.module if isinstance(layer, nn.Linear)]
    plain_linears = [layer for layer in plain.module if isinstance(layer, nn.Linear)]
    for got, want in zip(linears, plain_linears, strict=True):
        torch.testing.assert_close(got.state_dict(), want.state_dict(), rtol=0, atol=0)

    with torch.no_grad():
        for norm in norms:  # a non-identity affine, so the order shows in the output
            norm.weight.uniform_(0.5, 1.5)
            norm.bias.uniform_(-1.0, 1.0)
    obs, action = torch.randn(2, 6, OBS), torch.rand(2, 6, ACT)
    td = normed(TensorDict({"observation": obs, "action": action}, batch_size=[2, 6]))
    q = td["state_action_value"]
    assert q.shape == (2, 6, 1)
    hidden = torch.cat([obs, action], dim=-1)
    for linear, norm in zip(linears[:-1], norms, strict=True):
        hidden = F.layer_norm(linear(hidden), norm.normalized_shape, norm.weight, norm.bias)
        hidden = hidden.relu()
    torch.testing.assert_close(q, linears[-1](hidden))
    # Linear -> ReLU -> LayerNorm would be another function.
    other = torch.cat([obs, action], dim=-1)
    for linear, norm in zip(linears[:-1], norms, strict=True):
        other = norm(linear(other).relu())
    assert not torch.allclose(q, linears[-1](other), atol=1e-3)


def test_fused_paths_match_the_members_modules() -> None:
    qnets = ln_ensemble()
    params = TensorDict.from_modules(*qnets, as_module=True)
    plan = plain_mlp_plan(qnets[0], *KEYS, inplace=False)
    assert plan is not None
    assert [kind for kind, _ in plan] == ["linear", "norm", "act"] * len(HIDDEN) + ["linear"]
    assert plan[1][1] == LayerNormSpec("1", HIDDEN[0], 1e-5, True, True)
    qnets[0].module[4].eps = 1e-3  # the plan carries each module's own eps
    assert plain_mlp_plan(qnets[0], *KEYS)[4][1].eps == 1e-3
    for net in qnets:
        net.module[4].eps = 1e-3
    plan = plain_mlp_plan(qnets[0], *KEYS, inplace=False)

    shared = torch.randn(10, OBS + ACT)
    per_member = torch.randn(M, 10, OBS + ACT)
    for inputs in (shared, per_member):
        expected = member_loop(qnets, inputs)
        got = stacked_mlp_forward(inputs, params, plan)
        assert got.shape == (M, 10)
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
        # The parameters' gradients: the stacked ones against each member's own.
        grads = torch.autograd.grad(got.square().sum(), list(params.values(True, True)))
        expected.square().sum().backward()
        for (name, _), grad in zip(params.items(True, True), grads, strict=True):
            want = torch.stack([net.module.get_parameter(".".join(name[1:])).grad for net in qnets])
            torch.testing.assert_close(grad, want, rtol=1e-5, atol=1e-5, msg=str(name))
        for net in qnets:
            net.zero_grad(set_to_none=True)
    # detach=True: the same values, gradients reach the inputs only.
    x = shared.clone().requires_grad_()
    out = stacked_mlp_forward(x, params, plan, detach=True)
    torch.testing.assert_close(out, member_loop(qnets, shared), rtol=1e-5, atol=1e-5)
    out.sum().backward()
    assert x.grad is not None and all(p.grad is None for p in params.values(True, True))

    # The rollout path (in-place activations, per-member affine, reused buffers when chunked).
    rollout_plan = plain_mlp_plan(qnets[0], *KEYS)
    layers = stack_mlp_weights(params, rollout_plan, torch.float32)
    expected = member_loop(qnets, shared).detach()
    with torch.no_grad():
        for chunk_rows in (None, 3, 4, 10):
            got = fused_mlp_ensemble(shared, layers, chunk_rows)
            assert got.shape == (M, 10) and got.dtype == torch.float32
            torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
        bf16 = fused_mlp_ensemble(
            shared, stack_mlp_weights(params, rollout_plan, torch.bfloat16), 3
        )
    assert bf16.dtype == torch.float32
    torch.testing.assert_close(bf16, expected, rtol=0.05, atol=0.05 * expected.abs().max().item())
    # Under autograd (no buffers), the same values.
    torch.testing.assert_close(
        fused_mlp_ensemble(shared, layers, 3), expected, rtol=1e-5, atol=1e-5
    )


def test_fused_layer_norm_traces_as_one_graph_for_torch_compile() -> None:
    qnets = ln_ensemble()
    params = TensorDict.from_modules(*qnets, as_module=True)
    plan = plain_mlp_plan(qnets[0], *KEYS)
    inputs = torch.randn(10, OBS + ACT)
    compiled = torch.compile(fused_mlp_ensemble, backend="eager", fullgraph=True)
    with torch.no_grad():
        for dtype in (torch.float32, torch.bfloat16):
            layers = stack_mlp_weights(params, plan, dtype)
            torch.testing.assert_close(
                compiled(inputs, layers, None), fused_mlp_ensemble(inputs, layers, None)
            )


def test_a_layer_norm_ensemble_trains_through_cbop_loss_fused_or_not() -> None:
    qnets = ln_ensemble(members=3)
    torch.manual_seed(1)
    actor = make_actor(OBS, ACT, (16,))
    dynamics = DynamicsModel(GaussianEnsemble(OBS, ACT, 3, (16,)), "none")
    losses, grads = {}, {}
    for fused in (True, False):
        loss = CBOPLoss(
            copy.deepcopy(actor), copy.deepcopy(qnets), dynamics, action_spec=action_spec(ACT),
            horizon=2, seed=0, eta=1.0, loss_function="l2", fused_q=fused,
        )  # fmt: skip
        assert (loss._q_plan is not None) == fused
        assert (loss.value_estimator._mlp_plan is not None) == fused
        torch.manual_seed(7)
        out = loss(random_transitions((12,), OBS, ACT))
        losses[fused] = {key: out[key] for key in ("loss_actor", "loss_qvalue", "loss_alpha")}
        assert all(torch.isfinite(value) for value in losses[fused].values())
        params = dict(loss.named_parameters())
        total = sum(losses[fused].values())
        values = torch.autograd.grad(total, list(params.values()), allow_unused=True)
        grads[fused] = dict(zip(params, values, strict=True))
    torch.testing.assert_close(losses[True], losses[False], rtol=1e-5, atol=1e-5)
    assert grads[True].keys() == grads[False].keys()
    assert any("qvalue_network_params.module.1.weight" in name for name in grads[True])
    for name, grad in grads[True].items():
        if grads[False][name] is None:
            assert grad is None or not grad.any(), name
            continue
        scale = grads[False][name].abs().max().item()
        torch.testing.assert_close(
            grad, grads[False][name], rtol=1e-5, atol=1e-6 + 1e-5 * scale, msg=name
        )


class _KeySeen(Exception):
    pass


def fqe_cache_key(monkeypatch: pytest.MonkeyPatch, **kwargs) -> dict:
    """The cache key ``load_or_train_fqe`` builds, caught before it touches the cache.

    Shared by the tests of every option that enters the key (tests/test_prior_members.py).
    """
    seen = {}

    def stage_dir(stage: str, key: dict):
        seen[stage] = key
        raise _KeySeen

    monkeypatch.setattr(pretrain, "_stage_dir", stage_dir)
    config = FQEConfig(steps=10, batch_size=8, lr=1e-3, checkpoint_interval=10)
    with pytest.raises(_KeySeen):
        pretrain.load_or_train_fqe(
            None, "fingerprint", OBS, ACT, [16, 16], 3, 0.99, config, 7, **kwargs
        )
    return seen["fqe"]


def test_fqe_cache_key_changes_only_with_layer_norm(monkeypatch: pytest.MonkeyPatch) -> None:
    fqe = dict(vars(FQEConfig(steps=10, batch_size=8, lr=1e-3, checkpoint_interval=10)))
    del fqe["drop_terminal"]  # off, it stays out of the key: keys made before it still match
    before = {
        "data": "fingerprint",
        "config": fqe,
        "hidden": [16, 16],
        "members": 3,
        "gamma": 0.99,
        "seed": 7,
        "init": "authors",
    }
    default = fqe_cache_key(monkeypatch, q_init="authors")
    assert default == before and list(default) == list(before)  # the same dict, the same hash
    assert fqe_cache_key(monkeypatch, q_init="authors", layer_norm=False) == before
    with_norm = fqe_cache_key(monkeypatch, q_init="authors", layer_norm=True)
    assert with_norm == {**before, "layer_norm": True}
