"""Deterministic evaluation of a policy on vectorized TorchRL environments.

N episodes run side by side in one batched environment (``SerialEnv`` in
this process, or ``ParallelEnv`` workers), the actor is called once per step
on all of them, and each episode's return is summed up to its first
``done``. ``env.rollout(..., break_when_all_done=True)`` stops once every
episode has ended; finished environments are not stepped again.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import asdict, dataclass
from functools import partial

import torch
from tensordict.nn import TensorDictModuleBase
from torchrl.envs import DoubleToFloat, EnvBase, GymEnv, ParallelEnv, SerialEnv, TransformedEnv
from torchrl.envs.utils import ExplorationType, set_exploration_type

from cbop_torchrl.registry import EnvFamily


def filter_env_warnings() -> None:
    """Silences gymnasium's "-v4 is out of date" and MuJoCo's compiler deprecation notices.

    Evaluation deliberately uses ``*-v4`` (DESIGN.md section 2), so both are noise.
    """
    warnings.filterwarnings("ignore", message=r".*is out of date\. You should consider upgrading")
    warnings.filterwarnings(
        "ignore", message=r".*deprecated.*compiler", category=DeprecationWarning
    )


def _make_gym_env(gym_id: str) -> EnvBase:
    filter_env_warnings()
    # MuJoCo observations are float64; the networks and the datasets are float32.
    return TransformedEnv(GymEnv(gym_id, device="cpu"), DoubleToFloat())


def make_eval_env(family: EnvFamily, num_envs: int, backend: str = "serial") -> EnvBase:
    """A batch of ``num_envs`` environments of ``family`` (batch size ``[num_envs]``).

    Args:
        family: gives the gymnasium id (``Hopper-v4``, ...).
        num_envs: episodes evaluated at once.
        backend: ``"serial"`` (``SerialEnv``: no worker processes, best on a
            couple of cores) or ``"parallel"`` (``ParallelEnv``: one process per
            environment; the entry script needs ``if __name__ == "__main__":``).
    """
    filter_env_warnings()
    make = partial(_make_gym_env, family.gym_id)
    if backend == "serial":
        return SerialEnv(num_envs, make)
    if backend == "parallel":
        return ParallelEnv(num_envs, make, mp_start_method="spawn")
    raise ValueError(f"evaluation backend must be 'serial' or 'parallel'; got {backend!r}")


@dataclass
class EvalResult:
    """Per-episode outcome of one evaluation."""

    returns: list[float]
    normalized_scores: list[float]
    lengths: list[int]

    @property
    def normalized_score_mean(self) -> float:
        return float(torch.tensor(self.normalized_scores).mean())

    @property
    def normalized_score_std(self) -> float:
        return float(torch.tensor(self.normalized_scores).std(unbiased=False))

    @property
    def return_mean(self) -> float:
        return float(torch.tensor(self.returns).mean())

    def summary(self) -> dict[str, float | int | list]:
        """Plain numbers for logs and ``results.json``."""
        return {
            "normalized_score_mean": self.normalized_score_mean,
            "normalized_score_std": self.normalized_score_std,
            "return_mean": self.return_mean,
            "return_std": float(torch.tensor(self.returns).std(unbiased=False)),
            "episode_length_mean": float(torch.tensor(self.lengths, dtype=torch.float).mean()),
            "episodes": len(self.returns),
            **asdict(self),
        }


def episode_returns(reward: torch.Tensor, done: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Return and length of each environment's first episode in a rollout.

    Args:
        reward: ``[N, T, 1]`` rewards of a batched rollout.
        done: ``[N, T, 1]`` bool ``("next", "done")`` flags.

    Returns:
        ``[N]`` returns (rewards summed up to and including the first done) and
        ``[N]`` lengths (steps until that done, or T).
    """
    done = done.squeeze(-1)
    ended_before = (done.long().cumsum(-1) - done.long()) > 0  # a done at an earlier step
    alive = ~ended_before
    return (reward.squeeze(-1) * alive).sum(-1), alive.sum(-1)


def evaluate_policy(
    actor: TensorDictModuleBase,
    family: EnvFamily,
    env: EnvBase,
    max_steps: int = 1000,
    seed: int = 0,
) -> EvalResult:
    """Runs one deterministic episode per environment of ``env`` and scores them.

    The global RNG is left as it was (the rollout runs under ``fork_rng``), so
    evaluating during training does not change what training samples next.

    Args:
        actor: the policy; called under ``ExplorationType.DETERMINISTIC``
            (the tanh of the Gaussian mean). It may live on another device.
        family: gives D4RL's normalized score.
        env: from :func:`make_eval_env`; its batch size is the episode count.
        max_steps: episode cap (the environments' own limit is 1000).
        seed: environment seed (episode i uses ``seed + i``).
    """
    devices = [torch.cuda.current_device()] if torch.cuda.is_initialized() else []
    with torch.random.fork_rng(devices=devices), torch.no_grad():
        env.set_seed(seed)
        with set_exploration_type(ExplorationType.DETERMINISTIC):
            rollout = env.rollout(
                max_steps,
                actor,
                break_when_all_done=True,
                auto_cast_to_device=True,
            )
    returns, lengths = episode_returns(
        rollout.get(("next", "reward")), rollout.get(("next", "done"))
    )
    scores = [family.normalized_score(float(r)) for r in returns]
    if not all(math.isfinite(s) for s in scores):
        raise FloatingPointError(f"evaluation produced non-finite returns: {returns.tolist()}")
    return EvalResult(
        returns=[float(r) for r in returns],
        normalized_scores=scores,
        lengths=[int(n) for n in lengths],
    )
