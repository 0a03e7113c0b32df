"""The programs: console scripts (``cbop-train``, ...), ``scripts/*.py`` and the Python API.

The top of the package's stack: the modules here turn a Hydra config (every
program is a Hydra app with a typed schema, :mod:`cbop_torchrl.cli`) into calls
of the layers below, print, and map errors to exit code 2.
``scripts/<name>.py`` in a checkout and the console script installed with the
package run the same :func:`launch` and accept the same Hydra overrides;
:mod:`cbop_torchrl.apps.api` is the same work as Python functions that return
the results instead of printing them.

This module imports nothing heavy, so :func:`launch` sets the environment
before torch is imported.
"""

from __future__ import annotations

import importlib
import os
import sys
import warnings
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Command:
    """One program: its console script, its module here and its script in a checkout."""

    name: str  # console script installed with the package
    module: str  # cbop_torchrl.apps.<module>, whose main() runs it
    script: str  # the same program in a checkout
    summary: str


COMMANDS: tuple[Command, ...] = (
    Command("cbop-train", "cbop", "scripts/cbop.py",
            "offline CBOP on one dataset: dynamics -> BC -> FQE -> CBOP -> evaluation"),
    Command("cbop-baseline", "baseline", "scripts/baseline.py",
            "a model-free baseline (algo=bc|td3bc|iql|cql) in CBOP's run format"),
    Command("cbop-evaluate", "evaluate", "scripts/evaluate.py",
            "score a saved policy (checkpoint=.../policy.pt) on its task"),
    Command("cbop-collect", "collect", "scripts/collect.py",
            "generate D4RL-recipe datasets with a SAC behaviour policy"),
    Command("cbop-train-dynamics", "train_dynamics", "scripts/train_dynamics.py",
            "train (or fetch from the cache) one dataset's dynamics ensemble"),
    Command("cbop-select-psi", "select_psi", "scripts/select_psi.py",
            "rank a sweep's runs offline by fitted Q evaluation of their policies"),
    Command("cbop-report", "report", "scripts/report.py",
            "results table, learning curves and the paper's figures from run directories"),
    Command("cbop-score", "score", "scripts/score.py",
            "score the snapshots of runs trained with eval.snapshot_interval, on the CPU"),
)  # fmt: skip
"""Every program; ``pyproject.toml``'s ``[project.scripts]`` lists the same (tested)."""


def launch(module: str) -> Any:
    """Runs ``cbop_torchrl.apps.<module>.main()`` and returns its exit code (None: 0)."""
    # Idle OpenMP threads sleep instead of spinning: on a busy machine (more runnable processes
    # than cores) spinning threads slow every small matmul down by up to 10x. OpenMP reads it
    # when torch loads, so it is set before the program's module imports torch.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    warnings.filterwarnings("ignore", message=".*compiled extension.*")
    try:
        from cbop_torchrl.runtime import set_running_program  # imports torch: after OMP_WAIT_POLICY

        set_running_program(next(c.name for c in COMMANDS if c.module == module))
        return importlib.import_module(f"cbop_torchrl.apps.{module}").main()
    except KeyboardInterrupt:  # while importing (the programs' own handler covers the rest)
        print("\ninterrupted; nothing was started, run the same command again", file=sys.stderr)
        return 130


# The console scripts' targets ([project.scripts] in pyproject.toml).
def cbop_train() -> Any:
    return launch("cbop")


def cbop_baseline() -> Any:
    return launch("baseline")


def cbop_evaluate() -> Any:
    return launch("evaluate")


def cbop_collect() -> Any:
    return launch("collect")


def cbop_train_dynamics() -> Any:
    return launch("train_dynamics")


def cbop_select_psi() -> Any:
    return launch("select_psi")


def cbop_report() -> Any:
    return launch("report")


def cbop_score() -> Any:
    return launch("score")
