"""Runs a package program (``scripts/<name>.py``) inside the test process.

A ``scripts/*.py`` subprocess spends ~6-7 s importing torch/TorchRL and exiting
before and after its work; a test that checks what a program writes or prints
(not kills, locks between processes or the interpreter's own exit) runs it here
instead: the same ``cbop_torchrl.apps.<name>.main()`` behind the same Hydra
command line, with its exit code, its standard output and its standard error.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import os
import sys
import warnings
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from cbop_torchrl.apps import COMMANDS
from cbop_torchrl.cli import run_entry
from cbop_torchrl.runtime import set_running_program

ROOT = Path(__file__).resolve().parents[1]


@dataclass(frozen=True)
class Finished:
    """What ``subprocess.run(..., capture_output=True, text=True)`` would have returned."""

    returncode: int
    stdout: str
    stderr: str


@contextlib.contextmanager
def environment(env: Mapping[str, str] | None) -> Iterator[None]:
    """``env`` set (and W&B offline) inside the block; the environment and torch's thread
    count as they were after it (a run sets its own thread count)."""
    saved_env, saved_threads = dict(os.environ), torch.get_num_threads()
    os.environ.update({"WANDB_MODE": "offline", **(env or {})})
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved_env)
        torch.set_num_threads(saved_threads)


def train_cbop(
    overrides: Sequence[str], run_dir: Path, env: Mapping[str, str] | None = None
) -> dict:
    """``cbop_torchrl.train(compose_config(overrides), run_dir)``: the ``results.json`` dict.

    For tests that read what a run wrote: one Hydra composition instead of the program's
    two, and no program output to capture.
    """
    from cbop_torchrl.apps.api import compose_config, train

    with environment(env):
        return train(compose_config([o for o in overrides if not o.startswith("hydra.")]), run_dir)


def run_program(module: str, argv: Sequence[str], env: Mapping[str, str] | None = None) -> Finished:
    """Runs ``python scripts/<module>.py *argv`` in this process.

    ``env``: environment variables set for the run only (e.g. ``CBOP_TORCHRL_CACHE``);
    W&B is offline. Warnings the run emits are appended to ``stderr`` as Python
    prints them (pytest would otherwise swallow them); warnings at import time are not
    seen (the package is imported already).
    """
    program = importlib.import_module(f"cbop_torchrl.apps.{module}")
    saved_argv = sys.argv
    out, err = io.StringIO(), io.StringIO()
    sys.argv = [str(ROOT / "scripts" / f"{module}.py")]
    set_running_program(next(c.name for c in COMMANDS if c.module == module))
    try:
        with (
            environment(env),
            warnings.catch_warnings(record=True) as caught,
            contextlib.redirect_stdout(out),
            contextlib.redirect_stderr(err),
        ):
            # a fresh interpreter's filters (pytest's own would hide or turn warnings into errors)
            warnings.resetwarnings()
            warnings.simplefilter("default")
            for category in (DeprecationWarning, PendingDeprecationWarning, ImportWarning,
                             ResourceWarning):  # fmt: skip
                warnings.simplefilter("ignore", category)
            warnings.filterwarnings("default", category=DeprecationWarning, module="__main__")
            code = run_entry(program.main, list(argv))
    finally:
        set_running_program(None)
        sys.argv = saved_argv
    shown = "".join(
        warnings.formatwarning(w.message, w.category, w.filename, w.lineno) for w in caught
    )
    return Finished(code, out.getvalue(), err.getvalue() + shown)
