"""Online SAC behaviour-policy training that keeps what D4RL's recipe needs.

One SAC run (TorchRL ``SACLoss``, ``Collector``, ``ReplayBuffer``) on a
gymnasium MuJoCo env yields every D4RL dataset kind: its ordered replay
buffer (``medium-replay``, ``full-replay``) and its policy checkpoints with
deterministic evaluation returns (``medium``, ``expert``).

The run lives in one directory and is resumable after a kill: every
``checkpoint_every`` environment steps it writes, each atomically and in this
order, the new buffer chunk, the policy, then ``train_state.pt`` (networks,
optimizer, RNG states, step, evaluation history and the exact simulator state
of the collection env). Rerunning continues from the last ``train_state.pt``
and produces the same result as an uninterrupted run on CPU with the same
number of torch threads.
"""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tensordict import TensorDict
from torchrl.collectors import Collector
from torchrl.data import LazyTensorStorage, ReplayBuffer
from torchrl.envs.utils import ExplorationType, set_exploration_type
from torchrl.modules import ProbabilisticActor
from torchrl.objectives import SACLoss, SoftUpdate
from tqdm import tqdm

from cbop_torchrl.data.collect_env import (
    default_episode_cap,
    env_sizes,
    make_collect_env,
    state_wrapper,
)
from cbop_torchrl.io import atomic_torch_save, config_hash
from cbop_torchrl.modules.actor_critic import action_spec, make_actor, make_qvalue_ensemble
from cbop_torchrl.registry import Task
from cbop_torchrl.runtime import seed_everything

# Keys of a collected transition kept in the buffer (and in the datasets).
TRANSITION_KEYS = (
    "observation",
    "action",
    "qpos",
    "qvel",
    ("next", "observation"),
    ("next", "reward"),
    ("next", "terminated"),
    ("next", "truncated"),
    ("next", "done"),
)


@dataclass(frozen=True)
class SACConfig:
    """Behaviour-policy SAC settings (standard SAC values, as D4RL's rlkit runs).

    ``total_steps``, ``warmup_steps`` and ``checkpoint_every`` must be
    multiples of ``frames_per_batch``.
    """

    total_steps: int = 100_000
    warmup_steps: int = 5_000  # uniform random actions before the policy acts
    frames_per_batch: int = 1_000  # env steps per collector batch; 1 update per step
    checkpoint_every: int = 5_000  # policy checkpoint + evaluation + resume point
    eval_episodes: int = 10  # deterministic episodes per checkpoint evaluation
    batch_size: int = 256  # replay rows per gradient step
    lr: float = 3e-4  # Adam learning rate of the actor, critics and temperature
    gamma: float = 0.99  # discount
    tau: float = 5e-3  # the target critics' Polyak rate
    hidden_sizes: tuple[int, ...] = (256, 256)  # actor's and critics' widths
    # rlkit's SAC (D4RL's behaviour policies) regresses Q with MSE; SACLoss's own
    # default, smooth_l1, caps the TD gradient (with it, hopper seed 0 peaked at
    # return 746 in 100k steps).
    loss_function: str = "l2"
    max_episode_steps: int | None = None  # null: the family's cap (1000)

    def validate(self) -> None:
        """Raises ``ValueError`` with a readable message for inconsistent settings."""
        step = self.frames_per_batch
        for name in ("total_steps", "warmup_steps", "checkpoint_every"):
            value = getattr(self, name)
            if value < 0 or value % step:
                raise ValueError(
                    f"sac.{name}={value} must be a non-negative multiple of "
                    f"sac.frames_per_batch={step} (the collector's batch size)."
                )
        if self.total_steps == 0 or self.checkpoint_every == 0:
            raise ValueError("sac.total_steps and sac.checkpoint_every must be positive.")
        if self.warmup_steps >= self.total_steps:
            raise ValueError(
                f"sac.warmup_steps={self.warmup_steps} leaves no SAC training within "
                f"sac.total_steps={self.total_steps}; use fewer warm-up steps."
            )


