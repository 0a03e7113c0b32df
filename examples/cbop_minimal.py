"""CBOP end to end in one file: dynamics ensemble, BC, FQE, then EDAC on CBOP's target.

    python examples/cbop_minimal.py                          # the defaults below
    python examples/cbop_minimal.py --cbop-steps 500 --psi 3  # any field of Config

Written like TorchRL's sota-implementations (a config, then a ``main`` with explicit
loops), on the hopper demo data bundled with the package. The four stages use the
library's modules; the last one runs
:func:`~cbop_torchrl.objectives.cbop_update.cbop_update`, the gradient step ``cbop-train``
runs (target, critic MSE + EDAC's diversity term, actor, alpha, Adam, Polyak, on one
page), so every Q member regresses on CBOP's conservative target

    y = r + gamma * (1 - terminated) * (mu - psi * sigma - alpha * log pi(a'|s'))

where ``mu`` and ``sigma`` are the posterior mean and deviation of the H + 1 model-based
value expansions of ``Q(s', a')`` (h = 0 is the model-free bootstrap, h = H the longest
rollout of the dynamics ensemble). ``cbop-train`` runs the same stages with caching,
checkpoints, logging and evaluation during training; this file leaves those out, and its
defaults are a short run (the paper trains for a million steps), so the score says little.
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import time
from collections.abc import Callable

import torch
from tensordict import TensorDictBase
from torch.nn.utils import parameters_to_vector
from torchrl.data import ReplayBuffer
from torchrl.objectives import LossModule, SoftUpdate

from cbop_torchrl.config import DynamicsConfig
from cbop_torchrl.data import load_dataset_with_info, make_replay_buffer
from cbop_torchrl.envs import EvalResult, evaluate_policy, make_eval_env, resolve_task
from cbop_torchrl.modules.actor_critic import action_spec, make_actor, make_qvalue_ensemble
from cbop_torchrl.objectives import CBOPLoss
from cbop_torchrl.objectives.cbop_update import cbop_update, make_optimizer
from cbop_torchrl.objectives.pretrain import (
    ROW_KEY,
    BehaviourCloningLoss,
    FittedQEvaluationLoss,
    bootstrap_counts,
)
from cbop_torchrl.registry import Task
from cbop_torchrl.trainers.dynamics import train_dynamics


@dataclasses.dataclass
class Config:
    """Every setting; each is also a command-line flag (``--cbop-steps 500``)."""

    seed: int = 0
    # Dynamics ensemble: Gaussian MLPs of 4 hidden layers; the elites make the rollouts.
    dynamics_members: int = 7
    dynamics_elites: int = 5
    dynamics_hidden: int = 200
    dynamics_epochs: int = 10
    # Actor (2 hidden layers) and Q-ensemble (3), as cbop-train's cpu preset.
    hidden_size: int = 256
    num_qvalue_nets: int = 5
    batch_size: int = 256
    lr: float = 3e-4
    gamma: float = 0.99
    # Pretraining: BC for the actor, FQE of the behaviour policy for the critics.
    bc_steps: int = 5000
    fqe_steps: int = 5000
    fqe_tau: float = 0.1
    # CBOP: rollout horizon H and LCB coefficient psi (the paper's psi for medium-replay),
    # EDAC's diversity weight eta, the three learning rates and the Polyak rate (the paper's).
    cbop_steps: int = 2000
    horizon: int = 5
    psi: float = 2.0
    eta: float = 1.0
    actor_lr: float = 3e-4
    critic_lr: float = 3e-4
    alpha_lr: float = 3e-4
    tau: float = 5e-3
    log_interval: int = 250
    # Evaluation: deterministic episodes in Hopper-v4.
    eval_episodes: int = 5
    eval_max_steps: int = 1000


def parse_config(argv: list[str] | None = None) -> Config:
    """A :class:`Config` from flags named after its fields (``--bc-steps 100``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    for field in dataclasses.fields(Config):
        flag = "--" + field.name.replace("_", "-")
        parser.add_argument(flag, type=type(field.default), default=field.default)
    return Config(**vars(parser.parse_args(argv)))


def pretrain(
    name: str,
    loss: LossModule,
    batches: ReplayBuffer,
    steps: int,
    lr: float,
    after_step: Callable[[], None] = lambda: None,
) -> list[float]:
    """``steps`` Adam steps on the sum of ``loss(batch)["loss_*"]``, each on a ``[batch_size]``
    sample of ``batches``; ``after_step`` runs after each (FQE's target update). Returns the
    loss of every step."""
    optimizer = torch.optim.Adam(loss.parameters(), lr=lr)
    history = []
    for _ in range(steps):
        out = loss(batches.sample())
        total = sum(value for key, value in out.items() if key.startswith("loss_"))
        optimizer.zero_grad()
        total.backward()
        optimizer.step()
        after_step()
        history.append(float(total.detach()))
    others = ", ".join(f"{k} {float(v):.3g}" for k, v in out.items() if not k.startswith("loss_"))
    print(f"{name}: loss {history[0]:.3g} -> {history[-1]:.3g} after {steps} steps ({others})")
    return history


def evaluate(actor: torch.nn.Module, task: Task, config: Config, label: str) -> EvalResult:
    """``config.eval_episodes`` deterministic episodes side by side; prints the score."""
    env = make_eval_env(task, config.eval_episodes)
    result = evaluate_policy(actor, task, env, config.eval_max_steps, seed=config.seed)
    env.close()
    print(
        f"{label}: normalized score {result.normalized_score_mean:.1f} "
        f"(return {result.return_mean:.1f}, {config.eval_episodes} episodes)"
    )
    return result


def fqe_rows(data: TensorDictBase) -> TensorDictBase:
    """The ``[N_fqe]`` rows of ``data`` ``[N]`` whose next dataset action is known (not the
    last row of a cut episode), each numbered in ``ROW_KEY`` to find its bootstrap weights."""
    keys = ("observation", "action", ("next", "observation"), ("next", "reward"),
            ("next", "terminated"), ("next", "action"))  # fmt: skip
    rows = data[data.get("next_action_mask")].select(*keys)
    rows.set(ROW_KEY, torch.arange(rows.shape[0]))
    return rows


def main(config: Config) -> dict:
    """Trains the four stages, evaluates BC and CBOP, and returns what it printed.

    Returns:
        ``normalized_score`` (CBOP's mean over the episodes), ``bc_normalized_score``,
        ``expected_horizon`` (E[h] of CBOP's target at every log step), ``critic_losses``
        (``loss_qvalue`` of every CBOP step) and ``actor_change`` (the L2 distance of
        the actor's parameters from BC's after CBOP).
    """
    start = time.perf_counter()
    torch.manual_seed(config.seed)
    data, info = load_dataset_with_info("demo")  # [N]: observation [N, 11], action [N, 3], next
    task = resolve_task(None, info)  # Hopper-v4, its termination rule and score constants
    obs_dim, act_dim = info.obs_dim, info.action_dim  # 11 and 3
    print(f"data: {info.name}, {data.shape[0]} transitions")

    # 1. Dynamics: s, a -> (s' - s, r) Gaussians, each member on its own bootstrap sample.
    dynamics_config = DynamicsConfig(
        num_members=config.dynamics_members, num_elites=config.dynamics_elites,
        hidden_size=config.dynamics_hidden, max_epochs=config.dynamics_epochs,
        seed=config.seed,
    )  # fmt: skip
    dynamics, fit = train_dynamics(data, task.termination, dynamics_config, progress=False)
    print(f"dynamics: holdout R^2 {fit['holdout_r2_mean']:.2f} after {fit['epochs']} epochs")

    # 2. Behaviour cloning: the actor maximizes the likelihood of the dataset's actions.
    actor = make_actor(obs_dim, act_dim, (config.hidden_size,) * 2)
    bc_batches = make_replay_buffer(data.select("observation", "action"), config.batch_size)
    pretrain("bc", BehaviourCloningLoss(actor), bc_batches, config.bc_steps, config.lr)
    bc_score = evaluate(actor, task, config, "BC actor").normalized_score_mean
    bc_actor_vector = parameters_to_vector(actor.parameters()).detach().clone()

    # 3. FQE: the Q-ensemble evaluates the behaviour policy, r + gamma * mean_m Q'_m(s', a'_data).
    # Without it CBOP would compare model returns with an untrained Q: all weight on h = 0.
    critic_sizes = (config.hidden_size,) * 3
    fqe_data = fqe_rows(data)
    fqe_loss = FittedQEvaluationLoss(
        make_qvalue_ensemble(config.num_qvalue_nets, obs_dim, act_dim, critic_sizes),
        gamma=config.gamma,
        bootstrap_weights=bootstrap_counts(config.num_qvalue_nets, fqe_data.shape[0]),
    )
    fqe_target_update = SoftUpdate(fqe_loss, tau=config.fqe_tau)
    fqe_batches = make_replay_buffer(fqe_data, config.batch_size)
    pretrain("fqe", fqe_loss, fqe_batches, config.fqe_steps, config.lr, fqe_target_update.step)

    # 4. CBOP on the BC actor and the FQE critics: CBOPLoss (TorchRL's SACLoss with EDAC's
    # diversity term) whose critic target is CBOP's: the model rollouts from s', the h-step
    # returns, their posterior and its lower confidence bound mu - psi * sigma.
    loss = CBOPLoss(
        actor,  # its parameters are shared: training the loss trains this actor
        make_qvalue_ensemble(config.num_qvalue_nets, obs_dim, act_dim, critic_sizes),
        dynamics, action_spec=action_spec(act_dim), gamma=config.gamma,
        horizon=config.horizon, psi=config.psi, eta=config.eta, seed=config.seed,
    )  # fmt: skip
    loss.qvalue_network_params.data.update_(fqe_loss.qvalue_network_params.data)
    # Built after the FQE weights are in: the updater starts the target ensemble as a copy.
    target_update = SoftUpdate(loss, tau=config.tau)
    optimizer = make_optimizer(
        loss, actor_lr=config.actor_lr, critic_lr=config.critic_lr, alpha_lr=config.alpha_lr
    )
    cbop_batches = make_replay_buffer(
        data.select("observation", "action", ("next", "observation"), ("next", "reward"),
                    ("next", "terminated"), ("next", "done")),
        config.batch_size,
    )  # fmt: skip
    expected_horizons, critic_losses = [], []
    for step in range(1, config.cbop_steps + 1):
        # The step cbop-train runs: target, critic + EDAC, actor, alpha, Adam, Polyak.
        losses = cbop_update(loss, optimizer, target_update, cbop_batches.sample())
        critic_losses.append(float(losses["loss_qvalue"]))
        if step % config.log_interval == 0 or step == config.cbop_steps:
            # E[h] = sum_h w_h h: how far, on average, the posterior trusts the model.
            target = losses["cbop"]
            expected_horizons.append(float(target["expected_horizon"]))
            print(
                f"cbop step {step}: loss_qvalue {critic_losses[-1]:.3g} "
                f"(EDAC {float(losses['edac_penalty']):.3g}), "
                f"loss_actor {float(losses['loss_actor']):.3g}, "
                f"alpha {float(losses['alpha']):.3g}, E[h] {expected_horizons[-1]:.2f} "
                f"of H = {config.horizon}, mean target {float(target['target_mean']):.1f}"
            )
    if not all(math.isfinite(loss) for loss in critic_losses):
        raise FloatingPointError("a CBOP critic loss was not finite")

    score = evaluate(actor, task, config, "CBOP actor").normalized_score_mean
    actor_change = (parameters_to_vector(actor.parameters()).detach() - bc_actor_vector).norm()
    print(f"done in {time.perf_counter() - start:.0f} s")
    return {
        "normalized_score": score,
        "bc_normalized_score": bc_score,
        "expected_horizon": expected_horizons,
        "critic_losses": critic_losses,
        "actor_change": float(actor_change),
    }


if __name__ == "__main__":
    main(parse_config())
