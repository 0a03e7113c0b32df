"""Conservatism: the learned Q at dataset states against the real discounted return.

The paper's conservatism table (appendix "Conservatism Analysis", Table 2 and
``tab:pe-full``) reports ``E_{s ~ D}[Q(s, pi(s)) - V^pi(s)]`` at the end of
training, with ``V^pi`` a Monte-Carlo estimate in the real environment started
from the dataset state ``s``. :func:`dataset_conservatism` measures exactly
that, and one more number:

- ``overestimation``: ``Q(s, pi(s)) - MC(s)`` (mean over members, deterministic
  action), the raw difference the paper's table reports (its critics are soft
  Q-functions too).
- ``overestimation_no_entropy``: the same with the entropy part of a soft Q
  removed. CBOP's (SAC's) critic regresses on ``r + gamma * (V(s') - alpha *
  log pi(a'|s'))``, so at its fixed point it also holds ``alpha * sum_{t>=1}
  gamma^t H(pi(.|s_t))``, which is no part of the plain return. That sum is
  estimated along the same real rollout (one sampled action per state:
  ``H ~ -log pi(a~|s_t)``) with the loss's current ``alpha``; for critics without
  an entropy term in their target (TD3+BC, IQL, CQL with a deterministic
  backup) ``alpha = 0`` and both numbers agree.

Used at every evaluation by :class:`~cbop_torchrl.trainers.diagnostics.LearningDiagnostics`
and at the end of a run by :mod:`cbop_torchrl.evaluation.analysis`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributions as D
from tensordict import TensorDict, TensorDictBase

from cbop_torchrl.envs.evaluate import deterministic_policy
from cbop_torchrl.envs.starts import restore_states, rollout_restored
from cbop_torchrl.registry import Task

MC_STATES = 100
"""Dataset states the policy is rolled out from (the paper's histograms use the whole set)."""

STATES_SEED = 0
"""Draws those states (:func:`start_states`): the same for every run, whatever its seed, so the
diagnostics' last ``q_minus_mc_data`` and the summary's ``analysis.conservatism`` are one number,
and runs of different seeds are compared on the same states."""

EntropyFn = Callable[[torch.Tensor], torch.Tensor]
"""Observations ``[N, O]`` -> a one-sample estimate of the policy's entropy ``[N]``."""


def member_q_values(
    qvalue_network: Any, stacked_params: TensorDictBase, obs: torch.Tensor, action: torch.Tensor
) -> torch.Tensor:
    """``Q_m(obs, action)`` for every member: ``[N, O], [N, A] -> [M, N]``.

    One member at a time (not ``vmap``), so it works for every TorchRL loss's critic.
    """
    td = TensorDict({"observation": obs, "action": action}, batch_size=obs.shape[:1])
    values = []
    for member in range(stacked_params.shape[0]):
        with stacked_params[member].to_module(qvalue_network):
            values.append(qvalue_network(td.clone()).get("state_action_value").squeeze(-1))
    return torch.stack(values)


def rollout_from_observations(
    actor: Any,
    task: Task,
    start_obs: torch.Tensor,
    gamma: float,
    max_steps: int = 1000,
    entropy_fn: EntropyFn | None = None,
) -> tuple[torch.Tensor, torch.Tensor] | tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Discounted Monte-Carlo returns of the deterministic ``actor`` from dataset states.

    Each of the ``E`` environments is restored to its dataset state
    (:func:`~cbop_torchrl.envs.starts.restore_states`, shared with the start-state
    evaluation); the actor is called once per step on all environments still running.

    Args:
        actor: a TensorDict module writing ``action`` from ``observation`` (its parameters
            already in place).
        task: the gymnasium id and keyword arguments of the real environment.
        start_obs: ``[E, O]`` dataset observations.
        gamma: the discount.
        max_steps: episode cap.
        entropy_fn: when given, also accumulate ``sum_{t>=1} gamma^t entropy_fn(s_t)``
            over the states the rollout reaches after its first step.

    Returns:
        ``[E]`` returns ``sum_t gamma^t r_t`` up to termination or ``max_steps`` and ``[E]``
        episode lengths; with ``entropy_fn`` also the ``[E]`` discounted entropy sums.
    """
    rollout = rollout_restored(
        actor, task, start_obs, gamma, max_steps, entropy_fn=entropy_fn, device=start_obs.device
    )
    if entropy_fn is None:
        return rollout.discounted.float(), rollout.lengths
    return rollout.discounted.float(), rollout.lengths, rollout.entropy.float()


def sample_with(dist: D.Distribution, generator: torch.Generator) -> torch.Tensor:
    """One sample of a (transformed, independent) Normal drawn from ``generator``.

    ``Distribution.sample`` draws from the global stream only; the diagnostics measured in a
    thread beside training must not. Supports what the actors here produce: a
    ``TransformedDistribution`` (e.g. a tanh-Normal) over an ``Independent`` ``Normal``.
    """
    base, transforms = dist, []
    if isinstance(base, D.TransformedDistribution):
        base, transforms = base.base_dist, list(base.transforms)
    while isinstance(base, D.Independent):
        base = base.base_dist
    if not isinstance(base, D.Normal):
        raise TypeError(f"cannot sample a {type(dist).__name__} from a generator")
    noise = torch.randn(base.loc.shape, generator=generator, device=base.loc.device)
    sample = base.loc + base.scale * noise.to(base.loc.dtype)
    for transform in transforms:
        sample = transform(sample)
    return sample


def policy_entropy_fn(actor: Any, generator: torch.Generator | None = None) -> EntropyFn:
    """One-sample estimates ``-log pi(a~|s)``, ``a~ ~ pi(.|s)``, of an actor's entropy
    (``a~`` from ``generator`` when given, else from the global stream)."""

    def entropy(obs: torch.Tensor) -> torch.Tensor:
        dist = actor.get_dist(TensorDict({"observation": obs}, batch_size=obs.shape[:1]))
        action = dist.sample() if generator is None else sample_with(dist, generator)
        return -dist.log_prob(action)

    return entropy


def soft_critic_alpha(loss: Any) -> float:
    """The entropy temperature in a SAC-style loss's critic target (``exp(log_alpha)``,
    within the loss's bounds), as SACLoss computes it."""
    log_alpha = loss.log_alpha.detach()
    low, high = getattr(loss, "min_log_alpha", None), getattr(loss, "max_log_alpha", None)
    if low is not None or high is not None:
        log_alpha = log_alpha.clamp(low, high)
    return float(log_alpha.exp())


@torch.no_grad()
def dataset_conservatism(
    loss: Any,
    task: Task,
    start_obs: torch.Tensor,
    gamma: float,
    alpha: float = 0.0,
    max_steps: int = 1000,
    generator: torch.Generator | None = None,
    value_scale: float = 1.0,
) -> dict[str, Any]:
    """The paper's conservatism numbers for any TorchRL loss with an actor and a Q-ensemble.

    Args:
        loss: a loss with ``actor_network(_params)`` and ``qvalue_network(_params)``
            (CBOP's SAC loss, TD3+BC, IQL, CQL).
        task: the real environment.
        start_obs: ``[E, O]`` dataset states.
        gamma: discount of the Monte-Carlo returns.
        alpha: the entropy temperature of the critic's target (0: no entropy term).
        max_steps: episode cap.
        generator: draws the entropy part's action samples (None: the global stream).
        value_scale: the factor the critics' rewards were scaled by in training (IQL's
            recipe, :func:`~cbop_torchrl.trainers.recipes.reward_scale`): Q is divided by
            it, so that it compares with the environment's returns.

    Returns:
        Plain numbers (see the module doc): ``overestimation`` (mean of ``Q - MC``),
        ``overestimation_max``, ``overestimation_no_entropy``, ``entropy_part_mean``, the
        predicted Q (mean over members and min over members), the MC returns, and the
        per-state ``differences``.
    """
    actor = loss.actor_network
    with loss.actor_network_params.to_module(actor):
        td = TensorDict({"observation": start_obs}, batch_size=start_obs.shape[:1])
        action = deterministic_policy(actor)(td).get("action")
        entropy_fn = policy_entropy_fn(actor, generator) if alpha > 0 else None
        rollout = rollout_from_observations(
            actor, task, start_obs, gamma, max_steps, entropy_fn=entropy_fn
        )
    mc_return, lengths = rollout[0].to(start_obs.device), rollout[1]
    entropy_sum = rollout[2].to(start_obs.device) if alpha > 0 else torch.zeros_like(mc_return)
    q = member_q_values(loss.qvalue_network, loss.qvalue_network_params, start_obs, action)
    q = q / value_scale
    return conservatism_record(q, mc_return, lengths, entropy_sum, gamma, alpha)


def conservatism_record(
    q: torch.Tensor,
    mc_return: torch.Tensor,
    lengths: torch.Tensor,
    entropy_sum: torch.Tensor,
    gamma: float,
    alpha: float,
) -> dict[str, Any]:
    """:func:`dataset_conservatism`'s fields from the members' Q ``[M, N]`` at the policy's
    actions and the rollouts' ``[N]`` discounted returns, lengths and entropy sums."""
    difference = q.mean(0) - mc_return  # [N]
    entropy_part = alpha * entropy_sum  # [N]
    return {
        "states": int(q.shape[1]),
        "gamma": gamma,
        "alpha": float(alpha),
        "predicted_q_mean": float(q.mean()),
        "predicted_q_min": float(q.min(0).values.mean()),
        "mc_return_mean": float(mc_return.mean()),
        "mc_return_std": float(mc_return.std(unbiased=False)),
        "episode_length_mean": float(lengths.float().mean()),
        "overestimation": float(difference.mean()),
        "overestimation_max": float(difference.max()),
        "entropy_part_mean": float(entropy_part.mean()),
        "overestimation_no_entropy": float((difference - entropy_part).mean()),
        "differences": difference.tolist(),
    }


def start_states(data: TensorDictBase, count: int, seed: int) -> torch.Tensor:
    """``count`` dataset observations ``[count, O]``, drawn without replacement by ``seed``."""
    generator = torch.Generator().manual_seed(seed + 1)
    rows = torch.randperm(data.shape[0], generator=generator)[:count]
    return data.get("observation")[rows.to(data.device)].float()


__all__ = [
    "MC_STATES",
    "STATES_SEED",
    "conservatism_record",
    "dataset_conservatism",
    "member_q_values",
    "policy_entropy_fn",
    "restore_states",
    "soft_critic_alpha",
    "rollout_from_observations",
    "start_states",
]
