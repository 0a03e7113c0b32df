"""Deterministic evaluation of a policy on vectorized TorchRL environments.

N episodes run side by side in one batched environment (``SerialEnv`` in
this process, or ``ParallelEnv`` workers), the actor is called once per step
on all of them, and each episode's return is summed up to its first
``done``. ``env.rollout(..., break_when_all_done=True)`` stops once every
episode has ended; finished environments are not stepped again.
"""

from __future__ import annotations

import json
import math
from contextlib import nullcontext
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModuleBase
from torchrl.envs import EnvBase
from torchrl.envs.utils import ExplorationType, set_exploration_type

from cbop_torchrl.registry import Task

NO_NORMALIZED_SCORE = (
    "no normalized score: the task has no reference scores (pass task.ref_min_score and "
    "task.ref_max_score, the returns that normalize to 0 and 100)"
)
"""What ``results.json`` says instead of a normalized score for a task without constants."""


EVALUATION_FORMAT = "cbop-torchrl-evaluation/1"
"""The ``format`` of the JSON file ``cbop-evaluate output=<path>`` writes; only such a file
(or one written before the key existed) is ever replaced by a later evaluation."""

_OLD_EVALUATION_KEYS = frozenset(("checkpoint", "task", "returns", "episodes"))
"""Keys every evaluation output held before :data:`EVALUATION_FORMAT` was recorded."""


def evaluation_output_problem(path: str | Path, checkpoint: str | Path | None = None) -> str | None:
    """Why ``output=path`` must not be written by an evaluation, or None when it may.

    It may be a new file in an existing directory or a previous evaluation output of
    this program (a JSON object with ``format`` :data:`EVALUATION_FORMAT`, or the keys
    such an output had before); never a directory, the checkpoint being evaluated or any
    other existing file (a checkpoint, a results.json, a user's file).
    """
    path = Path(path)
    if checkpoint is not None and path.exists() and Path(checkpoint).exists():
        if path.resolve() == Path(checkpoint).resolve():
            return f"output={path} is the checkpoint being evaluated, which it would replace"
    if path.is_dir():
        return (
            f"output={path} is a directory; output= takes the path of a JSON file to write, "
            f"e.g. output={path / 'evaluation.json'}"
        )
    if not path.exists() and not path.is_symlink():
        return None
    if not path.is_file():
        return f"output={path} exists and is not a regular file"
    try:
        with open(path, "rb") as handle:
            head = handle.read(1 << 20)
        value = json.loads(head)
    except (OSError, ValueError):
        value = None
    if isinstance(value, dict) and (
        value.get("format") == EVALUATION_FORMAT or _OLD_EVALUATION_KEYS <= value.keys()
    ):
        return None
    return (
        f"output={path} exists and is not an evaluation output of cbop-evaluate, so it is not "
        "replaced; give a new file name (e.g. output=evaluation.json) or remove that file "
        "first if you no longer need it"
    )


@dataclass
class EvalResult:
    """Per-episode outcome of one evaluation.

    ``normalized_scores`` is None when the task has no reference scores; the
    normalized statistics are then None too (never a made-up normalization).
    """

    returns: list[float]
    normalized_scores: list[float] | None
    lengths: list[int]

    @property
    def normalized_score_mean(self) -> float | None:
        if self.normalized_scores is None:
            return None
        return float(torch.tensor(self.normalized_scores).mean())

    @property
    def normalized_score_std(self) -> float | None:
        if self.normalized_scores is None:
            return None
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


class DeterministicPolicy(TensorDictModuleBase):
    """A probabilistic actor's deterministic action, whatever the global exploration type.

    TorchRL's exploration type is one process-wide setting, and training sets it to RANDOM
    around its own actor calls, so a policy called in a thread beside training cannot rely
    on it. This writes ``action`` from the actor's ``get_dist(...).deterministic_sample``:
    what a ``ProbabilisticActor`` writes under ``ExplorationType.DETERMINISTIC``.

    Args:
        actor: a module with ``get_dist`` (its parameters in place when called).
    """

    def __init__(self, actor: TensorDictModuleBase) -> None:
        super().__init__()
        self.actor = actor
        self.in_keys = list(actor.in_keys)
        self.out_keys = ["action"]

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        dist = self.actor.get_dist(tensordict)
        action = getattr(dist, "deterministic_sample", None)  # TorchRL's first choice
        return tensordict.set("action", dist.mean if action is None else action)


def deterministic_policy(actor: Any) -> Any:
    """``actor`` wrapped in :class:`DeterministicPolicy` when it has a distribution, else as is
    (a deterministic module, e.g. TD3+BC's actor)."""
    return DeterministicPolicy(actor) if hasattr(actor, "get_dist") else actor


def evaluate_policy(
    actor: TensorDictModuleBase,
    task: Task,
    env: EnvBase,
    max_steps: int = 1000,
    seed: int = 0,
    fork_rng: bool = True,
) -> EvalResult:
    """Runs one deterministic episode per environment of ``env`` and scores them.

    The global RNG is left as it was (the rollout runs under ``fork_rng``), so
    evaluating during training does not change what training samples next. In a thread
    beside training pass ``fork_rng=False``: restoring the forked state there would
    undo the draws training made meanwhile (the rollout itself draws none).

    Args:
        actor: the policy; called under ``ExplorationType.DETERMINISTIC``
            (the tanh of the Gaussian mean). It may live on another device.
        task: gives the normalized score (None without reference scores).
        env: from :func:`cbop_torchrl.envs.gym.make_eval_env`; its batch size is the episode count.
        max_steps: episode cap (the environments' own limit is 1000).
        seed: environment seed (episode i uses ``seed + i``).
    """
    devices = [torch.cuda.current_device()] if torch.cuda.is_initialized() else []
    policy = deterministic_policy(actor)
    # In a thread the global exploration type is left alone: training sets it too.
    mode = set_exploration_type(ExplorationType.DETERMINISTIC) if fork_rng else nullcontext()
    with torch.random.fork_rng(devices=devices, enabled=fork_rng), torch.no_grad():
        env.set_seed(seed)
        with mode:
            rollout = env.rollout(
                max_steps,
                policy,
                break_when_all_done=True,
                auto_cast_to_device=True,
            )
    returns, lengths = episode_returns(
        rollout.get(("next", "reward")), rollout.get(("next", "done"))
    )
    if not all(math.isfinite(float(r)) for r in returns):
        raise FloatingPointError(f"evaluation produced non-finite returns: {returns.tolist()}")
    scores = [task.normalized_score(float(r)) for r in returns]
    return EvalResult(
        returns=[float(r) for r in returns],
        normalized_scores=None if not task.has_reference_scores else scores,
        lengths=[int(n) for n in lengths],
    )


def describe_score(summary: dict) -> str:
    """``normalized score 12.3 +- 0.4 (return 410.2, 10 episodes)`` for logs and scripts.

    ``summary`` is an :meth:`EvalResult.summary` or a ``results.json`` dict. Without a
    normalized score (a task without ``task.ref_*``) the raw return is described instead.
    """
    episodes = f"{summary['episodes']} episodes"
    if summary.get("normalized_score_mean") is None:
        return (
            f"return {summary['return_mean']:.1f} +- {summary['return_std']:.1f} ({episodes}; "
            "no normalized score: pass task.ref_min_score and task.ref_max_score for one)"
        )
    return (
        f"normalized score {summary['normalized_score_mean']:.1f} +- "
        f"{summary['normalized_score_std']:.1f} (return {summary['return_mean']:.1f}, {episodes})"
    )
