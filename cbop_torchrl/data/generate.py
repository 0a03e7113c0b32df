"""D4RL-recipe dataset generation on gymnasium MuJoCo ``*-v4``.

D4RL's MuJoCo recipe, applied to one SAC behaviour-policy run
(:class:`~cbop_torchrl.data.collect_sac.SACRun`):

========== =====================================================================
kind       transitions
========== =====================================================================
random     rollouts of uniform random actions
medium     rollouts of the checkpoint whose evaluation return is nearest
           ``medium_fraction`` (default 1/3) of the run's best return, or of
           D4RL's expert reference score with ``medium_reference="d4rl"``
medium-    the run's replay buffer up to that checkpoint
replay
full-      the whole replay buffer
replay
expert     rollouts of the best checkpoint
medium-    ``medium`` followed by ``expert``
expert
========== =====================================================================

Every file holds complete episodes only (a rollout or buffer cut mid-episode
drops that last partial episode), so ``terminals`` are exactly the
environment's terminations and ``timeouts`` exactly the episode cap. Files are
D4RL-layout HDF5 named ``<family>[-<tag>]-<kind>-gen.hdf5`` (the ``-gen``
keeps them from being mistaken for D4RL's), each with a
``.provenance.json`` beside it.
"""

from __future__ import annotations

import dataclasses
import json
import platform
import re
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import gymnasium
import h5py
import mujoco
import numpy as np
import tensordict
import torch
import torchrl
from tensordict import TensorDict
from torchrl.collectors import Collector
from torchrl.envs.utils import ExplorationType
from torchrl.modules import ProbabilisticActor
from tqdm import tqdm

from cbop_torchrl.data.behaviour_checkpoints import (
    MEDIUM_REFERENCES,
    medium_reached,
    medium_target,
    select_checkpoints,
)
from cbop_torchrl.data.collect_env import make_collect_env
from cbop_torchrl.data.collect_sac import TRANSITION_KEYS, SACConfig, SACRun, run_dir_for
from cbop_torchrl.data.hdf5 import (
    Arrays,
    metadata_text,
    read_d4rl_hdf5,
    sha256_of_file,
    write_d4rl_hdf5,
)
from cbop_torchrl.io import (
    atomic_json_dump,
    cache_root,
    check_owned_output,
    config_hash,
    is_within,
    owned_outputs,
)
from cbop_torchrl.registry import D4RL_KINDS, Task
from cbop_torchrl.runtime import seed_everything

GENERATOR_VERSION = "2"  # 2: 10-episode evaluations, medium floor, early stop
ROLLOUT_EXPLORATION = {
    "random": ExplorationType.RANDOM,
    "deterministic": ExplorationType.DETERMINISTIC,
}
# Seed offsets keep each rollout kind's random streams apart from SAC's and each other's.
_ROLLOUT_SEED_OFFSET = {"random": 1_000, "medium": 2_000, "expert": 3_000}


#: A tag is one plain file-name part: no separator, no ``..``, so the file stays in out_dir.
_TAG_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")


def check_tag(tag: str | None) -> None:
    """Raises ValueError unless ``tag`` is None or one plain file-name part."""
    if tag is not None and (not _TAG_PATTERN.match(str(tag)) or ".." in str(tag)):
        raise ValueError(
            f"tag={tag!r} must be a plain name part of the file name (letters, digits, "
            "'_', '-', '.', '+', starting with a letter or digit, no '..' or '/'), e.g. tag=demo."
        )


def dataset_file_name(family: Task, kind: str, tag: str | None = None) -> str:
    """``hopper-medium-replay-gen.hdf5`` or, with a tag, ``hopper-demo-medium-replay-gen.hdf5``."""
    check_tag(tag)
    middle = f"{tag}-" if tag else ""
    return f"{family.name}-{middle}{kind}-gen.hdf5"


