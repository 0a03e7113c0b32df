"""CQL's conservative penalty as its authors' code computes it.

The penalty of CQL(H) (Kumar et al. 2020, importance-sampled version) is, for each state
``s`` of the batch and each critic, a log-sum-exp of Q-values over ``3 N`` sampled actions
(``N`` uniform ones, ``N`` of the policy's at ``s``, ``N`` of the policy's at the next
state ``s'``) minus the Q-value of the data's action. Two choices separate the authors'
code (aviralkumar2907/CQL, ``d4rl/rlkit/torch/sac/cql.py``) from
``torchrl.objectives.CQLLoss`` (torchrl 0.14):

- **where the next state's actions are scored.** The authors score them with the critics
  at ``s`` (``_get_tensor_values(obs, new_curr_actions_tensor, ...)``); ``CQLLoss`` at
  ``s'``.
- **what the log-sum-exp runs over.** The authors concatenate the three groups as
  ``[B, N, 1]`` tensors along the action axis and take the log-sum-exp over all ``3 N``
  actions of a state. ``CQLLoss`` concatenates ``[B * N, 1]`` tensors along the last axis,
  so its log-sum-exp runs over three values, one action of each group, for each of the
  ``B * N`` draws, and the mean over draws follows.

:class:`AuthorsCQLLoss` is ``CQLLoss`` with each choice selectable and nothing else
changed: the same random draws in the same order, the same critic passes, weights and
temperature. With ``next_actions_scored_at="next_state"`` and ``logsumexp_over="draw"`` it
computes ``CQLLoss``'s penalty exactly (tests/test_cql_penalty.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from tensordict import TensorDictBase
from torchrl.objectives import CQLLoss

NEXT_ACTIONS_SCORED_AT = ("state", "next_state")
"""Where the penalty scores the policy's actions drawn at the next state: ``state`` (the
authors' code) or ``next_state`` (``torchrl.objectives.CQLLoss``)."""

LOGSUMEXP_OVER = ("state", "draw")
"""What the penalty's log-sum-exp runs over: ``state`` (all ``3 N`` sampled actions of each
state, the authors' code) or ``draw`` (the three groups' actions of each of the ``N`` draws,
``torchrl.objectives.CQLLoss``)."""


CRITIC_PASSES = ("auto", "loop", "vmap")
"""How CQL runs its critics (``CQLLoss``'s ``deactivate_vmap``): one after another
(``loop``), or as one batched product over the critics (``vmap``); ``auto`` loops on a CPU
and vmaps elsewhere. The same products either way, equal to float rounding; on a CPU the
penalty's passes of 2,560 rows per critic and group run faster as plain matrix products
than as batched ones (``python -m benchmarks.speed.baseline_steps``, ``cql-vmap``'s row)."""


def critics_loop(critic_passes: str, device: Any) -> bool:
    """Whether ``critic_passes`` (:data:`CRITIC_PASSES`) runs the critics one after another
    on ``device`` (``CQLLoss``'s ``deactivate_vmap``)."""
    if critic_passes == "auto":
        return torch.device(device).type == "cpu"
    return critic_passes == "loop"


