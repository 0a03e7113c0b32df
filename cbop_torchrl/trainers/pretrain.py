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

import math
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDictBase
from torchrl.checkpoint import GlobalRNGState
from torchrl.data import ReplayBuffer
from torchrl.objectives import LossModule, SoftUpdate
from tqdm.auto import tqdm

from cbop_torchrl.config import FQEConfig, PretrainConfig
from cbop_torchrl.data import make_replay_buffer
from cbop_torchrl.modules.actor_critic import make_actor, make_qvalue_ensemble
from cbop_torchrl.objectives.pretrain import (
    ROW_KEY,
    BehaviourCloningLoss,
    FittedQEvaluationLoss,
    bootstrap_counts,
)
from cbop_torchrl.trainers.checkpoint import NonFiniteLossError
from cbop_torchrl.utils import (
    atomic_torch_save,
    cache_dir,
    cache_entry_lock,
    config_hash,
    describe_load_error,
    seed_everything,
)

LogFn = Callable[[dict[str, float], int], None]

BC_SEED_OFFSET = 1
FQE_SEED_OFFSET = 2


def _sampler(data: TensorDictBase, batch_size: int, seed: int) -> tuple[ReplayBuffer, Any]:
    buffer = make_replay_buffer(data, batch_size, device=data.device)
    generator = torch.Generator(device=data.device).manual_seed(seed)
    buffer.set_rng(generator)
    return buffer, generator


def run_supervised_stage(
    name: str,
    loss: LossModule,
    buffer: ReplayBuffer,
    generator: torch.Generator,
    config: PretrainConfig,
    work_dir: Path,
    progress: bool = True,
    log_fn: LogFn | None = None,
    after_step: Callable[[int], None] | None = None,
    log_interval: int = 1000,
) -> dict[str, float]:
    """``config.steps`` Adam steps on the sum of ``loss``'s ``loss_*`` entries.

    Resumes from ``work_dir/partial.pt`` when present and writes it every
    ``config.checkpoint_interval`` steps.

    Returns:
        The loss outputs of the last step, as floats.

    Raises:
        NonFiniteLossError: a loss or gradient became NaN/inf (the step is not applied).
    """
    optimizer = torch.optim.Adam(loss.parameters(), lr=config.lr)
    rng = GlobalRNGState()
    partial = work_dir / "partial.pt"
    start = 0
    if (state := read_cached_stage(partial)) is not None:
        loss.load_state_dict(state["loss"])
        optimizer.load_state_dict(state["optimizer"])
        generator.set_state(state["generator"])
        rng.load_state_dict(state["rng"])
        start = int(state["step"])
    last: dict[str, float] = {}
    bar = tqdm(
        range(start, config.steps),
        initial=start,
        total=config.steps,
        desc=name,
        disable=not progress,
        dynamic_ncols=True,
    )
    for step in bar:
        batch = buffer.sample()
        out = loss(batch)
        total = sum(value for key, value in out.items() if key.startswith("loss_"))
        optimizer.zero_grad(set_to_none=True)
        total.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(loss.parameters(), math.inf)
        if not (torch.isfinite(total) and torch.isfinite(grad_norm)):
            raise NonFiniteLossError(
                f"the {name} stage hit a non-finite loss or gradient at step {step + 1} "
                f"(loss {float(total)}, gradient norm {float(grad_norm)}); nothing was trained "
                f"on it. Its last good checkpoint is {partial if partial.is_file() else 'none'}. "
                f"Check the dataset for extreme values or lower {name}.lr."
            )
        optimizer.step()
        done = step + 1
        if after_step is not None:
            after_step(done)
        if done % log_interval == 0 or done == config.steps:
            last = {key: float(value.detach()) for key, value in out.items() if value.ndim == 0}
            bar.set_postfix({key: f"{value:.3g}" for key, value in last.items()})
            if log_fn is not None:
                log_fn({f"{name}/{key}": value for key, value in last.items()}, done)
        if done % config.checkpoint_interval == 0 and done < config.steps:
            atomic_torch_save(
                {
                    "loss": loss.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "generator": generator.get_state(),
                    "rng": rng.state_dict(),
                    "step": done,
                },
                partial,
            )
    return last