def complete_episodes(transitions: TensorDict) -> TensorDict:
    """Drops the trailing transitions after the last episode end, batch ``[N] -> [M<=N]``."""
    ends = transitions["next", "done"].reshape(-1).nonzero()
    if ends.numel() == 0:
        raise ValueError(
            f"{transitions.numel()} transitions hold no complete episode; collect more "
            "transitions (sac.total_steps / rollout_transitions) or lower max_episode_steps."
        )
    return transitions[: int(ends[-1]) + 1]


def to_d4rl_arrays(transitions: TensorDict) -> Arrays:
    """Transitions (keys :data:`TRANSITION_KEYS`, batch ``[N]``) in D4RL's HDF5 layout.

    ``terminals`` is the environment's termination; ``timeouts`` marks episodes
    cut by the step cap and never a terminal step (as in D4RL).
    """
    terminated = transitions["next", "terminated"].reshape(-1)
    truncated = transitions["next", "truncated"].reshape(-1)
    return {
        "observations": transitions["observation"].float().numpy(),
        "next_observations": transitions["next", "observation"].float().numpy(),
        "actions": transitions["action"].float().numpy(),
        "rewards": transitions["next", "reward"].reshape(-1).float().numpy(),
        "terminals": terminated.numpy().astype(bool),
        "timeouts": (truncated & ~terminated).numpy().astype(bool),
        "infos/qpos": transitions["qpos"].float().numpy(),
        "infos/qvel": transitions["qvel"].float().numpy(),
    }


def episode_returns(arrays: Arrays) -> np.ndarray:
    """Undiscounted return of every episode of a complete-episode D4RL array dict."""
    ends = np.flatnonzero(arrays["terminals"] | arrays["timeouts"])
    sums = np.cumsum(arrays["rewards"], dtype=np.float64)[ends]
    return np.diff(sums, prepend=0.0)


# D4RL's own sizes (transitions) of the sets the benchmark imitates, for comparison.
D4RL_TRANSITIONS = {
    "hopper-medium-replay": 402_000,
    "walker2d-medium-replay": 302_000,
    "hopper-medium": 1_000_000,
    "walker2d-medium": 1_000_000,
}


def dataset_statistics(arrays: Arrays, family: Task | None = None) -> dict[str, Any]:
    """Transitions, episodes, mean episode return (and normalized), fraction of terminals."""
    returns = episode_returns(arrays)
    mean_return = float(returns.mean()) if len(returns) else float("nan")
    return {
        "transitions": len(arrays["rewards"]),
        "episodes": len(returns),
        "episode_return_mean": mean_return,
        "episode_normalized_score_mean": None
        if family is None
        else _optional_float(family.normalized_score(mean_return)),
        "terminal_fraction": float(arrays["terminals"].mean()),
    }


def concat_arrays(parts: Sequence[Arrays]) -> Arrays:
    """Stitches datasets one after the other (``medium-expert``)."""
    return {key: np.concatenate([part[key] for part in parts]) for key in parts[0]}