class AuthorsCQLLoss(CQLLoss):
    """``CQLLoss`` whose penalty follows the CQL authors' code (by default).

    Args:
        *args, **kwargs: ``CQLLoss``'s.
        next_actions_scored_at: ``state`` or ``next_state`` (see :data:`NEXT_ACTIONS_SCORED_AT`).
        logsumexp_over: ``state`` or ``draw`` (see :data:`LOGSUMEXP_OVER`).

    Only :meth:`cql_loss` differs from ``CQLLoss``'s.
    """

    def __init__(
        self,
        *args: Any,
        next_actions_scored_at: str = "state",
        logsumexp_over: str = "state",
        **kwargs: Any,
    ) -> None:
        if next_actions_scored_at not in NEXT_ACTIONS_SCORED_AT:
            raise ValueError(f"next_actions_scored_at must be one of {NEXT_ACTIONS_SCORED_AT}")
        if logsumexp_over not in LOGSUMEXP_OVER:
            raise ValueError(f"logsumexp_over must be one of {LOGSUMEXP_OVER}")
        super().__init__(*args, **kwargs)
        self.next_actions_scored_at = next_actions_scored_at
        self.logsumexp_over = logsumexp_over

    def cql_loss(self, tensordict: TensorDictBase) -> tuple[torch.Tensor, dict]:
        """The conservative penalty of a batch ``[B]`` that :meth:`q_loss` has seen.

        Returns the penalty (a scalar under the default reduction) and an empty dict, as
        ``CQLLoss.cql_loss``; writes each critic's per-state penalty (``cql_q1_loss``,
        ``cql_q2_loss``) for :meth:`alpha_prime_loss`.
        """
        keys = self.tensor_keys
        pred_q = [tensordict.get(keys.pred_q1), tensordict.get(keys.pred_q2)]  # [B, 1] each
        if pred_q[0] is None or pred_q[1] is None:
            raise KeyError("cql_loss needs pred_q1 and pred_q2: call q_loss on the batch first")
        batch, num = tensordict.shape[-1], self.num_random
        critics = self.num_qvalue_nets
        action_dim = tensordict.get(keys.action).shape[-1]

        # The draws, in CQLLoss's order: uniform, the policy's at s, the policy's at s'.
        # _get_policy_actions and, below, _vmap_qvalue_network00 and _reduce_loss are
        # CQLLoss's private helpers (torchrl 0.14), used so that the draws, the critic passes
        # and the reduction are CQLLoss's to the bit; CQLLoss offers no public hook for the
        # two choices made here.
        uniform = pred_q[0].new_empty((*tensordict.shape[:-1], batch * num, action_dim))
        uniform.uniform_(-1, 1)  # [B * N, A]
        at_state, log_pi_state = self._get_policy_actions(
            tensordict.copy(), self.actor_network_params, num_actions=num
        )  # rows [B * N], draw j of state b at b * N + j; log-probs [B * N]
        at_next, log_pi_next = self._get_policy_actions(
            tensordict.get("next").copy(), self.actor_network_params, num_actions=num
        )
        states = tensordict.select(*self.actor_network.in_keys, strict=False)
        states = states.apply(
            lambda x: x.repeat_interleave(num, dim=states.ndim - 1),
            batch_size=[*states.batch_size[:-1], batch * num],
        )  # [B * N, ...], in the draws' row order
        scored_uniform = states.clone().set(keys.action, uniform)
        if self.next_actions_scored_at == "state":
            at_next = states.clone().set(keys.action, at_next.get(keys.action))

        # One vmapped pass of the critics over [uniform, at s, at s'] x critics: [3 C, B * N, 1]
        inputs = torch.cat(
            [td.expand(critics, *at_state.batch_size) for td in (scored_uniform, at_state, at_next)]
        ).contiguous()
        params = torch.cat([self.qvalue_network_params] * 3, 0)
        q = self._vmap_qvalue_network00(inputs, params).get(keys.state_action_value)
        q_uniform, q_state, q_next = q.split([critics] * 3, dim=0)  # [C, B * N, 1] each

        uniform_log_density = np.log(0.5**action_dim)
        groups = (  # CQLLoss's order: uniform, at s', at s; importance-weighted
            q_uniform - uniform_log_density,
            q_next - log_pi_next.detach().unsqueeze(-1),
            q_state - log_pi_state.detach().unsqueeze(-1),
        )
        weight, temperature = self.min_q_weight, self.temperature
        per_critic = []
        for critic in (0, 1):  # CQLLoss's penalty reads the first two critics
            if self.logsumexp_over == "state":  # [B, 3 N] -> [B]
                values = torch.cat([g[critic].reshape(*tensordict.shape, num) for g in groups], -1)
                pushed = torch.logsumexp(values / temperature, dim=-1) * weight * temperature
                per_critic.append(pushed - pred_q[critic].squeeze(-1) * weight)
            else:  # [B * N, 3] -> [B * N]; CQLLoss's arithmetic, broadcast to [B, B * N]
                values = torch.cat([g[critic] for g in groups], -1)
                pushed = torch.logsumexp(values / temperature, dim=-1) * weight * temperature
                per_critic.append(pushed.flatten() - pred_q[critic] * weight)
        tensordict.set(keys.cql_q1_loss, per_critic[0])
        tensordict.set(keys.cql_q2_loss, per_critic[1])
        penalty = per_critic[0] + per_critic[1]
        if self.logsumexp_over == "draw":
            penalty = penalty.mean(-1)
        return self._reduce_loss(penalty, tensordict=tensordict), {}


__all__ = [
    "CRITIC_PASSES",
    "LOGSUMEXP_OVER",
    "NEXT_ACTIONS_SCORED_AT",
    "AuthorsCQLLoss",
    "critics_loop",
]
