"""The environment used to collect D4RL-recipe datasets.

A gymnasium MuJoCo ``*-v4`` environment wrapped twice:

* :class:`RecordStateWrapper` (gymnasium side) adds the simulator's ``qpos``
  and ``qvel`` to every ``info`` (D4RL stores them as ``infos/qpos``,
  ``infos/qvel``) and can snapshot and restore the complete simulator state,
  the episode step count and the reset RNG, so a killed collection resumes
  mid-episode bit for bit.
* TorchRL's ``GymWrapper`` with an info reader turns it into an ``EnvBase``
  whose TensorDicts carry ``qpos``/``qvel`` beside ``observation``;
  ``DoubleToFloat`` casts MuJoCo's float64 observations for the float32 actor.
"""

from __future__ import annotations

import json
import warnings
from typing import Any

import gymnasium as gym
import mujoco
import numpy as np
import torch
from torchrl.data import Unbounded
from torchrl.envs import DoubleToFloat, GymWrapper, TransformedEnv, default_info_dict_reader

from cbop_torchrl.registry import Task
from cbop_torchrl.runtime import MuJoCoWarning, keep_mujoco_log_out_of_cwd


def filter_env_warnings() -> None:
    """Silences the two known, harmless warnings of gymnasium ``*-v4`` on MuJoCo 3+/4.

    We evaluate on ``-v4`` on purpose (it keeps the dynamics D4RL v2 used), so
    gymnasium's "is out of date" notice and MuJoCo's deprecated-attribute
    notice carry no information here (DESIGN.md, section 7).
    """
    warnings.filterwarnings("ignore", message=".*is out of date. You should consider upgrading")
    warnings.filterwarnings("ignore", message=".*[Dd]eprecat.*", module="gymnasium.*")
    warnings.filterwarnings("ignore", message=".*[Dd]eprecat.*", module="mujoco.*")
    warnings.filterwarnings("ignore", message=".*[Dd]eprecat.*", category=MuJoCoWarning)
    keep_mujoco_log_out_of_cwd()  # MuJoCo's warnings as Python warnings, no MUJOCO_LOG.TXT


_FULL_STATE = mujoco.mjtState.mjSTATE_INTEGRATION


class RecordStateWrapper(gym.Wrapper):
    """Adds ``info["qpos"]``/``info["qvel"]`` and snapshot/restore to a MuJoCo env.

    ``info`` returned by ``reset`` and ``step`` describes the state of the
    observation returned with it. Must wrap the ``TimeLimit`` wrapper (it
    snapshots the elapsed step count).
    """

    def __init__(self, env: gym.Env):
        super().__init__(env)
        self._pending_snapshot: dict[str, Any] | None = None

    def _state_info(self, info: dict) -> dict:
        data = self.env.unwrapped.data
        info = dict(info)
        info["qpos"] = np.array(data.qpos, dtype=np.float64)
        info["qvel"] = np.array(data.qvel, dtype=np.float64)
        return info

    def reset(self, **kwargs):
        if self._pending_snapshot is not None:
            # The next reset after restore() resumes the saved episode instead.
            # The inner reset keeps gymnasium's wrappers consistent; its effects
            # (physics, step count, RNG) are then overwritten by the snapshot.
            snapshot, self._pending_snapshot = self._pending_snapshot, None
            self.env.reset()
            obs = self._apply_snapshot(snapshot)
            return obs, self._state_info({})
        obs, info = self.env.reset(**kwargs)
        return obs, self._state_info(info)

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        return obs, reward, terminated, truncated, self._state_info(info)

    def _time_limit(self) -> gym.wrappers.TimeLimit:
        env = self.env
        while not isinstance(env, gym.wrappers.TimeLimit):
            if not hasattr(env, "env"):
                raise TypeError("RecordStateWrapper must wrap a TimeLimit wrapper")
            env = env.env
        return env

    def snapshot(self) -> str:
        """The exact simulator state, episode step and reset RNG, as a JSON string."""
        base = self.env.unwrapped
        state = np.empty(mujoco.mj_stateSize(base.model, _FULL_STATE), dtype=np.float64)
        mujoco.mj_getState(base.model, base.data, state, _FULL_STATE)
        rng_state = base.np_random.bit_generator.state
        return json.dumps(
            {
                "mj_state": state.tolist(),
                "elapsed_steps": self._time_limit()._elapsed_steps,
                "np_random": rng_state,
            }
        )

    def restore_on_next_reset(self, snapshot: str) -> None:
        """Makes the next ``reset()`` continue the episode saved by :meth:`snapshot`."""
        self._pending_snapshot = json.loads(snapshot)

    def _apply_snapshot(self, snapshot: dict[str, Any]) -> np.ndarray:
        base = self.env.unwrapped
        state = np.asarray(snapshot["mj_state"], dtype=np.float64)
        mujoco.mj_setState(base.model, base.data, state, _FULL_STATE)
        base.np_random.bit_generator.state = snapshot["np_random"]
        self._time_limit()._elapsed_steps = snapshot["elapsed_steps"]
        return base._get_obs()


def default_episode_cap(task: Task) -> int:
    """The episode cap gymnasium registers for ``task.gym_id`` (1000 for MuJoCo locomotion)."""
    return int(gym.spec(task.gym_id).max_episode_steps or 1000)


def env_sizes(task: Task) -> tuple[int, int]:
    """Observation and action sizes of ``task``'s environment, from its spaces."""
    env = gym.make(task.gym_id, **task.gym_kwargs)
    try:
        return int(env.observation_space.shape[-1]), int(env.action_space.shape[-1])
    finally:
        env.close()


def make_collect_env(task: Task, max_episode_steps: int | None = None) -> TransformedEnv:
    """A TorchRL env for ``task.gym_id`` that also reports ``qpos``/``qvel``.

    Args:
        task: gives the gymnasium id and its keyword arguments.
        max_episode_steps: the episode cap; ``None`` keeps gymnasium's (1000).

    Returns:
        A ``TransformedEnv`` with float32 ``observation [obs_dim]``, ``action
        [act_dim]``, float64 ``qpos [nq]``, ``qvel [nv]`` and the usual
        ``("next", "reward"/"terminated"/"truncated"/"done")`` entries. Its
        base env's ``RecordStateWrapper`` is reachable as
        ``env.base_env._env``.
    """
    filter_env_warnings()
    cap = max_episode_steps or default_episode_cap(task)
    gym_env = RecordStateWrapper(gym.make(task.gym_id, max_episode_steps=cap, **task.gym_kwargs))
    base = gym_env.unwrapped
    env = GymWrapper(gym_env)
    env.set_info_dict_reader(
        default_info_dict_reader(
            ["qpos", "qvel"],
            spec={
                "qpos": Unbounded(shape=(base.model.nq,), dtype=torch.float64),
                "qvel": Unbounded(shape=(base.model.nv,), dtype=torch.float64),
            },
        )
    )
    return TransformedEnv(env, DoubleToFloat(in_keys=["observation"]))


def state_wrapper(env: TransformedEnv) -> RecordStateWrapper:
    """The :class:`RecordStateWrapper` inside an env from :func:`make_collect_env`."""
    return env.base_env._env
