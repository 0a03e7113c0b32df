"""Model-free offline baselines on the pipeline's data, evaluation and run-directory format.

Four algorithms, each a TorchRL loss with a small config (``cbop_torchrl/configs/algo/*.yaml``):

- ``bc``: behaviour cloning (:class:`~cbop_torchrl.objectives.pretrain.BehaviourCloningLoss`,
  the loss of the pipeline's BC stage);
- ``td3bc``: TD3+BC (``torchrl.objectives.TD3BCLoss``), a deterministic tanh actor,
  actor updated every ``policy_delay`` steps;
- ``iql``: implicit Q-learning (``torchrl.objectives.IQLLoss``) with a state-value network;
- ``cql``: conservative Q-learning (``torchrl.objectives.CQLLoss``), auto-tuned entropy.

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
from torchrl.trainers import OptimizationStepper, Trainer

from cbop_torchrl.config import RunConfig, range_problems
from cbop_torchrl.data import DatasetInfo, make_replay_buffer
from cbop_torchrl.data.transitions import warn_about_action_range
from cbop_torchrl.envs import make_eval_env
from cbop_torchrl.modules.actor_critic import (
    action_spec,
    make_actor,
    make_deterministic_actor,
    make_qvalue_ensemble,
)
from cbop_torchrl.objectives.pretrain import ACTION_EPS, BehaviourCloningLoss
from cbop_torchrl.runtime import seed_everything
from cbop_torchrl.trainers.checkpoint import (
    CheckpointHook,
    NonFiniteLossError,
    training_config_hash,
)
from cbop_torchrl.trainers.datasize import check_dataset_size, warn_about_terminals
from cbop_torchrl.trainers.offline_run import OfflineRun, write_results
from cbop_torchrl.trainers.offline_training import (
    CBOP_KEYS,
    build_offline_training,
    final_evaluation,
    restore_final_records,
)

BASELINE_SEED_OFFSET = 5
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

    Fields an algorithm does not use are ignored by it.
    """

    name: str = "td3bc"
    num_qvalue_nets: int = 2
    # TD3+BC
    alpha: float = 2.5
    policy_noise: float = 0.2
    noise_clip: float = 0.5
    policy_delay: int = 2
    # IQL
    temperature: float = 3.0
    expectile: float = 0.7
    value_lr: float = 3e-4
    # CQL
    min_q_weight: float = 5.0
    num_random: int = 10
    cql_temperature: float = 1.0
    with_lagrange: bool = False
    lagrange_thresh: float = 10.0

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
        has_targets: whether a ``SoftUpdate`` of the target networks runs after each step.
        actor_kind: ``"tanh_normal"`` (:func:`make_actor`) or ``"deterministic"``.
    """

    loss: LossModule
    actor: TensorDictModuleBase
    groups: list[tuple[tuple[str, ...], list[nn.Parameter], float, int]]
    has_targets: bool
    actor_kind: str


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
    """The networks' sizes and device, for a baseline's builder."""

    obs: int
    act: int
    hidden: tuple[int, ...]
    device: torch.device

    def actor(self) -> TensorDictModuleBase:
        """A tanh-Gaussian actor (:func:`make_actor`)."""
        return make_actor(self.obs, self.act, self.hidden, device=self.device)

    def critics(self, count: int) -> TensorDictModuleBase:
        """``count`` Q-networks (:func:`make_qvalue_ensemble`)."""
        return make_qvalue_ensemble(count, self.obs, self.act, self.hidden, device=self.device)


def _build_bc(algo: AlgoConfig, agent: Any, sizes: _Sizes) -> BaselineParts:
    actor = sizes.actor()
    loss = BehaviourCloningLoss(actor)
    groups = [(("loss_bc",), list(actor.parameters()), agent.actor_lr, 1)]
    return BaselineParts(loss, actor, groups, False, "tanh_normal")


def _build_td3bc(algo: AlgoConfig, agent: Any, sizes: _Sizes) -> BaselineParts:
    actor = make_deterministic_actor(sizes.obs, sizes.act, sizes.hidden, sizes.device)
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
        (("loss_actor",), _params(loss.actor_network_params), agent.actor_lr, algo.policy_delay),
        (("loss_qvalue",), _params(loss.qvalue_network_params), agent.critic_lr, 1),
    ]
    return BaselineParts(loss, actor, groups, True, "deterministic")


def _build_iql(algo: AlgoConfig, agent: Any, sizes: _Sizes) -> BaselineParts:
    actor = sizes.actor()
    qnets = sizes.critics(algo.num_qvalue_nets)
    value = make_state_value(sizes.obs, sizes.hidden, sizes.device)
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
        (("loss_actor",), _params(loss.actor_network_params), agent.actor_lr, 1),
        (("loss_qvalue",), _params(loss.qvalue_network_params), agent.critic_lr, 1),
        (("loss_value",), _params(loss.value_network_params), algo.value_lr, 1),
    ]
    return BaselineParts(loss, actor, groups, True, "tanh_normal")


def _build_cql(algo: AlgoConfig, agent: Any, sizes: _Sizes) -> BaselineParts:
    actor = sizes.actor()
    qnets = sizes.critics(algo.num_qvalue_nets)
    loss = CQLLoss(
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
    )
    loss.make_value_estimator(gamma=agent.gamma)
    groups = [
        (("loss_actor",), _params(loss.actor_network_params), agent.actor_lr, 1),
        (("loss_qvalue", "loss_cql"), _params(loss.qvalue_network_params), agent.critic_lr, 1),
        (("loss_alpha",), [loss.log_alpha], agent.alpha_lr, 1),
    ]
    if algo.with_lagrange:
        groups.append((("loss_alpha_prime",), [loss.log_alpha_prime], agent.critic_lr, 1))
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
    algo: AlgoConfig, config: RunConfig, info: DatasetInfo, device: torch.device
) -> BaselineParts:
    """The loss, actor and optimizer groups of ``algo`` for the dataset's sizes."""
    sizes = _Sizes(info.obs_dim, info.action_dim, tuple(config.agent.hidden_sizes), device)
    return BUILDERS[algo.name](algo, config.agent, sizes)


