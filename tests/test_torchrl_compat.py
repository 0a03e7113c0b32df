"""The TorchRL internals the package relies on (``cbop_torchrl/_torchrl_compat.py``) and the
SACLoss swap."""

from __future__ import annotations

import copy

import pytest
import torch
from batches import random_transitions
from tensordict import TensorDict
from torchrl.objectives import SACLoss

from cbop_torchrl._torchrl_compat import vmap_over_params
from cbop_torchrl.accel import CBOPLoss, CBOPValueEstimator
from cbop_torchrl.modules.actor_critic import action_spec, make_actor, make_qvalue_ensemble
from cbop_torchrl.modules.dynamics import DynamicsModel, GaussianEnsemble
from cbop_torchrl.objectives import SACLossWithCBOPTarget

OBS, ACT, M, H = 5, 2, 3, 2

pytestmark = pytest.mark.filterwarnings("ignore:No target network updater")


def _parts():
    torch.manual_seed(0)
    actor = make_actor(OBS, ACT, (16,))
    qnets = make_qvalue_ensemble(M, OBS, ACT, (16,))
    dynamics = DynamicsModel(GaussianEnsemble(OBS, ACT, 3, (16,)), "none")
    return actor, qnets, dynamics


def _batch(n: int = 8) -> TensorDict:
    return random_transitions((n,), OBS, ACT)


def _swap(loss_cls):
    actor, qnets, dynamics = _parts()
    loss = loss_cls(
        actor, qnets, num_qvalue_nets=M, action_spec=action_spec(ACT), loss_function="l2"
    )
    estimator = CBOPValueEstimator.from_sac_loss(loss, dynamics, horizon=H, seed=0)
    loss.make_value_estimator(estimator)
    return loss


def _actor_passes(loss, batch) -> int:
    calls = []
    handle = loss.actor_network.module[0].register_forward_hook(lambda *_: calls.append(1))
    try:
        with loss.actor_network_params.to_module(loss.actor_network):
            loss(batch.clone())
    finally:
        handle.remove()
    return len(calls)


def test_swap_computes_only_the_cbop_target():
    batch = _batch()
    # Actor module passes: 1 for the actor loss. The CBOP rollout's H + 1 actor passes (s'
    # and every model state) run on the plain actor's weights, not through the module.
    swap = _swap(SACLossWithCBOPTarget)
    assert swap.value_estimator._actor_plan is not None
    assert _actor_passes(swap, batch) == 1
    # A stock SACLoss first bootstraps from s' itself (one more actor pass, thrown away):
    # if TorchRL stops routing its target through _compute_target_v2, the swap's count rises.
    assert _actor_passes(_swap(SACLoss), batch) == 1 + 1
    # Through the module (another actor would be run so): 1 + H + 1.
    swap.value_estimator._actor_plan = None
    assert _actor_passes(swap, batch) == 1 + H + 1


def test_swap_has_no_edac_term_and_cbop_loss_adds_it():
    batch = _batch()
    swap = _swap(SACLossWithCBOPTarget)
    actor, qnets, dynamics = _parts()
    cbop = {
        eta: CBOPLoss(
            copy.deepcopy(actor),
            copy.deepcopy(qnets),
            dynamics,
            action_spec=action_spec(ACT),
            horizon=H,
            seed=0,
            eta=eta,
        )
        for eta in (0.0, 1.0)
    }
    out_swap = swap(batch.clone())
    out = {eta: loss(batch.clone()) for eta, loss in cbop.items()}
    # Same parameters, same estimator seed: same targets, so the same critic loss as eta=0.
    torch.testing.assert_close(out_swap["loss_qvalue"], out[0.0]["loss_qvalue"])
    penalty = out[1.0]["edac_penalty"]
    assert penalty.abs() > 1e-4
    torch.testing.assert_close(out[1.0]["loss_qvalue"], out[0.0]["loss_qvalue"] + penalty)


def test_alpha_is_read_from_the_public_log_alpha_with_its_bounds():
    actor, qnets, dynamics = _parts()
    loss = SACLossWithCBOPTarget(
        actor, qnets, num_qvalue_nets=M, action_spec=action_spec(ACT), max_alpha=0.5
    )
    estimator = CBOPValueEstimator.from_sac_loss(loss, dynamics, horizon=H)
    with torch.no_grad():
        loss.log_alpha.fill_(0.0)  # alpha 1, above max_alpha
    assert float(estimator._alpha()) == pytest.approx(0.5)


def test_vmap_over_params_matches_each_member_run_alone():
    _, qnets, _ = _parts()
    params = TensorDict.from_modules(*qnets, as_module=True)
    td = TensorDict({"observation": torch.randn(4, OBS), "action": torch.rand(4, ACT)}, [4])
    expected = torch.stack([q(td.clone())["state_action_value"] for q in qnets])
    for loop in (False, True):
        shared = vmap_over_params(qnets[0], (None, 0), loop=loop)(td.clone(), params)
        torch.testing.assert_close(shared["state_action_value"], expected)
        per_member = td.expand(M, 4).clone()
        own = vmap_over_params(qnets[0], (0, 0), loop=loop)(per_member, params)
        torch.testing.assert_close(own["state_action_value"], expected)
