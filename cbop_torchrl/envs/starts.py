"""Episodes started from dataset states restored in the MuJoCo simulator.

The standard evaluation (:func:`~cbop_torchrl.envs.evaluate.evaluate_policy`) starts
every episode from ``env.reset()``: the locomotion tasks reset to one pose with
noise of 0.005, so ten deterministic episodes are close to one trajectory and a
score can swing several-fold between two checkpoints of the same run
(docs/learning.md). :func:`evaluate_from_states` samples the start
instead: each of ``E`` episodes begins in the MuJoCo state of a dataset
observation (:func:`restore_states`, the mechanism of the conservatism measure in
:mod:`cbop_torchrl.trainers.conservatism`) and runs the deterministic policy for
up to ``max_steps`` steps or until the task terminates. The undiscounted return is
normalized with the task's reference scores like a standard episode's; it is a
different quantity (episodes begin mid-gait, some in states about to fall) and is
compared only with the same measure on the same dataset, never with D4RL's table.

Everything here is deterministic: the MuJoCo dynamics are, the restored state
replaces the reset's noise, and the states are chosen by a fixed generator.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, NamedTuple

import gymnasium
import numpy as np
import torch
from tensordict import TensorDict

from cbop_torchrl.envs.evaluate import EvalResult, deterministic_policy
from cbop_torchrl.envs.gym import filter_env_warnings
from cbop_torchrl.registry import Task

START_STATES_SEED = 0
"""Seed of the dataset rows the start-state evaluation uses: the same rows for every run,
algorithm and seed on one dataset, so their scores are paired."""


def pick_start_states(observations: torch.Tensor, count: int, seed: int) -> torch.Tensor:
    """``count`` rows of ``observations`` ``[N, O]`` drawn without replacement by ``seed``.

    The same draw as :func:`cbop_torchrl.trainers.conservatism.start_states`
    (``seed + 1``), returned as float32 on the observations' device.
    """
    generator = torch.Generator().manual_seed(seed + 1)
    rows = torch.randperm(observations.shape[0], generator=generator)[:count]
    return observations[rows.to(observations.device)].float()


def restore_states(task: Any, start_obs: torch.Tensor) -> tuple[list[Any], torch.Tensor]:
    """One gymnasium env per row of ``start_obs`` ``[E, O]``, put in that row's MuJoCo state.

    The locomotion observations are ``qpos[1:]`` and ``qvel``; the x position does not
    change the dynamics, and the observed velocities are clipped to +-10, so this is the
    dataset state up to that clipping.

    Args:
        task: anything with ``gym_id`` and ``gym_kwargs`` (a :class:`~cbop_torchrl.registry.Task`
            or a registry family).
        start_obs: ``[E, O]`` observations.

    Returns:
        The envs and their observations ``[E, O]`` after the restore.
    """
    filter_env_warnings()  # one env per row: MuJoCo would print its notices once per env
    kwargs = getattr(task, "gym_kwargs", None) or {}
    envs = [gymnasium.make(task.gym_id, **kwargs) for _ in range(start_obs.shape[0])]
    obs = []
    for index, env in enumerate(envs):
        env.reset(seed=index)
        raw = env.unwrapped
        nq = raw.model.nq
        state = start_obs[index].double().cpu().numpy()
        raw.set_state(np.concatenate([[0.0], state[: nq - 1]]), state[nq - 1 :])
        obs.append(raw._get_obs())
    return envs, torch.as_tensor(np.stack(obs), dtype=torch.float32)


class RestoredRollout(NamedTuple):
    """Per-episode outcomes of :func:`rollout_restored` (``[E]`` each)."""

    returns: torch.Tensor  # undiscounted, float64
    discounted: torch.Tensor  # sum_t gamma^t r_t, float64
    lengths: torch.Tensor  # steps taken, long
    entropy: torch.Tensor  # sum_{t>=1} gamma^t entropy_fn(s_t) (zeros without entropy_fn)


def actor_device(actor: Any, default: torch.device) -> torch.device:
    """The device of ``actor``'s first parameter (``default`` for a parameter-free callable)."""
    parameters = getattr(actor, "parameters", None)
    if parameters is None:
        return default
    first = next(iter(parameters()), None)
    return default if first is None else first.device