def collect_rollouts(
    family: Task,
    policy: ProbabilisticActor | None,
    num_transitions: int,
    seed: int,
    max_episode_steps: int | None = None,
    exploration: str = "random",
    desc: str = "rollouts",
    progress: bool = True,
) -> TensorDict:
    """Up to ``num_transitions`` transitions of complete episodes, in order.

    Args:
        family: environment family.
        policy: the behaviour policy, or None for uniform random actions.
        num_transitions: steps to collect; the last partial episode is dropped.
        seed: seeds torch and the environment.
        max_episode_steps: episode cap (None: the family's).
        exploration: ``"random"`` samples the policy (D4RL's choice),
            ``"deterministic"`` takes the tanh of its mean.
        desc, progress: the progress bar's label, and whether to show it.

    Returns:
        TensorDict with keys :data:`TRANSITION_KEYS`, batch ``[M <= num_transitions]``.
    """
    seed_everything(seed)
    env = make_collect_env(family, max_episode_steps)
    env.set_seed(seed)
    frames_per_batch = min(num_transitions, 1_000)
    total = -(-num_transitions // frames_per_batch) * frames_per_batch
    collector = Collector(
        env,
        policy,
        frames_per_batch=frames_per_batch,
        total_frames=total,
        exploration_type=ROLLOUT_EXPLORATION[exploration],
        auto_register_policy_transforms=False,
    )
    batches = []
    with torch.no_grad(), tqdm(total=total, desc=desc, unit="step", disable=not progress) as bar:
        for batch in collector:
            batches.append(batch.reshape(-1).select(*TRANSITION_KEYS).clone())
            bar.update(batch.numel())
    collector.shutdown()
    return complete_episodes(torch.cat(batches)[:num_transitions])


@dataclasses.dataclass
class GenerationRequest:
    """Everything that determines a set of generated files."""

    family: Task
    kinds: Sequence[str]
    seed: int = 0
    sac: SACConfig = dataclasses.field(default_factory=SACConfig)
    medium_fraction: float = 1 / 3
    medium_reference: str = "best"
    # the medium checkpoint must score at least this (D4RL-normalized; None: no floor)
    medium_min_normalized: float | None = None
    # end the SAC run at the first checkpoint that reaches the medium target (and floor)
    stop_at_medium: bool = False
    rollout_transitions: int = 1_000_000
    rollout_exploration: str = "random"
    tag: str | None = None
    out_dir: Path = Path(".")
    runs_dir: Path = Path(".")
    compression: str | None = "gzip"
    compression_level: int = 4
    command: str = ""
    progress: bool = True

    def validate(self) -> None:
        check_tag(self.tag)
        unknown = [kind for kind in self.kinds if kind not in D4RL_KINDS]
        if unknown or not self.kinds:
            raise ValueError(
                f"unknown dataset kind(s) {unknown or self.kinds!r}; choose among "
                f"{list(D4RL_KINDS)} (one, a list, or 'all')."
            )
        if not 0.0 < self.medium_fraction <= 1.0:
            raise ValueError(f"medium_fraction={self.medium_fraction} must be in (0, 1].")
        if self.medium_reference not in MEDIUM_REFERENCES:
            raise ValueError(
                f"medium_reference={self.medium_reference!r} must be one of "
                f"{list(MEDIUM_REFERENCES)}: the run's best return or D4RL's expert score."
            )
        if self.stop_at_medium and self.medium_reference != "d4rl":
            raise ValueError(
                "stop_at_medium=true needs medium_reference=d4rl (a fixed target); with "
                "medium_reference=best the target moves with the run, so use stop_at_medium=false."
            )
        if self.rollout_exploration not in ROLLOUT_EXPLORATION:
            raise ValueError(
                f"rollout_exploration={self.rollout_exploration!r} must be one of "
                f"{list(ROLLOUT_EXPLORATION)}."
            )
        if self.rollout_transitions <= 0:
            raise ValueError(f"rollout_transitions={self.rollout_transitions} must be positive.")
        self.sac.validate()
        if self.sac.checkpoint_every > self.sac.total_steps and set(self.kinds) != {"random"}:
            raise ValueError(
                f"sac.checkpoint_every={self.sac.checkpoint_every} is more than sac.total_steps="
                f"{self.sac.total_steps}: the SAC run would end before its first evaluated "
                "checkpoint, the policies the medium and expert kinds are made from. Use "
                f"sac.checkpoint_every={self.sac.total_steps} or less."
            )

    def data_key(self) -> str:
        """Hash of every setting that changes the data (not the command or paths)."""
        return config_hash(
            {
                "family": self.family.name,
                "seed": self.seed,
                "sac": dataclasses.asdict(self.sac),
                "medium_fraction": self.medium_fraction,
                "medium_reference": self.medium_reference,
                "medium_min_normalized": self.medium_min_normalized,
                "stop_at_medium": self.stop_at_medium,
                "rollout_transitions": self.rollout_transitions,
                "rollout_exploration": self.rollout_exploration,
                "generator_version": GENERATOR_VERSION,
            }
        )


def _optional_float(value: float | None) -> float | None:
    """``value`` as a plain float, None kept (a task without reference scores)."""
    return None if value is None else float(value)


def _policy_fields(family: Task, evaluation: dict[str, Any]) -> dict[str, Any]:
    return {
        "policy_step": int(evaluation["step"]),
        "policy_return": float(evaluation["return"]),
        "policy_normalized_score": _optional_float(family.normalized_score(evaluation["return"])),
        "policy_eval_episodes": len(evaluation.get("returns", [])),
    }


def _versions() -> dict[str, str]:
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torchrl": torchrl.__version__,
        "tensordict": tensordict.__version__,
        "gymnasium": gymnasium.__version__,
        "mujoco": mujoco.__version__,
        "torch_num_threads": str(torch.get_num_threads()),
    }


