"""Gymnasium environments as TorchRL envs, and the check that a dataset fits one.

The sizes a run trains with come from the dataset's tensors; the environment's
TorchRL specs (``observation_spec``, ``action_spec``) must agree with them,
and give the action bounds. The agent's tanh policy acts in ``[-1, 1]`` per
dimension (D4RL's MuJoCo tasks); for a task with another action box, TorchRL's
``ActionScaling`` maps the policy's actions onto the box in the environment,
and :meth:`EnvSpecs.to_agent_actions` maps the dataset's actions into
``[-1, 1]`` the same way, so training and evaluation agree.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from functools import partial

import torch
from tensordict import TensorDictBase
from torchrl.data import Bounded
from torchrl.envs import (
    ActionScaling,
    DoubleToFloat,
    EnvBase,
    GymEnv,
    ParallelEnv,
    SerialEnv,
    TransformedEnv,
)

from cbop_torchrl.data.info import DatasetInfo
from cbop_torchrl.envs.task import TaskError
from cbop_torchrl.registry import Task
from cbop_torchrl.runtime import MuJoCoWarning, keep_mujoco_log_out_of_cwd


def filter_env_warnings() -> None:
    """Silences gymnasium's "-v4 is out of date" and MuJoCo's compiler deprecation notices.

    Evaluation deliberately uses ``*-v4`` (DESIGN.md section 2), so both are noise.
    """
    warnings.filterwarnings("ignore", message=r".*is out of date\. You should consider upgrading")
    warnings.filterwarnings(
        "ignore", message=r".*deprecated.*compiler", category=DeprecationWarning
    )
    warnings.filterwarnings(
        "ignore", message=r"compiler attribute .* is deprecated", category=MuJoCoWarning
    )
    keep_mujoco_log_out_of_cwd()  # MuJoCo's warnings as Python warnings, no MUJOCO_LOG.TXT


def make_env(task: Task) -> EnvBase:
    """One TorchRL ``GymEnv`` of ``task`` (float32 observations) whose actions are in [-1, 1].

    An action box other than ``[-1, 1]`` is rescaled by TorchRL's ``ActionScaling``.

    Raises:
        TaskError: gymnasium has no such id, or rejects the keyword arguments.
    """
    env = _make_gym_env(task)
    action = env.action_spec
    if isinstance(action, Bounded) and not _is_unit_box(action.space.low, action.space.high):
        env.append_transform(ActionScaling())
    return env


def _is_unit_box(low: torch.Tensor, high: torch.Tensor) -> bool:
    return bool((low == -1).all() and (high == 1).all())


def _make_gym_env(task: Task) -> TransformedEnv:
    """``task``'s ``GymEnv`` with float32 observations and its own action box."""
    filter_env_warnings()
    try:
        env = GymEnv(task.gym_id, device="cpu", **task.gym_kwargs)
    except Exception as error:  # gymnasium raises NameNotFound, TypeError, DependencyNotInstalled
        raise TaskError(
            f"gymnasium cannot make task.gym_id={task.gym_id} with task.gym_kwargs="
            f"{dict(task.gym_kwargs)} ({type(error).__name__}: {error}). Pass the id of an "
            "installed gymnasium environment (e.g. Hopper-v4, Swimmer-v4) and only keyword "
            "arguments its constructor accepts."
        ) from None
    # MuJoCo observations are float64; the networks and the datasets are float32.
    return TransformedEnv(env, DoubleToFloat())


def make_eval_env(task: Task, num_envs: int, backend: str = "serial") -> EnvBase:
    """A batch of ``num_envs`` environments of ``task`` (batch size ``[num_envs]``).

    Args:
        task: gives the gymnasium id and its keyword arguments.
        num_envs: episodes evaluated at once.
        backend: ``"serial"`` (``SerialEnv``: no worker processes, best on a
            couple of cores) or ``"parallel"`` (``ParallelEnv``: one process per
            environment; the entry script needs ``if __name__ == "__main__":``).
    """
    filter_env_warnings()
    make = partial(make_env, task)
    if backend == "serial":
        return SerialEnv(num_envs, make)
    if backend == "parallel":
        return ParallelEnv(num_envs, make, mp_start_method="spawn")
    raise ValueError(f"evaluation backend must be 'serial' or 'parallel'; got {backend!r}")


