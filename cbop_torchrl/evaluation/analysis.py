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
  dataset states against its discounted Monte-Carlo return from the same
  states in the real environment (Table 2); :func:`analyze_baseline_run`
  gives the same numbers for TD3+BC, IQL and CQL.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase

from cbop_torchrl.config import RunConfig, load_config
from cbop_torchrl.data import load_dataset_with_info
from cbop_torchrl.envs import resolve_task
from cbop_torchrl.objectives.posterior import gaussian_posterior
from cbop_torchrl.registry import Task
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
    task = resolve_task(config.task, info)
    dynamics, _ = load_or_train_dynamics(
        data, info, config.dynamics, progress=False, termination=task.termination
    )
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


def ensemble_q(
    qvalue_network: Any, stacked_params: TensorDictBase, obs: torch.Tensor, action: torch.Tensor
) -> torch.Tensor:
    """``Q_m(obs, action)`` for every member: ``[N, O], [N, A] -> [M, N]``."""
    td = TensorDict({"observation": obs, "action": action}, batch_size=obs.shape[:1])
    values = []
    for member in range(stacked_params.shape[0]):
        with stacked_params[member].to_module(qvalue_network):
            values.append(qvalue_network(td.clone()).get("state_action_value").squeeze(-1))
    return torch.stack(values)


def rollout_from_observations(
    actor: Any, task: Task, start_obs: torch.Tensor, gamma: float, max_steps: int = 1000
) -> tuple[torch.Tensor, torch.Tensor]:
    """Discounted Monte-Carlo returns of the deterministic ``actor`` from dataset states.

    Each of the ``E`` environments (gymnasium ``task.gym_id``) is reset and
    then put in the MuJoCo state the observation describes (the locomotion
    observations are ``qpos[1:]`` and ``qvel``; the x position does not change
    the dynamics, and the observed velocities are clipped to +-10, so this is
    the dataset state up to that clipping). The actor is called once per step
    on all environments still running.

    Returns:
        ``[E]`` returns ``sum_t gamma^t r_t`` up to termination or ``max_steps``,
        and ``[E]`` episode lengths.
    """
    import gymnasium
    import numpy as np
    from torchrl.envs.utils import ExplorationType, set_exploration_type

    count = start_obs.shape[0]
    envs = [gymnasium.make(task.gym_id, **task.gym_kwargs) for _ in range(count)]
    obs = []
    for index, env in enumerate(envs):
        env.reset(seed=index)
        raw = env.unwrapped
        nq = raw.model.nq
        state = start_obs[index].double().numpy()
        raw.set_state(np.concatenate([[0.0], state[: nq - 1]]), state[nq - 1 :])
        obs.append(raw._get_obs())
    returns = torch.zeros(count, dtype=torch.float64)
    lengths = torch.zeros(count, dtype=torch.long)
    alive = list(range(count))
    batch = torch.as_tensor(np.stack(obs), dtype=torch.float32)
    with set_exploration_type(ExplorationType.DETERMINISTIC):
        for step in range(max_steps):
            td = TensorDict({"observation": batch[alive]}, batch_size=[len(alive)])
            actions = actor(td).get("action").double().numpy()
            still = []
            for row, index in enumerate(alive):
                ob, reward, terminated, truncated, _ = envs[index].step(actions[row])
                returns[index] += gamma**step * float(reward)
                lengths[index] += 1
                batch[index] = torch.as_tensor(ob, dtype=torch.float32)
                if not (terminated or truncated):
                    still.append(index)
            alive = still
            if not alive:
                break
    for env in envs:
        env.close()
    return returns.float(), lengths


@torch.no_grad()
def monte_carlo_conservatism(
    loss: Any,
    task: Task,
    start_obs: torch.Tensor,
    gamma: float,
    max_steps: int = 1000,
) -> dict[str, Any]:
    """Paper Table 2: learned ``Q(s, pi(s))`` at dataset states vs the real discounted return.

    Works for any TorchRL loss with ``actor_network(_params)`` and
    ``qvalue_network(_params)`` (CBOP's SAC loss, TD3+BC, IQL, CQL). The
    prediction is the Q-ensemble's mean (and min) over members at the
    deterministic action; ``overestimation`` is the mean over states of
    prediction minus MC return (negative: conservative).
    """
    actor = loss.actor_network
    with loss.actor_network_params.to_module(actor):
        from torchrl.envs.utils import ExplorationType, set_exploration_type

        with set_exploration_type(ExplorationType.DETERMINISTIC):
            td = TensorDict({"observation": start_obs}, batch_size=start_obs.shape[:1])
            action = actor(td).get("action")
        mc_return, lengths = rollout_from_observations(actor, task, start_obs, gamma, max_steps)
    q = ensemble_q(loss.qvalue_network, loss.qvalue_network_params, start_obs, action)  # [M, E]
    difference = q.mean(0) - mc_return
    return {
        "states": int(start_obs.shape[0]),
        "gamma": gamma,
        "predicted_q_mean": float(q.mean()),
        "predicted_q_min": float(q.min(0).values.mean()),
        "mc_return_mean": float(mc_return.mean()),
        "mc_return_std": float(mc_return.std(unbiased=False)),
        "episode_length_mean": float(lengths.float().mean()),
        "overestimation": float(difference.mean()),
        "overestimation_max": float(difference.max()),
        "differences": difference.tolist(),
    }


def _start_states(data: Any, count: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed + 1)
    rows = torch.randperm(data.shape[0], generator=generator)[:count]
    return data.get("observation")[rows].float()


@torch.no_grad()
def analyze_baseline_run(run_dir: str | Path, mc_states: int = 5, seed: int = 0) -> dict | None:
    """Table 2 numbers for a TD3+BC/IQL/CQL run (None for BC, which has no Q-function)."""
    from cbop_torchrl.baselines import AlgoConfig, build_baseline

    values = json.loads((Path(run_dir) / "config.json").read_text())
    algo = AlgoConfig.from_dict(values["algo"])
    if algo.name == "bc":
        return None
    config, data, info = load_run_config(run_dir)
    parts = build_baseline(algo, config, info, torch.device("cpu"))
    state = load_checkpoint(Path(run_dir) / CHECKPOINT_NAME)
    parts.loss.load_state_dict(state["trainer"]["loss_module"])
    start = _start_states(data, mc_states, seed)
    return {
        "conservatism": monte_carlo_conservatism(
            parts.loss,
            resolve_task(config.task, info),
            start,
            config.agent.gamma,
            config.eval.max_steps,
        )
    }


@torch.no_grad()
def analyze_cbop_run(
    run_dir: str | Path,
    num_states: int = 512,
    mc_states: int = 5,
    seed: int = 0,
) -> dict[str, Any]:
    """Fig. 5 / Fig. 8 / Table 2 numbers of one CBOP run (see the module doc).

    Args:
        run_dir: a ``scripts/cbop.py`` run directory with ``config.json`` and ``checkpoint.pt``.
        num_states: dataset transitions for the A/(A+B) histograms.
        mc_states: dataset states the policy is rolled out from in the real environment.
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
            loss,
            resolve_task(config.task, info),
            _start_states(data, mc_states, seed),
            config.agent.gamma,
            config.eval.max_steps,
        ),
    }


__all__ = [
    "SHARE_BINS",
    "analyze_baseline_run",
    "analyze_cbop_run",
    "ensemble_q",
    "rollout_from_observations",
    "load_cbop_loss",
    "load_run_config",
    "monte_carlo_conservatism",
    "value_var_share_histograms",
]
