"""Small snapshots of a run's policy and critics, written during training, scored afterwards.

:class:`SnapshotHook` (``post_steps``, ``eval.snapshot_interval=N``) writes, every ``N``
gradient steps and at the last one, ``<run dir>/snapshots/step<k>.pt``: the actor's
weights in the layout of ``policy.pt`` (so
:func:`~cbop_torchrl.trainers.checkpoint.load_policy` reads a snapshot as it reads a
policy) and, at :data:`~cbop_torchrl.trainers.conservatism.MC_STATES` fixed dataset
states, the critics' Q of every member at the dataset actions and at the policy's actions.
The states are those of the start-state measure and of the conservatism (Q - MC) measure
(both take the first rows of one permutation seeded by 0 + 1), so the scorer
(``cbop-score``) computes both from a snapshot on the CPU after a GPU job that evaluated
nothing inside its window.

A snapshot is a file per step, written atomically; a run killed and resumed from an
earlier checkpoint trains the same steps again and writes the same files again, so no
step is missing and none appears twice. Measuring the Q-values draws no random numbers,
so training is unchanged by the hook.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDict
from torchrl.data import ReplayBuffer
from torchrl.trainers import Trainer, TrainerHookBase

from cbop_torchrl.envs.evaluate import deterministic_policy
from cbop_torchrl.io import atomic_torch_save, find_regular_files
from cbop_torchrl.trainers.checkpoint import CHECKPOINT_FORMAT, seal, training_config_hash
from cbop_torchrl.trainers.conservatism import (
    MC_STATES,
    STATES_SEED,
    member_q_values,
    soft_critic_alpha,
)

SNAPSHOT_DIR = "snapshots"
"""The snapshots' folder inside the run directory."""
SNAPSHOT_FORMAT = "cbop-torchrl-snapshot/1"


def snapshot_path(run_dir: Path, step: int) -> Path:
    """``<run_dir>/snapshots/step<step>.pt``."""
    return Path(run_dir) / SNAPSHOT_DIR / f"step{int(step)}.pt"


def snapshot_steps(run_dir: Path) -> list[int]:
    """The steps of the snapshots in ``run_dir``, ascending (temporary files are not counted)."""
    folder = Path(run_dir) / SNAPSHOT_DIR
    found = find_regular_files(folder, "step*.pt", depth=0) if folder.is_dir() else []
    digits = (path.stem.removeprefix("step") for path in found if not path.is_symlink())
    return sorted(int(text) for text in digits if text.isdigit())


