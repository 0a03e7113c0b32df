"""Several seeds' BC actors, or FQE critics, trained together, each as it is trained alone.

:func:`train_bc_together` and :func:`train_fqe_together` run the step-count stages of
:mod:`cbop_torchrl.trainers.pretrain` (``bc.converge`` and ``fqe.converge`` off, no
``fqe.eta``) for R seeds at once: every seed's networks are drawn as its stage draws them
(:func:`~cbop_torchrl.trainers.pretrain.new_bc_loss`, :meth:`~cbop_torchrl.trainers.
pretrain.FQEStage.networks`: ``seed_stage(stage seed)``, then the bootstrap counts and the
networks), its batches come from its own replay buffer and sampling generator (seeded as
alone, one batch per step as alone), and its parameters are one slice of stacked
``[R, ...]`` tensors that one Adam steps (Adam is elementwise, so each slice takes the
steps it takes alone). The forward pass is one ``torch.vmap`` over the seed axis of the
stage's own network and loss arithmetic (for FQE a ``vmap`` over seeds of the ensemble's
``vmap`` over members: :func:`~cbop_torchrl.objectives.pretrain.fqe_regression_target`,
:func:`~cbop_torchrl.objectives.pretrain.member_mse`), and the loss is the sum of the seeds'
losses, so each seed's gradient is its own. FQE's target ensemble is updated as
``SoftUpdate``/``HardUpdate`` update it (a ``lerp_`` by ``1 - (1 - tau)``, a copy), on the
stacked parameters. No draw differs from alone; the batched matmuls may round
differently, so a seed's result equals the stage alone to float rounding.

A seed whose loss or gradient is not finite at a step is marked and not returned as
trained (its run trains the stage alone and reports it); the others are unaffected (no
arithmetic mixes seeds). The stages here write no ``partial.pt``: a stopped joint stage
starts again from its seeds, which gives the same result.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from tensordict import TensorDict, TensorDictBase
from torch import nn
from tqdm.auto import tqdm

from cbop_torchrl.config import PretrainConfig
from cbop_torchrl.objectives.pretrain import (
    ROW_KEY,
    BehaviourCloningLoss,
    FittedQEvaluationLoss,
    data_action_log_prob,
    ensemble_q,
    fqe_regression_target,
    member_mse,
)
from cbop_torchrl.trainers.pretrain import FQEStage, fqe_target_update, new_bc_loss
from cbop_torchrl.trainers.stage_loop import _sampler


def stack_params(params: Sequence[TensorDictBase], trainable: set) -> TensorDict:
    """The seeds' ``[...]`` parameter TensorDicts stacked into ``[R, ...]``: the ``trainable``
    keys as leaf tensors that require grad, the others (buffers) as plain tensors."""
    stacked = torch.stack([p.detach() for p in params]).to_tensordict()
    for key in trainable:
        stacked.set(key, stacked.get(key).clone().requires_grad_())
    return stacked


def _trainable(params: TensorDictBase) -> set:
    return {k for k, v in params.items(True, True) if isinstance(v, nn.Parameter)}


class _SeedHealth:
    """Which seeds have hit a non-finite loss or gradient (their results are not kept)."""

    def __init__(self, count: int, device: torch.device) -> None:
        self.bad = torch.zeros(count, dtype=torch.bool, device=device)

    def check(self, losses: torch.Tensor, params: TensorDict, trainable: set) -> None:
        """Marks the seeds whose ``losses [R]`` or gradient slices are not finite."""
        bad = ~torch.isfinite(losses)
        for key in trainable:
            grad = params.get(key).grad
            if grad is not None:
                bad |= ~torch.isfinite(grad).flatten(1).all(1)
        self.bad |= bad

    def good(self) -> list[bool]:
        return (~self.bad).tolist()


def _adam_steps(
    name: str,
    params: TensorDict,
    trainable: set,
    config: PretrainConfig,
    seed_losses: Callable[[int], torch.Tensor],
    after_step: Callable[[int], None] | None = None,
    progress: bool = True,
    fused: bool = False,
) -> list[bool]:
    """``config.steps`` Adam steps on the sum of ``seed_losses(step)`` (``[R]``, one loss per
    seed); returns which seeds stayed finite."""
    leaves = [params.get(key) for key in sorted(trainable, key=str)]
    optimizer = torch.optim.Adam(leaves, lr=config.lr, **({"fused": True} if fused else {}))
    health = _SeedHealth(params.batch_size[0], leaves[0].device)
    for step in tqdm(range(config.steps), desc=name, disable=not progress, dynamic_ncols=True):
        losses = seed_losses(step)
        optimizer.zero_grad(set_to_none=True)
        losses.sum().backward()
        health.check(losses.detach(), params, trainable)
        optimizer.step()
        if after_step is not None:
            after_step(step + 1)
    return health.good()


def train_bc_together(
    data: TensorDictBase,
    obs_dim: int,
    action_dim: int,
    hidden_sizes: Sequence[int],
    config: PretrainConfig,
    stage_seeds: Sequence[int],
    progress: bool = True,
    fused: bool = False,
) -> list[BehaviourCloningLoss | None]:
    """One BC actor per stage seed, trained together as
    :func:`~cbop_torchrl.trainers.pretrain.load_or_train_bc` trains each (``config.steps``
    Adam steps of ``config.batch_size`` rows); returns each seed's trained loss module (its
    ``actor_network`` holds the actor), None for a seed that went non-finite."""
    losses = [
        new_bc_loss(obs_dim, action_dim, hidden_sizes, seed, data.device) for seed in stage_seeds
    ]
    pairs = data.select("observation", "action")
    buffers = [_sampler(pairs, config.batch_size, seed)[0] for seed in stage_seeds]
    network = losses[0].actor_network.module[0]  # observation -> loc, scale
    head = losses[0].actor_network.module[1]  # the TanhNormal
    seed_params = [TensorDict.from_module(loss.actor_network.module[0]) for loss in losses]
    trainable = _trainable(seed_params[0])
    params = stack_params(seed_params, trainable)

    def seed_net(member: TensorDictBase, rows: TensorDictBase) -> TensorDictBase:
        with member.to_module(network):
            return network(rows.select("observation"))

    def seed_losses(step: int) -> torch.Tensor:
        batch = torch.stack([buffer.sample() for buffer in buffers])  # [R, B]
        out = torch.vmap(seed_net, randomness="different")(params, batch)
        log_prob = data_action_log_prob(head.get_dist(out), batch.get("action"))  # [R, B]
        return -log_prob.mean(-1)

    good = _adam_steps(f"bc x{len(losses)}", params, trainable, config, seed_losses,
                       progress=progress, fused=fused)  # fmt: skip
    with torch.no_grad():
        for index in range(len(losses)):
            seed_params[index].update_(params[index].detach())
    return [loss if ok else None for loss, ok in zip(losses, good, strict=True)]


def fqe_joinable(stages: Sequence[FQEStage]) -> bool:
    """Whether the FQE ``stages`` train together: step-count FQE without ``eta`` (the
    gradient-diversity term differentiates inside the step, which ``vmap`` cannot batch)."""
    config = stages[0].config
    return not config.converge and config.eta == 0


def _target_update(
    params: TensorDict, target: TensorDict, trainable: set, config: Any
) -> Callable[[int], None]:
    """:func:`~cbop_torchrl.trainers.pretrain.fqe_target_update` on stacked parameters."""
    keys = sorted(trainable, key=str)
    if config.rounds is None:
        weight = 1 - (1 - config.target_tau)  # SoftUpdate's lerp_(source, 1 - eps)

        def soft(step: int) -> None:
            with torch.no_grad():
                for key in keys:
                    target.get(key).lerp_(params.get(key), weight)

        return soft
    round_steps = config.steps // config.rounds

    def hard(step: int) -> None:
        if step % round_steps == 0:
            with torch.no_grad():
                for key in keys:
                    target.get(key).copy_(params.get(key))

    return hard


def train_fqe_together(
    data: TensorDictBase,
    stages: Sequence[FQEStage],
    progress: bool = True,
    fused: bool = False,
) -> list[FittedQEvaluationLoss | None]:
    """One FQE Q-ensemble per stage (:func:`fqe_joinable`, equal but for their seeds),
    trained together as :func:`~cbop_torchrl.trainers.pretrain.load_or_train_fqe` trains
    each; returns each seed's trained loss module (None for a seed that went non-finite)."""
    config = stages[0].config
    rows = stages[0].rows(data)
    losses, counts = [], []
    for stage in stages:
        seed_counts, qnets = stage.networks(rows)
        loss = FittedQEvaluationLoss(qnets, stage.gamma, seed_counts, config.eta)
        fqe_target_update(loss, config)  # its updater, as alone (the steps below update it)
        losses.append(loss)
        counts.append(seed_counts)
    weights = torch.stack(counts)  # [R, M, N]
    buffers = [_sampler(rows, config.batch_size, stage.stage_seed)[0] for stage in stages]
    network, gamma = losses[0].qvalue_network, losses[0].gamma
    trainable = _trainable(losses[0].qvalue_network_params)
    params = stack_params([loss.qvalue_network_params for loss in losses], trainable)
    target = stack_params([loss.target_qvalue_network_params for loss in losses], set())

    def seed_loss(
        member_params: TensorDictBase, target_params: TensorDictBase, counts: torch.Tensor,
        batch: TensorDictBase,
    ) -> torch.Tensor:  # fmt: skip
        y = fqe_regression_target(network, target_params, batch, gamma)
        q = ensemble_q(network, member_params, batch)
        return member_mse(q, y, counts, batch.get(ROW_KEY)).sum()

    def seed_losses(step: int) -> torch.Tensor:
        batch = torch.stack([buffer.sample() for buffer in buffers])  # [R, B]
        return torch.vmap(seed_loss, randomness="different")(params, target, weights, batch)

    update = _target_update(params, target, trainable, config)
    good = _adam_steps(f"fqe x{len(losses)}", params, trainable, config, seed_losses,
                       update, progress, fused)  # fmt: skip
    with torch.no_grad():
        for index, loss in enumerate(losses):
            loss.qvalue_network_params.data.update_(params[index].detach())
            loss.target_qvalue_network_params.data.update_(target[index])
    return [loss if ok else None for loss, ok in zip(losses, good, strict=True)]


__all__ = ["fqe_joinable", "stack_params", "train_bc_together", "train_fqe_together"]