class GroupedOptimizationStepper(OptimizationStepper):
    """One Adam step where each parameter group gets the gradient of its own losses only.

    TorchRL's offline losses are meant for one optimizer per network (the
    critic loss may read the actor, the CQL penalty samples actions from it):
    summing all losses into one backward would leak critic gradients into the
    actor. Each group's loss is differentiated w.r.t. its parameters with
    ``torch.autograd.grad``; groups not due this step (TD3's delayed actor)
    get no gradient, so Adam leaves them untouched. Non-finite values stop the
    run before any parameter changes (:class:`NonFiniteLossError`).
    """

    def __init__(self, groups: BaselineParts, checkpoint: CheckpointHook, algo: str) -> None:
        self.groups = groups.groups
        self.checkpoint = checkpoint
        self.algo = algo

    def step(self, trainer: Trainer, sub_batch: TensorDictBase) -> TensorDictBase:
        losses = trainer.compute_loss(sub_batch)
        step = trainer._optim_count
        trainer.optimizer.zero_grad(set_to_none=True)
        due = [g for g in self.groups if step % g[3] == 0]
        bad = []
        norms = []
        for index, (keys, params, _, _) in enumerate(due):
            total = sum(losses.get(key) for key in keys)
            last = index == len(due) - 1
            grads = torch.autograd.grad(total, params, retain_graph=not last, allow_unused=True)
            for param, grad in zip(params, grads, strict=True):
                param.grad = grad
            norms += [g.norm() for g in grads if g is not None]
            if not torch.isfinite(total):
                bad.append("+".join(keys))
        grad_norm = torch.stack(norms).norm() if norms else torch.zeros(())
        if not torch.isfinite(grad_norm):
            bad.append("gradient norm")
        if bad:
            trainer.optimizer.zero_grad(set_to_none=True)
            raise NonFiniteLossError(
                f"non-finite {', '.join(bad)} at gradient step {step} of the {self.algo} "
                "baseline; the step was not applied and the run stopped. Last good checkpoint: "
                f"{self.checkpoint.describe_last()}. Lower the learning rates (agent.*_lr) and "
                "resume (the same command continues from that checkpoint)."
            )
        trainer.optimizer.step()
        scalars = {
            k: v.detach() for k, v in losses.items() if v.ndim == 0 and v.is_floating_point()
        }
        out = losses.empty()
        out.update(scalars)
        out.set("grad_norm", grad_norm.detach())
        return out


