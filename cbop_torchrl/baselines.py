"""Model-free offline baselines on the pipeline's data, evaluation and run-directory format.

Four algorithms, each a TorchRL loss with a small config (``cbop_torchrl/configs/algo/*.yaml``):

- ``bc``: behaviour cloning (:class:`~cbop_torchrl.objectives.pretrain.BehaviourCloningLoss`,
  the loss of the pipeline's BC stage);
- ``td3bc``: TD3+BC (``torchrl.objectives.TD3BCLoss``), a deterministic tanh actor,
  actor updated every ``policy_delay`` steps;
- ``iql``: implicit Q-learning (``torchrl.objectives.IQLLoss``) with a state-value network;
- ``cql``: conservative Q-learning (``torchrl.objectives.CQLLoss`` with its penalty as the
  authors' code computes it: :class:`~cbop_torchrl.objectives.cql.AuthorsCQLLoss`),
  auto-tuned entropy.

Training runs on TorchRL's ``Trainer`` with the same hooks as the CBOP stage
(:mod:`cbop_torchrl.trainers.hooks`, registered by
:func:`cbop_torchrl.trainers.offline_training.build_offline_training`): the
gradient-step "collector", the replay-buffer sampler, periodic evaluation,
metrics, the target-network updater and the atomic checkpoint, so a baseline
run directory holds the same
``results.json``/``config.json``/``checkpoint.pt``/``policy.pt``/CSV logs as a
CBOP run and resumes the same way. ``results.json`` additionally names the
``algo``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, fields
from functools import partial
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModuleBase
from torch import nn
from torchrl.modules import MLP, ValueOperator
from torchrl.objectives import CQLLoss, IQLLoss, LossModule, SoftUpdate, TD3BCLoss

from cbop_torchrl.config import RunConfig, range_problems
from cbop_torchrl.data import DatasetInfo, make_replay_buffer
from cbop_torchrl.data.transitions import warn_about_action_range
from cbop_torchrl.envs import make_eval_env
from cbop_torchrl.modules.actor_critic import (
    ACTOR_BUILDERS,
    action_spec,
    make_deterministic_actor,
    make_qvalue_ensemble,
)
from cbop_torchrl.modules.standardize import observation_statistics, standardize_observation
from cbop_torchrl.objectives.cql import (
    CRITIC_PASSES,
    LOGSUMEXP_OVER,
    NEXT_ACTIONS_SCORED_AT,
    AuthorsCQLLoss,
    critics_loop,
)
from cbop_torchrl.objectives.pretrain import ACTION_EPS, BehaviourCloningLoss
from cbop_torchrl.trainers.checkpoint import CheckpointHook
from cbop_torchrl.trainers.datasize import check_dataset_size, warn_about_terminals
from cbop_torchrl.trainers.decisions import seed_stage
from cbop_torchrl.trainers.grouped_step import GroupedOptimizationStepper
from cbop_torchrl.trainers.offline_run import OfflineRun, write_results
from cbop_torchrl.trainers.offline_training import (
    CBOP_KEYS,
    build_offline_training,
    final_evaluation,
    restore_final_records,
)
from cbop_torchrl.trainers.recipes import ACTOR_LR_SCHEDULES, REWARD_SCALES, reward_scale

POLICY_DISTRIBUTIONS = ("tanh_normal", "tanh_mean_gaussian")
"""IQL's actor: a tanh-squashed Gaussian (the project's other stochastic actors') or a
Gaussian with a tanh'd mean and a state-independent std (IQL's authors' code)."""

UPDATE_ORDERS = ("value_first", "together")
"""IQL's update: the value network steps first and the actor and critics then read the new
V (the authors' code, ``learner.py``'s ``_update_jit``), or all three losses from the same
parameters in one step (TorchRL's ``IQLLoss`` and CORL's ``iql.py``)."""

CONFIG_DIR = Path(__file__).resolve().parent / "configs"


