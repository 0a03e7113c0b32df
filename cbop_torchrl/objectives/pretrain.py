"""Pretraining losses run before CBOP (DESIGN.md section 1, appendix B.3 of the paper).

- :class:`BehaviourCloningLoss`: the actor maximizes the likelihood of the
  dataset's actions.
- :class:`FittedQEvaluationLoss`: the Q-ensemble evaluates the behaviour
  policy, regressing on ``r + gamma * (1 - terminated) * mean_m Q'_m(s', a'_data)``
  with the dataset's own next action and a slowly updated target ensemble.
  Each member sees its own bootstrap resample of the data.

Without this the model-based returns and an untrained Q-ensemble live on
different scales and CBOP's posterior puts all weight on h = 0.
"""

from __future__ import annotations

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.nn import TensorDictModule
from torchrl.objectives import LossModule

from cbop_torchrl.objectives.diversity import gradient_diversity_penalty

ACTION_EPS = 1e-5
"""Dataset actions are clipped to ``[-1 + eps, 1 - eps]``: a TanhNormal has no density at +-1."""


def data_action_log_prob(
    dist: torch.distributions.Distribution, action: torch.Tensor
) -> torch.Tensor:
    """``log pi(a|s)`` of recorded actions ``[*batch, A] -> [*batch]``, clipped by ``ACTION_EPS``.

    Recorded actions may sit on the box's edges, where a TanhNormal's log-density is infinite.
    """
    return dist.log_prob(action.clamp(-1.0 + ACTION_EPS, 1.0 - ACTION_EPS))


ROW_KEY = "row"
"""Key holding each transition's dataset row, used to look up its bootstrap weights."""


class BehaviourCloningLoss(LossModule):
    """Negative log-likelihood of the dataset action under the actor.

    Args:
        actor_network: a ``ProbabilisticActor`` (e.g. :func:`make_actor`) whose
            ``get_dist`` reads ``observation``.

    Reads ``observation`` ``[B, obs]`` and ``action`` ``[B, act]``; returns a
    TensorDict with ``loss_bc`` (scalar) and ``log_prob`` (its mean, for logs).
    """

    def __init__(self, actor_network: TensorDictModule) -> None:
        super().__init__()
        self.actor_network = actor_network

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        dist = self.actor_network.get_dist(tensordict.select("observation"))
        log_prob = data_action_log_prob(dist, tensordict.get("action"))
        return TensorDict(
            {"loss_bc": -log_prob.mean(), "log_prob": log_prob.detach().mean()},
            batch_size=[],
        )


def bootstrap_counts(
    num_members: int, num_rows: int, generator: torch.Generator | None = None
) -> torch.Tensor:
    """How often each row appears in each member's bootstrap resample.

    Returns:
        ``[num_members, num_rows]`` uint8 counts (a resample of ``num_rows``
        draws with replacement per member; counts above 255 are clipped, which
        happens with negligible probability).
    """
    counts = torch.empty(num_members, num_rows, dtype=torch.uint8)
    for member in range(num_members):  # one resample at a time bounds the memory
        draws = torch.randint(num_rows, (num_rows,), generator=generator)
        counts[member] = torch.bincount(draws, minlength=num_rows).clamp_(max=255).to(torch.uint8)
    return counts


def ensemble_q(
    qvalue_network: TensorDictModule, params: TensorDictBase, tensordict: TensorDictBase
) -> torch.Tensor:
    """``Q_m(s, a)`` for every member of stacked ``[M, ...]`` parameters: ``[B]`` -> ``[M, B, 1]``.

    One ``torch.vmap`` over the member dimension (a batched matmul per layer).
    """
    inputs = tensordict.select(*qvalue_network.in_keys)

    def member_q(member_params: TensorDictBase) -> torch.Tensor:
        with member_params.to_module(qvalue_network):
            return qvalue_network(inputs.copy()).get("state_action_value")

    return torch.vmap(member_q, randomness="different")(params)


def member_action_gradients(
    qvalue_network: TensorDictModule, params: TensorDictBase, tensordict: TensorDictBase
) -> torch.Tensor:
    """``grad_a Q_m(s, a)`` for every member at the batch's actions: ``[B]`` -> ``[M, B, A]``.

    Differentiable in the Q parameters (``create_graph``), so a loss on the
    gradients trains the ensemble.
    """
    num_members = params.shape[0]
    inputs = tensordict.select(*qvalue_network.in_keys)
    with torch.enable_grad():  # the action gradient is needed even under no_grad
        action = inputs.get("action").detach().requires_grad_()
        # A broadcast view: autograd gives the gradient of each member's slice separately.
        member_action = action.unsqueeze(0).expand(num_members, *action.shape)

        def member_q(member_params: TensorDictBase, member_act: torch.Tensor) -> torch.Tensor:
            with member_params.to_module(qvalue_network):
                td = inputs.copy()
                td.set("action", member_act)
                return qvalue_network(td).get("state_action_value")

        q = torch.vmap(member_q, randomness="different")(params, member_action)
        (grad,) = torch.autograd.grad(q.sum(), member_action, create_graph=True)
    return grad


