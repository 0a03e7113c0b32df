"""Writes small, plausible D4RL-format HDF5 files for tests (reusable by every test module).

Rows follow D4RL's layout: inside an episode ``next_observations[i] ==
observations[i + 1]``; an episode ends with a terminal row, a timeout row, or is
simply cut (the next row starts a new episode with neither flag set).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import h5py
import numpy as np

SIZES = {
    "hopper": (11, 3),
    "walker2d": (17, 6),
    "halfcheetah": (17, 6),
    "ant": (111, 8),  # D4RL's layout: 27 positions/velocities + 84 contact forces
    "swimmer": (8, 2),  # gymnasium's Swimmer-v4, a task the registry does not know
}
"""Observation and action sizes of the environments the test files imitate (the data's
sizes are what the package reads; these only shape the synthetic arrays)."""


def write_d4rl_hdf5(
    path: str | Path,
    family: str = "hopper",
    episode_lengths: Sequence[int] = (6, 5, 4),
    terminal_episodes: Sequence[int] = (0,),
    timeout_episodes: Sequence[int] = (1,),
    seed: int = 0,
    metadata: Mapping[str, str | int | float] | None = None,
    obs_dim: int | None = None,
    action_dim: int | None = None,
    drop_keys: Sequence[str] = (),
    edit: Mapping[str, np.ndarray] | None = None,
) -> Path:
    """Writes a D4RL-format file and returns its path.

    Args:
        path: file to write (parents are created).
        family: a name in :data:`SIZES` giving the default observation/action sizes.
        episode_lengths: rows per episode, in file order.
        terminal_episodes: indices of episodes whose last row has ``terminals = 1``
            (its next observation is a fallen hopper/walker: height 0.3).
        timeout_episodes: indices of episodes whose last row has ``timeouts = 1``.
            Other episodes are cut: their last row has neither flag.
        seed: NumPy seed for observations, actions and rewards.
        metadata: written as scalar datasets ``metadata/<key>``.
        obs_dim, action_dim: override the family's sizes (to write a mismatching file).
        drop_keys: top-level keys to leave out (to write a broken file).
        edit: arrays replacing the generated ones before writing (same key names).
    """
    obs_dim = obs_dim or SIZES[family][0]
    action_dim = action_dim or SIZES[family][1]
    rng = np.random.default_rng(seed)
    columns: dict[str, list[np.ndarray]] = {
        key: []
        for key in (
            "observations",
            "next_observations",
            "actions",
            "rewards",
            "terminals",
            "timeouts",
            "infos/qpos",
            "infos/qvel",
        )
    }
    for episode, length in enumerate(episode_lengths):
        states = rng.normal(0.0, 0.05, size=(length + 1, obs_dim)).astype(np.float32)
        states[:, 0] = 1.25  # a healthy height for hopper and walker2d
        terminal = episode in terminal_episodes
        if terminal:
            states[-1, 0] = 0.3
        flags = np.zeros(length, dtype=bool)
        columns["observations"].append(states[:-1])
        columns["next_observations"].append(states[1:])
        columns["actions"].append(rng.uniform(-1, 1, (length, action_dim)).astype(np.float32))
        columns["rewards"].append(rng.normal(1.0, 0.1, length).astype(np.float32))
        ends_terminal, ends_timeout = flags.copy(), flags.copy()
        ends_terminal[-1] = terminal
        ends_timeout[-1] = episode in timeout_episodes and not terminal
        columns["terminals"].append(ends_terminal)
        columns["timeouts"].append(ends_timeout)
        columns["infos/qpos"].append(rng.normal(size=(length, obs_dim // 2 + 1)))
        columns["infos/qvel"].append(rng.normal(size=(length, obs_dim - obs_dim // 2)))
    arrays = {key: np.concatenate(parts) for key, parts in columns.items()}
    arrays.update(edit or {})

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with h5py.File(path, "w") as handle:
        for key, array in arrays.items():
            if key not in drop_keys:
                handle.create_dataset(key, data=array)
        for key, value in (metadata or {}).items():
            handle.create_dataset(f"metadata/{key}", data=value)
    return path


def pipeline_workspace(root: Path, episode_lengths: Sequence[int] = (150,) * 8) -> dict:
    """The small hopper medium-replay file the end-to-end CBOP tests train on.

    Returns ``{"root", "dataset", "env"}``: ``env`` is this process's environment with
    ``CBOP_TORCHRL_CACHE`` under ``root`` and W&B offline, for ``subprocess.run``.
    """
    dataset = write_d4rl_hdf5(
        root / "hopper-medium-replay-tiny.hdf5",
        episode_lengths=list(episode_lengths),
        terminal_episodes=(0, 3),
        timeout_episodes=(1,),
    )
    env = {**os.environ, "CBOP_TORCHRL_CACHE": str(root / "cache"), "WANDB_MODE": "offline"}
    return {"root": root, "dataset": dataset, "env": env}


def debug_cbop_command(workspace: dict, run_dir: Path, *overrides: str) -> list[str]:
    """``scripts/cbop.py`` at the debug preset on ``workspace``'s file, in ``run_dir``."""
    script = Path(__file__).resolve().parents[1] / "scripts" / "cbop.py"
    return [
        sys.executable, str(script), "preset=debug", f"env={workspace['dataset']}",
        f"hydra.run.dir={run_dir}", "progress=false", *overrides,
    ]  # fmt: skip