@dataclass(frozen=True)
class EnvSpecs:
    """What a run reads from the environment's TorchRL specs.

    Attributes:
        observation_shape: ``observation_spec["observation"].shape`` (``(11,)``).
        action_shape: ``action_spec.shape`` (``(3,)``).
        action_low, action_high: the environment's own action box, one bound per
            dimension (before any rescaling to the agent's ``[-1, 1]``).
    """

    observation_shape: tuple[int, ...]
    action_shape: tuple[int, ...]
    action_low: tuple[float, ...]
    action_high: tuple[float, ...]

    @property
    def rescales_actions(self) -> bool:
        """True when the action box is not ``[-1, 1]`` (the agent's actions are rescaled)."""
        return not _is_unit_box(torch.tensor(self.action_low), torch.tensor(self.action_high))

    def to_agent_actions(self, data: TensorDictBase) -> TensorDictBase:
        """``data`` with ``action`` and ``("next", "action")`` mapped into ``[-1, 1]``.

        The forward map of the ``ActionScaling`` that :func:`make_env` puts on
        the environment, ``(a - loc) / scale``; ``data`` itself is unchanged, and
        returned as is when the box is already ``[-1, 1]``.
        """
        if not self.rescales_actions:
            return data
        low, high = torch.tensor(self.action_low), torch.tensor(self.action_high)
        loc, scale = ((high + low) / 2).to(data.device), ((high - low) / 2).to(data.device)
        data = data.clone()
        present = data.keys(include_nested=True)
        for key in ("action", ("next", "action")):
            if key in present:
                ActionScaling(in_keys_inv=[], in_keys=[key], loc=loc, scale=scale)(data)
        return data

    def fingerprint_suffix(self) -> str:
        """A cache-key part for data whose actions were rescaled ("" for ``[-1, 1]``)."""
        if not self.rescales_actions:
            return ""
        bounds = ",".join(f"{v:g}" for v in (*self.action_low, *self.action_high))
        return f"-actions[{bounds}]"


def read_env_specs(task: Task) -> EnvSpecs:
    """The specs of one environment of ``task`` (made and closed here).

    Raises:
        TaskError: the environment has no flat ``observation`` or no bounded,
            continuous action space (the agent's tanh policy needs a box).
    """
    env = _make_gym_env(task)
    try:
        observation = env.observation_spec.get("observation", None)
        action = env.action_spec
        if observation is None or not observation.dtype.is_floating_point:
            raise TaskError(
                f"{task.gym_id} has no flat continuous 'observation' (its observation_spec "
                f"keys are {list(env.observation_spec.keys())}); only vector-observation "
                "MuJoCo-style tasks are supported."
            )
        if not isinstance(action, Bounded) or not action.dtype.is_floating_point:
            raise TaskError(
                f"{task.gym_id}'s action_spec is {type(action).__name__} ({action.dtype}); "
                "the agent's tanh policy needs a bounded continuous (box) action space."
            )
        return EnvSpecs(
            observation_shape=tuple(observation.shape),
            action_shape=tuple(action.shape),
            action_low=tuple(float(v) for v in action.space.low.reshape(-1)),
            action_high=tuple(float(v) for v in action.space.high.reshape(-1)),
        )
    finally:
        env.close()


def check_data_fits_env(info: DatasetInfo, specs: EnvSpecs, task: Task) -> None:
    """Raises a :class:`TaskError` naming both shapes when ``info``'s data does not fit ``task``.

    Checked: the observation and action sizes.
    """
    check_sizes_fit_env(
        f"the dataset {info.name!r}", info.obs_dim, info.action_dim, specs, task, rows="N, "
    )


def check_sizes_fit_env(
    what: str, obs_dim: int, action_dim: int, specs: EnvSpecs, task: Task, rows: str = ""
) -> None:
    """Raises a :class:`TaskError` when ``obs_dim``/``action_dim`` (of the data or a
    policy, named by ``what``) do not match ``task``'s specs."""
    env_shapes = (list(specs.observation_shape), list(specs.action_shape))
    if ([obs_dim], [action_dim]) != env_shapes:
        hint = ""
        if task.gym_id.startswith("Ant-"):
            hint = (
                " Gymnasium's Ant-v4 has 27 observations, or 111 with contact forces "
                "(+task.gym_kwargs.use_contact_forces=true, D4RL's layout)."
            )
        raise TaskError(
            f"{what} does not fit task.gym_id={task.gym_id} (gym_kwargs "
            f"{dict(task.gym_kwargs)}): it has observations of shape [{rows}{obs_dim}] and "
            f"actions of shape [{rows}{action_dim}], but the environment's observation_spec "
            f"has shape {env_shapes[0]} and its action_spec shape {env_shapes[1]}. Pass the "
            "task the data was recorded on (task.gym_id=<id>, +task.gym_kwargs.<name>=<value>), or "
            f"check that the file holds data of {task.gym_id}.{hint}"
        )
