"""The supervised pretraining stages' loop: Adam steps, finiteness checks, partial checkpoints.

:func:`run_supervised_stage` runs a stage's ``config.steps`` steps on a TorchRL
``LossModule`` (eagerly, or each one a replay of a captured CUDA graph) and writes its
``partial.pt`` (:class:`PartialStage`) every ``config.checkpoint_interval`` steps, so a
killed stage resumes mid-way; :func:`read_cached_stage` reads a cached stage's file and
:func:`check_finite_state` refuses to cache a diverged one. The stages themselves (their
cache keys, data and networks) are :mod:`cbop_torchrl.trainers.pretrain`.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDictBase
from torchrl.checkpoint import GlobalRNGState
from torchrl.data import ReplayBuffer
from torchrl.objectives import LossModule
from tqdm.auto import tqdm

from cbop_torchrl.accel import CapturedStep
from cbop_torchrl.config import PretrainConfig
from cbop_torchrl.data import make_replay_buffer
from cbop_torchrl.trainers.checkpoint import NonFiniteLossError, read_stage, save_stage
from cbop_torchrl.trainers.update import GradientStep

LogFn = Callable[[dict[str, float], int], None]


def _sampler(data: TensorDictBase, batch_size: int, seed: int) -> tuple[ReplayBuffer, Any]:
    buffer = make_replay_buffer(data, batch_size, device=data.device)
    generator = torch.Generator(device=data.device).manual_seed(seed)
    buffer.set_rng(generator)
    return buffer, generator


@dataclass
class PartialStage:
    """A stage's ``partial.pt``: what a killed stage resumes from.

    It holds the loss's parameters, the optimizer, the sampling generator, the global RNG
    and how far the stage got (``counter``: ``"step"`` for :func:`run_supervised_stage`,
    ``"round"`` for :func:`fit_fqe_rounds_to_convergence`).
    """

    path: Path
    loss: LossModule
    optimizer: torch.optim.Optimizer
    generator: torch.Generator
    counter: str
    rng: GlobalRNGState = field(default_factory=GlobalRNGState)

    def resume(self) -> int:
        """Loads the stage's state when ``partial.pt`` may be used; returns its counter (0
        when there is none, :func:`read_cached_stage`)."""
        if (state := read_cached_stage(self.path)) is None:
            return 0
        self.loss.load_state_dict(state["loss"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.generator.set_state(state["generator"])
        self.rng.load_state_dict(state["rng"])
        return int(state[self.counter])

    def save(self, counter: int) -> None:
        """Writes the stage's state, ``counter`` steps or rounds done, as ``partial.pt``."""
        state = {
            "loss": self.loss.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "generator": self.generator.get_state(),
            "rng": self.rng.state_dict(),
            self.counter: counter,
        }
        save_stage(state, self.path, None)


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
    cuda_graph: bool = False,
) -> dict[str, float]:
    """``config.steps`` Adam steps on the sum of ``loss``'s ``loss_*`` entries.

    Resumes from ``work_dir/partial.pt`` when present and writes it every
    ``config.checkpoint_interval`` steps. With ``cuda_graph`` (a CUDA device) each
    step is one replay of a captured :class:`~cbop_torchrl.trainers.update.GradientStep`
    with a fused capturable Adam: a non-finite step is skipped on the device and
    reported at the next log step; ``after_step`` runs eagerly after each replay.

    Returns:
        The loss outputs of the last step, as floats.

    Raises:
        NonFiniteLossError: a loss or gradient became NaN/inf (the step is not applied).
    """
    captured = None
    if cuda_graph:
        optimizer = torch.optim.Adam(loss.parameters(), lr=config.lr, fused=True, capturable=True)
        captured = CapturedStep(GradientStep(loss, optimizer))
    else:
        optimizer = torch.optim.Adam(loss.parameters(), lr=config.lr)
    stage = PartialStage(work_dir / "partial.pt", loss, optimizer, generator, "step")
    partial = stage.path
    start = stage.resume()
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
        done = step + 1
        if captured is not None:
            out = captured(batch)
            if done % log_interval == 0 or done == config.steps:
                _raise_if_a_step_was_not_finite(name, captured.step, start, partial)
        else:
            out = _eager_stage_step(name, loss, optimizer, batch, step, partial)
        if after_step is not None:
            after_step(done)
        if done % log_interval == 0 or done == config.steps:
            last = {key: float(value.detach()) for key, value in out.items() if value.ndim == 0}
            bar.set_postfix({key: f"{value:.3g}" for key, value in last.items()})
            if log_fn is not None:
                log_fn({f"{name}/{key}": value for key, value in last.items()}, done)
        if done % config.checkpoint_interval == 0 and done < config.steps:
            stage.save(done)
    return last


