"""CQL's conservative penalty where its authors' code scores the next state's actions.

The penalty of CQL(H) (Kumar et al. 2020) is a log-sum-exp of each state's Q-values over
sampled actions: uniform ones, the policy's at the state ``s``, and the policy's at the next
state ``s'``. The authors' code (aviralkumar2907/CQL, ``rlkit/torch/sac/cql.py``:
``q1_next_actions = self._get_tensor_values(obs, new_curr_actions_tensor, ...)``) scores all
three with the critics at ``s``; ``torchrl.objectives.CQLLoss`` scores the third at ``s'``.
:class:`AuthorsCQLLoss` is ``CQLLoss`` with the authors' choice and nothing else changed:
the same random draws in the same order, the same log-sum-exp and weights.
"""

from __future__ import annotations

from typing import Any

from tensordict import TensorDictBase
from torchrl.objectives import CQLLoss

NEXT_ACTIONS_SCORED_AT = ("state", "next_state")
"""Where the penalty scores the policy's actions drawn at the next state: ``state`` (the
authors' code, :class:`AuthorsCQLLoss`) or ``next_state`` (``torchrl.objectives.CQLLoss``)."""


class AuthorsCQLLoss(CQLLoss):
    """``CQLLoss`` whose penalty scores the policy's next-state actions at the current state.

    Same arguments as ``CQLLoss``. Only :meth:`cql_loss` differs: its third group of
    ``num_random`` actions per state, drawn from the policy at ``s'``, goes through the
    critics with ``s``'s observation, as in the CQL authors' code.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._scoring_states: TensorDictBase | None = None

    def cql_loss(self, tensordict: TensorDictBase) -> tuple[Any, dict]:
        """``CQLLoss.cql_loss`` with every sampled action scored at the batch's own states."""
        self._scoring_states = tensordict.select(*self.actor_network.in_keys, strict=False)
        try:
            return super().cql_loss(tensordict)
        finally:
            self._scoring_states = None

    # A private helper of CQLLoss (torchrl 0.14) is overridden: cql_loss builds the
    # penalty's critic inputs from what this returns, and offers no public hook for the
    # state the next-state actions are scored at. tests/test_cql_penalty.py checks the
    # critic inputs against stock CQLLoss's, draw for draw.
    def _get_policy_actions(
        self, data: TensorDictBase, actor_params: TensorDictBase, num_actions: int = 10
    ) -> tuple[TensorDictBase, Any]:
        sampled, log_prob = super()._get_policy_actions(data, actor_params, num_actions)
        states = self._scoring_states
        if states is not None and "next" not in data.keys():  # the call on the next states
            for key in self.actor_network.in_keys:
                # [B, ...] -> [B * num_actions, ...], rows in the order the actions were drawn
                current = states.get(key).repeat_interleave(num_actions, dim=states.ndim - 1)
                sampled.set(key, current)
        return sampled, log_prob


__all__ = ["NEXT_ACTIONS_SCORED_AT", "AuthorsCQLLoss"]