def read_cached_stage(path: Path, key: str | None = None) -> Any | None:
    """``torch.load(path, weights_only=True)`` (its ``key`` entry when given), or None
    when the file is absent or unreadable.

    A damaged cache file (a disk error, a copy cut short, another version's
    format) is not fatal: a warning names it, the file is removed and the stage
    is trained again.
    """
    if not path.is_file():
        return None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
        return state if key is None else state[key]
    except Exception as error:
        warnings.warn(
            f"the cache file {path} cannot be read ({describe_load_error(error)}); it "
            "was removed and this stage is trained again",
            stacklevel=2,
        )
        path.unlink(missing_ok=True)
        return None


def _stage_dir(stage: str, key: dict[str, Any]) -> Path:
    return cache_dir("pretrain", stage, config_hash(key))


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
) -> tuple[dict[str, torch.Tensor], bool]:
    """The behaviour-cloned actor's state dict, and whether it came from the cache.

    Args:
        data: the dataset TensorDict (on the training device).
        fingerprint: the dataset's fingerprint (cache key).
        obs_dim, action_dim, hidden_sizes: the actor's architecture.
        config: steps, batch size, learning rate, checkpoint interval.
        seed: run seed (the stage uses ``seed + BC_SEED_OFFSET``).
    """
    key = {"data": fingerprint, "config": vars(config), "hidden": list(hidden_sizes), "seed": seed}
    work_dir = _stage_dir("bc", key)
    result = work_dir / "result.pt"
    with cache_entry_lock(work_dir, "behaviour-cloning stage"):
        if (cached := read_cached_stage(result, "actor")) is not None:
            return cached, True
        seed_everything(seed + BC_SEED_OFFSET)
        actor = make_actor(obs_dim, action_dim, tuple(hidden_sizes), device=data.device)
        loss = BehaviourCloningLoss(actor)
        buffer, generator = _sampler(
            data.select("observation", "action"), config.batch_size, seed + BC_SEED_OFFSET
        )
        run_supervised_stage("bc", loss, buffer, generator, config, work_dir, progress, log_fn)
        state = {k: v.detach().cpu() for k, v in actor.state_dict().items()}
        atomic_torch_save({"actor": state}, result)
        (work_dir / "partial.pt").unlink(missing_ok=True)
        return state, False


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
    # tau = 1 is an exact copy; HardUpdate counts calls in a counter that a resumed run
    # would not restore, the step number here comes from the stage's checkpoint.
    hard_update = SoftUpdate(loss, tau=1.0)

    def update(step: int) -> None:
        if step % round_steps == 0:
            hard_update.step()

    return update


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
) -> tuple[dict[str, torch.Tensor], bool]:
    """FQE of the behaviour policy for an M-member Q-ensemble.

    Returns:
        The :class:`FittedQEvaluationLoss` state dict (``qvalue_network_params.*``
        and ``target_qvalue_network_params.*``, stacked ``[M, ...]``, the same
        names ``CBOPLoss`` uses) and whether it came from the cache.
    """
    key = {
        "data": fingerprint,
        "config": vars(config),
        "hidden": list(hidden_sizes),
        "members": num_members,
        "gamma": gamma,
        "seed": seed,
    }
    work_dir = _stage_dir("fqe", key)
    result = work_dir / "result.pt"
    with cache_entry_lock(work_dir, "FQE stage"):
        if (cached := read_cached_stage(result, "qvalue")) is not None:
            return cached, True
        seed_everything(seed + FQE_SEED_OFFSET)
        usable = data.get("next_action_mask")
        fqe_data = data.select(
            "observation",
            "action",
            ("next", "observation"),
            ("next", "action"),
            ("next", "reward"),
            ("next", "terminated"),
        )[usable]
        fqe_data.set(ROW_KEY, torch.arange(fqe_data.shape[0], device=data.device))
        counts = bootstrap_counts(num_members, fqe_data.shape[0]).to(data.device)
        qnets = make_qvalue_ensemble(
            num_members, obs_dim, action_dim, tuple(hidden_sizes), device=data.device
        )
        loss = FittedQEvaluationLoss(qnets, gamma=gamma, bootstrap_weights=counts, eta=config.eta)
        buffer, generator = _sampler(fqe_data, config.batch_size, seed + FQE_SEED_OFFSET)
        run_supervised_stage(
            "fqe", loss, buffer, generator, config, work_dir, progress, log_fn,
            fqe_target_update(loss, config),
        )  # fmt: skip
        state = {k: v.detach().cpu() for k, v in loss.state_dict().items()}
        atomic_torch_save({"qvalue": state}, result)
        (work_dir / "partial.pt").unlink(missing_ok=True)
        return state, False