def snapshot_states(data: Any, count: int = MC_STATES) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``count`` fixed dataset states ``[count, O]`` and their dataset actions ``[count, A]``.

    The same rows as :func:`~cbop_torchrl.trainers.conservatism.start_states` and
    :func:`~cbop_torchrl.envs.starts.pick_start_states` (seed ``STATES_SEED + 1``).
    """
    generator = torch.Generator().manual_seed(STATES_SEED + 1)
    rows = torch.randperm(data.shape[0], generator=generator)[:count].to(data.device)
    return data.get("observation")[rows].float(), data.get("action")[rows].float()


@torch.no_grad()
def critic_values(loss: Any, obs: torch.Tensor, data_actions: torch.Tensor) -> dict[str, Any]:
    """The policy's actions and every critic member's Q at ``obs`` ``[N, O]``.

    Returns:
        ``policy_action`` ``[N, A]``, ``q_data`` and ``q_policy`` ``[M, N]`` (at the dataset
        and the deterministic policy's actions), their mean and min over members ``[N]``,
        and the critic target's entropy temperature ``alpha`` (0 without one).
    """
    actor = loss.actor_network
    with loss.actor_network_params.to_module(actor):
        td = TensorDict({"observation": obs}, batch_size=obs.shape[:1])
        policy_action = deterministic_policy(actor)(td).get("action").float()
    params = loss.qvalue_network_params
    q_data = member_q_values(loss.qvalue_network, params, obs, data_actions).float()
    q_policy = member_q_values(loss.qvalue_network, params, obs, policy_action).float()
    return {
        "policy_action": policy_action.cpu(),
        "q_data": q_data.cpu(),
        "q_policy": q_policy.cpu(),
        "q_data_mean": q_data.mean(0).cpu(),
        "q_data_min": q_data.min(0).values.cpu(),
        "q_policy_mean": q_policy.mean(0).cpu(),
        "q_policy_min": q_policy.min(0).values.cpu(),
        "alpha": soft_critic_alpha(loss) if hasattr(loss, "log_alpha") else 0.0,
    }


class SnapshotHook(TrainerHookBase):
    """Writes a snapshot every ``interval`` gradient steps and at ``total_steps`` (``post_steps``).

    Args:
        run_dir: the run directory (snapshots go to its ``snapshots/``).
        interval: gradient steps between snapshots (> 0).
        total_steps: the run's last step (always snapshotted).
        loss: a loss with ``actor_network(_params)`` and ``qvalue_network(_params)``.
        actor: the trained actor (its ``state_dict`` is the snapshot's ``actor``).
        obs: ``[N, O]`` the fixed dataset states (:func:`snapshot_states`).
        data_actions: ``[N, A]`` their dataset actions.
        metadata: the policy metadata at a step (``OfflineRun.policy_metadata``).
        config_hash: the run's training-config hash.
    """

    def __init__(
        self,
        run_dir: Path,
        interval: int,
        total_steps: int,
        loss: Any,
        actor: Any,
        obs: torch.Tensor,
        data_actions: torch.Tensor,
        metadata: Callable[[int], dict[str, Any]],
        config_hash: str,
    ) -> None:
        self.run_dir, self.interval, self.total_steps = Path(run_dir), int(interval), total_steps
        self.loss, self.actor, self.obs, self.data_actions = loss, actor, obs, data_actions
        self.metadata, self.config_hash = metadata, config_hash
        self.trainer: Trainer | None = None

    def __call__(self) -> None:
        step = self.trainer.collected_frames  # one frame per gradient step
        if step % self.interval == 0 or step == self.total_steps:
            self.write(step)

    def write(self, step: int) -> Path:
        """Writes ``snapshots/step<step>.pt`` atomically and returns its path."""
        values = critic_values(self.loss, self.obs, self.data_actions)
        actor = {k: v.detach().cpu().clone() for k, v in self.actor.state_dict().items()}
        state = {
            "format": CHECKPOINT_FORMAT,
            "snapshot_format": SNAPSHOT_FORMAT,
            "policy": self.metadata(step),
            "actor": actor,
            "step": int(step),
            "training_config_hash": self.config_hash,
            "states": {
                "observation": self.obs.cpu(),
                "action": self.data_actions.cpu(),
                "seed": STATES_SEED,
            },
            "critic": values,
        }
        return atomic_torch_save(seal(state), snapshot_path(self.run_dir, step))

    def register(self, trainer: Trainer, name: str = "snapshots") -> None:
        self.trainer = trainer
        trainer.register_op("post_steps", self)


def snapshot_hook(run: Any, loss: Any, actor: Any, buffer: ReplayBuffer) -> SnapshotHook:
    """The :class:`SnapshotHook` of an :class:`~cbop_torchrl.trainers.offline_run.OfflineRun`,
    its states drawn from the replay buffer's dataset (``eval.snapshot_interval`` steps apart)."""
    obs, actions = snapshot_states(buffer.storage.get(slice(None)))
    config = run.config
    return SnapshotHook(
        run.run_dir, config.eval.snapshot_interval, config.train.total_steps, loss, actor,
        obs, actions, run.policy_metadata, training_config_hash(run.training_config),
    )  # fmt: skip


__all__ = [
    "SNAPSHOT_DIR",
    "SNAPSHOT_FORMAT",
    "SnapshotHook",
    "critic_values",
    "snapshot_hook",
    "snapshot_path",
    "snapshot_states",
    "snapshot_steps",
]
