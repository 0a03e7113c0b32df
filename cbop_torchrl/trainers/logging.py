"""Logging through TorchRL's loggers, and the trainer hook that feeds them.

``csv`` (default) writes ``<run_dir>/logs/<name>/scalars/<metric>.csv``;
``tensorboard`` writes event files under ``<run_dir>/logs``; ``wandb`` runs
in offline mode (no account, no network) under ``<run_dir>/logs/wandb``, to
be uploaded later with ``wandb sync`` if wanted.
"""

from __future__ import annotations

import os
import time
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDictBase
from torchrl.record.loggers import Logger
from torchrl.trainers import Trainer, TrainerHookBase

from cbop_torchrl.utils import atomic_write


def make_logger(
    backend: str, run_dir: Path, exp_name: str, project: str, resume_step: int | None = None
) -> Logger | None:
    """A TorchRL logger writing under ``run_dir/logs`` (None for ``backend="none"``).

    ``resume_step``: the run continues from a checkpoint at that step, so CSV
    rows logged past it are dropped first (:func:`drop_rows_after`).
    """
    log_dir = Path(run_dir) / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    if backend == "none":
        return None
    if backend == "csv":
        from torchrl.record.loggers import CSVLogger

        logger = CSVLogger(exp_name, log_dir=str(log_dir))
        if resume_step is not None:
            drop_rows_after(logger, resume_step)
        return logger
    if backend == "tensorboard":
        from torchrl.record.loggers import TensorboardLogger

        return TensorboardLogger(exp_name, log_dir=str(log_dir))
    if backend == "wandb":
        from torchrl.record.loggers import WandbLogger

        os.environ.setdefault("WANDB_SILENT", "true")
        return WandbLogger(
            exp_name, offline=True, save_dir=str(log_dir), project=project, log_env_packages=False
        )
    raise ValueError(f"unknown logger backend {backend!r}; use csv, tensorboard, wandb or none")


#: Log prefixes on the training-step axis: what a resumed run logs again.
RESUMED_PREFIXES = ("train/", "eval/", "final/")


def drop_rows_after(
    logger: Logger | None, step: int, prefixes: tuple[str, ...] = RESUMED_PREFIXES
) -> int:
    """Removes CSV rows past ``step`` from the ``prefixes`` logs; returns how many.

    A run killed after its last checkpoint logged rows it will log again when
    resumed from that checkpoint; without this the CSV files would hold those
    steps twice. Files are rewritten atomically. Other backends keep their
    own history (TensorBoard shows the later point; wandb offline runs are new
    runs), so only the CSV logger is touched.
    """
    from torchrl.record.loggers import CSVLogger

    if not isinstance(logger, CSVLogger):
        return 0
    scalars = Path(logger.experiment.log_dir) / "scalars"
    dropped = 0
    for prefix in prefixes:
        for path in sorted((scalars / prefix).rglob("*.csv")):
            lines = path.read_text().splitlines(keepends=True)
            kept = [line for line in lines if _row_step(line) <= step]  # drops a partial line
            if len(kept) != len(lines):
                dropped += len(lines) - len(kept)
                text = "".join(kept)
                atomic_write(path, lambda tmp, text=text: tmp.write_text(text))
    return dropped


def _row_step(line: str) -> float:
    """The step of a complete ``step,value`` row; inf for a line cut short by a kill."""
    if not line.endswith("\n") or "," not in line:
        return float("inf")
    try:
        return float(line.split(",", 1)[0])
    except ValueError:
        return float("inf")


def log_scalars(logger: Logger | None, values: Mapping[str, float], step: int) -> None:
    """Writes every finite scalar of ``values`` at ``step`` (no-op without a logger)."""
    if logger is None:
        return
    for name, value in values.items():
        logger.log_scalar(name, float(value), step=step)


def flatten_metrics(metrics: TensorDictBase, prefix: str = "") -> dict[str, float]:
    """Scalars of a (nested) loss TensorDict; a vector ``v`` ``[n]`` becomes ``v/0..v/n-1``.

    ``("cbop", "weights")`` of shape ``[H+1]`` becomes ``cbop/weights/0`` ... ``cbop/weights/H``.
    """
    flat: dict[str, float] = {}
    for key, value in metrics.items(include_nested=True, leaves_only=True):
        name = prefix + ("/".join(key) if isinstance(key, tuple) else key)
        if not isinstance(value, torch.Tensor) or not value.is_floating_point():
            continue
        value = value.detach().float().cpu()
        if value.ndim == 0:
            flat[name] = float(value)
        elif value.ndim == 1:
            for index, item in enumerate(value.tolist()):
                flat[f"{name}/{index}"] = float(item)
    return flat


class MetricsHook(TrainerHookBase):
    """Averages the loss module's outputs over ``interval`` steps and logs them.

    Registered at ``post_optim_complete_log``: it receives the step's losses
    and diagnostics (``loss_*``, ``alpha``, ``entropy``, ``qvalue_mse``,
    ``edac_penalty``, ``cbop/weights/h``, ``cbop/expected_horizon``,
    ``cbop/value_var_share/h``, ``cbop/target_mean``, ...), and every
    ``interval`` steps writes their window means under ``train/`` plus
    ``train/grad_steps_per_s``. It returns a few numbers for the progress bar.

    The first window's means are kept (and checkpointed) so the run summary
    can report e.g. the expected horizon at the start and the end of training.
    """

    PBAR_KEYS = ("loss_qvalue", "cbop/expected_horizon", "alpha")

    def __init__(self, logger: Logger | None, interval: int) -> None:
        self.logger = logger
        self.interval = int(interval)
        self._sums: dict[str, float] = defaultdict(float)
        self._count = 0
        self._clock = time.perf_counter()
        self.first_window: dict[str, float] = {}
        self.last_window: dict[str, float] = {}

    def __call__(self, step: int, losses: TensorDictBase | None) -> dict[str, Any] | None:
        if losses is None:
            return None
        for name, value in flatten_metrics(losses).items():
            self._sums[name] += value
        self._count += 1
        if step % self.interval != 0:
            return None
        means = {name: total / self._count for name, total in self._sums.items()}
        elapsed = time.perf_counter() - self._clock
        means["grad_steps_per_s"] = self._count / max(elapsed, 1e-9)
        self._sums.clear()
        self._count = 0
        self._clock = time.perf_counter()
        if not self.first_window:
            self.first_window = dict(means)
        self.last_window = dict(means)
        log_scalars(self.logger, {f"train/{k}": v for k, v in means.items()}, step)
        shown = {k.split("/")[-1]: means[k] for k in self.PBAR_KEYS if k in means}
        return {**shown, "log_pbar": True}

    def state_dict(self) -> dict[str, Any]:
        return {"first_window": dict(self.first_window), "last_window": dict(self.last_window)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.first_window = dict(state_dict.get("first_window", {}))
        self.last_window = dict(state_dict.get("last_window", {}))

    def register(self, trainer: Trainer, name: str = "metrics") -> None:
        trainer.register_op("post_optim_complete_log", self)
        trainer.register_module(name, self)
