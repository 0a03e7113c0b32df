"""The CBOP target on one page: model rollouts, h-step returns, the posterior, the LCB.

Pure tensor functions; the networks come in as callables, so nothing here knows a
TensorDict, a loss or a device. :class:`~cbop_torchrl.objectives.estimator.CBOPValueEstimator`
supplies them (the dynamics model, the actor's sampler, the target Q-ensemble) and calls
:func:`rollout_returns`, :func:`horizon_value` and :func:`soft_bellman_target`.

For a batch of dataset transitions ``(s, a, r, s', terminated)`` and ``a' ~ pi(.|s')``:

1. K particles start at ``s_1 = s'`` with ``a'`` and roll out H steps, particle k with
   dynamics elite k (one batched dynamics call and one actor call per step);
2. the target Q-ensemble (M members) scores every ``(s_{h+1}, a_{h+1})`` in one call;
3. ``R_h[k, m] = sum_{t=1..h} gamma^(t-1) r_t[k] + gamma^h Q'_m(s_{h+1}[k], a_{h+1}[k])``
   for h = 0..H, a ``returns`` tensor ``(N, H+1, K, M)`` (horizon 0 is SAC's bootstrap);
4. :func:`~cbop_torchrl.objectives.posterior.gaussian_posterior` combines the horizons
   (paper eq. 6-8) into ``N(mu, sigma^2)``, and the LCB is ``mu - psi sigma``;
5. ``y = r + gamma (1 - terminated) (LCB - alpha log pi(a'|s'))``.

Model termination: a particle whose predicted next state is terminal is absorbing (no
later reward, no bootstrap) and stays at its last live state. With
``termination="zero_precision"`` every horizon from the first step at which ANY particle
of a transition terminated also gets zero precision (``valid`` is False there); with
``"absorb"`` only the absorbing rule applies.

Sampling: ``"shared"`` rollouts feed every horizon from one set of K rollouts of length H;
``"independent"`` gives each horizon h >= 1 its own K rollouts of length h, which makes the
horizons conditionally independent, as the posterior assumes.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from cbop_torchrl.objectives.posterior import (
    VAR_FLOOR,
    GaussianPosterior,
    fixed_weight_moments,
    gaussian_posterior,
    pooled_quantile,
)

#: ``(obs [K, R, O], action [K, R, A]) -> (next obs [K, R, O], reward [K, R, 1],
#: terminated [K, R] bool)``: one dynamics step, particle k with elite k.
ModelStep = Callable[[torch.Tensor, torch.Tensor], tuple[torch.Tensor, torch.Tensor, torch.Tensor]]
#: ``obs [*b, O] -> a ~ pi(.|obs) [*b, A]``.
SampleAction = Callable[[torch.Tensor], torch.Tensor]
#: ``(obs [R, O], action [R, A]) -> Q' [M, R]``: every target member on every row (fp32).
QValues = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def shared_rollout_returns(
    next_obs: torch.Tensor,
    first_action: torch.Tensor,
    step: ModelStep,
    sample: SampleAction,
    q_values: QValues,
    *,
    horizon: int,
    particles: int,
    gamma: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``returns`` ``(N, H+1, K, M)`` and ``valid`` ``(N, H+1)`` from one set of K rollouts."""
    H, K = horizon, particles
    N, obs_dim = next_obs.shape
    device = next_obs.device
    obs = next_obs.unsqueeze(0).expand(K, N, obs_dim)  # a view: s_1 = s'
    action = first_action.unsqueeze(0).expand(K, *first_action.shape)
    q_obs, q_action, rewards, dead_after = [], [], [], []
    # dead [K, N, 1]: True from the step at which a particle terminated (none before step 1).
    dead = zero = None
    for _ in range(H):
        stepped, reward, terminated = step(obs, action)
        stepped, reward = stepped.float(), reward.float()  # [K, N, O], [K, N, 1]
        terminated = terminated.bool().unsqueeze(-1)
        # Absorbing: no reward once terminated; the terminal step's reward counts.
        if dead is None:
            rewards.append(reward)
            dead = terminated
        else:
            zero = reward.new_zeros(()) if zero is None else zero
            rewards.append(torch.where(dead, zero, reward))
            dead = dead | terminated
        dead_after.append(dead)
        # A terminated particle stays at its last live state (as the authors freeze
        # terminated rollouts): its later rows are masked, and the model never sees a
        # terminal (possibly non-finite or out-of-range) state.
        obs = torch.where(dead, obs, stepped)
        action = sample(obs)
        q_obs.append(obs)
        q_action.append(action)

    if H == 0:
        q = q_values(next_obs, first_action)  # [M, N]
        returns_0 = q.t()[:, None, None, :].expand(N, 1, K, q.shape[0])
        valid = torch.ones(N, 1, dtype=torch.bool, device=device)
        return returns_0.contiguous(), valid
    reward_h = torch.stack(rewards).squeeze(-1)  # [H, K, N]
    discounts = gamma ** torch.arange(H, device=device, dtype=reward_h.dtype)  # gamma^(h-1)
    discounts = discounts.view(H, 1, 1)
    partial = torch.cumsum(reward_h * discounts, dim=0)
    alive_h = ~torch.stack(dead_after).squeeze(-1)  # [H, K, N]
    returns = bootstrapped_returns(
        q_values,
        torch.cat([next_obs, torch.stack(q_obs).view(H * K * N, obs_dim)]),
        torch.cat([first_action, torch.stack(q_action).view(H * K * N, -1)]),
        partial,
        alive_h,
        gamma * discounts,
    )
    valid = torch.cat([torch.ones(1, N, dtype=torch.bool, device=device), alive_h.all(dim=1)]).t()
    return returns, valid


