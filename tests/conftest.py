"""Shared fixtures: every test gets its own project cache and TorchRL dataset root."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch


def pytest_configure(config: pytest.Config) -> None:
    # Under pytest-xdist each worker already has a core; torch's default (one thread per
    # core in every worker) would oversubscribe the machine.
    if os.environ.get("PYTEST_XDIST_WORKER"):
        torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def isolated_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Points ``CBOP_TORCHRL_CACHE`` at a fresh directory so tests never touch ``~/.cache``."""
    cache = tmp_path / "cbop_cache"
    monkeypatch.setenv("CBOP_TORCHRL_CACHE", str(cache))
    return cache


@pytest.fixture
def torchrl_root(tmp_path: Path) -> Path:
    """A private stand-in for ``~/.cache/torchrl`` (pass as ``torchrl_root=``)."""
    root = tmp_path / "torchrl_cache"
    root.mkdir()
    return root
