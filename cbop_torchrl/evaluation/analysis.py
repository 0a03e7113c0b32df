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
  ``MC_STATES`` dataset states against its discounted Monte-Carlo return from
  the same states in the real environment (Table 2), raw and with the soft
  critic's entropy part removed
  (:func:`~cbop_torchrl.trainers.conservatism.dataset_conservatism`);
  :func:`analyze_baseline_run` gives the same numbers for TD3+BC, IQL and CQL.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torchrl.objectives import SoftUpdate

from cbop_torchrl.config import RunConfig, load_config
from cbop_torchrl.data import load_dataset_with_info
from cbop_torchrl.envs import resolve_task
from cbop_torchrl.objectives.posterior import gaussian_posterior
from cbop_torchrl.trainers.checkpoint import (
    CHECKPOINT_NAME,
    check_recorded_gym_id,
    load_checkpoint,
)
from cbop_torchrl.trainers.conservatism import (
    MC_STATES,
    dataset_conservatism,
    member_q_values,
    rollout_from_observations,
    soft_critic_alpha,
    start_states,
)
from cbop_torchrl.trainers.dynamics import load_or_train_dynamics
from cbop_torchrl.trainers.offline import build_cbop_loss

ensemble_q = member_q_values
"""``Q_m(obs, action)`` for every member ``[M, N]`` (the name this module always exported)."""

SHARE_BINS = 20
"""Histogram bins of A/(A+B) on [0, 1]."""


def load_run_config(run_dir: Path) -> tuple[RunConfig, Any, Any]:
    """The run's :class:`RunConfig`, its dataset TensorDict and :class:`DatasetInfo`."""
    path = Path(run_dir) / "config.json"
    values = json.loads(path.read_text())
    values.pop("algo", None)
    # No command line names the task here: a stored module-qualified id is never trusted.
    check_recorded_gym_id(
        str((values.get("task") or {}).get("gym_id")),
        None,
        f"the run's config {str(path)!r}",
        "leave that run out of the report, or pass analysis=false (no environment is made)",
    )
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
    # The analysis runs under no_grad; training the model again (its cache entry was
    # deleted) needs gradients.
    with torch.enable_grad():
        dynamics, _ = load_or_train_dynamics(
            data, info, config.dynamics, progress=False, termination=task.termination
        )
    loss, _ = build_cbop_loss(config, info, dynamics, torch.device("cpu"))
    # Associated as in training (TorchRL warns on a loss without one); never stepped here,
    # and built before the checkpoint's weights are loaded, so they are kept as stored.
    SoftUpdate(loss, tau=config.agent.tau)
    loss.load_state_dict(state["trainer"]["loss_module"])
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
def analyze_baseline_run(
    run_dir: str | Path, mc_states: int = MC_STATES, seed: int = 0
) -> dict | None:
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
    # No baseline's critic target holds an entropy term (CQL runs with a deterministic backup).
    return {
        "conservatism": dataset_conservatism(
            parts.loss,
            resolve_task(config.task, info),
            start_states(data, mc_states, seed),
            config.agent.gamma,
            alpha=0.0,
            max_steps=config.eval.max_steps,
        )
    }


@torch.no_grad()
def analyze_cbop_run(
    run_dir: str | Path,
    num_states: int = 512,
    mc_states: int = MC_STATES,
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
        "conservatism": dataset_conservatism(
            loss,
            resolve_task(config.task, info),
            start_states(data, mc_states, seed),
            config.agent.gamma,
            alpha=soft_critic_alpha(loss),
            max_steps=config.eval.max_steps,
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
    "dataset_conservatism",
    "value_var_share_histograms",
]
