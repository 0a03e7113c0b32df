"""Diagnostics of a trained CBOP run that need its checkpoint (paper Fig. 5, Fig. 8, Table 2).

:func:`analyze_cbop_run` rebuilds a finished (or checkpointed) CBOP run from
its directory (``config.json``, ``checkpoint.pt``, the dataset and the
cached dynamics ensemble) and returns plain numbers, small enough to be
stored in a benchmark summary so the report can draw the figures without
the checkpoint:

- ``rh_sample``: the h-step returns ``R_h`` (K particles x M Q-members per h)
  from one dataset state, with the posterior weights and mean/std per h
  (Fig. 5);
- ``value_var_share``: per h, a histogram over dataset states of
  ``A / (A + B)``, the share of the Q-ensemble (value) variance in the
  total variance of ``R_h`` (Fig. 8);
- ``conservatism``: the learned Q estimate of the deterministic policy at
  real start states against its discounted Monte-Carlo return in the real
  environment (Table 2).
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDict

from cbop_torchrl.config import RunConfig, load_config
from cbop_torchrl.data import load_dataset_with_info
from cbop_torchrl.evaluation.evaluate import episode_returns, make_eval_env
from cbop_torchrl.objectives.posterior import gaussian_posterior
from cbop_torchrl.trainers.checkpoint import CHECKPOINT_NAME, load_checkpoint
from cbop_torchrl.trainers.dynamics import load_or_train_dynamics
from cbop_torchrl.trainers.offline import build_cbop_loss

SHARE_BINS = 20
"""Histogram bins of A/(A+B) on [0, 1]."""


def load_run_config(run_dir: Path) -> tuple[RunConfig, Any, Any]:
    """The run's :class:`RunConfig`, its dataset TensorDict and :class:`DatasetInfo`."""
    values = json.loads((Path(run_dir) / "config.json").read_text())
    values.pop("algo", None)
    loaded: dict[str, Any] = {}

    def lookup(env: str):
        loaded["data"], loaded["info"] = load_dataset_with_info(env)
        return loaded["info"].family, loaded["info"].name

    config, _ = load_config(values, lookup)
    return config, loaded["data"], loaded["info"]


def load_cbop_loss(run_dir: Path) -> tuple[Any, RunConfig, Any, Any]:
    """The run's CBOP loss with the checkpoint's weights, its config, dataset and info.

    The dynamics ensemble comes from the cache (trained again if the cache
    entry was deleted: same data and config give the same model).
    """
    config, data, info = load_run_config(run_dir)
    state = load_checkpoint(Path(run_dir) / CHECKPOINT_NAME)
    dynamics, _ = load_or_train_dynamics(data, info, config.dynamics, progress=False)
    loss, _ = build_cbop_loss(config, info, dynamics, torch.device("cpu"))
    loss.load_state_dict(state["trainer"]["loss_module"])
    # Only read here: no target updates, so TorchRL's "no target updater" notice is noise.
    warnings.filterwarnings("ignore", message="No target network updater")
    return loss, config, data, info


def value_var_share_histograms(
    returns: torch.Tensor, valid: torch.Tensor, bins: int = SHARE_BINS
) -> list[list[int]]:
    """Per horizon h, counts of ``A/(A+B)`` over states in ``bins`` equal bins of [0, 1].

    Args:
        returns: ``[N, H+1, K, M]`` h-step returns.
        valid: ``[N, H+1]`` horizons kept (see ``rollout_returns``).

    Returns:
        ``H+1`` lists of ``bins`` counts; horizon 0 has no model variance (share 1).
    """
    post = gaussian_posterior(returns, valid)
    share = post.var_value / (post.var_value + post.var_model).clamp_min(1e-12)  # [N, H+1]
    counts = []
    for h in range(share.shape[1]):
        values = share[:, h][valid[:, h]].clamp(0.0, 1.0)
        counts.append(torch.histc(values, bins=bins, min=0.0, max=1.0).long().tolist())
    return counts