@torch.no_grad()
def fqe_regression_target(
    qvalue_network: TensorDictModule,
    target_params: TensorDictBase,
    tensordict: TensorDictBase,
    gamma: float,
) -> torch.Tensor:
    """FQE's target ``r + gamma * (1 - terminated) * mean_m Q'_m(s', a'_data)`` of the
    target ensemble's stacked ``[M, ...]`` parameters: ``[B]`` rows -> ``[B, 1]``."""
    next_inputs = TensorDict(
        {
            "observation": tensordict.get(("next", "observation")),
            "action": tensordict.get(("next", "action")),
        },
        batch_size=tensordict.batch_size,
    )
    next_q = ensemble_q(qvalue_network, target_params, next_inputs).mean(0)
    reward = tensordict.get(("next", "reward"))
    continues = (~tensordict.get(("next", "terminated"))).to(reward.dtype)
    return reward + gamma * continues * next_q


def member_mse(
    q: torch.Tensor,
    target: torch.Tensor,
    bootstrap_weights: torch.Tensor | None,
    rows: torch.Tensor | None,
) -> torch.Tensor:
    """Each member's squared error on the batch, ``q [M, B, 1]``, ``target [B, 1]`` -> ``[M]``:
    weighted by the rows' (``rows [B]``) counts in the member's resample
    (``bootstrap_weights [M, N]``) and normalized by their sum, or a plain mean without them."""
    squared_error = (q - target).pow(2).squeeze(-1)  # [M, B]
    if bootstrap_weights is None:
        return squared_error.mean(-1)
    weights = bootstrap_weights[:, rows].to(q.dtype)
    return (weights * squared_error).sum(-1) / weights.sum(-1).clamp_min(1.0)


class FittedQEvaluationLoss(LossModule):
    """Fitted Q evaluation of the behaviour policy for an M-member Q-ensemble.

    Target (no gradient), shared by all members:
    ``y = r + gamma * (1 - terminated) * mean_m Q'_m(s', a'_data)``
    where ``Q'`` is the target ensemble (update it with ``SoftUpdate``) and
    ``a'_data = ("next", "action")``, the action the behaviour policy took next.
    Only rows whose ``next_action_mask`` is True may be used.

    Loss: for member m, the mean over the batch of ``w_m * (Q_m(s, a) - y)^2``
    with ``w_m`` the row's count in member m's bootstrap resample, normalized
    by the batch's total weight for that member; summed over members.

    Args:
        qvalue_networks: M Q-networks (``observation``, ``action`` ->
            ``state_action_value``), stacked like ``SACLoss`` stacks them.
        gamma: discount.
        bootstrap_weights: ``[M, N]`` counts from :func:`bootstrap_counts`,
            indexed by the batch's ``row`` entry; None trains every member on
            the whole data.
        eta: weight of EDAC's gradient-diversity term at the dataset actions
            (:func:`gradient_diversity_penalty`), added to ``loss_qvalue``. 0
            (default) is the paper's FQE; > 0 is an extension beyond the paper:
            it starts CBOP from an ensemble whose members already disagree off
            the data instead of one whose action gradients all point the same way.
    """

    qvalue_network: TensorDictModule
    qvalue_network_params: TensorDictBase
    target_qvalue_network_params: TensorDictBase

    def __init__(
        self,
        qvalue_networks: list[TensorDictModule],
        gamma: float = 0.99,
        bootstrap_weights: torch.Tensor | None = None,
        eta: float = 0.0,
    ) -> None:
        super().__init__()
        self.eta = float(eta)
        self.num_members = len(qvalue_networks)
        self.convert_to_functional(
            qvalue_networks, "qvalue_network", self.num_members, create_target_params=True
        )
        self.gamma = float(gamma)
        if bootstrap_weights is not None and bootstrap_weights.shape[0] != self.num_members:
            raise ValueError(
                f"bootstrap_weights has {bootstrap_weights.shape[0]} rows for "
                f"{self.num_members} Q-networks"
            )
        self.register_buffer("bootstrap_weights", bootstrap_weights, persistent=False)

    def ensemble_q(self, tensordict: TensorDictBase, params: TensorDictBase) -> torch.Tensor:
        """``Q_m(s, a)`` for every member: ``[B]`` inputs -> ``[M, B, 1]``."""
        return ensemble_q(self.qvalue_network, params, tensordict)

    @torch.no_grad()
    def regression_target(self, tensordict: TensorDictBase) -> torch.Tensor:
        """``y = r + gamma * (1 - terminated) * mean_m Q'_m(s', a'_data)``: ``[B]`` -> ``[B, 1]``.

        ``Q'`` is the target ensemble and ``a'_data`` the batch's ``("next", "action")``;
        no gradient flows through it (:func:`fqe_regression_target`).
        """
        return fqe_regression_target(
            self.qvalue_network, self.target_qvalue_network_params, tensordict, self.gamma
        )

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        target = self.regression_target(tensordict)  # [B, 1]
        q = self.ensemble_q(tensordict, self.qvalue_network_params)  # [M, B, 1]
        rows = tensordict.get(ROW_KEY, None)  # needed with bootstrap weights only
        per_member = member_mse(q, target, self.bootstrap_weights, rows)
        loss_qvalue = per_member.sum()
        out = {"q_mean": q.detach().mean(), "target_mean": target.mean()}
        if self.eta > 0:
            grad = member_action_gradients(
                self.qvalue_network, self.qvalue_network_params, tensordict
            )
            penalty = gradient_diversity_penalty(grad).mean()
            loss_qvalue = loss_qvalue + self.eta * penalty
            out["edac_penalty"] = penalty.detach()
        return TensorDict({"loss_qvalue": loss_qvalue, **out}, batch_size=[])
