"""The one-page CBOP step (``objectives/cbop_update.py``) takes the steps the update took before.

Before the page, the losses were ``SACLoss.forward`` calling CBOPLoss's overrides of
``qvalue_v2_loss`` and ``actor_loss`` (the EDAC, BC and critic-gap terms handed on to
``forward``), and the step was the generic :class:`GradientStep` on that loss. ``_Before``
keeps that composition here, verbatim; after a few steps on the same batches and seeds
every parameter, target parameter and optimizer moment must be EQUAL (``torch.equal``,
not close): a drift in any operation, or in the order the graph is built (which orders
the gradients' sums), fails it.
"""

from __future__ import annotations

import copy
from functools import partial
from types import SimpleNamespace

import pytest
import torch
from batches import random_transitions
from tensordict import TensorDictBase
from torch import Tensor
from torchrl.envs.utils import ExplorationType, set_exploration_type
from torchrl.modules.distributions.utils import rsample_and_log_prob
from torchrl.objectives import SACLoss, SoftUpdate
from torchrl.objectives.utils import distance_loss

from cbop_torchrl.accel import CBOPLoss
from cbop_torchrl.modules.actor_critic import action_spec, make_actor, make_qvalue_ensemble
from cbop_torchrl.modules.dynamics import DynamicsModel, GaussianEnsemble
from cbop_torchrl.objectives.cbop_update import cbop_update, make_optimizer
from cbop_torchrl.objectives.diversity import gradient_diversity_penalty
from cbop_torchrl.objectives.estimator import sac_alpha
from cbop_torchrl.trainers.cbop_stage import GuardedOptimizationStepper
from cbop_torchrl.trainers.checkpoint import NonFiniteLossError
from cbop_torchrl.trainers.update import GradientStep

OBS, ACT, M, H, K = 5, 2, 3, 2, 3

pytestmark = pytest.mark.filterwarnings("ignore:No target network updater")


class _Before(CBOPLoss):
    """CBOPLoss's forward as it was before the page (SACLoss.forward with its overrides)."""

    def qvalue_v2_loss(self, tensordict: TensorDictBase) -> tuple[Tensor, dict[str, Tensor]]:
        weights = self._maybe_get_priority_weight(tensordict)
        target_value = self._compute_target_v2(tensordict)
        pred_val, grad = self._q_and_action_gradients(tensordict, with_gradients=self.eta > 0)
        if grad is not None:
            self._extras["edac_penalty"] = gradient_diversity_penalty(grad)
        if self.critic_penalty > 0:
            policy_action = self._policy_action(tensordict)
            params = self.qvalue_network_params
            policy_q = self._member_q(tensordict, policy_action, params, detach=False)
            self._extras["critic_gap"] = (policy_q - pred_val).sum(0)
        with torch.no_grad():
            td_error = (pred_val - target_value).abs().amax(0)
        loss_qval = distance_loss(
            pred_val, target_value.expand_as(pred_val), loss_function=self.loss_function
        ).sum(0)
        loss_qval = self._reduce_loss(loss_qval, tensordict=tensordict, weights=weights)
        return loss_qval, {"td_error": td_error}

    def actor_loss(self, tensordict: TensorDictBase) -> tuple[Tensor, dict[str, Tensor]]:
        weights = self._maybe_get_priority_weight(tensordict)
        with set_exploration_type(ExplorationType.RANDOM):
            dist = self._actor_dist(tensordict)
            action, log_prob = rsample_and_log_prob(dist)
            if self.bc_weight > 0:
                self._extras["bc_nll"] = self._nll(dist, tensordict)
        q = self._member_q(tensordict, action, self.qvalue_network_params, detach=True)
        loss_actor = sac_alpha(self) * log_prob - q.min(0)[0]
        loss_actor = self._reduce_loss(loss_actor, tensordict=tensordict, weights=weights)
        return loss_actor, {"log_prob": log_prob.detach()}

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        self._extras = {}
        td_out = SACLoss.forward(self, tensordict.copy())
        extras = self._extras
        if self.bc_weight > 0:
            nll = self._reduce_loss(extras["bc_nll"], tensordict=tensordict)
            td_out.set("loss_actor", td_out.get("loss_actor") + self.bc_weight * nll)
            td_out.set("bc_nll", nll.detach())
        mse = td_out.get("loss_qvalue")
        if self.eta > 0:
            penalty = self._reduce_loss(extras["edac_penalty"], tensordict=tensordict)
            td_out.set("loss_qvalue", mse + self.eta * penalty)
        else:
            penalty = torch.zeros_like(mse)
        if self.critic_penalty > 0:
            gap = self._reduce_loss(extras["critic_gap"], tensordict=tensordict)
            td_out.set("loss_qvalue", td_out.get("loss_qvalue") + self.critic_penalty * gap)
            td_out.set("critic_gap", gap.detach() / self.num_qvalue_nets)
        td_out.set("qvalue_mse", mse.detach())
        td_out.set("edac_penalty", penalty.detach())
        td_out.set("cbop", self.value_estimator.last_diagnostics)
        return td_out


