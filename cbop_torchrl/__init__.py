"""CBOP (Conservative Bayesian Model-Based Value Expansion) on TorchRL.

The Python API (see the README's "Python API")::

    from cbop_torchrl import compose_config, train
    cfg = compose_config(["preset=debug", "seed=1"])  # the CLI's config and overrides
    results = train(cfg, run_dir="runs/api-demo")    # the results.json dict

Names are imported on first use (PEP 562), so ``import cbop_torchrl`` loads
neither torch nor TorchRL: the console scripts (:mod:`cbop_torchrl.apps`) set
``OMP_WAIT_POLICY`` before torch is imported.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS: dict[str, str] = {
    "Task": "cbop_torchrl.registry",
    "get_family": "cbop_torchrl.registry",
    "register_family": "cbop_torchrl.registry",
    "register_termination": "cbop_torchrl.registry",
    "compose_config": "cbop_torchrl.apps.api",
    "train": "cbop_torchrl.apps.api",
    "train_baseline": "cbop_torchrl.apps.api",
    "train_side_by_side": "cbop_torchrl.apps.api",
    "evaluate": "cbop_torchrl.apps.api",
}
"""Public name -> the module defining it."""

__all__ = sorted(_EXPORTS)
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'cbop_torchrl' has no attribute {name!r}")
    value = getattr(importlib.import_module(_EXPORTS[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