def run_dir_for(root: Path, family: Task, seed: int, config: SACConfig) -> Path:
    """The directory of the SAC run identified by family, seed and settings.

    ``total_steps`` is not part of the key: a run's first T steps do not depend
    on how long it goes on, so a longer request extends the run and a shorter
    one reads its prefix (:class:`SACRun` serves only steps <= total_steps).
    """
    settings = dataclasses.asdict(config)
    del settings["total_steps"]
    key = config_hash({"family": family.name, "seed": seed, **settings})
    return root / f"{family.name}-seed{seed}-{key}"


def _rng_state() -> dict[str, Any]:
    # numpy's state holds an ndarray: stored as a tensor so weights_only loading works.
    name, keys, pos, has_gauss, cached = np.random.get_state()
    return {
        "torch": torch.get_rng_state(),
        "numpy": [name, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached],
        "python": random.getstate(),
    }


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
    random.setstate(state["python"])


def _to_flat_dict(td: TensorDict) -> dict[str, torch.Tensor]:
    return td.flatten_keys("/").to_dict()


def _from_flat_dict(data: dict[str, torch.Tensor]) -> TensorDict:
    size = next(iter(data.values())).shape[0]
    return TensorDict(data, batch_size=[size]).unflatten_keys("/")


def evaluate_policy(
    actor: ProbabilisticActor, family: Task, episodes: int, seed: int, max_steps: int | None
) -> list[float]:
    """Returns of ``episodes`` deterministic (tanh of the mean) episodes.

    Uses its own env seeded with ``seed`` and forks the torch RNG, so it leaves
    the training run's random streams untouched.
    """
    env = make_collect_env(family, max_steps)
    env.set_seed(seed)
    cap = max_steps or default_episode_cap(family)
    returns = []
    with (
        torch.random.fork_rng(),
        torch.no_grad(),
        set_exploration_type(ExplorationType.DETERMINISTIC),
    ):
        for _ in range(episodes):
            rollout = env.rollout(cap, policy=actor, break_when_any_done=True)
            returns.append(float(rollout["next", "reward"].sum()))
    env.close()
    return returns


def _sac_updates(
    loss: SACLoss,
    optimizer: torch.optim.Optimizer,
    target_update: SoftUpdate,
    buffer: ReplayBuffer,
    steps: int,
) -> None:
    """``steps`` SAC updates, each on a fresh batch from ``buffer``: one Adam step on the
    actor, critic and alpha losses together, then the critics' target update."""
    for _ in range(steps):
        losses = loss(buffer.sample())
        total = losses["loss_actor"] + losses["loss_qvalue"] + losses["loss_alpha"]
        optimizer.zero_grad(set_to_none=True)
        total.backward()
        optimizer.step()
        target_update.step()


