"""The CBOP gradient step on one page: target, critic + EDAC, actor, alpha, Adam, Polyak.

``cbop-train``'s CBOP stage and ``examples/cbop_minimal.py`` both run :func:`cbop_update`.
For a batch of B dataset transitions ``(s, a, r, s', terminated)``, with M Q-members,
K dynamics particles, H rollout steps and A action dimensions:

1. the target ``y = r + gamma (1 - terminated) (mu - psi sigma - alpha log pi(a'|s'))``,
   the lower confidence bound of the posterior over the H + 1 value expansions from
   ``s'`` (the pure maths: :mod:`~cbop_torchrl.objectives.cbop_target` and
   :mod:`~cbop_torchrl.objectives.posterior`; the estimator supplies the networks);
2. the critic ``sum_m MSE(Q_m(s, a), y) + eta * L_ES``, EDAC's gradient-diversity term
   ``L_ES = 1/(M-1) sum_{i != j} cos(grad_a Q_i, grad_a Q_j)`` from the same forward;
3. the actor ``alpha log pi(a~|s) - min_m Q_m(s, a~)``, ``a~ ~ pi(.|s)`` reparameterized;
4. the temperature ``-log_alpha (log pi(a~|s) + target_entropy)``, ``target_entropy = -A``;
5. one backward of their sum, and one fused Adam step with a learning rate per part (the
   parts touch disjoint parameters: the actor loss reads detached Q parameters, the alpha
   loss a detached log-prob, so one optimizer on the sum equals three);
6. the Polyak update ``theta' <- theta' + tau (theta - theta')`` of the target Q-ensemble.

The networks run through ``loss``'s helpers (``_q_and_action_gradients``, ``_member_q``,
``_actor_dist``) and its estimator: as modules in the eager loss, in their fast forms
(stacked ``baddbmm`` Q-ensembles, the plain actor, bf16 rollouts, compile) once
:func:`cbop_torchrl.accel.accelerate` has turned them on; this page is the same for both.
Nothing here reads a value on the host, so a CUDA graph can capture :func:`cbop_update`
whole (:class:`~cbop_torchrl.accel.CapturedStep`).

Two terms BEYOND THE PAPER are off by default (docs/learning.md): ``bc_weight`` adds
``bc_weight * E[-log pi(a|s)]`` to the actor, ``critic_penalty`` adds
``critic_penalty * E[sum_m (Q_m(s, a_pi) - Q_m(s, a))]`` to the critic.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase
from torch import Tensor
from torchrl.envs.utils import ExplorationType, set_exploration_type
from torchrl.modules.distributions.utils import rsample_and_log_prob
from torchrl.objectives import SACLoss, SoftUpdate
from torchrl.objectives.utils import distance_loss

from cbop_torchrl.objectives.diversity import gradient_diversity_penalty
from cbop_torchrl.objectives.estimator import sac_alpha

#: ``guard(losses, grad_norm)``, called after the backward and before the optimizer step:
#: records whether the step was finite on the device (and may refuse it).
Guard = Callable[[TensorDictBase, Tensor], None]


def make_optimizer(
    loss: SACLoss, *, actor_lr: float, critic_lr: float, alpha_lr: float
) -> torch.optim.Optimizer:
    """One Adam with a parameter group per part: actor, Q-ensemble, log-alpha."""
    return torch.optim.Adam(
        [
            {"params": list(loss.actor_network_params.values(True, True)), "lr": actor_lr},
            {"params": list(loss.qvalue_network_params.values(True, True)), "lr": critic_lr},
            {"params": [loss.log_alpha], "lr": alpha_lr},
        ],
        # One fused kernel over all parameters (CPU and CUDA): fewer small kernels, and
        # no per-parameter read of the step count (13 host syncs per step unfused).
        fused=True,
        # On CUDA the step count stays on the device, so the step can be captured in a
        # CUDA graph (torch refuses to capture a non-capturable optimizer's step).
        capturable=loss.log_alpha.device.type == "cuda",
    )


def cbop_losses(loss: Any, batch: TensorDictBase) -> TensorDictBase:
    """Steps 1-4 on ``batch`` ``[B]``: what :class:`~cbop_torchrl.objectives.CBOPLoss` returns.

    ``loss`` is a ``CBOPLoss``. Returns a TensorDict, batch ``[]``: ``loss_actor``,
    ``loss_qvalue``, ``loss_alpha`` (summing the ``loss_*`` keys gives the objective),
    ``alpha``, ``entropy``, ``qvalue_mse``, ``edac_penalty``, ``bc_nll`` (``bc_weight > 0``),
    ``critic_gap`` (``critic_penalty > 0``) and ``cbop`` (the target's diagnostics), all
    detached but the losses. The batch is read, never written.
    """
    batch = batch.copy()  # shallow: what the estimator writes stays out of the caller's batch
    weights = loss._maybe_get_priority_weight(batch)  # [B] (prioritized replay) or None

    # 1. The target, without gradient: the LCB of the value expansions.
    y = loss.value_estimator.value_estimate(batch).squeeze(-1)  # [B]

    # 2. The critic on (s, a): Q [M, B] and grad_a Q [M, B, A] from one Q-ensemble forward.
    q, grad_a = loss._q_and_action_gradients(batch, with_gradients=loss.eta > 0)
    if grad_a is not None:
        edac = gradient_diversity_penalty(grad_a)  # [B]: L_ES per sample
    if loss.critic_penalty > 0:
        policy_action = loss._policy_action(batch)  # [B, A], no gradient
        q_policy = loss._member_q(batch, policy_action, loss.qvalue_network_params, detach=False)
        gap = (q_policy - q).sum(0)  # [B]: sum_m Q_m(s, a_pi) - Q_m(s, a)
    mse = distance_loss(q, y.expand_as(q), loss_function=loss.loss_function).sum(0)  # [B]
    mse = loss._reduce_loss(mse, tensordict=batch, weights=weights)  # []

    # 3. The actor on (s, a~): reparameterized a~, the members' minimum at detached Q weights.
    with set_exploration_type(ExplorationType.RANDOM):
        dist = loss._actor_dist(batch)
        action, log_prob = rsample_and_log_prob(dist)  # [B, A], [B]
        if loss.bc_weight > 0:
            bc_nll = loss._nll(dist, batch)  # [B]: -log pi(a|s) at the data's actions
    q_new = loss._member_q(batch, action, loss.qvalue_network_params, detach=True)  # [M, B]
    loss_actor = sac_alpha(loss) * log_prob - q_new.min(0)[0]  # [B]
    loss_actor = loss._reduce_loss(loss_actor, tensordict=batch, weights=weights)  # []

    # 4. The temperature, on the detached log-prob.
    log_prob = log_prob.detach()
    loss_alpha = -loss.log_alpha * (log_prob + loss.target_entropy)  # [B]
    loss_alpha = loss._reduce_loss(loss_alpha, tensordict=batch, weights=weights)  # []

    # The weighted terms, added in this order (the autograd graph's order since the first
    # release: another order sums gradients in another order, and rounds differently).
    out: dict[str, Any] = {"loss_actor": loss_actor, "loss_qvalue": mse, "loss_alpha": loss_alpha}
    out["alpha"] = loss._alpha  # [] (SACLoss's: clamps log_alpha to its bounds, if any)
    out["entropy"] = (-log_prob).mean()  # []
    if loss.bc_weight > 0:
        nll = loss._reduce_loss(bc_nll, tensordict=batch)  # []
        out["loss_actor"] = loss_actor + loss.bc_weight * nll
        out["bc_nll"] = nll.detach()
    if loss.eta > 0:
        penalty = loss._reduce_loss(edac, tensordict=batch)  # []
        out["loss_qvalue"] = mse + loss.eta * penalty
    else:
        penalty = torch.zeros_like(mse)
    if loss.critic_penalty > 0:
        gap = loss._reduce_loss(gap, tensordict=batch)  # []
        out["loss_qvalue"] = out["loss_qvalue"] + loss.critic_penalty * gap
        out["critic_gap"] = gap.detach() / loss.num_qvalue_nets
    out["qvalue_mse"] = mse.detach()
    out["edac_penalty"] = penalty.detach()
    diagnostics = loss.value_estimator.last_diagnostics
    if diagnostics is not None:
        out["cbop"] = diagnostics
    return TensorDict(out, batch_size=[])


def polyak_update(target_update: Any) -> None:
    """Step 6: ``target_update.step()``; a TorchRL ``SoftUpdate`` as one ``torch._foreach_lerp_``.

    ``SoftUpdate.step`` runs ``target.data.lerp_(source.data, 1 - eps)`` (``eps = 1 - tau``)
    on the loss's parameter TensorDicts, and each ``.data`` is a ``detach``: two operations
    per parameter tensor before the one ``_foreach_lerp_``. The same lerp on the tensors
    themselves, under ``no_grad``, is the same update without them (TensorDict's ``lerp_``
    calls the same multi-tensor kernel). Any other updater steps itself.
    """
    sources = getattr(target_update, "_sources", None)
    targets = getattr(target_update, "_targets", None)
    if (
        type(target_update) is not SoftUpdate
        or not getattr(target_update, "initialized", False)
        or not isinstance(sources, TensorDictBase)
        or not isinstance(targets, TensorDictBase)
    ):
        target_update.step()
        return
    source_leaves, target_leaves = [], []
    for key, source in sources.items():
        target = targets.get(f"target_{key}")
        if isinstance(source, TensorDictBase):
            for leaf_key, leaf in source.items(True, True):
                source_leaves.append(leaf)
                target_leaves.append(target.get(leaf_key))
        else:
            source_leaves.append(source)
            target_leaves.append(target)
    if any(leaf.requires_grad for leaf in target_leaves):
        raise RuntimeError("the target parameter is part of a graph.")
    with torch.no_grad():
        torch._foreach_lerp_(target_leaves, source_leaves, 1 - target_update.eps)


def cbop_update(
    loss: Any,
    optimizer: torch.optim.Optimizer,
    target_update: Any | None,
    batch: TensorDictBase,
    guard: Guard | None = None,
) -> TensorDictBase:
    """One CBOP gradient step on ``batch`` ``[B]``; returns the detached losses and ``grad_norm``.

    Args:
        loss: the ``CBOPLoss`` (networks, estimator, eta, log-alpha).
        optimizer: its optimizer (:func:`make_optimizer`).
        target_update: its ``SoftUpdate`` (the Polyak update), or None.
        batch: ``[B]`` transitions: ``observation``, ``action`` and ``next``'s
            ``observation``, ``reward``, ``terminated``, ``done``.
        guard: see :data:`Guard`: the run's finiteness record
            (:meth:`~cbop_torchrl.trainers.update.GradientStep.guard`).
    """
    # set_to_none: no kernel, so inside a CUDA graph capture the gradients are allocated
    # in the graph's pool and every replay overwrites them.
    optimizer.zero_grad(set_to_none=True)
    losses = cbop_losses(loss, batch)  # steps 1-4
    total = losses["loss_actor"] + losses["loss_qvalue"] + losses["loss_alpha"]  # []
    total.backward()  # step 5
    params = [p for group in optimizer.param_groups for p in group["params"]]
    # The total 2-norm without clip_grad_norm_'s multiply by a clip factor of 1.
    grad_norm = torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None])
    if guard is not None:
        guard(losses, grad_norm)
    optimizer.step()
    if target_update is not None:
        polyak_update(target_update)  # step 6
    losses = losses.apply(lambda value: value.detach() if value.requires_grad else value)
    losses.set("grad_norm", grad_norm.detach())
    return losses


__all__ = ["Guard", "cbop_losses", "cbop_update", "make_optimizer", "polyak_update"]
