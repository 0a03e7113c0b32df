"""The BC and FQE stages: short supervised loops, cached by data and config, resumable.

Each stage is a plain loop over TorchRL primitives (a ``ReplayBuffer``, a
``LossModule``, ``SoftUpdate`` for FQE's target ensemble) rather than a
``Trainer``: it has no evaluation, no collector and a single loss, so the
Trainer's hook machinery would add indirection without removing code.

Cache layout: ``cache_dir("pretrain", <stage>, <key>)/result.pt`` holds the
finished stage; while a stage runs, ``partial.pt`` holds its last
checkpoint (parameters, optimizer, sampling generator, global RNG, step) so
a killed run resumes mid-stage. The key hashes the dataset fingerprint, the
stage config, the network sizes and the seed.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDictBase
from torchrl.objectives import HardUpdate, LossModule, SoftUpdate

from cbop_torchrl.config import FQEConfig, PretrainConfig
from cbop_torchrl.config.sections import BCConfig
from cbop_torchrl.io import cache_dir, cache_entry_lock, config_hash
from cbop_torchrl.modules.actor_critic import make_actor, make_qvalue_ensemble
from cbop_torchrl.objectives.pretrain import (
    ROW_KEY,
    BehaviourCloningLoss,
    FittedQEvaluationLoss,
    bootstrap_counts,
)
from cbop_torchrl.trainers.checkpoint import NonFiniteLossError, save_stage
from cbop_torchrl.trainers.decisions import BC_SEED_OFFSET, FQE_SEED_OFFSET, seed_stage
from cbop_torchrl.trainers.stage_loop import (
    LogFn,
    PartialStage,
    _eager_stage_step,
    _sampler,
    check_finite_state,
    read_cached_stage,
    run_supervised_stage,
)


def _stage_dir(stage: str, key: dict[str, Any]) -> Path:
    return cache_dir("pretrain", stage, config_hash(key))


def _store_result(
    module: torch.nn.Module, stage: str, key: str, lr: float, work_dir: Path, record: dict
) -> dict[str, torch.Tensor]:
    """``module``'s trained state dict (on the CPU), checked finite and cached as the
    entry's ``result.pt`` under ``key``; the stage's ``partial.pt`` is removed."""
    state = {k: v.detach().cpu() for k, v in module.state_dict().items()}
    check_finite_state(state, stage, lr)
    save_stage({key: state}, work_dir / "result.pt", record)
    (work_dir / "partial.pt").unlink(missing_ok=True)
    return state


def bc_entry(
    fingerprint: str, hidden_sizes: Sequence[int], config: PretrainConfig, seed: int
) -> Path:
    """The cache entry's folder of the BC actor of run seed ``seed`` (``result.pt``; hold its
    :func:`~cbop_torchrl.io.cache_entry_lock` to read or write it)."""
    fields = config.cache_fields() if isinstance(config, BCConfig) else vars(config)
    key = {"data": fingerprint, "config": fields, "hidden": list(hidden_sizes), "seed": seed}
    return _stage_dir("bc", key)


def new_bc_loss(
    obs_dim: int,
    action_dim: int,
    hidden_sizes: Sequence[int],
    stage_seed: int,
    device: torch.device,
) -> BehaviourCloningLoss:
    """The BC stage's loss on a fresh actor, drawn after ``seed_stage(stage_seed)``, as the
    stage draws it (the process's random streams are seeded)."""
    seed_stage(stage_seed)
    actor = make_actor(obs_dim, action_dim, tuple(hidden_sizes), device=device)
    return BehaviourCloningLoss(actor)


def load_or_train_bc(
    data: TensorDictBase,
    fingerprint: str,
    obs_dim: int,
    action_dim: int,
    hidden_sizes: list[int],
    config: PretrainConfig,
    seed: int,
    progress: bool = True,
    log_fn: LogFn | None = None,
    cuda_graph: bool = False,
    stage_seed: int | None = None,
) -> tuple[dict[str, torch.Tensor], bool]:
    """The behaviour-cloned actor's state dict, and whether it came from the cache.

    Args:
        data: the dataset TensorDict (on the training device).
        fingerprint: the dataset's fingerprint (cache key).
        obs_dim, action_dim, hidden_sizes: the actor's architecture.
        config: steps, batch size, learning rate, checkpoint interval.
        seed: run seed (in the cache key).
        cuda_graph: capture each step as a CUDA graph (see :func:`run_supervised_stage`).
        stage_seed: the stage's seed (``decisions.seeds.bc``; None: ``seed + BC_SEED_OFFSET``).
    """
    stage_seed = seed + BC_SEED_OFFSET if stage_seed is None else int(stage_seed)
    work_dir = bc_entry(fingerprint, hidden_sizes, config, seed)
    result = work_dir / "result.pt"
    with cache_entry_lock(work_dir, "behaviour-cloning stage"):
        record = {"fingerprint": fingerprint}  # the data's fingerprint holds its content key
        if (cached := read_cached_stage(result, "actor", record)) is not None:
            return cached, True
        loss = new_bc_loss(obs_dim, action_dim, hidden_sizes, stage_seed, data.device)
        actor = loss.actor_network
        pairs = data.select("observation", "action")
        if getattr(config, "converge", False):
            generator = torch.Generator(device=data.device).manual_seed(stage_seed)
            fit_bc_to_convergence(loss, pairs, config, generator, work_dir, log_fn)
        else:
            buffer, generator = _sampler(pairs, config.batch_size, stage_seed)
            run_supervised_stage(
                "bc", loss, buffer, generator, config, work_dir, progress, log_fn,
                cuda_graph=cuda_graph,
            )  # fmt: skip
        return _store_result(actor, "bc", "actor", config.lr, work_dir, record), False


@torch.no_grad()
def bc_holdout_nll(loss: BehaviourCloningLoss, rows: TensorDictBase) -> float:
    """The actor's mean negative log-likelihood of held-out ``[H]`` rows' actions."""
    return float(loss(rows).get("loss_bc"))


def fit_bc_to_convergence(
    loss: BehaviourCloningLoss,
    data: TensorDictBase,
    config: BCConfig,
    generator: torch.Generator,
    work_dir: Path,
    log_fn: LogFn | None = None,
) -> int:
    """The authors' BC (``rlkit/trainers/behavior_clone.py`` in jihwan-jeong/CBOP, lines
    144-247), in place; returns the number of epochs.

    Holds out ``min(config.holdout, N // 5)`` random rows of ``data`` (``observation``,
    ``action`` ``[N]``) and trains on the rest in epochs of ``ceil(N_train / batch_size)``
    Adam steps on ``N_train`` rows drawn with replacement. After each epoch the held-out
    NLL is measured; a relative fall of more than ``config.improvement`` keeps those
    weights as the best, and training ends after ``config.patience`` epochs without one
    (or ``config.max_epochs``), with the best weights restored. The stage is not resumed
    mid-way: a killed one starts again from its seed and gives the same result.
    """
    rows = data.shape[0]
    holdout = min(config.holdout, rows // 5)
    order = torch.randperm(rows, generator=generator, device=data.device)
    test, train_rows = data[order[:holdout]], order[holdout:]
    optimizer = torch.optim.Adam(loss.parameters(), lr=config.lr)
    best_nll = bc_holdout_nll(loss, test)
    best_state = {key: value.clone() for key, value in loss.state_dict().items()}
    epochs, stale, steps = 0, 0, 0
    while stale < config.patience and epochs < config.max_epochs:
        draws = train_rows[
            torch.randint(
                train_rows.numel(), (train_rows.numel(),), generator=generator,
                device=data.device,
            )
        ]  # fmt: skip
        for start in range(0, draws.numel(), config.batch_size):
            batch = data[draws[start : start + config.batch_size]]
            _eager_stage_step("bc", loss, optimizer, batch, steps, work_dir / "partial.pt")
            steps += 1
        epochs += 1
        nll = bc_holdout_nll(loss, test)
        if (best_nll - nll) / max(abs(best_nll), 1e-12) > config.improvement:
            best_nll, stale = nll, 0
            best_state = {key: value.clone() for key, value in loss.state_dict().items()}
        else:
            stale += 1
    loss.load_state_dict(best_state)
    if log_fn is not None:
        log_fn({"bc/epochs": float(epochs), "bc/holdout_nll": best_nll}, steps)
    return epochs


def fqe_target_update(loss: LossModule, config: FQEConfig) -> Callable[[int], None]:
    """The FQE target ensemble's update, called after every gradient step with its number.

    ``config.rounds=None``: a Polyak step of rate ``config.target_tau``.
    ``config.rounds=n``: a hard copy every ``config.steps // n`` steps, so each
    round regresses on the previous round's frozen ensemble (paper Algorithm 2).
    """
    if config.rounds is None:
        soft_update = SoftUpdate(loss, tau=config.target_tau)
        return lambda step: soft_update.step()
    round_steps = config.steps // config.rounds
    # An exact copy at every call: HardUpdate's counter starts at 0 and, with an interval of
    # 0, stays there, so a resumed stage needs no counter state (the step comes from the
    # stage's checkpoint). SoftUpdate(tau=1.0) copies too but warns that eps < 0.5.
    hard_update = HardUpdate(loss, value_network_update_interval=0)

    def update(step: int) -> None:
        if step % round_steps == 0:
            hard_update.step()

    return update


TARGET_CHUNK = 16_384
"""Rows per forward pass when a round's targets are computed."""


@torch.no_grad()
def fqe_round_targets(loss: FittedQEvaluationLoss, data: TensorDictBase) -> torch.Tensor:
    """:meth:`~cbop_torchrl.objectives.pretrain.FittedQEvaluationLoss.regression_target` of
    every row ``[N]``, computed in chunks of :data:`TARGET_CHUNK` rows."""
    chunks = (data[start : start + TARGET_CHUNK] for start in range(0, data.shape[0], TARGET_CHUNK))
    return torch.cat([loss.regression_target(chunk).squeeze(-1) for chunk in chunks])


@torch.no_grad()
def member_holdout_mse(
    loss: FittedQEvaluationLoss, inputs: TensorDictBase, targets: torch.Tensor
) -> torch.Tensor:
    """Each member's mean squared error on held-out rows: ``[H]`` rows -> ``[M]``."""
    q = loss.ensemble_q(inputs, loss.qvalue_network_params).squeeze(-1)  # [M, H]
    return (q - targets).pow(2).mean(-1)


def member_batch_loss(
    loss: FittedQEvaluationLoss, inputs: TensorDictBase, targets: torch.Tensor
) -> torch.Tensor:
    """Summed over members, each member's MSE on its own batch: ``[M, B]`` rows -> scalar."""
    network = loss.qvalue_network

    def member_q(params: TensorDictBase, member_inputs: TensorDictBase) -> torch.Tensor:
        with params.to_module(network):
            return network(member_inputs.copy()).get("state_action_value")

    q = torch.vmap(member_q, randomness="different")(loss.qvalue_network_params, inputs)
    return (q.squeeze(-1) - targets).pow(2).mean(-1).sum()


def fit_fqe_rounds_to_convergence(
    loss: FittedQEvaluationLoss,
    data: TensorDictBase,
    config: FQEConfig,
    generator: torch.Generator,
    work_dir: Path,
    log_fn: LogFn | None = None,
) -> None:
    """The authors' FQE (``rlkit/trainers/pol_eval.py`` in jihwan-jeong/CBOP), in place.

    ``config.rounds`` rounds. Each round computes the targets of every row once with the
    target ensemble (:func:`fqe_round_targets`; the first round's is the freshly
    initialised ensemble), holds out ``min(config.holdout, N // 5)`` random rows, and fits
    the online ensemble to convergence: epochs of ``ceil(N_train / batch_size)`` Adam steps
    in which every member draws its own ``N_train`` rows with replacement; after each
    epoch each member's held-out MSE is measured, a member whose MSE fell by more than
    ``config.improvement`` (relative) keeps those weights as its best, and the round ends
    after ``config.patience`` epochs in which no member improved (or ``config.max_epochs``).
    Every member then takes its best weights and the target ensemble copies them. One Adam
    serves all rounds. After each round ``work_dir/partial.pt`` holds the state, so a
    killed stage resumes at its last finished round (and gives the same result).
    """
    data_rows = data.shape[0]
    num_members = loss.num_members
    holdout = min(config.holdout, data_rows // 5)
    params = loss.qvalue_network_params
    optimizer = torch.optim.Adam(loss.parameters(), lr=config.lr)
    copy_to_target = HardUpdate(loss, value_network_update_interval=0)  # a copy per step()
    stage = PartialStage(work_dir / "partial.pt", loss, optimizer, generator, "round")
    first_round = stage.resume()
    inputs = data.select("observation", "action")
    for round_index in range(first_round, config.rounds):
        targets = fqe_round_targets(loss, data)
        order = torch.randperm(data_rows, generator=generator, device=data.device)
        test_rows, train_rows = order[:holdout], order[holdout:]
        test_inputs, test_targets = inputs[test_rows], targets[test_rows]
        best_mse = member_holdout_mse(loss, test_inputs, test_targets)
        best_params = params.data.clone()
        epochs, stale = 0, 0
        while stale < config.patience and epochs < config.max_epochs:
            draws = train_rows[
                torch.randint(
                    train_rows.numel(), (num_members, train_rows.numel()),
                    generator=generator, device=data.device,
                )
            ]  # fmt: skip
            for start in range(0, train_rows.numel(), config.batch_size):
                rows = draws[:, start : start + config.batch_size]  # [M, B]
                batch_loss = member_batch_loss(loss, inputs[rows], targets[rows])
                optimizer.zero_grad(set_to_none=True)
                batch_loss.backward()
                if not torch.isfinite(batch_loss):
                    raise NonFiniteLossError(
                        f"the fqe stage hit a non-finite loss in round {round_index + 1}, epoch "
                        f"{epochs + 1}; nothing was trained on it. Check the dataset for extreme "
                        "values or lower fqe.lr."
                    )
                optimizer.step()
            epochs += 1
            mse = member_holdout_mse(loss, test_inputs, test_targets)
            improved = (best_mse - mse) / best_mse.abs().clamp_min(1e-12) > config.improvement
            best_mse = torch.where(improved, mse, best_mse)
            best_params[improved] = params.data[improved]
            stale = 0 if bool(improved.any()) else stale + 1
        params.data.copy_(best_params)
        copy_to_target.step()
        if log_fn is not None:
            log_fn(
                {
                    "fqe/round_epochs": float(epochs),
                    "fqe/holdout_mse": float(best_mse.mean()),
                    "fqe/target_mean": float(targets.mean()),
                },
                round_index + 1,
            )
        stage.save(round_index + 1)


@dataclass(frozen=True)
class FQEStage:
    """One run's FQE stage: what names its cache entry and draws its networks.

    Attributes:
        fingerprint: the data's fingerprint (as the stages see it).
        obs_dim, action_dim, hidden_sizes, num_members: the Q-ensemble's sizes.
        gamma, config: the discount and the stage's settings.
        seed: the run's seed (in the key; the priors' seed).
        q_init, layer_norm, prior_scale: the Q-networks' options (see :func:`load_or_train_fqe`).
        stage_seed: the stage's seed (``decisions.seeds.fqe``).
    """

    fingerprint: str
    obs_dim: int
    action_dim: int
    hidden_sizes: tuple[int, ...]
    num_members: int
    gamma: float
    config: FQEConfig
    seed: int
    q_init: str
    layer_norm: bool
    prior_scale: float
    stage_seed: int

    def entry(self) -> Path:
        """The cache entry's folder (``result.pt``; hold its lock to read or write it)."""
        fields = dict(vars(self.config))
        if not fields.get("drop_terminal", True):  # added later: named only when on
            fields.pop("drop_terminal")
        key = {
            "data": self.fingerprint, "config": fields, "hidden": list(self.hidden_sizes),
            "members": self.num_members, "gamma": self.gamma, "seed": self.seed,
            "init": self.q_init,
        }  # fmt: skip
        if self.layer_norm:
            key["layer_norm"] = True
        if self.prior_scale > 0:
            key["prior_scale"] = self.prior_scale
        return _stage_dir("fqe", key)

    def rows(self, data: TensorDictBase) -> TensorDictBase:
        """The ``[N']`` rows FQE fits (a next action; with ``drop_terminal`` no terminal
        row), with their ``row`` index for the bootstrap counts."""
        usable = data.get("next_action_mask")
        if getattr(self.config, "drop_terminal", False):  # the authors' FQE (see FQEConfig)
            usable = usable & ~data.get(("next", "terminated")).reshape(-1)
        keys = ("observation", "action", ("next", "observation"), ("next", "action"),
                ("next", "reward"), ("next", "terminated"))  # fmt: skip
        rows = data.select(*keys)[usable]
        rows.set(ROW_KEY, torch.arange(rows.shape[0], device=data.device))
        return rows

    def networks(self, rows: TensorDictBase) -> tuple[torch.Tensor, list]:
        """``seed_stage(stage_seed)``, then the members' bootstrap counts ``[M, N']`` and the
        M fresh Q-networks, drawn in that order as the stage draws them."""
        seed_stage(self.stage_seed)
        device = rows.device
        counts = bootstrap_counts(self.num_members, rows.shape[0]).to(device)
        qnets = make_qvalue_ensemble(
            self.num_members, self.obs_dim, self.action_dim, self.hidden_sizes, device,
            self.q_init, layer_norm=self.layer_norm, prior_scale=self.prior_scale,
            prior_seed=self.seed,
        )  # fmt: skip
        return counts, qnets


def load_or_train_fqe(
    data: TensorDictBase,
    fingerprint: str,
    obs_dim: int,
    action_dim: int,
    hidden_sizes: list[int],
    num_members: int,
    gamma: float,
    config: FQEConfig,
    seed: int,
    progress: bool = True,
    log_fn: LogFn | None = None,
    q_init: str = "torch",
    layer_norm: bool = False,
    prior_scale: float = 0.0,
    cuda_graph: bool = False,
    stage_seed: int | None = None,
) -> tuple[dict[str, torch.Tensor], bool]:
    """FQE of the behaviour policy for an M-member Q-ensemble.

    ``config.converge`` runs the authors' scheme (:func:`fit_fqe_rounds_to_convergence`),
    otherwise ``config.steps`` steps of :func:`run_supervised_stage`. ``q_init`` is the
    Q-networks' initialisation (:func:`~cbop_torchrl.modules.actor_critic.make_qvalue`).
    ``layer_norm`` gives them ``Linear -> LayerNorm -> ReLU`` hidden layers (beyond the
    paper, whose critics are plain MLPs: see ``make_qvalue``); the cache key holds it
    only when True, so the plain networks' cached results keep their keys.
    ``prior_scale`` > 0 gives every member a fixed random prior network (beyond the
    paper: ``Q_m = f_m + prior_scale * p_m``, see ``make_qvalue``; the priors are
    seeded with ``seed``, as CBOP's); the cache key holds it only when > 0.
    ``cuda_graph`` captures the steps of the latter (:func:`run_supervised_stage`); the
    authors' scheme runs eagerly. ``config.drop_terminal`` leaves the terminal rows out, as
    the authors' dataset of targets does (their ``simple_replay_buffer.py``, lines 271-295).
    ``seed``: the run's (cache key); ``stage_seed``: the stage's (None: seed + FQE_SEED_OFFSET).

    Returns:
        The :class:`FittedQEvaluationLoss` state dict (``qvalue_network_params.*``
        and ``target_qvalue_network_params.*``, stacked ``[M, ...]``, the same
        names ``CBOPLoss`` uses) and whether it came from the cache.
    """
    stage = FQEStage(
        fingerprint, obs_dim, action_dim, tuple(hidden_sizes), num_members, gamma, config,
        seed, str(q_init), bool(layer_norm), float(prior_scale),
        seed + FQE_SEED_OFFSET if stage_seed is None else int(stage_seed),
    )  # fmt: skip
    stage_seed = stage.stage_seed
    work_dir = stage.entry()
    result = work_dir / "result.pt"
    with cache_entry_lock(work_dir, "FQE stage"):
        record = {"fingerprint": fingerprint}
        if (cached := read_cached_stage(result, "qvalue", record)) is not None:
            return cached, True
        fqe_data = stage.rows(data)
        counts, qnets = stage.networks(fqe_data)
        if config.converge:
            loss = FittedQEvaluationLoss(qnets, gamma=gamma, eta=config.eta)
            generator = torch.Generator(device=data.device).manual_seed(stage_seed)
            fit_fqe_rounds_to_convergence(loss, fqe_data, config, generator, work_dir, log_fn)
        else:
            loss = FittedQEvaluationLoss(
                qnets, gamma=gamma, bootstrap_weights=counts, eta=config.eta
            )
            buffer, generator = _sampler(fqe_data, config.batch_size, stage_seed)
            run_supervised_stage(
                "fqe", loss, buffer, generator, config, work_dir, progress, log_fn,
                fqe_target_update(loss, config), cuda_graph=cuda_graph,
            )  # fmt: skip
        return _store_result(loss, "fqe", "qvalue", config.lr, work_dir, record), False