class SACRun:
    """One behaviour-policy SAC run on disk: train it, then read its products.

    Args:
        run_dir: where checkpoints live (see :func:`run_dir_for`).
        family: environment family.
        seed: seeds torch/numpy/python and the environment.
        config: SAC settings.
    """

    def __init__(self, run_dir: Path, family: Task, seed: int, config: SACConfig):
        config.validate()
        self.run_dir, self.family, self.seed, self.config = Path(run_dir), family, seed, config
        self.state_path = self.run_dir / "train_state.pt"

    # ---- products -------------------------------------------------------------------------

    def state(self) -> dict[str, Any] | None:
        """The last saved training state, or None before the first checkpoint."""
        if not self.state_path.exists():
            return None
        return torch.load(self.state_path, weights_only=True)

    @property
    def finished(self) -> bool:
        state = self.state()
        return state is not None and state["step"] >= self.config.total_steps

    def evaluations(self) -> list[dict[str, Any]]:
        """``[{"step", "return", "returns", "wall_time"}]`` of the checkpoints up to
        ``total_steps``, in order."""
        state = self.state()
        if state is None:
            return []
        return [e for e in state["evaluations"] if e["step"] <= self.config.total_steps]

    def wall_time(self) -> float:
        """Seconds spent training up to ``total_steps`` (or the last checkpoint), over resumes."""
        state = self.state()
        if state is None:
            return 0.0
        if state["step"] <= self.config.total_steps:
            return float(state["wall_time"])
        return float(self.evaluations()[-1].get("wall_time", float("nan")))

    def make_actor(self) -> ProbabilisticActor:
        cfg = self.config
        return make_actor(*env_sizes(self.family), cfg.hidden_sizes)

    def load_policy(self, step: int) -> ProbabilisticActor:
        """The actor saved at environment step ``step``."""
        actor = self.make_actor()
        path = self.run_dir / "policies" / f"step{step:08d}.pt"
        actor.load_state_dict(torch.load(path, weights_only=True))
        return actor

    def buffer(self, upto_step: int | None = None) -> TensorDict:
        """The replay buffer's transitions in collection order, batch ``[steps]``.

        Keys are :data:`TRANSITION_KEYS`. ``upto_step`` keeps the first
        ``upto_step`` transitions (those collected up to that checkpoint).
        """
        state = self.state()
        if state is None:
            raise RuntimeError(f"the SAC run in {self.run_dir} has no checkpoint yet")
        last = min(state["step"], self.config.total_steps) if upto_step is None else upto_step
        chunks = []
        for chunk_end in range(
            self.config.checkpoint_every, last + 1, self.config.checkpoint_every
        ):
            path = self.run_dir / "buffer" / f"upto{chunk_end:08d}.pt"
            chunks.append(_from_flat_dict(torch.load(path, weights_only=True)))
        if last % self.config.checkpoint_every:
            raise ValueError(f"upto_step={last} is not a checkpoint step")
        return torch.cat(chunks)

    # ---- training -------------------------------------------------------------------------

    def stopped_early(self, should_stop: Callable[[dict[str, Any]], bool] | None) -> bool:
        """Whether the last saved checkpoint's evaluation meets ``should_stop``."""
        state = self.state()
        if should_stop is None or state is None or not state["evaluations"]:
            return False
        last = state["evaluations"][-1]
        return last["step"] <= self.config.total_steps and should_stop(last)

    def train(
        self,
        progress: bool = True,
        stop_at: int | None = None,
        should_stop: Callable[[dict[str, Any]], bool] | None = None,
    ) -> None:
        """Trains to ``config.total_steps``, resuming from the last checkpoint if any.

        ``should_stop(evaluation)`` ends the run early after the first checkpoint
        whose evaluation (``{"step", "return", "returns", ...}``) meets it; a
        rerun with the same criterion then does nothing, and a rerun without it
        (or a criterion the last checkpoint does not meet) continues the same run:
        stopping early never changes the steps that were trained.

        ``stop_at`` ends the process-local work after the first checkpoint at or
        past that step, as a kill right after a checkpoint would (for tests).
        """
        cfg, family = self.config, self.family
        state = self.state()
        if state is not None and state["step"] >= cfg.total_steps:
            return
        if self.stopped_early(should_stop):
            return
        self.run_dir.mkdir(parents=True, exist_ok=True)
        seed_everything(self.seed)

        actor, loss, target_update, optimizer = self._learner()
        buffer = ReplayBuffer(storage=LazyTensorStorage(cfg.total_steps), batch_size=cfg.batch_size)
        env = make_collect_env(family, cfg.max_episode_steps)
        step, evaluations, wall_time = 0, [], 0.0
        if state is None:
            env.set_seed(self.seed)
        else:
            step, evaluations, wall_time = state["step"], state["evaluations"], state["wall_time"]
            loss.load_state_dict(state["loss"])
            optimizer.load_state_dict(state["optimizer"])
            buffer.extend(self.buffer(step))
            state_wrapper(env).restore_on_next_reset(state["env_snapshot"])

        collector = Collector(
            env,
            actor,
            frames_per_batch=cfg.frames_per_batch,
            total_frames=cfg.total_steps - step,
            init_random_frames=max(0, cfg.warmup_steps - step),
            exploration_type=ExplorationType.RANDOM,
            auto_register_policy_transforms=False,
        )
        if state is not None:
            _set_rng_state(state["rng"])  # after the collector: its set-up must not matter

        bar = tqdm(
            total=cfg.total_steps,
            initial=step,
            desc=f"SAC {family.name} seed {self.seed}",
            unit="step",
            disable=not progress,
            dynamic_ncols=True,
        )
        pending: list[TensorDict] = []
        started = time.perf_counter()
        for batch in collector:
            batch = batch.reshape(-1).select(*TRANSITION_KEYS).clone()
            buffer.extend(batch)
            pending.append(batch)
            step += batch.numel()
            if step > cfg.warmup_steps:
                _sac_updates(loss, optimizer, target_update, buffer, batch.numel())
            bar.update(batch.numel())
            if step % cfg.checkpoint_every == 0:
                returns = evaluate_policy(
                    actor, family, cfg.eval_episodes, self.seed + 10_000, cfg.max_episode_steps
                )
                wall_time += time.perf_counter() - started
                started = time.perf_counter()
                evaluations.append(self._evaluation(step, returns, wall_time, bar, progress))
                self._checkpoint(
                    step, torch.cat(pending), actor, loss, optimizer, env, evaluations, wall_time
                )
                pending = []
                if stop_at is not None and step >= stop_at:
                    break
                if should_stop is not None and should_stop(evaluations[-1]):
                    break
        collector.shutdown()
        bar.close()

    def _learner(self) -> tuple[ProbabilisticActor, SACLoss, SoftUpdate, torch.optim.Optimizer]:
        """A fresh actor, its SAC loss (two critics), the target update and the optimizer."""
        cfg = self.config
        actor = self.make_actor()
        obs_dim, action_dim = env_sizes(self.family)
        qvalues = make_qvalue_ensemble(2, obs_dim, action_dim, cfg.hidden_sizes)
        loss = SACLoss(
            actor,
            qvalues,
            num_qvalue_nets=2,
            action_spec=action_spec(action_dim),
            loss_function=cfg.loss_function,
        )
        loss.make_value_estimator(gamma=cfg.gamma)
        target_update = SoftUpdate(loss, tau=cfg.tau)
        # One Adam over actor, critics and alpha: Adam is per-parameter and the
        # three SAC losses touch disjoint parameters, so this equals three Adams.
        optimizer = torch.optim.Adam(loss.parameters(), lr=cfg.lr)
        return actor, loss, target_update, optimizer

    def _evaluation(
        self, step: int, returns: list[float], wall_time: float, bar: tqdm, progress: bool
    ) -> dict[str, Any]:
        """A checkpoint's evaluation record, shown on the bar (or as a log line without it)."""
        evaluation = {
            "step": step,
            "return": float(np.mean(returns)),
            "returns": returns,
            "wall_time": wall_time,
        }
        bar.set_postfix(eval_return=f"{evaluation['return']:.0f}")
        if not progress:  # a log line per checkpoint for background runs
            print(
                f"[sac {self.family.name} seed {self.seed}] step {step} eval return "
                f"{evaluation['return']:.1f} wall {wall_time:.0f} s",
                flush=True,
            )
        return evaluation

    def _checkpoint(
        self,
        step: int,
        new_transitions: TensorDict,
        actor: ProbabilisticActor,
        loss: SACLoss,
        optimizer: torch.optim.Optimizer,
        env,
        evaluations: list[dict[str, Any]],
        wall_time: float,
    ) -> None:
        atomic_torch_save(
            _to_flat_dict(new_transitions), self.run_dir / "buffer" / f"upto{step:08d}.pt"
        )
        atomic_torch_save(actor.state_dict(), self.run_dir / "policies" / f"step{step:08d}.pt")
        atomic_torch_save(
            {
                "step": step,
                "loss": loss.state_dict(),
                "optimizer": optimizer.state_dict(),
                "rng": _rng_state(),
                "env_snapshot": state_wrapper(env).snapshot(),
                "evaluations": evaluations,
                "wall_time": wall_time,
                "config": dataclasses.asdict(self.config),
                "seed": self.seed,
            },
            self.state_path,
        )