def _eager_stage_step(
    name: str,
    loss: LossModule,
    optimizer: torch.optim.Optimizer,
    batch: TensorDictBase,
    step: int,
    partial: Path,
) -> TensorDictBase:
    """One eager Adam step, refused before ``optimizer.step()`` when not finite."""
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
    return out


def _raise_if_a_step_was_not_finite(
    name: str, step: GradientStep, start: int, partial: Path
) -> None:
    """Reads a captured stage's finiteness record (one host read, at log steps)."""
    bad_steps, first_bad, names = step.health.read()
    if bad_steps:
        raise NonFiniteLossError(
            f"the {name} stage hit a non-finite {', '.join(names)} at step "
            f"{start + first_bad + 1} ({bad_steps} such step(s), skipped on the device); "
            f"nothing was trained on them. Its last good checkpoint is "
            f"{partial if partial.is_file() else 'none'}. Check the dataset for extreme "
            f"values or lower {name}.lr."
        )


def read_cached_stage(
    path: Path, key: str | None = None, data: dict[str, Any] | None = None
) -> Any | None:
    """The cached stage at ``path`` (its ``key`` entry when given), or None when there is
    none or it may not be used.

    Written by :func:`~cbop_torchrl.trainers.checkpoint.save_stage`, so it carries its
    SHA-256 and a record of its cache entry and data; :func:`~cbop_torchrl.trainers.
    checkpoint.read_stage` checks both (``data``: the record of this run's data). A damaged,
    unreadable, moved, other data's or unrecorded file is not fatal: a warning names it, the
    file is removed and the stage is trained again.
    """
    what = {"partial.pt": "partial stage"}.get(path.name, "stage")
    state = read_stage(path, data, f"{what} ({path.parent.parent.name})")
    if state is None:
        return None
    if key is not None and key not in state:
        warnings.warn(
            f"the cached stage {str(path)!r} holds no {key!r}; it was removed and this stage is "
            "trained again",
            stacklevel=2,
        )
        path.unlink(missing_ok=True)
        return None
    return state if key is None else state[key]


def check_finite_state(state: dict[str, torch.Tensor], stage: str, lr: float) -> None:
    """Raises :class:`NonFiniteLossError` when a trained stage's parameters hold NaN/inf.

    Checked before the stage is cached: the per-step checks see the loss and the
    gradients, not the parameters that the last optimizer step wrote.
    """
    bad = [
        name
        for name, value in state.items()
        if value.is_floating_point() and not bool(torch.isfinite(value).all())
    ]
    if bad:
        raise NonFiniteLossError(
            f"the {stage} stage diverged: its trained {', '.join(bad[:3])} hold NaN or inf, so "
            f"it was not cached. The usual causes are a learning rate too large for the data "
            f"({stage}.lr={lr:g}) or data of a very large scale; run again with a smaller "
            f"{stage}.lr or rescale the data."
        )


__all__ = [
    "LogFn",
    "PartialStage",
    "check_finite_state",
    "read_cached_stage",
    "run_supervised_stage",
]