def bootstrapped_returns(
    q_values: QValues,
    rows_obs: torch.Tensor,
    rows_action: torch.Tensor,
    partial: torch.Tensor,
    alive: torch.Tensor,
    discount: torch.Tensor,
) -> torch.Tensor:
    """``returns`` ``(N, H+1, K, M)``: ``Q(s', a')`` at h = 0, then each horizon's bootstrap.

    Args:
        q_values: the target Q-ensemble, called once for every horizon.
        rows_obs, rows_action: ``[N + H*K*N, *]``: the N rows ``(s', a')`` (h = 0), then
            the rollout's states and actions at the end of each horizon, ``[H, K, N]``.
        partial: ``[H, K, N]`` the discounted rewards of each horizon's first h steps.
        alive: ``[H, K, N]`` whether the particle is still running after h steps.
        discount: ``gamma^h``, broadcastable to ``[H, K, N]``.
    """
    H, K, N = partial.shape
    q = q_values(rows_obs, rows_action)  # [M, N + H*K*N]
    M = q.shape[0]
    returns_0 = q[:, :N].t()[:, None, None, :].expand(N, 1, K, M)
    q_h = q[:, N:].reshape(M, H, K, N)
    # gamma^h Q where the particle is alive; a where, not a 0 x Q product, so a
    # terminated particle's Q (never used) cannot turn the sum into NaN.
    returns_h = partial + torch.where(alive, discount * q_h, 0.0)  # [M, H, K, N]
    return torch.cat([returns_0, returns_h.permute(3, 1, 2, 0)], dim=1)


