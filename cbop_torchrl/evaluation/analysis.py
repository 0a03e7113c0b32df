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

And the numbers a ranking rests on, from a run's evaluation history alone
(:func:`score_measures`, one run) and from the summaries of a row's seeds
(:func:`row_intervals`): the final score as the mean of the last
:data:`FINAL_WINDOW` evaluations, the mean of the last :data:`LAST_WINDOW`, the
evaluation-to-evaluation noise, and a bootstrap interval over seeds and
evaluations, for the reset evaluation and for the start-state evaluation
(``eval.start_states``, :mod:`cbop_torchrl.envs.starts`).
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torchrl.objectives import SoftUpdate

from cbop_torchrl.config import RunConfig, load_config
from cbop_torchrl.data import load_dataset_with_info
from cbop_torchrl.envs import resolve_task
from cbop_torchrl.envs.starts import START_STATES_SEED
from cbop_torchrl.evaluation.protocol import (
    final_scores,
    final_window,
    seed_se,
    self_resolution,
    t_interval,
)
from cbop_torchrl.io import read_regular_text
from cbop_torchrl.objectives.posterior import gaussian_posterior
from cbop_torchrl.trainers.cbop_stage import build_cbop_loss
from cbop_torchrl.trainers.checkpoint import (
    CHECKPOINT_NAME,
    check_recorded_gym_id,
    load_checkpoint,
)
from cbop_torchrl.trainers.conservatism import (
    MC_STATES,
    STATES_SEED,
    dataset_conservatism,
    member_q_values,
    rollout_from_observations,
    soft_critic_alpha,
    start_states,
)
from cbop_torchrl.trainers.dynamics import load_or_train_dynamics
from cbop_torchrl.trainers.recipes import reward_scale
from cbop_torchrl.trainers.run_state import loss_weights

ensemble_q = member_q_values
"""``Q_m(obs, action)`` for every member ``[M, N]`` (the name this module always exported)."""

SHARE_BINS = 20
"""Histogram bins of A/(A+B) on [0, 1]."""


def load_run_config(run_dir: Path) -> tuple[RunConfig, Any, Any]:
    """The run's :class:`RunConfig`, its dataset TensorDict and :class:`DatasetInfo`."""
    path = Path(run_dir) / "config.json"
    values = json.loads(read_regular_text(path))  # never blocks on a FIFO
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
    loss.load_state_dict(loss_weights(state))
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
    run_dir: str | Path, mc_states: int = MC_STATES, seed: int = STATES_SEED
) -> dict | None:
    """Table 2 numbers for a TD3+BC/IQL/CQL run (None for BC, which has no Q-function)."""
    from cbop_torchrl.baselines import AlgoConfig, build_baseline

    values = json.loads(read_regular_text(Path(run_dir) / "config.json"))
    algo = AlgoConfig.from_dict(values["algo"])
    if algo.name == "bc":
        return None
    config, data, info = load_run_config(run_dir)
    parts = build_baseline(algo, config, info, torch.device("cpu"), data)
    state = load_checkpoint(Path(run_dir) / CHECKPOINT_NAME)
    parts.loss.load_state_dict(loss_weights(state))
    scale = reward_scale(algo.reward_scale, data)  # Q is in the scaled rewards' units
    # No baseline's critic target holds an entropy term (CQL runs with a deterministic backup).
    return {
        "conservatism": dataset_conservatism(
            parts.loss,
            resolve_task(config.task, info),
            start_states(data, mc_states, seed),
            config.agent.gamma,
            alpha=0.0,
            max_steps=config.eval.max_steps,
            value_scale=scale,
        )
    }


