"""Logging through TorchRL's loggers, and the trainer hook that feeds them.

``csv`` (default) writes ``<run_dir>/logs/<name>/scalars/<metric>.csv``;
``tensorboard`` writes event files under ``<run_dir>/logs`` (and the run's
hparams with its final score at the end); ``wandb`` logs under
``<run_dir>/logs/wandb``, offline by default (``logger.mode=offline``: no
account, no network; ``wandb sync`` uploads it later), with the resolved
config as the run's config and one run id per run directory.
"""

from __future__ import annotations

import os
import re
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TextIO

import torch
from tensordict import TensorDictBase
from torchrl.record.loggers import CSVLogger, Logger, get_logger
from torchrl.trainers import Trainer, TrainerHookBase

from cbop_torchrl.io import atomic_write

#: wandb modes accepted by ``logger.mode`` (wandb.init's ``mode``).
WANDB_MODES = ("online", "offline", "disabled")
WANDB_ID_FILE = "wandb_run_id"


def make_logger(
    backend: str,
    run_dir: Path,
    exp_name: str,
    project: str = "cbop-torchrl",
    *,
    mode: str = "offline",
    entity: str | None = None,
    group: str | None = None,
    tags: Sequence[str] = (),
    run_config: Mapping[str, Any] | None = None,
) -> Logger | None:
    """A TorchRL logger writing under ``run_dir/logs`` (None for ``backend="none"``).

    Args:
        backend: ``csv``, ``tensorboard``, ``wandb`` or ``none``.
        run_dir: the run directory; logs go to ``run_dir/logs``.
        exp_name: the experiment's name (the CSV/TensorBoard sub-directory, the wandb run name).
        project, entity, group, tags: the wandb run's place (wandb only).
        mode: wandb's ``online``, ``offline`` (default: no account, no network; upload
            later with ``wandb sync``) or ``disabled``.
        run_config: the resolved run configuration, logged as the run's config
            (wandb's run config, TensorBoard's hparams with the final score at
            :func:`log_final_hparams`).

    The CSV logger is :class:`ResumableCSVLogger`: a resumed or restarted run
    replaces the rows it logs again instead of appending a second copy. A wandb
    run keeps one id per run directory (stored in ``logs/wandb_run_id``) and is
    opened with ``resume="allow"``, so a resumed run continues the same wandb run.
    """
    log_dir = Path(run_dir) / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    if backend == "none":
        return None
    if backend == "csv":
        # get_logger("csv") builds a plain CSVLogger, which appends to the files of an
        # earlier session; the subclass keeps every step once (see its docstring).
        return ResumableCSVLogger(exp_name, log_dir=str(log_dir))
    if backend == "tensorboard":
        return get_logger("tensorboard", str(log_dir), exp_name)
    if backend == "wandb":
        if mode not in WANDB_MODES:
            raise ValueError(f"logger.mode={mode!r} must be one of {WANDB_MODES}")
        os.environ.setdefault("WANDB_SILENT", "true")
        wandb_kwargs = {
            "id": wandb_run_id(log_dir),
            "resume": "allow",
            "project": project,
            "entity": entity,
            "group": group,
            "tags": list(tags) or None,
            "mode": mode,
            "config": dict(run_config) if run_config is not None else None,
            "log_env_packages": False,
        }
        logger = get_logger("wandb", str(log_dir), exp_name, wandb_kwargs=wandb_kwargs)
        return logger
    raise ValueError(f"unknown logger backend {backend!r}; use csv, tensorboard, wandb or none")


def wandb_run_id(log_dir: Path) -> str:
    """The wandb run id of this run directory: read from ``log_dir/wandb_run_id``, else new.

    The same id on every session of a run makes wandb continue one run
    (``resume="allow"``) instead of opening a new one per restart.
    """
    path = Path(log_dir) / WANDB_ID_FILE
    if path.is_file() and path.read_text().strip():
        return path.read_text().strip()
    run_id = uuid.uuid4().hex[:12]  # wandb ids: letters and digits
    atomic_write(path, lambda tmp: tmp.write_text(run_id + "\n"))
    return run_id