def generate_datasets(request: GenerationRequest) -> list[Path]:
    """Trains (or resumes, or reuses) the SAC run and writes the requested kinds.

    A file that already exists with the same settings (``metadata/data_key``)
    is kept as it is, so rerunning an interrupted command redoes only what is
    missing.

    Returns:
        The paths of the HDF5 files, in the order of ``request.kinds``.
    """
    request.validate()
    family = request.family
    out_dir = Path(request.out_dir)
    key = request.data_key()
    paths = {kind: out_dir / dataset_file_name(family, kind, request.tag) for kind in D4RL_KINDS}

    # The package's cache is its own; any other folder: only files a collect run wrote there
    # (its manifest says so) are replaced, checked before any work.
    in_cache = is_within(out_dir, cache_root())
    for kind in request.kinds if not in_cache else ():
        check_owned_output(paths[kind], PROGRAM)
        check_owned_output(paths[kind].with_suffix(".provenance.json"), PROGRAM)

    def up_to_date(kind: str) -> bool:
        if not paths[kind].exists():
            return False
        try:
            with h5py.File(paths[kind], "r") as handle:
                return metadata_text(handle, "data_key") == key
        except (OSError, AttributeError, UnicodeDecodeError):  # a damaged file of ours: rewritten
            return False

    if in_cache:
        return _generate(request, paths, key, up_to_date)
    with owned_outputs(out_dir, PROGRAM):
        return _generate(request, paths, key, up_to_date)


PROGRAM = "cbop-collect"


GENERATOR_NAME = "cbop_torchrl.data.generate"


def _generate(
    request: GenerationRequest,
    paths: dict[str, Path],
    key: str,
    up_to_date: Callable[[str], bool],
) -> list[Path]:
    family, sac = request.family, request.sac
    todo = [kind for kind in request.kinds if not up_to_date(kind)]
    run = SACRun(
        run_dir_for(Path(request.runs_dir), family, request.seed, sac), family, request.seed, sac
    )
    evaluations, medium, expert = _train_behaviour(request, run, todo)
    rollouts: dict[str, Arrays] = {}

    def rollout(kind: str) -> Arrays:
        """``random``/``medium``/``expert`` rollouts, read back from their file if present."""
        if kind not in rollouts:
            if up_to_date(kind):
                rollouts[kind] = read_d4rl_hdf5(paths[kind])[0]
            else:
                checkpoint = {"medium": medium, "expert": expert}.get(kind)
                policy = None if checkpoint is None else run.load_policy(checkpoint["step"])
                transitions = collect_rollouts(
                    family,
                    policy,
                    request.rollout_transitions,
                    request.seed + _ROLLOUT_SEED_OFFSET[kind],
                    sac.max_episode_steps,
                    request.rollout_exploration,
                    desc=f"{kind} rollouts",
                    progress=request.progress,
                )
                rollouts[kind] = to_d4rl_arrays(transitions)
        return rollouts[kind]

    def provenance(kind: str, fields: dict[str, Any], started: float) -> dict[str, Any]:
        """The ``.provenance.json`` of the ``kind`` file just written (begun at ``started``)."""
        sac_time = run.wall_time() if kind != "random" else 0.0
        return {
            **fields,
            "file": paths[kind].name,
            "sha256": sha256_of_file(paths[kind]),
            "size_bytes": paths[kind].stat().st_size,
            "wall_time_s": {
                "sac_training": round(sac_time, 1),
                "this_file": round(time.perf_counter() - started, 1),
                "total": round(sac_time + time.perf_counter() - started, 1),
            },
            "sac": {"config": dataclasses.asdict(sac), "evaluations": evaluations}
            if kind != "random"
            else None,
            "versions": _versions(),
        }

    for kind in todo:
        started = time.perf_counter()
        if kind in ("random", "medium", "expert"):
            arrays = rollout(kind)
        elif kind == "medium-expert":
            arrays = concat_arrays([rollout("medium"), rollout("expert")])
        else:
            upto = medium["step"] if kind == "medium-replay" else None
            arrays = to_d4rl_arrays(complete_episodes(run.buffer(upto)))
        fields = _file_fields(request, kind, arrays, key, evaluations, medium, expert)
        write_d4rl_hdf5(paths[kind], arrays, fields, request.compression, request.compression_level)
        record = provenance(kind, fields, started)
        atomic_json_dump(record, paths[kind].with_suffix(".provenance.json"))
    return [paths[kind] for kind in request.kinds]