def rollout_restored(
    actor: Any,
    task: Any,
    start_obs: torch.Tensor,
    gamma: float = 1.0,
    max_steps: int = 1000,
    entropy_fn: Callable[[torch.Tensor], torch.Tensor] | None = None,
    device: torch.device | None = None,
) -> RestoredRollout:
    """Runs the deterministic ``actor`` from each dataset state until it ends.

    Each of the ``E`` environments is restored to its row of ``start_obs``
    (:func:`restore_states`); the actor is called once per step on all environments
    still running (on ``device``: by default that of its parameters, or of ``start_obs``
    for a plain callable). An episode ends when the task terminates or truncates, or after
    ``max_steps`` steps.

    This loop steps gymnasium environments itself, where the standard evaluation uses a
    TorchRL collector (:class:`~cbop_torchrl.envs.evaluate.PolicyEvaluator`): a collector
    begins every episode with the environment's ``reset()``, which draws a new start, and
    has no way to begin one in a given MuJoCo state.

    Args:
        actor: a TensorDict module writing ``action`` from ``observation``.
        task: the gymnasium id and keyword arguments of the real environment.
        start_obs: ``[E, O]`` dataset observations.
        gamma: discount of :attr:`RestoredRollout.discounted`.
        max_steps: episode cap.
        entropy_fn: when given, also accumulate ``sum_{t>=1} gamma^t entropy_fn(s_t)``.
        device: where the actor is called (default: its parameters' device).
    """
    envs, batch = restore_states(task, start_obs)
    device = device if device is not None else actor_device(actor, start_obs.device)
    count = start_obs.shape[0]
    returns = torch.zeros(count, dtype=torch.float64)
    discounted = torch.zeros(count, dtype=torch.float64)
    entropy = torch.zeros(count, dtype=torch.float64)
    lengths = torch.zeros(count, dtype=torch.long)
    alive = list(range(count))
    policy = deterministic_policy(actor)  # reads no global exploration type (thread-safe)
    try:
        for step in range(max_steps):
            current = batch[alive].to(device)
            if entropy_fn is not None and step > 0:
                entropy[alive] += gamma**step * entropy_fn(current).double().cpu()
            td = TensorDict({"observation": current}, batch_size=[len(alive)])
            actions = policy(td).get("action").detach().double().cpu().numpy()
            still = []
            for row, index in enumerate(alive):
                ob, reward, terminated, truncated, _ = envs[index].step(actions[row])
                returns[index] += float(reward)
                discounted[index] += gamma**step * float(reward)
                lengths[index] += 1
                batch[index] = torch.as_tensor(ob, dtype=torch.float32)
                if not (terminated or truncated):
                    still.append(index)
            alive = still
            if not alive:
                break
    finally:
        for env in envs:
            env.close()
    return RestoredRollout(returns, discounted, lengths, entropy)


def evaluate_from_states(
    actor: Any,
    task: Task,
    start_obs: torch.Tensor,
    max_steps: int = 1000,
    fork_rng: bool = True,
) -> EvalResult:
    """Scores the deterministic ``actor`` on one episode from each dataset state.

    The global RNG is left as it was (``fork_rng``) and no gradient is recorded, so
    evaluating during training does not change what training samples next (in a thread
    beside training: ``fork_rng=False``, see :func:`~cbop_torchrl.envs.evaluate_policy`).

    Args:
        actor: the policy (its parameters in place).
        task: the real environment and its reference scores (None normalized scores
            without them).
        start_obs: ``[E, O]`` dataset observations (:func:`pick_start_states`).
        max_steps: episode cap, as the standard evaluation's.

    Returns:
        An :class:`~cbop_torchrl.envs.evaluate.EvalResult` of the ``E`` undiscounted returns.
    """
    devices = [torch.cuda.current_device()] if torch.cuda.is_initialized() else []
    with torch.random.fork_rng(devices=devices, enabled=fork_rng), torch.no_grad():
        rollout = rollout_restored(actor, task, start_obs, max_steps=max_steps)
    returns = [float(r) for r in rollout.returns]
    if not all(math.isfinite(r) for r in returns):
        raise FloatingPointError(f"start-state evaluation produced non-finite returns: {returns}")
    return EvalResult(
        returns=returns,
        normalized_scores=[task.normalized_score(r) for r in returns]
        if task.has_reference_scores
        else None,
        lengths=[int(n) for n in rollout.lengths],
    )


__all__ = [
    "START_STATES_SEED",
    "RestoredRollout",
    "actor_device",
    "evaluate_from_states",
    "pick_start_states",
    "restore_states",
    "rollout_restored",
]
