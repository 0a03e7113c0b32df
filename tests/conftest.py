"""Shared fixtures: every test gets its own project cache and TorchRL dataset root."""

from __future__ import annotations

from pathlib import Path

import pytest


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