class ResumableCSVLogger(CSVLogger):
    """TorchRL's CSV logger that never holds a step twice across sessions.

    The first row a session writes to a metric's file at step ``s`` first
    removes that file's rows at steps ``>= s`` (and a line cut short by a
    kill). Every stage logs its metrics at increasing steps on a fixed
    schedule, so whatever a killed session logged past the point the new
    session restarts from (a CBOP checkpoint, a BC/FQE partial checkpoint, the
    first epoch of a retrained dynamics model, the final evaluation) is exactly
    what the new session writes again: after any sequence of kills and resumes
    each step is in each file once. Files are rewritten atomically.
    """

    def __init__(self, exp_name: str, log_dir: str | None = None) -> None:
        super().__init__(exp_name, log_dir=log_dir)
        self._written: set[str] = set()

    def log_scalar(self, name: str, value: float, step: int | None = None) -> None:
        if name not in self._written:
            self._written.add(name)
            if step is not None:
                path = Path(self.experiment.log_dir) / "scalars" / f"{name}.csv"
                drop_rows_from(path, step)
        super().log_scalar(name, value, step=step)


def drop_rows_from(path: Path, step: float) -> int:
    """Removes the rows of a ``step,value`` CSV file at steps ``>= step``; returns how many.

    A line without its newline (a write cut short by a kill) goes too.
    """
    if not path.is_file():
        return 0
    lines = path.read_text().splitlines(keepends=True)
    kept = [line for line in lines if _row_step(line) < step]
    if len(kept) != len(lines):
        text = "".join(kept)
        atomic_write(path, lambda tmp: tmp.write_text(text))
    return len(lines) - len(kept)


def _row_step(line: str) -> float:
    """The step of a complete ``step,value`` row; inf for a line cut short by a kill."""
    if not line.endswith("\n") or "," not in line:
        return float("inf")
    try:
        return float(line.split(",", 1)[0])
    except ValueError:
        return float("inf")


