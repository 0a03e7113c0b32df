"""The extras: dynamics-training throughput and the vectorized evaluator's env steps/s."""

from __future__ import annotations

import time

import torch

from benchmarks.speed.measure import sync
from benchmarks.speed.sizes import Size, env_sizes, mlp_flops
from cbop_torchrl.modules.actor_critic import make_actor
from cbop_torchrl.modules.dynamics import GaussianEnsemble
from cbop_torchrl.registry import get_family


def bench_dynamics_training(device: torch.device, size: Size, steps: int) -> dict:
    """Minibatch steps of the project's training epoch on synthetic standardized data.

    On CUDA also with the minibatch step captured as a CUDA graph (``*_captured``), as
    the pipeline trains with ``cuda_graph`` on a GPU.
    """
    # The trainer's inner loop: the same forward/NLL/backward/Adam step.
    from cbop_torchrl.trainers.dynamics import DynamicsConfig, make_minibatch_step, train_epoch

    obs_dim, act_dim = env_sizes(size.family)
    config = DynamicsConfig(
        num_members=size.dyn_members,
        num_elites=size.particles,
        hidden_size=size.dyn_hidden[0],
        num_layers=len(size.dyn_hidden),
        weight_decay=(1e-4,) * (len(size.dyn_hidden) + 1),
    )
    rows = steps * config.batch_size
    x = torch.randn(rows, obs_dim + act_dim, device=device)
    y = torch.randn(rows, obs_dim + 1, device=device)
    bootstrap = torch.randint(rows, (size.dyn_members, rows), device=device)
    gen = torch.Generator(device=device).manual_seed(0)
    samples = rows * size.dyn_members  # (row, member) pairs
    flops = 3 * samples * mlp_flops([obs_dim + act_dim, *size.dyn_hidden, 2 * (obs_dim + 1)])
    result = {}
    for suffix, capture in (("", False), ("_captured", True)):
        if capture and device.type != "cuda":
            continue
        ensemble = GaussianEnsemble(obs_dim, act_dim, size.dyn_members, size.dyn_hidden)
        ensemble = ensemble.to(device)
        step, captured = make_minibatch_step(ensemble, x, y, config, capture)
        warm = bootstrap[:, : 5 * config.batch_size]  # warm-up (and the capture)
        train_epoch(step, warm, gen, config, captured)
        sync(device)
        start = time.perf_counter()
        train_epoch(step, bootstrap, gen, config, captured)
        sync(device)
        seconds = time.perf_counter() - start
        result[f"dynamics_train_samples_per_s{suffix}"] = samples / seconds
        result[f"dynamics_train_gflops{suffix}"] = flops / seconds / 1e9
        result[f"dynamics_train_ms_per_step{suffix}"] = seconds / steps * 1e3
    return result


def bench_evaluation(num_envs: int, max_steps: int, hidden: tuple[int, ...]) -> dict:
    """Env steps/s of the vectorized evaluator vs one environment at a time."""
    from cbop_torchrl.envs import evaluate_policy, make_eval_env

    family = get_family("hopper")
    actor = make_actor(*env_sizes("hopper"), hidden)
    env = make_eval_env(family, num_envs)
    start = time.perf_counter()
    result = evaluate_policy(actor, family, env, max_steps=max_steps)
    vec_seconds = time.perf_counter() - start
    vec_steps = sum(result.lengths)
    env.close()
    single = make_eval_env(family, 1)
    single_steps, start = 0, time.perf_counter()
    for episode in range(num_envs):
        single_steps += sum(evaluate_policy(actor, family, single, max_steps, seed=episode).lengths)
    single_seconds = time.perf_counter() - start
    single.close()
    return {
        "eval_vectorized_steps_per_s": vec_steps / vec_seconds,
        "eval_single_env_steps_per_s": single_steps / single_seconds,
        "eval_num_envs": num_envs,
    }
