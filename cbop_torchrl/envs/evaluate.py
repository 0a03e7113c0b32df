"""Deterministic evaluation of a policy on vectorized TorchRL environments.

N episodes run side by side in one batched environment (``SerialEnv`` in
this process, or ``ParallelEnv`` workers), stepped by a TorchRL ``Collector``
that calls the actor once per step on all of them (:class:`PolicyEvaluator`).
Each episode's return is TorchRL's ``RewardSum`` at its first ``done``, and
its length ``StepCounter``'s count, capped at ``max_steps``.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModuleBase
from torchrl.collectors import Collector
from torchrl.envs import Compose, EnvBase, RewardSum, StepCounter, TransformedEnv
from torchrl.envs.utils import ExplorationType

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


class PolicyEvaluator:
    """Deterministic episodes of one policy through a TorchRL ``Collector``, one per environment.

    ``env`` (batch size ``[N]``) gets TorchRL's ``StepCounter(max_steps)`` (the episode cap,
    as truncation) and ``RewardSum`` (each episode's return, ``episode_reward``). The
    collector steps all ``N`` environments once per batch (``frames_per_batch = N``) under
    ``ExplorationType.DETERMINISTIC``; environment ``i``'s first episode (seed ``seed + i``)
    is read at its first ``done``, and collection stops once every environment has ended
    one. The collector resets a finished environment and steps it on with the others; those
    steps are never read.

    TorchRL's :class:`~torchrl.collectors.Evaluator` is not used: its ``trajs_per_batch``
    takes the first ``N`` episodes to end, over all environments (a short one can count
    twice before a long one ends), not environment ``i``'s first episode, and it reports
    only their mean.

    Args:
        env: a batched environment (:func:`~cbop_torchrl.envs.gym.make_eval_env`), batch
            size ``[N]``; it stays open when the evaluator is closed (its owner closes it).
        policy: a module writing ``action`` from ``observation`` (a probabilistic actor
            acts by its deterministic sample, :func:`deterministic_policy`). The collector
            calls it on ``policy_device``; when its parameters live elsewhere the collector
            keeps its own copy there, refreshed by :meth:`update_policy_weights_`.
        max_steps: episode cap.
        policy_device: where the policy runs (default: its parameters' device).
    """

    def __init__(
        self,
        env: EnvBase,
        policy: TensorDictModuleBase,
        max_steps: int,
        policy_device: torch.device | str | None = None,
    ) -> None:
        (self.num_envs,) = env.batch_size
        self.max_steps = int(max_steps)
        self.env = TransformedEnv(env, Compose(StepCounter(self.max_steps), RewardSum()))
        self.policy = deterministic_policy(policy)
        if policy_device is None:
            first = next(iter(self.policy.parameters()), None)
            policy_device = env.device if first is None else first.device
        self.collector = Collector(
            self.env,
            self.policy,
            frames_per_batch=self.num_envs,
            total_frames=-1,
            exploration_type=ExplorationType.DETERMINISTIC,
            policy_device=policy_device,
            env_device=env.device,
            trust_policy=True,
            auto_register_policy_transforms=False,  # the actor reads only the observation
        )

    def update_policy_weights_(self, weights: TensorDictBase) -> None:
        """Loads ``weights`` (``TensorDict.from_module`` of a policy of the same structure,
        wrapped as :func:`deterministic_policy` wraps it) into the collector's policy."""
        self.collector.update_policy_weights_(weights)

    def run(self, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Each environment's first episode from seed ``seed + i``.

        Returns:
            ``[N]`` float returns (``RewardSum``'s ``episode_reward`` at the first done) and
            ``[N]`` long lengths (``StepCounter``'s ``step_count`` there, at most ``max_steps``).
        """
        returns = torch.zeros(self.num_envs)
        lengths = torch.zeros(self.num_envs, dtype=torch.long)
        ended = torch.zeros(self.num_envs, dtype=torch.bool)
        self.collector.set_seed(seed)  # seeds then resets: the same starts as env.rollout's
        self.collector.reset()
        for batch in self.collector:  # [N, 1]: one step of every environment
            step = batch.get("next")[:, -1]
            done = step.get("done").reshape(self.num_envs)
            first = done & ~ended
            returns[first] = step.get("episode_reward").reshape(self.num_envs)[first].cpu()
            lengths[first] = step.get("step_count").reshape(self.num_envs)[first].cpu()
            ended |= done.cpu()
            if bool(ended.all()):  # StepCounter ends every episode within max_steps steps
                return returns, lengths
        raise AssertionError("the collector stopped before every episode ended")

    def close(self) -> None:
        """Shuts the collector down; ``env`` stays open."""
        self.collector.shutdown(close_env=False)


def score(task: Task, returns: torch.Tensor, lengths: torch.Tensor) -> EvalResult:
    """The :class:`EvalResult` of ``[N]`` returns and lengths; raises on a non-finite return."""
    if not all(math.isfinite(float(r)) for r in returns):
        raise FloatingPointError(f"evaluation produced non-finite returns: {returns.tolist()}")
    return EvalResult(
        returns=[float(r) for r in returns],
        normalized_scores=[task.normalized_score(float(r)) for r in returns]
        if task.has_reference_scores
        else None,
        lengths=[int(n) for n in lengths],
    )


def run_evaluator(
    evaluator: PolicyEvaluator, task: Task, seed: int, fork_rng: bool = True
) -> EvalResult:
    """Scores ``evaluator``'s policy on one episode per environment (seed ``seed + i``).

    With ``fork_rng`` the global RNG is left as it was (the episodes run under
    ``fork_rng``), so evaluating during training does not change what training samples
    next. In a thread beside training pass ``fork_rng=False``: restoring the forked state
    there would undo the draws training made meanwhile (the episodes themselves draw none).
    """
    devices = [torch.cuda.current_device()] if torch.cuda.is_initialized() else []
    with torch.random.fork_rng(devices=devices, enabled=fork_rng), torch.no_grad():
        returns, lengths = evaluator.run(seed)
    return score(task, returns, lengths)


def evaluate_policy(
    actor: TensorDictModuleBase,
    task: Task,
    env: EnvBase,
    max_steps: int = 1000,
    seed: int = 0,
    fork_rng: bool = True,
) -> EvalResult:
    """Runs one deterministic episode per environment of ``env`` and scores them.

    A :class:`PolicyEvaluator` (a TorchRL ``Collector``, returns from ``RewardSum``) made
    for this one call; :func:`run_evaluator` says what ``fork_rng`` does.

    Args:
        actor: the policy; its deterministic action (the tanh of the Gaussian mean). It
            may live on another device than ``env``.
        task: gives the normalized score (None without reference scores).
        env: from :func:`cbop_torchrl.envs.gym.make_eval_env`; its batch size is the episode count.
        max_steps: episode cap (the environments' own limit is 1000).
        seed: environment seed (episode i uses ``seed + i``).
    """
    evaluator = PolicyEvaluator(env, actor, max_steps)
    try:
        return run_evaluator(evaluator, task, seed, fork_rng)
    finally:
        evaluator.close()


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