def _train_behaviour(
    request: GenerationRequest, run: SACRun, todo: Sequence[str]
) -> tuple[list[dict[str, Any]], dict[str, Any], dict[str, Any]]:
    """Trains (or resumes) the SAC run when a kind in ``todo`` needs it: its evaluations and
    its medium and expert checkpoints (none for random data alone)."""
    family = request.family
    evaluations: list[dict[str, Any]] = []
    medium: dict[str, Any] = {}
    expert: dict[str, Any] = {}
    if any(kind != "random" for kind in todo):
        should_stop = None
        if request.stop_at_medium:
            target = medium_target([], request.medium_fraction, "d4rl", family)

            def should_stop(evaluation: dict[str, Any]) -> bool:
                return medium_reached(evaluation, target, family, request.medium_min_normalized)

        run.train(progress=request.progress, should_stop=should_stop)
        evaluations = run.evaluations()
        medium, expert = select_checkpoints(
            evaluations,
            request.medium_fraction,
            request.medium_reference,
            family,
            request.medium_min_normalized,
        )
    return evaluations, medium, expert


def _file_fields(
    request: GenerationRequest,
    kind: str,
    arrays: Arrays,
    key: str,
    evaluations: list[dict[str, Any]],
    medium: dict[str, Any],
    expert: dict[str, Any],
) -> dict[str, Any]:
    """The ``metadata/*`` of the ``kind`` file: the settings, the data's statistics and the
    behaviour policy's checkpoint (and, for medium-expert, the expert's)."""
    family, sac = request.family, request.sac
    medium_ref = request.medium_reference
    behaviour = {
        "random": None,
        "medium": medium,
        "medium-replay": medium,
        "expert": expert,
        "medium-expert": medium,
        "full-replay": evaluations[-1] if evaluations else None,  # none: random alone
    }[kind]
    fields: dict[str, Any] = {
        "env_id": family.gym_id,
        "family": family.name,
        "kind": kind,
        "seed": request.seed,
        "sac_total_steps": sac.total_steps if kind != "random" else 0,
        "sac_steps_trained": evaluations[-1]["step"] if kind != "random" else 0,
        **dataset_statistics(arrays, family),
        "medium_fraction": request.medium_fraction,
        "medium_reference": request.medium_reference,
        "medium_target_return": None
        if kind == "random"
        else medium_target(evaluations, request.medium_fraction, medium_ref, family),
        "medium_min_normalized": request.medium_min_normalized,
        "stop_at_medium": request.stop_at_medium,
        "rollout_exploration": request.rollout_exploration,
        "generator": GENERATOR_NAME,
        "generator_version": GENERATOR_VERSION,
        "command": request.command,
        "data_key": key,
    }
    if behaviour is not None:
        fields.update(_policy_fields(family, behaviour))
    if kind == "medium-expert":
        fields.update({f"expert_{k}": v for k, v in _policy_fields(family, expert).items()})
    return fields


def load_json(path: Path) -> dict[str, Any]:
    """A provenance file's content."""
    return json.loads(Path(path).read_text())
