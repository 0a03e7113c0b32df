"""The reference target: the official code's design, written here for comparison only."""

from __future__ import annotations

import torch
from tensordict import TensorDict

from cbop_torchrl.modules.dynamics import DynamicsModel


def _stacked_linear(qnets) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """``[(W [M, in, out], b [M, 1, out]), ...]`` of the Q-networks' Linear layers."""
    layers = [m for m in qnets[0].module if isinstance(m, torch.nn.Linear)]
    stacked = []
    for i in range(len(layers)):
        linears = [[m for m in q.module if isinstance(m, torch.nn.Linear)][i] for q in qnets]
        weight = torch.stack([lin.weight.detach().t() for lin in linears]).contiguous()
        bias = torch.stack([lin.bias.detach() for lin in linears]).unsqueeze(1)
        stacked.append((weight, bias))
    return stacked


class ReferenceTarget:
    """The official code's target design (fp32, ``repeat``ed particles, ``var_mean``).

    Written for comparison only: per horizon ``t = 0..H`` the Q-ensemble runs on
    all ``K N`` particle rows (``bmm`` + bias + ReLU per layer on a member-expanded
    input), the dynamics elites are gathered from the full ensemble at every step,
    the returns are accumulated into ``[K, N, H+1]``/``[M, K, N, H+1]`` buffers and
    the per-horizon moments come from ``var_mean`` over ``(M, K)``; LCB of the
    inverse-variance-weighted posterior.
    """

    def __init__(
        self, actor, qnets, dynamics: DynamicsModel, horizon: int, gamma: float, psi: float = 1.0
    ) -> None:
        self.actor, self.dynamics = actor, dynamics
        self.q_layers = _stacked_linear(qnets)
        self.horizon, self.gamma, self.psi = horizon, gamma, psi

    def q_ensemble(self, x: torch.Tensor) -> torch.Tensor:  # [R, in] -> [M, R, 1]
        M = self.q_layers[0][0].shape[0]
        h = x.unsqueeze(0).expand(M, *x.shape)
        for i, (w, b) in enumerate(self.q_layers):
            h = torch.bmm(h, w) + b
            if i < len(self.q_layers) - 1:
                h = torch.relu(h)
        return h

    def dynamics_step(self, obs: torch.Tensor, action: torch.Tensor, K: int):
        ens = self.dynamics.ensemble
        members = self.dynamics.elite_indices
        x = ((torch.cat([obs, action], -1) - ens.input_mean) / ens.input_std).view(
            K, -1, obs.shape[-1] + action.shape[-1]
        )
        n_layers = len(ens.net.layers)
        for i, layer in enumerate(ens.net.layers):
            w, b = layer.weight.index_select(0, members), layer.bias.index_select(0, members)
            x = torch.bmm(x, w) + b
            if i < n_layers - 1:
                x = torch.nn.functional.silu(x)
        mean, raw_logvar = x.chunk(2, dim=-1)
        max_lv, min_lv = ens.max_logvar[members], ens.min_logvar[members]
        logvar = max_lv - torch.nn.functional.softplus(max_lv - raw_logvar)
        logvar = min_lv + torch.nn.functional.softplus(logvar - min_lv)
        sample = mean + torch.exp(0.5 * logvar) * torch.randn_like(mean)
        sample = (sample * ens.target_std + ens.target_mean).reshape(-1, sample.shape[-1])
        obs_dim = obs.shape[-1]
        next_obs = obs + sample[:, :obs_dim]
        return next_obs, sample[:, obs_dim:], self.dynamics.termination_fn(next_obs).unsqueeze(-1)

    def sample(self, obs: torch.Tensor):
        dist = self.actor.get_dist(TensorDict({"observation": obs}, batch_size=obs.shape[:1]))
        action = dist.sample()
        return action, dist

    @torch.no_grad()
    def __call__(self, batch: TensorDict) -> torch.Tensor:
        K, H, gamma = self.dynamics.num_elites, self.horizon, self.gamma
        next_obs = batch.get(("next", "observation"))
        N = next_obs.shape[0]
        M = self.q_layers[0][0].shape[0]
        first_action, dist = self.sample(next_obs)
        log_prob = dist.log_prob(first_action)
        obs = next_obs.repeat(K, 1)  # [KN, O]
        action = first_action.repeat(K, 1)
        terminated = torch.zeros(K * N, 1, dtype=torch.bool, device=obs.device)
        terminated_step = torch.zeros(N, H + 1, dtype=torch.bool, device=obs.device)
        x_returns = torch.zeros(K, N, H + 1, device=obs.device)
        q_terms = torch.zeros(M, K, N, H + 1, device=obs.device)
        for t in range(H + 1):
            if t > 0:
                action, _ = self.sample(obs)
            q = self.q_ensemble(torch.cat([obs, action], -1))  # [M, KN, 1]
            q[terminated.unsqueeze(0).expand(M, -1, -1)] = 0
            q_terms[..., t] = q.view(M, K, N) * gamma**t
            if t < H:
                obs, reward, done = self.dynamics_step(obs, action, K)
                reward[terminated] = 0
                terminated |= done
                terminated_step[:, t + 1 :] = terminated.view(K, N, 1).any(0)
                x_returns[..., t + 1 :] += reward.view(K, N, 1) * gamma**t
        returns = x_returns.unsqueeze(0) + q_terms  # [M, K, N, H+1]
        var, mean = torch.var_mean(returns, dim=(0, 1))  # [N, H+1]
        precision = 1.0 / var.clamp_min(1e-5)
        precision[terminated_step] = 0
        weights = precision / precision.sum(-1, keepdim=True)
        post_mean = (weights * mean).sum(-1)
        post_std = (1.0 / precision.sum(-1)).sqrt()
        value = post_mean - self.psi * post_std
        reward0 = batch.get(("next", "reward")).squeeze(-1)
        not_done = 1.0 - batch.get(("next", "terminated")).squeeze(-1).float()
        return reward0 + gamma * not_done * (value - 0.0 * log_prob)