def flatten_config(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested config as ``{"a/b": value}`` with TensorBoard-friendly values.

    Numbers, strings and booleans stay; None and lists become strings.
    """
    flat: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flatten_config(value, f"{name}/"))
        elif isinstance(value, (bool, int, float, str)):
            flat[name] = value
        else:
            flat[name] = str(value)
    return flat


def log_final(
    logger: Logger | None, run_config: Mapping[str, Any], final: Mapping[str, float], step: int
) -> None:
    """Logs the final scores at ``step`` and closes the logger.

    TensorBoard also gets the run's hparams with the final scores as their
    metrics (TorchRL's ``TensorboardLogger.log_hparams`` writes hparams with no
    metrics, so ``add_hparams`` is called on its writer directly); wandb gets
    them in the run summary.
    """
    if logger is None:
        return
    log_scalars(logger, final, step)
    from torchrl.record.loggers import TensorboardLogger, WandbLogger

    if isinstance(logger, TensorboardLogger):
        logger.experiment.add_hparams(flatten_config(run_config), dict(final), run_name="hparams")
    elif isinstance(logger, WandbLogger):
        logger.experiment.summary.update(dict(final))
    logger.shutdown()


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
        # Window sums stay on the loss's device: read once per interval, not every step.
        self._sums: dict[str, torch.Tensor] = {}
        self._count = 0
        self._clock = time.perf_counter()
        self.first_window: dict[str, float] = {}
        self.last_window: dict[str, float] = {}

    def __call__(self, step: int, losses: TensorDictBase | None) -> dict[str, Any] | None:
        if losses is None:
            return None
        for key, value in losses.items(include_nested=True, leaves_only=True):
            if not isinstance(value, torch.Tensor) or not value.is_floating_point():
                continue
            if value.ndim > 1:
                continue
            name = "/".join(key) if isinstance(key, tuple) else key
            value = value.detach().float()
            total = self._sums.get(name)
            self._sums[name] = value.clone() if total is None else total.add_(value)
        self._count += 1
        if step % self.interval != 0:
            return None
        means = self._read_means()
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

    def _read_means(self) -> dict[str, float]:
        """The window means as floats: one device-to-host copy for all metrics."""
        if not self._sums:
            return {}
        names = list(self._sums)
        flat = torch.cat([self._sums[name].reshape(-1) for name in names]) / self._count
        values = flat.cpu().tolist()
        means: dict[str, float] = {}
        offset = 0
        for name in names:
            total = self._sums[name]
            if total.ndim == 0:
                means[name] = values[offset]
            else:
                for index in range(total.numel()):
                    means[f"{name}/{index}"] = values[offset + index]
            offset += total.numel()
        return means

    def state_dict(self) -> dict[str, Any]:
        """The first and last windows (the run checkpoint's ``metrics_windows``)."""
        return {"first_window": dict(self.first_window), "last_window": dict(self.last_window)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.first_window = dict(state_dict.get("first_window", {}))
        self.last_window = dict(state_dict.get("last_window", {}))

    def register(self, trainer: Trainer, name: str = "metrics") -> None:
        trainer.register_op("post_optim_complete_log", self)


class ProgressLines:
    """A stream for progress bars on a non-terminal: a few whole lines per bar, not a refresh
    per fragment.

    tqdm redraws its bar by writing ``"\r" + status`` many times a second; on a terminal
    that is a live bar, but in a file (``nohup``, a cluster job, CI) each redraw stays, a
    few MB for a long run. Wrapped around that file (as ``sys.stderr`` while a program
    runs, :func:`cbop_torchrl.cli.hydra_entry`), a bar's first status is written as a line,
    then at most one line every ``interval`` seconds and only when the percentage moved by
    at least ``min_percent`` points, then its final status when the bar closes (or when
    anything else is written). Everything that is not a bar's redraw passes through unchanged.
    """

    _PERCENT = re.compile(r"(\d+)%\|")

    def __init__(
        self,
        stream: TextIO,
        interval: float = 30.0,
        min_percent: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stream = stream
        self.interval = float(interval)
        self.min_percent = float(min_percent)
        self.clock = clock
        self._open = False  # a bar has written its first line and not closed
        self._pending: str | None = None  # the bar's latest status not written yet
        self._last_time = 0.0
        self._last_percent: int | None = None

    def write(self, text: str) -> int:
        if text.startswith("\r"):
            self._status(text.lstrip("\r").rstrip())
        elif text == "":  # tqdm writes "" to test the stream before closing a bar
            pass
        elif text == "\n" and self._open:  # tqdm closes a bar (leave=True) with a newline
            self._close()
        else:
            self._close()
            self.stream.write(text)
        return len(text)

    def _status(self, status: str) -> None:
        if not status:  # a bar cleared on close (leave=False)
            self._close()
            return
        match = self._PERCENT.search(status)
        percent = int(match[1]) if match else None
        now = self.clock()
        if self._open:
            moved = (
                percent is None
                or self._last_percent is None
                or percent - self._last_percent >= self.min_percent
            )
            if now - self._last_time < self.interval or not moved:
                self._pending = status
                return
        self._line(status, now, percent)

    def _line(self, status: str, now: float, percent: int | None) -> None:
        self.stream.write(status + "\n")
        self.stream.flush()
        self._open, self._pending = True, None
        self._last_time, self._last_percent = now, percent

    def _close(self) -> None:
        if self._pending is not None:
            self.stream.write(self._pending + "\n")
        self._open, self._pending, self._last_percent = False, None, None

    def flush(self) -> None:
        self.stream.flush()

    def isatty(self) -> bool:
        return False

    def close_bars(self) -> None:
        """Writes the status a bar that was never closed still holds back."""
        self._close()
        self.stream.flush()

    def __getattr__(self, name: str) -> Any:  # fileno, encoding, ... of the wrapped stream
        return getattr(self.stream, name)