def independent_rollout_returns(
    next_obs: torch.Tensor,
    first_action: torch.Tensor,
    step: ModelStep,
    sample: SampleAction,
    q_values: QValues,
    *,
    horizon: int,
    particles: int,
    gamma: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``returns`` ``(N, H+1, K, M)`` and ``valid`` ``(N, H+1)`` with fresh rollouts per h.

    Horizon h >= 1 has its own K particles, all starting at ``(s', a')`` (the same ``a'``
    as horizon 0). The groups still running at step t are those with h >= t, so step t
    propagates ``[K, (H - t + 1) * N]`` rows; the group with h = t is then complete and
    leaves the batch.
    """
    H, K = horizon, particles
    N, obs_dim = next_obs.shape
    device = next_obs.device
    obs = next_obs.expand(K, H, N, obs_dim)  # [K, G, N, O], group g is horizon g + 1
    action = first_action.expand(K, H, *first_action.shape)
    alive = torch.ones(K, H, N, dtype=torch.bool, device=device)
    partial = torch.zeros(K, H, N, device=device)
    done_obs, done_action, done_partial, done_alive, done_valid = [], [], [], [], []
    valid_group = torch.ones(H, N, dtype=torch.bool, device=device)
    for t in range(H):  # model step t + 1; groups with horizon >= t + 1 remain
        groups = H - t
        stepped, reward, terminated = step(
            obs.reshape(K, groups * N, obs_dim), action.reshape(K, groups * N, -1)
        )
        stepped = stepped.float().reshape(K, groups, N, obs_dim)
        reward = reward.float().reshape(K, groups, N)
        terminated = terminated.reshape(K, groups, N)
        partial = partial + gamma**t * torch.where(alive, reward, torch.zeros_like(reward))
        alive = alive & ~terminated.bool()
        # Terminated particles stay at their last live state (see shared_rollout_returns).
        obs = torch.where(alive.unsqueeze(-1), stepped, obs)
        valid_group = valid_group & alive.all(dim=0)
        action = sample(obs)
        # The first remaining group has horizon t + 1: it is complete.
        done_obs.append(obs[:, 0])
        done_action.append(action[:, 0])
        done_partial.append(partial[:, 0])
        done_alive.append(alive[:, 0])
        done_valid.append(valid_group[0])
        obs, action = obs[:, 1:], action[:, 1:]
        partial, alive, valid_group = partial[:, 1:], alive[:, 1:], valid_group[1:]

    discount_h = gamma ** torch.arange(1, H + 1, device=device, dtype=partial.dtype)  # gamma^h
    returns = bootstrapped_returns(
        q_values,
        torch.cat([next_obs, *(o.reshape(K * N, -1) for o in done_obs)]),
        torch.cat([first_action, *(a.reshape(K * N, -1) for a in done_action)]),
        torch.stack(done_partial),
        torch.stack(done_alive),
        discount_h[:, None, None],
    )
    first = torch.ones(1, N, dtype=torch.bool, device=device)
    valid = torch.cat([first, *(v.unsqueeze(0) for v in done_valid)]).t()
    return returns, valid


def rollout_returns(
    next_obs: torch.Tensor,
    first_action: torch.Tensor,
    step: ModelStep,
    sample: SampleAction,
    q_values: QValues,
    *,
    horizon: int,
    particles: int,
    gamma: float,
    sampling: str = "shared",
    termination: str = "zero_precision",
) -> tuple[torch.Tensor, torch.Tensor]:
    """The h-step samples ``returns`` ``(N, H+1, K, M)`` and ``valid`` ``(N, H+1)`` from ``s'``.

    Args:
        next_obs: ``[N, O]`` the dataset's next observations ``s'``.
        first_action: ``[N, A]`` ``a' ~ pi(.|s')``, shared by every particle and horizon.
        step, sample, q_values: the dynamics model, the actor and the target Q-ensemble.
        horizon, particles, gamma: H, K and the discount.
        sampling: ``"shared"`` or ``"independent"`` rollouts per horizon.
        termination: ``"zero_precision"`` or ``"absorb"`` (every horizon valid).
    """
    shape = {"horizon": horizon, "particles": particles, "gamma": gamma}
    if sampling == "independent" and horizon > 0:
        returns, valid = independent_rollout_returns(
            next_obs, first_action, step, sample, q_values, **shape
        )
    else:
        returns, valid = shared_rollout_returns(
            next_obs, first_action, step, sample, q_values, **shape
        )
    if termination == "absorb" and horizon > 0:
        valid = torch.ones_like(valid)
    return returns, valid


def horizon_value(
    returns: torch.Tensor,
    valid: torch.Tensor | None,
    mode: str,
    psi: float,
    var_floor: float = VAR_FLOOR,
    fixed_weights: torch.Tensor | None = None,
    quantile: float = 0.3085,
    unbiased_variance: bool = False,
) -> tuple[torch.Tensor, GaussianPosterior, torch.Tensor]:
    """The value ``(N,)`` that ``y`` bootstraps from, the posterior and its ``sigma`` ``(N,)``.

    ``mode``: ``"lcb"`` (CBOP: ``mu - psi sigma``), ``"map"`` (STEVE: ``mu``), ``"fixed"``
    (the LCB of the K*M samples combined with ``fixed_weights``) or ``"quantile"`` (DiMVE:
    the ``quantile`` of all samples pooled). The posterior is computed in every mode (the
    diagnostics report it). ``unbiased_variance``: each horizon's (and ``"fixed"``'s) variance
    over its K*M samples with the ``n - 1`` divisor (the authors' code) instead of ``n``.
    """
    post = gaussian_posterior(returns, valid, var_floor, unbiased_variance)
    sigma = post.var.sqrt()
    if mode == "lcb":
        value = post.mean - psi * sigma
    elif mode == "map":
        value = post.mean
    elif mode == "fixed":
        mean, var = fixed_weight_moments(returns, fixed_weights, unbiased_variance)
        value = mean - psi * var.sqrt()
    else:
        value = pooled_quantile(returns, quantile)
    return value, post, sigma


def soft_bellman_target(
    reward: torch.Tensor,
    terminated: torch.Tensor,
    gamma: float,
    value: torch.Tensor,
    alpha: torch.Tensor | float,
    log_prob: torch.Tensor,
) -> torch.Tensor:
    """``y = r + gamma (1 - terminated) (value - alpha log pi(a'|s'))``, all ``[N]``."""
    alpha = torch.as_tensor(alpha, dtype=value.dtype, device=value.device)
    not_terminal = 1.0 - terminated.to(value.dtype)
    return reward + gamma * not_terminal * (value - alpha * log_prob.float())


def target_diagnostics(
    post: GaussianPosterior, sigma: torch.Tensor, valid: torch.Tensor, target: torch.Tensor
) -> dict[str, torch.Tensor]:
    """Batch means: the posterior's weights ``w_h``, ``E[h]``, ``sigma``, the Q-ensemble's
    share of each horizon's variance, the share of valid horizons and the mean target."""
    value = post.mean
    horizons = torch.arange(valid.shape[-1], device=value.device, dtype=value.dtype)
    total_var = post.var_value + post.var_model
    return {
        "weights": post.weights.mean(0),
        "expected_horizon": (post.weights * horizons).sum(-1).mean(),
        "posterior_std": sigma.mean(),
        "value_var_share": (post.var_value / total_var.clamp_min(1e-12)).mean(0),
        "valid_fraction": valid.float().mean(0),
        "target_mean": target.mean(),
    }


__all__ = [
    "ModelStep",
    "QValues",
    "SampleAction",
    "bootstrapped_returns",
    "horizon_value",
    "independent_rollout_returns",
    "rollout_returns",
    "shared_rollout_returns",
    "soft_bellman_target",
    "target_diagnostics",
]