@dataclass(frozen=True)
class PipelineBudget:
    """The gradient steps of ``cbop-train``'s whole pipeline: BC + FQE + the CBOP stage."""

    bc_steps: int
    fqe_steps: int
    cbop_steps: int  # train.epochs x train.steps_per_epoch of the CBOP stage

    @property
    def total(self) -> int:
        return self.bc_steps + self.fqe_steps + self.cbop_steps

    def describe(self) -> str:
        """``14000 (BC 5000 + FQE 5000 + CBOP 4000)``."""
        return f"{self.total} (BC {self.bc_steps} + FQE {self.fqe_steps} + CBOP {self.cbop_steps})"


def preset_training(preset: str) -> dict[str, int]:
    """``bc.steps``, ``fqe.steps``, ``train.epochs`` and ``train.steps_per_epoch`` of a preset.

    Read from ``configs/preset/<preset>.yaml`` (``configs/config.yaml`` for a key the preset
    leaves out); a null is the paper's value (:data:`cbop_torchrl.config.PAPER_SHARED`).
    """
    from omegaconf import OmegaConf

    from cbop_torchrl.config import PAPER_SHARED

    values = OmegaConf.merge(
        OmegaConf.load(CONFIG_DIR / "config.yaml"),
        OmegaConf.load(CONFIG_DIR / "preset" / f"{preset}.yaml"),
    )
    found = {}
    for key in ("bc.steps", "fqe.steps", "train.epochs", "train.steps_per_epoch"):
        value = OmegaConf.select(values, key)
        found[key] = int(PAPER_SHARED[key] if value is None else value)
    return found


def cbop_pipeline_budget(
    preset: str, bc_steps: int, fqe_steps: int, steps_per_epoch: int | None
) -> PipelineBudget:
    """``cbop-train``'s pipeline with ``preset``'s CBOP epochs and these steps.

    ``steps_per_epoch``: the CBOP stage's (None: the preset's, or the paper's).
    """
    preset_values = preset_training(preset)
    steps_per_epoch = steps_per_epoch or preset_values["train.steps_per_epoch"]
    return PipelineBudget(
        int(bc_steps), int(fqe_steps), preset_values["train.epochs"] * int(steps_per_epoch)
    )