def _dataset_for(algo: str, data: TensorDictBase) -> TensorDictBase:
    """The keys a baseline reads; dataset actions moved off +-1 where a log-density is taken."""
    batch = data.select(*CBOP_KEYS)
    if algo in ("bc", "iql", "cql"):  # a TanhNormal has no density at exactly +-1
        batch.set("action", batch.get("action").clamp(-1.0 + ACTION_EPS, 1.0 - ACTION_EPS))
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
    check_dataset_size(data, info.name, {"train.batch_size": config.train.batch_size})
    run = OfflineRun.open(config, info, run_dir, baseline_training_dict(config, algo))
    if (finished := run.finished_results()) is not None:
        return finished
    warn_about_terminals(data, info.name, run.task)
    run.start({**config.to_dict(), "algo": asdict(algo)})
    total_steps = config.train.total_steps

    seed_everything(config.seed + BASELINE_SEED_OFFSET)
    parts = build_baseline(algo, config, info, run.device)
    optimizer = torch.optim.Adam([{"params": p, "lr": lr} for _, p, lr, _ in parts.groups])
    data = run.specs.to_agent_actions(data.to(run.device))
    warn_about_action_range(data, info.name)
    buffer = make_replay_buffer(
        _dataset_for(algo.name, data), config.train.batch_size, device=run.device
    )
    generator = torch.Generator(device=run.device).manual_seed(config.seed + BASELINE_SEED_OFFSET)
    buffer.set_rng(generator)
    eval_env = make_eval_env(run.task, config.eval.episodes, config.eval.backend)
    checkpoint = CheckpointHook(
        run.checkpoint_path, config.train.checkpoint_interval, total_steps,
        partial(_checkpoint_payload, run, algo, parts),
    )  # fmt: skip
    training = build_offline_training(
        run, loss=parts.loss, optimizer=optimizer,
        stepper=GroupedOptimizationStepper(parts, checkpoint, algo.name), checkpoint=checkpoint,
        buffer=buffer, generator=generator, actor=parts.actor, eval_env=eval_env,
        target_update=SoftUpdate(parts.loss, tau=config.agent.tau) if parts.has_targets else None,
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
            "batch_size": config.train.batch_size,
            "hidden_sizes": run.hidden_sizes,
            "algo": asdict(algo),
        },
    }
    return write_results(run, training, final, metadata, fields)


def _policy_metadata(
    run: OfflineRun, algo: AlgoConfig, parts: BaselineParts, step: int
) -> dict[str, Any]:
    meta = run.policy_metadata(step)
    return {**meta, "algo": algo.name, "actor_kind": parts.actor_kind}


def _checkpoint_payload(
    run: OfflineRun, algo: AlgoConfig, parts: BaselineParts, step: int
) -> dict[str, Any]:
    return {
        "training_config": run.training_config,
        "training_config_hash": training_config_hash(run.training_config),
        "policy": _policy_metadata(run, algo, parts, step),
        "actor": parts.actor.state_dict(),
        "wall_time_s": run.wall_time(),
    }


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