@torch.no_grad()
def monte_carlo_conservatism(
    loss: Any, config: RunConfig, family: Any, episodes: int = 5, max_steps: int = 1000
) -> dict[str, float]:
    """Learned Q of the deterministic policy at real start states vs its discounted MC return.

    ``episodes`` environments are reset with seeds ``10_000 + i`` (start states
    from the environment's own reset distribution, which is also where the
    dataset's episodes start); the policy acts deterministically; the MC
    return is ``sum_t gamma^t r_t`` up to the first ``done`` or ``max_steps``.
    The prediction is ``Q_m(s_0, pi(s_0))`` of the trained (online) Q-ensemble,
    averaged over members (``predicted_q_mean``) and its minimum over members.
    """
    from torchrl.envs.utils import ExplorationType, set_exploration_type

    actor = loss.actor_network
    env = make_eval_env(family, episodes, "serial")
    try:
        env.set_seed(10_000)
        params = loss.actor_network_params
        with params.to_module(actor), set_exploration_type(ExplorationType.DETERMINISTIC):
            rollout = env.rollout(max_steps, actor, break_when_all_done=True)
    finally:
        env.close()
    gamma = config.agent.gamma
    reward = rollout.get(("next", "reward"))  # [E, T, 1]
    steps = reward.shape[1]
    discount = gamma ** torch.arange(steps, dtype=reward.dtype)
    discounted = reward * discount[None, :, None]
    mc_return, lengths = episode_returns(discounted, rollout.get(("next", "done")))
    first = rollout[:, 0]
    td = TensorDict(
        {"observation": first.get("observation"), "action": first.get("action")},
        batch_size=[episodes],
    )
    q_rows = loss.value_estimator._q_values(
        td.get("observation"), td.get("action"), loss.qvalue_network_params
    )  # [M, E]
    return {
        "episodes": episodes,
        "gamma": gamma,
        "predicted_q_mean": float(q_rows.mean()),
        "predicted_q_min": float(q_rows.min(0).values.mean()),
        "mc_return_mean": float(mc_return.mean()),
        "mc_return_std": float(mc_return.std(unbiased=False)),
        "episode_length_mean": float(lengths.float().mean()),
        "overestimation": float(q_rows.mean() - mc_return.mean()),
    }


@torch.no_grad()
def analyze_cbop_run(
    run_dir: str | Path,
    num_states: int = 512,
    mc_episodes: int = 5,
    seed: int = 0,
) -> dict[str, Any]:
    """Fig. 5 / Fig. 8 / Table 2 numbers of one CBOP run (see the module doc).

    Args:
        run_dir: a ``scripts/cbop.py`` run directory with ``config.json`` and ``checkpoint.pt``.
        num_states: dataset transitions for the A/(A+B) histograms.
        mc_episodes: real-environment episodes for the conservatism numbers.
        seed: picks the states (the sample state is the first of them).
    """
    loss, config, data, info = load_cbop_loss(Path(run_dir))
    estimator = loss.value_estimator
    generator = torch.Generator().manual_seed(seed)
    rows = torch.randperm(data.shape[0], generator=generator)[:num_states]
    next_obs = data.get(("next", "observation"))[rows].float()
    torch.manual_seed(seed)
    returns, valid, _ = estimator.rollout_returns(next_obs)  # [N, H+1, K, M]
    post = gaussian_posterior(returns[:1], valid[:1])
    sample = returns[0]  # [H+1, K, M]
    rh_sample = {
        "dataset_row": int(rows[0]),
        "returns": sample.reshape(sample.shape[0], -1).tolist(),  # [H+1][K*M]
        "valid": valid[0].tolist(),
        "weights": post.weights[0].tolist(),
        "mu_h": post.mu_h[0].tolist(),
        "std_h": post.var_h[0].sqrt().tolist(),
        "posterior_mean": float(post.mean[0]),
        "posterior_std": float(post.var[0].sqrt()),
    }
    return {
        "mode": config.estimator.mode,
        "horizon": estimator.horizon,
        "num_particles": estimator.num_particles,
        "rh_sample": rh_sample,
        "value_var_share": {
            "bins": SHARE_BINS,
            "num_states": int(next_obs.shape[0]),
            "counts": value_var_share_histograms(returns, valid),
        },
        "conservatism": monte_carlo_conservatism(
            loss, config, info.family, mc_episodes, config.eval.max_steps
        ),
    }


__all__ = [
    "SHARE_BINS",
    "analyze_cbop_run",
    "load_cbop_loss",
    "load_run_config",
    "monte_carlo_conservatism",
    "value_var_share_histograms",
]