def pipeline_epochs(preset: str, bc_steps: int, fqe_steps: int, steps_per_epoch: int | None) -> int:
    """A baseline's default ``train.epochs``: as many gradient steps as ``cbop-train``'s whole
    pipeline with the same preset and settings (:func:`cbop_pipeline_budget`), rounded up to
    whole epochs of ``steps_per_epoch`` (None: the preset's)."""
    steps_per_epoch = steps_per_epoch or preset_training(preset)["train.steps_per_epoch"]
    budget = cbop_pipeline_budget(preset, bc_steps, fqe_steps, steps_per_epoch)
    return -(-budget.total // int(steps_per_epoch))


class BaselineConfigError(ValueError):
    """An ``algo`` section is invalid; the message says what would be valid."""


@dataclass
class AlgoConfig:
    """One baseline's hyperparameters (``cbop_torchrl/configs/algo/<name>.yaml``).

    Fields an algorithm does not use are ignored by it. The recipe's sizes and rates
    (``batch_size``, ``hidden_sizes``, ``actor_lr``, ``critic_lr``) fall back to the run
    config's (``train.batch_size``, ``agent.*``) where None.
    """

    name: str = "td3bc"  # the baseline: bc | td3bc | iql | cql (set by the algo group)
    batch_size: int | None = None  # the recipe's batch (null: train.batch_size)
    hidden_sizes: list[int] | None = None  # actor's and critics' widths (null: agent's)
    actor_lr: float | None = None  # the actor's learning rate (null: agent.actor_lr)
    critic_lr: float | None = None  # the critics' learning rate (null: agent.critic_lr)
    normalize_states: bool = False  # standardize states by the dataset's mean and std
    reward_scale: str = "none"  # none | return_range: x 1000 / (max - min return)
    actor_lr_schedule: str = "constant"  # constant | cosine: the actor's rate decays to 0
    num_qvalue_nets: int = 2  # critics (their minimum is the target)
    # TD3+BC
    alpha: float = 2.5  # TD3+BC: the actor's Q weight is alpha / mean |Q|
    policy_noise: float = 0.2  # TD3+BC: std of the target action's smoothing noise
    noise_clip: float = 0.5  # TD3+BC: the smoothing noise is clipped to +-noise_clip
    policy_delay: int = 2  # TD3+BC: critic steps per actor step
    # IQL
    temperature: float = 3.0  # IQL: inverse temperature of the advantage-weighted actor
    expectile: float = 0.7  # IQL: the expectile of the value regression
    value_lr: float = 3e-4  # IQL: the value network's learning rate
    # CQL
    min_q_weight: float = 5.0  # CQL: weight of the conservative penalty
    num_random: int = 10  # CQL: random actions per state in the penalty's log-sum-exp
    cql_temperature: float = 1.0  # CQL: temperature of that log-sum-exp
    with_lagrange: bool = False  # CQL: tune the penalty's weight to reach lagrange_thresh
    lagrange_thresh: float = 10.0  # CQL: the penalty's target with_lagrange aims for
    # IQL: tanh_normal | tanh_mean_gaussian (the authors': tanh'd mean, state-independent std)
    policy_distribution: str = "tanh_normal"
    next_actions_scored_at: str = "state"  # CQL: state (the authors') | next_state (TorchRL's)
    logsumexp_over: str = "state"  # CQL: state, all 3N actions (the authors') | draw (TorchRL's)
    update_order: str = "value_first"  # IQL: value_first, V then the rest (the authors') | together
    critic_passes: str = "auto"  # CQL: auto (loop on a CPU, else vmap) | loop | vmap: speed only

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> AlgoConfig:
        """Builds and validates an ``algo`` section (raises :class:`BaselineConfigError`)."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise BaselineConfigError(
                f"unknown key(s) {', '.join('algo.' + k for k in unknown)}; valid keys: "
                f"{', '.join(sorted(known))}"
            )
        config = cls(**values)
        if config.name not in ALGOS:
            raise BaselineConfigError(
                f"algo={config.name!r} is not a baseline; choose one of {', '.join(ALGOS)} "
                "(CBOP and its ablations run through cbop-train, scripts/cbop.py in a checkout)"
            )
        for key, value, allowed in (
            ("reward_scale", config.reward_scale, REWARD_SCALES),
            ("actor_lr_schedule", config.actor_lr_schedule, ACTOR_LR_SCHEDULES),
            ("policy_distribution", config.policy_distribution, POLICY_DISTRIBUTIONS),
            ("next_actions_scored_at", config.next_actions_scored_at, NEXT_ACTIONS_SCORED_AT),
            ("logsumexp_over", config.logsumexp_over, LOGSUMEXP_OVER),
            ("update_order", config.update_order, UPDATE_ORDERS),
            ("critic_passes", config.critic_passes, CRITIC_PASSES),
        ):
            if value not in allowed:
                raise BaselineConfigError(
                    f"algo.{key}={value!r} is not one of {', '.join(allowed)}; e.g. "
                    f"algo.{key}={allowed[0]} (every algo setting: configs/algo/{config.name}.yaml)"
                )
        problems = range_problems({"algo": asdict(config)})  # the one table of ranges
        if problems:
            raise BaselineConfigError(
                "; ".join(problems) + f" (every algo setting: configs/algo/{config.name}.yaml)"
            )
        return config


@dataclass
class BaselineParts:
    """What the trainer needs from an algorithm.

    Attributes:
        loss: the TorchRL loss module.
        actor: the policy evaluated (deterministic under ``ExplorationType.DETERMINISTIC``).
        groups: ``(loss keys, parameters, learning rate, every)``: the summed
            keys are differentiated w.r.t. these parameters only, every
            ``every``-th step.
        has_targets: whether a ``SoftUpdate`` of the target networks runs after the steps.
        target_every: the target networks move after every ``target_every``-th step only
            (TD3+BC's ``policy_delay``, with its actor).
        actor_kind: the actor's kind, a key of
            :data:`~cbop_torchrl.modules.actor_critic.ACTOR_BUILDERS`.
        stepped_first: ``(loss method, loss key)``: that loss's group takes its step
            before the other losses are computed, from the updated parameters (IQL's
            ``value_first``); None: every loss from the same parameters.
    """

    loss: LossModule
    actor: TensorDictModuleBase
    groups: list[tuple[tuple[str, ...], list[nn.Parameter], float, int]]
    has_targets: bool
    actor_kind: str
    stepped_first: tuple[str, str] | None = None
    target_every: int = 1


def make_state_value(
    obs_dim: int, hidden_sizes: Sequence[int], device: Any = None
) -> ValueOperator:
    """IQL's ``V(s)``: ``observation -> state_value [..., 1]``."""
    net = MLP(
        in_features=obs_dim,
        out_features=1,
        num_cells=list(hidden_sizes),
        activation_class=nn.ReLU,
        device=device,
    )
    return ValueOperator(net, in_keys=["observation"], out_keys=["state_value"])


def _params(module_params: TensorDictBase) -> list[nn.Parameter]:
    """The trainable leaves of a loss's functional parameters (buffers left out)."""
    return [p for p in module_params.values(True, True) if p.requires_grad]


@dataclass(frozen=True)
class _Sizes:
    """The networks' sizes, device, input statistics and learning rates, for a builder."""

    obs: int
    act: int
    hidden: tuple[int, ...]
    device: torch.device
    actor_lr: float
    critic_lr: float
    norm: tuple[torch.Tensor, torch.Tensor] | None = None  # [obs] mean and std, or none

    def standardized(self, module: nn.Module) -> nn.Module:
        """``module`` reading standardized observations where the recipe asks for them."""
        return module if self.norm is None else standardize_observation(module, *self.norm)

    def actor(self, kind: str = "tanh_normal") -> TensorDictModuleBase:
        """A stochastic actor of ``kind`` (a key of ``ACTOR_BUILDERS``)."""
        build = ACTOR_BUILDERS[kind]
        return self.standardized(build(self.obs, self.act, self.hidden, device=self.device))

    def critics(self, count: int) -> TensorDictModuleBase:
        """``count`` Q-networks (:func:`make_qvalue_ensemble`)."""
        nets = make_qvalue_ensemble(count, self.obs, self.act, self.hidden, device=self.device)
        return [self.standardized(net) for net in nets]


def _build_bc(algo: AlgoConfig, agent: Any, sizes: _Sizes) -> BaselineParts:
    actor = sizes.actor()
    loss = BehaviourCloningLoss(actor)
    groups = [(("loss_bc",), list(actor.parameters()), sizes.actor_lr, 1)]
    return BaselineParts(loss, actor, groups, False, "tanh_normal")


def _build_td3bc(algo: AlgoConfig, agent: Any, sizes: _Sizes) -> BaselineParts:
    actor = sizes.standardized(
        make_deterministic_actor(sizes.obs, sizes.act, sizes.hidden, sizes.device)
    )
    qnets = sizes.critics(algo.num_qvalue_nets)
    loss = TD3BCLoss(
        actor,
        qnets,
        action_spec=action_spec(sizes.act, sizes.device),
        num_qvalue_nets=algo.num_qvalue_nets,
        policy_noise=algo.policy_noise,
        noise_clip=algo.noise_clip,
        alpha=algo.alpha,
        loss_function="l2",
    )
    loss.make_value_estimator(gamma=agent.gamma)
    groups = [
        (("loss_actor",), _params(loss.actor_network_params), sizes.actor_lr, algo.policy_delay),
        (("loss_qvalue",), _params(loss.qvalue_network_params), sizes.critic_lr, 1),
    ]
    return BaselineParts(loss, actor, groups, True, "deterministic", target_every=algo.policy_delay)


def _build_iql(algo: AlgoConfig, agent: Any, sizes: _Sizes) -> BaselineParts:
    actor = sizes.actor(algo.policy_distribution)
    qnets = sizes.critics(algo.num_qvalue_nets)
    value = sizes.standardized(make_state_value(sizes.obs, sizes.hidden, sizes.device))
    loss = IQLLoss(
        actor,
        qnets,
        value,
        num_qvalue_nets=algo.num_qvalue_nets,
        temperature=algo.temperature,
        expectile=algo.expectile,
        loss_function="l2",
    )
    loss.make_value_estimator(gamma=agent.gamma)
    groups = [
        (("loss_actor",), _params(loss.actor_network_params), sizes.actor_lr, 1),
        (("loss_qvalue",), _params(loss.qvalue_network_params), sizes.critic_lr, 1),
        (("loss_value",), _params(loss.value_network_params), algo.value_lr, 1),
    ]
    first = ("value_loss", "loss_value") if algo.update_order == "value_first" else None
    return BaselineParts(loss, actor, groups, True, algo.policy_distribution, first)


def _build_cql(algo: AlgoConfig, agent: Any, sizes: _Sizes) -> BaselineParts:
    actor = sizes.actor()
    qnets = sizes.critics(algo.num_qvalue_nets)
    if (algo.next_actions_scored_at, algo.logsumexp_over) == ("next_state", "draw"):
        loss_class = CQLLoss  # both of TorchRL's choices: its own loss
    else:
        loss_class = partial(
            AuthorsCQLLoss,
            next_actions_scored_at=algo.next_actions_scored_at,
            logsumexp_over=algo.logsumexp_over,
        )
    loss = loss_class(
        actor,
        qnets,
        action_spec=action_spec(sizes.act, sizes.device),
        alpha_init=agent.alpha_init,
        temperature=algo.cql_temperature,
        min_q_weight=algo.min_q_weight,
        num_random=algo.num_random,
        with_lagrange=algo.with_lagrange,
        lagrange_thresh=algo.lagrange_thresh,
        deterministic_backup=True,
        loss_function="l2",
        deactivate_vmap=critics_loop(algo.critic_passes, sizes.device),
    )
    loss.make_value_estimator(gamma=agent.gamma)
    groups = [
        (("loss_actor",), _params(loss.actor_network_params), sizes.actor_lr, 1),
        (("loss_qvalue", "loss_cql"), _params(loss.qvalue_network_params), sizes.critic_lr, 1),
        (("loss_alpha",), [loss.log_alpha], agent.alpha_lr, 1),
    ]
    if algo.with_lagrange:
        groups.append((("loss_alpha_prime",), [loss.log_alpha_prime], sizes.critic_lr, 1))
    return BaselineParts(loss, actor, groups, True, "tanh_normal")


BUILDERS: dict[str, Callable[..., BaselineParts]] = {
    "bc": _build_bc,
    "td3bc": _build_td3bc,
    "iql": _build_iql,
    "cql": _build_cql,
}
"""Each baseline's builder: ``(algo, agent, sizes)`` -> :class:`BaselineParts`."""
ALGOS = tuple(BUILDERS)
"""The baselines, by the name ``algo=`` takes."""


def build_baseline(
    algo: AlgoConfig,
    config: RunConfig,
    info: DatasetInfo,
    device: torch.device,
    data: TensorDictBase | None = None,
) -> BaselineParts:
    """The loss, actor and optimizer groups of ``algo`` for the dataset's sizes.

    ``data`` (the training data) gives the observation statistics of a recipe with
    ``normalize_states``; it is needed only then.
    """
    norm = None
    if algo.normalize_states:
        if data is None:
            raise ValueError(f"{algo.name} standardizes observations: pass the training data")
        norm = tuple(t.to(device) for t in observation_statistics(data))
    agent = config.agent
    sizes = _Sizes(
        info.obs_dim,
        info.action_dim,
        baseline_hidden_sizes(algo, config),
        device,
        actor_lr=agent.actor_lr if algo.actor_lr is None else algo.actor_lr,
        critic_lr=agent.critic_lr if algo.critic_lr is None else algo.critic_lr,
        norm=norm,
    )
    return BUILDERS[algo.name](algo, agent, sizes)


SMOKE_PRESETS = ("debug",)
"""Presets whose own tiny sizes every baseline keeps (a smoke test, not a recipe's run)."""


def baseline_hidden_sizes(algo: AlgoConfig, config: RunConfig) -> tuple[int, ...]:
    """The hidden layer widths of the baseline's actor and critics: its recipe's, else (and
    on a :data:`SMOKE_PRESETS` preset) ``agent.hidden_sizes``."""
    if algo.hidden_sizes and config.preset not in SMOKE_PRESETS:
        return tuple(algo.hidden_sizes)
    return tuple(config.agent.hidden_sizes)


def baseline_batch_size(algo: AlgoConfig, config: RunConfig) -> int:
    """The baseline's batch: its recipe's, else (and on a :data:`SMOKE_PRESETS` preset)
    ``train.batch_size``."""
    if algo.batch_size and config.preset not in SMOKE_PRESETS:
        return int(algo.batch_size)
    return int(config.train.batch_size)


def _dataset_for(algo: str, data: TensorDictBase, scale: float = 1.0) -> TensorDictBase:
    """The keys a baseline reads, the rewards times ``scale`` (its recipe's reward scaling);
    dataset actions moved off +-1 where a log-density is taken."""
    batch = data.select(*CBOP_KEYS)
    if algo in ("bc", "iql", "cql"):  # a TanhNormal has no density at exactly +-1
        batch.set("action", batch.get("action").clamp(-1.0 + ACTION_EPS, 1.0 - ACTION_EPS))
    if scale != 1.0:
        batch.set(("next", "reward"), batch.get(("next", "reward")) * scale)
    return batch


def baseline_training_dict(config: RunConfig, algo: AlgoConfig) -> dict[str, Any]:
    """The settings that change what a baseline trains (resume is refused when they differ)."""
    values = config.training_dict()
    kept = {
        "env": values["env"],
        "seed": values["seed"],
        "agent": values["agent"],
        "train": values["train"],
        "algo": asdict(algo),
    }
    return kept


def run_baseline(
    config: RunConfig,
    algo: AlgoConfig,
    info: DatasetInfo,
    data: TensorDictBase,
    run_dir: Path,
) -> dict[str, Any]:
    """Trains ``algo`` for ``config.train.total_steps`` gradient steps and writes the run directory.

    Uses from ``config``: ``seed``, ``device``, ``threads``, ``resume``,
    ``progress``, ``agent`` (hidden sizes, gamma, tau, learning rates,
    alpha_init), ``train`` (steps, batch size, checkpoint/log intervals),
    ``eval`` and ``logger``; the CBOP-only sections are ignored.

    Returns:
        The ``results.json`` dict (the pipeline's fields plus ``algo``).

    Raises:
        DatasetError: the data is smaller than one batch (``train.batch_size``).
        CheckpointError: a checkpoint written with other settings (or none with ``resume=true``).
        NonFiniteLossError: a loss or gradient became NaN/inf.
    """
    batch_size = baseline_batch_size(algo, config)
    size_key = "algo.batch_size" if batch_size != config.train.batch_size else "train.batch_size"
    check_dataset_size(data, info.name, {size_key: batch_size})
    run = OfflineRun.open(
        config, info, run_dir, baseline_training_dict(config, algo), captures_step=False
    )
    if (finished := run.finished_results()) is not None:
        return finished
    warn_about_terminals(data, info.name, run.task)
    run.start({**config.to_dict(), "algo": asdict(algo)})
    total_steps = config.train.total_steps

    seed = seed_stage(run.decisions.seeds.baseline)
    data = run.specs.to_agent_actions(data.to(run.device))
    parts = build_baseline(algo, config, info, run.device, data)
    optimizer = torch.optim.Adam([{"params": p, "lr": lr} for _, p, lr, _ in parts.groups])
    warn_about_action_range(data, info.name)
    scale = reward_scale(algo.reward_scale, data)
    buffer = make_replay_buffer(_dataset_for(algo.name, data, scale), batch_size, device=run.device)
    generator = torch.Generator(device=run.device).manual_seed(seed)
    buffer.set_rng(generator)
    eval_env = make_eval_env(run.task, config.eval.episodes, config.eval.backend)
    checkpoint = CheckpointHook(
        run.checkpoint_path, config.train.checkpoint_interval, total_steps,
        partial(_checkpoint_payload, run, algo, parts),
    )  # fmt: skip
    training = build_offline_training(
        run, loss=parts.loss, optimizer=optimizer,
        stepper=GroupedOptimizationStepper(
            parts.groups, checkpoint, algo.name,
            total_steps if algo.actor_lr_schedule == "cosine" else None,
            parts.stepped_first,
        ),
        checkpoint=checkpoint,
        buffer=buffer, generator=generator, actor=parts.actor, eval_env=eval_env,
        target_update=SoftUpdate(parts.loss, tau=config.agent.tau) if parts.has_targets else None,
        target_update_every=parts.target_every,
    )  # fmt: skip
    restore_final_records(run, training)
    if config.progress and training.start_step:  # the settings are in the run banner
        print(
            f"[baseline] {algo.name}: resuming at gradient step {training.start_step}", flush=True
        )
    training.train(total_steps)
    final = final_evaluation(run, training)
    metadata = _policy_metadata(run, algo, parts, total_steps)
    last_window = training.metrics.last_window
    fields = {
        "algo": algo.name,
        "final_train_metrics": {k: v for k, v in last_window.items() if math.isfinite(v)},
        "settings": {
            "batch_size": batch_size,
            "hidden_sizes": list(baseline_hidden_sizes(algo, config)),
            "reward_scale": scale,
            "algo": asdict(algo),
        },
    }
    return write_results(run, training, final, metadata, fields)


def _policy_metadata(
    run: OfflineRun, algo: AlgoConfig, parts: BaselineParts, step: int
) -> dict[str, Any]:
    meta = run.policy_metadata(step)
    return {
        **meta,
        "hidden_sizes": list(baseline_hidden_sizes(algo, run.config)),
        "algo": algo.name,
        "actor_kind": parts.actor_kind,
        "observation_norm": algo.normalize_states,
    }


def _checkpoint_payload(
    run: OfflineRun, algo: AlgoConfig, parts: BaselineParts, step: int
) -> dict[str, Any]:
    """The baseline's part of its checkpoint (:meth:`OfflineRun.checkpoint_record` and
    :func:`~cbop_torchrl.trainers.run_state.run_state` add the rest)."""
    return {"policy": _policy_metadata(run, algo, parts, step), "actor": parts.actor.state_dict()}


__all__ = [
    "ALGOS",
    "AlgoConfig",
    "BaselineConfigError",
    "BaselineParts",
    "PipelineBudget",
    "GroupedOptimizationStepper",
    "build_baseline",
    "cbop_pipeline_budget",
    "pipeline_epochs",
    "make_state_value",
    "run_baseline",
]