def _setup(cls: type, **settings):
    torch.manual_seed(0)
    actor = make_actor(OBS, ACT, (16, 16))
    qnets = make_qvalue_ensemble(M, OBS, ACT, (16, 16))
    dynamics = DynamicsModel(GaussianEnsemble(OBS, ACT, K, (16,)), "none")
    loss = cls(
        actor, qnets, copy.deepcopy(dynamics), action_spec=action_spec(ACT), horizon=H,
        seed=0, alpha_init=0.5, **settings,
    )  # fmt: skip
    target = SoftUpdate(loss, tau=0.05)
    optimizer = make_optimizer(loss, actor_lr=3e-4, critic_lr=1e-3, alpha_lr=3e-4)
    return loss, optimizer, target


@pytest.mark.parametrize(
    "settings",
    [
        {},
        {"eta": 0.0},
        {"fused_q": False},
        {"bc_weight": 0.5, "critic_penalty": 0.1, "eta": 2.0},
        {"rollout_dtype": "bfloat16", "sampling": "independent"},
    ],
    ids=["paper", "no-edac", "vmap", "beyond-the-paper", "bf16-independent"],
)
def test_the_page_steps_as_the_update_did_before(settings) -> None:
    estimator_kwargs = {"sampling": settings.pop("sampling")} if "sampling" in settings else None
    settings = {**settings, "estimator_kwargs": estimator_kwargs}
    before, before_optimizer, before_target = _setup(_Before, **settings)
    after, optimizer, target = _setup(CBOPLoss, **settings)
    old_step = GradientStep(before, before_optimizer, before_target)
    new_step = GradientStep(after, optimizer, update=lambda b, g: cbop_update(
        after, optimizer, target, b, g))  # fmt: skip
    for step in range(4):
        batch = random_transitions((16,), OBS, ACT, seed=step)
        torch.manual_seed(100 + step)
        old = old_step(batch.clone())
        torch.manual_seed(100 + step)
        new = new_step(batch.clone())
        assert list(new.keys(True, True)) == list(old.keys(True, True))
        for key, value in old.items(True, True):
            assert torch.equal(new.get(key), value), (step, key)
    old_state, new_state = before.state_dict(), after.state_dict()
    assert list(new_state) == list(old_state)  # a checkpoint's keys are unchanged
    for name, value in old_state.items():
        assert torch.equal(new_state[name], value), name
    old_moments, new_moments = before_optimizer.state_dict(), optimizer.state_dict()
    for index, state in old_moments["state"].items():
        for name, value in state.items():
            assert torch.equal(new_moments["state"][index][name], value), (index, name)
    assert old_step.health.read() == new_step.health.read() == (0, -1, [])


def test_a_refused_step_changes_nothing() -> None:
    """With the guard raising (the CPU run's check), no parameter or target moves."""
    loss, optimizer, target = _setup(CBOPLoss)
    before = copy.deepcopy(loss.state_dict())

    def refuse(losses: TensorDictBase, grad_norm: Tensor) -> None:
        raise FloatingPointError("refused")

    with pytest.raises(FloatingPointError):
        cbop_update(loss, optimizer, target, random_transitions((16,), OBS, ACT), refuse)
    for name, value in loss.state_dict().items():
        assert torch.equal(value, before[name]), name


def test_the_stage_stepper_refuses_a_non_finite_page_step_before_it_changes_anything() -> None:
    loss, optimizer, target = _setup(CBOPLoss)
    trainer = SimpleNamespace(optimizer=optimizer, compute_loss=loss, collected_frames=7)
    checkpoint = SimpleNamespace(describe_last=lambda: "run/checkpoint.pt (gradient step 5)")
    stepper = GuardedOptimizationStepper(
        checkpoint, update=partial(cbop_update, loss, optimizer, target)
    )
    stepper.step(trainer, random_transitions((16,), OBS, ACT))  # a good step is applied
    before = copy.deepcopy(loss.state_dict())
    batch = random_transitions((16,), OBS, ACT, seed=2)
    batch["next", "reward"][3] = float("nan")
    with pytest.raises(NonFiniteLossError, match="loss_qvalue") as error:
        stepper.step(trainer, batch)
    assert "gradient step 8" in str(error.value) and "gradient step 5" in str(error.value)
    for name, value in loss.state_dict().items():  # targets included
        assert torch.equal(value, before[name]), name


def test_cbop_loss_refuses_an_unreduced_loss() -> None:
    with pytest.raises(ValueError, match="reduction='none'"):
        _setup(CBOPLoss, reduction="none")