@torch.no_grad()
def analyze_cbop_run(
    run_dir: str | Path,
    num_states: int = 512,
    mc_states: int = MC_STATES,
    seed: int = STATES_SEED,
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


# ----------------------------------------------------------------- score measures
FINAL_WINDOW = 3
"""A run's final score: the mean of its last this many evaluations (as the report's)."""
LAST_WINDOW = 10
"""The less noisy number beside it: the mean of the last this many evaluations."""
CI_LEVEL = 0.95
BOOTSTRAP_REPS = 4000

#: ``eval_history`` key of each measure's score per evaluation.
MEASURE_KEYS = {
    "reset": "normalized_score_mean",
    "starts": "start_normalized_score_mean",
}

FINAL_MEASURE = (
    "final_normalized_score = mean of the last {final} evaluations of the deterministic policy "
    "(every {interval} gradient steps, {episodes} episodes from env.reset(), D4RL-normalized); "
    "last10_normalized_score = mean of the last {last} evaluations; "
    "*_ci95 = 95% percentile bootstrap of that mean over the evaluations; "
    "eval_noise = std of consecutive evaluations' differences / sqrt(2)"
)
"""How :func:`score_measures` describes the measure in a summary (``final_measure``)."""


def history_curve(history: Sequence[dict[str, Any]], key: str) -> list[list[float]]:
    """``[[step, value], ...]`` of the records in ``history`` holding a number under ``key``."""
    points = [
        [int(record["step"]), float(record[key])]
        for record in history
        if isinstance(record.get(key), (int, float)) and not isinstance(record.get(key), bool)
    ]
    return sorted(points, key=lambda point: point[0])


def window(curve: Sequence[Sequence[float]], size: int) -> list[float]:
    """The scores of the last ``size`` points of a step-sorted ``[[step, score], ...]``."""
    return [float(score) for _, score in sorted(curve, key=lambda p: p[0])[-size:]]


def consecutive_noise(values: Sequence[float]) -> float | None:
    """The noise of one evaluation, from how much consecutive evaluations differ.

    ``std(v[i+1] - v[i]) / sqrt(2)``: for a slowly changing mean with independent noise of
    std ``sigma`` per evaluation this estimates ``sigma`` (a drift inflates it a little).
    None with fewer than 3 values.
    """
    if len(values) < 3:
        return None
    differences = np.diff(np.asarray(values, dtype=float))
    return float(differences.std(ddof=1) / math.sqrt(2))


def bootstrap_mean_interval(
    values: Sequence[float], reps: int = BOOTSTRAP_REPS, seed: int = 0, level: float = CI_LEVEL
) -> list[float] | None:
    """Percentile bootstrap interval ``[low, high]`` of the mean of ``values`` (None if empty)."""
    data = np.asarray(values, dtype=float)
    if data.size == 0:
        return None
    rng = np.random.default_rng(seed)
    means = data[rng.integers(0, data.size, size=(reps, data.size))].mean(axis=1)
    tail = (1 - level) / 2
    return [float(np.quantile(means, tail)), float(np.quantile(means, 1 - tail))]


def curve_measures(curve: Sequence[Sequence[float]]) -> dict[str, Any]:
    """Final (last :data:`FINAL_WINDOW`), last :data:`LAST_WINDOW`, its interval and the noise."""
    last = window(curve, LAST_WINDOW)
    final = window(curve, FINAL_WINDOW)
    return {
        "final_normalized_score": statistics.fmean(final) if final else None,
        "last10_normalized_score": statistics.fmean(last) if last else None,
        "last10_normalized_score_ci95": bootstrap_mean_interval(last),
        "eval_noise": consecutive_noise(last),
        "evaluations": len(curve),
    }


def score_measures(
    history: Sequence[dict[str, Any]],
    interval: int,
    episodes: int,
    start_states: int = 0,
) -> dict[str, Any]:
    """What a run's summary states about its score, from its ``eval_history``.

    Args:
        history: ``results.json``'s ``eval_history``.
        interval: gradient steps between evaluations (``eval.interval``).
        episodes: reset episodes per evaluation (``eval.episodes``).
        start_states: dataset states of the start-state evaluation (0: none was made).

    Returns:
        ``final_measure`` (the definition, in words), the reset evaluation's
        ``last10_normalized_score``, ``last10_normalized_score_ci95`` and ``eval_noise``,
        and, when the history holds the start-state evaluation, ``start_states``: the
        same numbers for it with its ``curve``, ``states`` and ``seed``.
    """
    reset = curve_measures(history_curve(history, MEASURE_KEYS["reset"]))
    measures: dict[str, Any] = {
        "final_measure": FINAL_MEASURE.format(
            final=FINAL_WINDOW, interval=interval, episodes=episodes, last=LAST_WINDOW
        ),
        "last10_normalized_score": reset["last10_normalized_score"],
        "last10_normalized_score_ci95": reset["last10_normalized_score_ci95"],
        "eval_noise": reset["eval_noise"],
    }
    start_curve = history_curve(history, MEASURE_KEYS["starts"])
    if start_curve:
        measures["start_states"] = {
            "states": int(start_states),
            "seed": START_STATES_SEED,
            "measure": (
                f"one deterministic episode (up to eval.max_steps) from each of {start_states} "
                "fixed dataset states restored in the simulator, undiscounted return "
                "D4RL-normalized; compare only with the same measure on the same dataset"
            ),
            "curve": start_curve,
            **curve_measures(start_curve),
        }
    return measures


def _row_curves(summary: dict[str, Any], measure: str) -> list[list[float]]:
    if measure == "reset":
        return [list(point) for point in summary.get("curve", [])]
    return [list(point) for point in (summary.get("start_states") or {}).get("curve", [])]


def hierarchical_bootstrap(
    per_seed: Sequence[Sequence[float]], reps: int = BOOTSTRAP_REPS, seed: int = 0
) -> np.ndarray:
    """Bootstrap means of a row: resample the seeds, then each seed's evaluations.

    Args:
        per_seed: for each seed, its evaluations in the window (equal lengths not needed).

    Returns:
        ``[reps]`` means over the resampled seeds of each resampled seed's mean.
    """
    rng = np.random.default_rng(seed)
    arrays = [np.asarray(values, dtype=float) for values in per_seed]
    picks = rng.integers(0, len(arrays), size=(reps, len(arrays)))
    means = np.empty(reps)
    for rep in range(reps):
        seed_means = []
        for index in picks[rep]:
            values = arrays[index]
            seed_means.append(values[rng.integers(0, values.size, size=values.size)].mean())
        means[rep] = np.mean(seed_means)
    return means


def _row_fields(name: str, per_seed: list[list[float]], reps: int, seed: int) -> dict:
    """A row's ``<name>`` with its spread over seeds and, beside it, the bootstrap's.

    ``<name>``: the mean over seeds of each seed's mean; ``<name>_per_seed``; over the seeds
    (None with one seed: one run has no spread over seeds): ``<name>_se``, ``<name>_ci95``
    (Student t) and ``<name>_min_difference`` (:func:`~cbop_torchrl.evaluation.protocol.
    self_resolution`); and ``<name>_bootstrap_ci95`` / ``<name>_bootstrap_se`` from
    :func:`hierarchical_bootstrap` (seeds, then evaluations: descriptive, never a resolution).
    """
    seed_means = [statistics.fmean(values) for values in per_seed]
    means = hierarchical_bootstrap(per_seed, reps, seed)
    tail = (1 - CI_LEVEL) / 2
    return {
        name: statistics.fmean(seed_means),
        f"{name}_per_seed": seed_means,
        f"{name}_se": seed_se(seed_means),
        f"{name}_ci95": t_interval(seed_means),
        f"{name}_min_difference": self_resolution(seed_means),
        f"{name}_bootstrap_ci95": [
            float(np.quantile(means, tail)),
            float(np.quantile(means, 1 - tail)),
        ],
        f"{name}_bootstrap_se": float(means.std(ddof=1)),
    }


def row_intervals(
    summaries: Sequence[dict[str, Any]],
    window_size: int = LAST_WINDOW,
    reps: int = BOOTSTRAP_REPS,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """One entry per (dataset, variant, measure) of ``summaries``: the row's score and interval.

    For the reset evaluation (``measure: reset``, the summaries' ``curve``) and the
    start-state evaluation (``measure: starts``, ``start_states.curve``, where present),
    the row's ``final`` (the mean over seeds of each seed's mean of its last
    :func:`~cbop_torchrl.evaluation.protocol.final_window` evaluations: 4 for a ``-50k``
    row, 3 otherwise; ``final_window``) and ``last10`` (the same over the last
    ``window_size``), each with (:func:`_row_fields`):

    - ``*_se``, ``*_ci95``: the standard error and Student-t interval over the per-seed
      means (None for a one-seed row);
    - ``*_min_difference``: how far another row of the same spread and seeds must be from
      this one to differ (Welch's t resolution; for two rows in general
      :func:`~cbop_torchrl.evaluation.protocol.resolution` of their ``*_per_seed``);
    - ``*_bootstrap_ci95``, ``*_bootstrap_se``: the hierarchical bootstrap over seeds and
      evaluations, a description of the noise and never a resolution;

    and ``across_seed_std`` (the std over seeds of their last-``window_size`` means) and
    ``eval_noise`` (the mean over seeds of :func:`consecutive_noise` in that window).
    Summaries made on different versions of a dataset (``dataset_provenance.sha256``,
    ``dataset_sha256`` in the row: its first 12 characters) are separate rows.
    """
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = {}
    for summary in summaries:
        sha = str((summary.get("dataset_provenance") or {}).get("sha256") or "")[:12]
        groups.setdefault((summary["dataset"], summary["variant"], sha), []).append(summary)
    rows = []
    for (dataset, variant, sha), members in sorted(groups.items()):
        members = sorted(members, key=lambda s: int(s["seed"]))
        for measure in MEASURE_KEYS:
            curves = {int(s["seed"]): _row_curves(s, measure) for s in members}
            curves = {k: v for k, v in curves.items() if v}
            if not curves:
                continue
            lasts = [window(curve, window_size) for curve in curves.values()]
            finals = [final_scores(curve, variant) for curve in curves.values()]
            last_means = [statistics.fmean(values) for values in lasts]
            noises = [n for n in map(consecutive_noise, lasts) if n is not None]
            rows.append(
                {
                    "dataset": dataset,
                    "variant": variant,
                    "dataset_sha256": sha or None,
                    "measure": measure,
                    "seeds": sorted(curves),
                    "final_window": final_window(variant),
                    **_row_fields("final", finals, reps, seed),
                    **_row_fields("last10", lasts, reps, seed),
                    "across_seed_std": statistics.stdev(last_means)
                    if len(last_means) > 1
                    else None,
                    "eval_noise": statistics.fmean(noises) if noises else None,
                    "window": window_size,
                }
            )
    return rows


__all__ = [
    "FINAL_WINDOW",
    "LAST_WINDOW",
    "MEASURE_KEYS",
    "SHARE_BINS",
    "bootstrap_mean_interval",
    "consecutive_noise",
    "curve_measures",
    "hierarchical_bootstrap",
    "history_curve",
    "row_intervals",
    "score_measures",
    "t_interval",
    "analyze_baseline_run",
    "analyze_cbop_run",
    "ensemble_q",
    "rollout_from_observations",
    "load_cbop_loss",
    "load_run_config",
    "dataset_conservatism",
    "value_var_share_histograms",
]
