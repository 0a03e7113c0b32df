"""The CBOP step's fast paths compute the same numbers as the straightforward ones.

CBOPLoss runs one Q-ensemble pass for the critic MSE and EDAC's action
gradients, reuses the actor loss's policy for the BC term, and evaluates plain-MLP
Q-ensembles with stacked ``baddbmm``. The reference here is the plain
composition: TorchRL's own ``SACLoss`` passes (``SACLossWithCBOPTarget``: the
same CBOP target, SACLoss's critic and actor losses, ``vmap`` over the members),
plus EDAC's definition with explicit member pairs and the BC NLL from a separate
actor pass. Losses and every parameter's gradient must agree in float32.
"""

from __future__ import annotations

import copy

import pytest
import torch
from batches import random_transitions
from tensordict import TensorDict
from torch import nn
from torchrl.modules import ValueOperator

from cbop_torchrl.accel import CBOPLoss, CBOPValueEstimator
from cbop_torchrl.modules.actor_critic import action_spec, make_actor, make_qvalue_ensemble
from cbop_torchrl.modules.dynamics import DynamicsModel, GaussianEnsemble
from cbop_torchrl.objectives import SACLossWithCBOPTarget
from cbop_torchrl.objectives.pretrain import ACTION_EPS

OBS, ACT, M, H, K = 5, 2, 3, 2, 3

pytestmark = pytest.mark.filterwarnings("ignore:No target network updater")


def _parts():
    torch.manual_seed(0)
    actor = make_actor(OBS, ACT, (16, 16))
    qnets = make_qvalue_ensemble(M, OBS, ACT, (16, 16))
    dynamics = DynamicsModel(GaussianEnsemble(OBS, ACT, K, (16,)), "none")
    return actor, qnets, dynamics


def _batch(shape=(12,)) -> TensorDict:
    return random_transitions(shape, OBS, ACT)


def _edac_by_pairs(loss, batch: TensorDict) -> torch.Tensor:
    """EDAC's ``1/(M-1) sum_{i != j} cos(g_i, g_j)`` per sample, one member at a time."""
    grads = []
    for m in range(M):
        action = batch["action"].detach().requires_grad_()
        td = TensorDict({"observation": batch["observation"], "action": action}, batch.batch_size)
        with loss.qvalue_network_params[m].to_module(loss.qvalue_network):
            q = loss.qvalue_network(td)["state_action_value"].sum()
        grads.append(torch.autograd.grad(q, action, create_graph=True)[0])
    pairs = sum(
        nn.functional.cosine_similarity(grads[i], grads[j], dim=-1, eps=0)
        for i in range(M)
        for j in range(M)
        if i != j
    )
    return pairs / (M - 1)


def _reference_losses(reference, batch: TensorDict, eta: float, bc_weight: float) -> dict:
    out = reference(batch.clone())
    losses = {key: out[key] for key in ("loss_actor", "loss_qvalue", "loss_alpha")}
    losses["loss_qvalue"] = losses["loss_qvalue"] + eta * _edac_by_pairs(reference, batch).mean()
    if bc_weight > 0:
        with reference.actor_network_params.to_module(reference.actor_network):
            dist = reference.actor_network.get_dist(batch.select("observation"))
        action = batch["action"].clamp(-1 + ACTION_EPS, 1 - ACTION_EPS)
        losses["loss_actor"] = losses["loss_actor"] - bc_weight * dist.log_prob(action).mean()
    return losses


def _gradients(loss_module, losses: dict) -> dict:
    params = dict(loss_module.named_parameters())
    total = sum(losses.values())
    grads = torch.autograd.grad(total, list(params.values()), allow_unused=True)
    return {name: grad for name, grad in zip(params, grads, strict=True)}


@pytest.mark.parametrize("fused_q", [True, False])
@pytest.mark.parametrize(("eta", "bc_weight"), [(1.0, 0.0), (0.0, 0.0), (2.0, 0.5)])
def test_cbop_loss_equals_sac_passes_plus_edac_and_bc(fused_q, eta, bc_weight):
    actor, qnets, dynamics = _parts()
    common = dict(action_spec=action_spec(ACT), loss_function="l2")
    reference = SACLossWithCBOPTarget(
        copy.deepcopy(actor), copy.deepcopy(qnets), num_qvalue_nets=M, **common
    )
    reference.make_value_estimator(
        CBOPValueEstimator.from_sac_loss(reference, dynamics, horizon=H, seed=0, fused_q=False)
    )
    loss = CBOPLoss(
        actor, qnets, dynamics, horizon=H, seed=0, eta=eta, bc_weight=bc_weight,
        fused_q=fused_q, **common,
    )  # fmt: skip
    assert (loss._q_plan is not None) == fused_q
    for shape in ((12,), (3, 4)):
        batch = _batch(shape)
        torch.manual_seed(7)  # the actor loss's sample
        expected = _reference_losses(reference, batch, eta, bc_weight)
        torch.manual_seed(7)
        out = loss(batch.clone())
        got = {key: out[key] for key in expected}
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
        if eta > 0:
            torch.testing.assert_close(
                out["edac_penalty"], _edac_by_pairs(reference, batch).mean().detach()
            )
        grads, expected_grads = _gradients(loss, got), _gradients(reference, expected)
        assert grads.keys() == expected_grads.keys()
        for name, grad in grads.items():
            if expected_grads[name] is None:
                assert grad is None or not grad.any(), name
                continue
            # fp32 sums in another order (fused members, AVX-512 kernels) differ by a few ulps
            # of the tensor's largest entries, so the absolute tolerance scales with them.
            scale = expected_grads[name].abs().max().item()
            torch.testing.assert_close(
                grad, expected_grads[name], rtol=1e-5, atol=1e-6 + 1e-5 * scale, msg=name
            )


class ActionFirstQ(nn.Module):
    """``Q(s, a) = tanh(W cat(a, s))``: not a plain MLP on ``cat(observation, action)``."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(ACT + OBS, 1)

    def forward(self, observation: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.linear(torch.cat([action, observation], dim=-1)))


def test_fused_q_is_used_only_for_plain_mlps():
    actor, _, dynamics = _parts()
    odd = [ValueOperator(ActionFirstQ(), in_keys=["observation", "action"]) for _ in range(2)]
    loss = CBOPLoss(actor, odd, dynamics, action_spec=action_spec(ACT), horizon=H)
    assert loss._q_plan is None
    out = loss(_batch())
    assert torch.isfinite(out["loss_qvalue"]) and out["edac_penalty"].abs() > 0
