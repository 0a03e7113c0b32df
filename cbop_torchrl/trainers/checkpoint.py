"""Checkpoints: one atomically written file per run, loadable with ``weights_only=True``.

A CBOP checkpoint (``<run_dir>/checkpoint.pt``) is a plain dict of tensors,
numbers, strings and lists, so ``torch.load(path, weights_only=True)`` reads
it and a checkpoint file cannot run code:

- ``format``, ``layout``, ``step``, ``total_steps``: which file and where the run stands;
- ``decisions``: the run's device, dtype, capture and seeds
  (:class:`~cbop_torchrl.trainers.decisions.RunDecisions`);
- ``integrity``: the SHA-256 of everything else (:func:`state_digest`), checked whenever the
  file is read, so a changed byte is refused rather than trained on;
- ``data``: the record of the data the run trains on (:func:`cbop_torchrl.data.data_record`),
  compared with the data on resume;
- ``training_config`` and its hash: resuming with other settings is refused,
  except a larger budget (``train.epochs``, ``train.steps_per_epoch``): the run
  then continues from its step to the new last step;
- ``policy``: what :func:`load_policy` needs to rebuild the actor (task,
  sizes, dataset name) and ``actor``, the actor's weights;
- the training's state (:mod:`cbop_torchrl.trainers.run_state`, which builds and restores
  the whole dict): ``loss_module`` (actor, Q-ensemble, target Q-ensemble, log-alpha),
  ``optimizer``, ``sampler_generator`` (the replay buffer's), ``trainer_loop`` (the step
  counters), ``metrics_windows``, ``evaluation_history``, ``rng`` (the global RNG
  states) and, where the run keeps them, ``actor_average`` and ``diagnostics_history``.

Together these make a resumed run continue exactly where the interrupted one
was: same parameters, same optimizer moments, same next batch, same random
draws.

What comes from TorchRL: saving runs as a ``TrainerHookBase`` registered on
the Trainer's ``post_steps`` (:class:`CheckpointHook`), and the global RNG state is
TorchRL's ``GlobalRNGState``. What does not, and why: the state is one dict whose keys
name what they hold rather than ``Trainer.state_dict()`` (the state of every hook
registered as a Trainer module, under the hooks' names), so that what a checkpoint holds
is read in one place (:func:`~cbop_torchrl.trainers.run_state.run_state`); and
the Trainer's own ``save_trainer`` saves only when more than
``save_trainer_interval`` frames passed since the last save (never at the
last step), and TorchRL 0.14's ``torchrl.checkpoint.Checkpoint`` /
``CheckpointRotation`` write a directory or a ZIP archive of components.
A run here needs one file that is both the resumable state and a readable
policy (``scripts/evaluate.py checkpoint=.../checkpoint.pt``, :func:`load_policy`),
saved at every ``interval`` and at the last step, and read with
``torch.load(weights_only=True)``; :func:`~cbop_torchrl.io.atomic_write`
gives the same atomicity as ``Checkpoint.save``'s staged publish.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModuleBase
from torch import nn
from torchrl.envs.utils import ExplorationType, set_exploration_type
from torchrl.trainers import Trainer, TrainerHookBase

from cbop_torchrl.io import (
    atomic_torch_save,
    atomic_write,
    config_hash,
    describe_load_error,
    require_regular_file,
)
from cbop_torchrl.modules.actor_critic import ACTOR_BUILDERS
from cbop_torchrl.modules.standardize import standardize_observation
from cbop_torchrl.registry import Task, get_family

CHECKPOINT_FORMAT = "cbop-torchrl/1"
CHECKPOINT_NAME = "checkpoint.pt"
POLICY_NAME = "policy.pt"


class CheckpointError(RuntimeError):
    """A checkpoint is missing, unreadable or belongs to other settings."""


class NonFiniteLossError(FloatingPointError):
    """A loss, target or gradient became NaN/inf; nothing was trained on it."""


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Reads a checkpoint with ``torch.load(..., weights_only=True)`` onto the CPU.

    Raises:
        CheckpointError: the file is missing, truncated or not one of ours.
    """
    path = Path(path)
    require_regular_file(
        path,
        CheckpointError,
        "a checkpoint file",
        "pass the checkpoint.pt or policy.pt of a run directory",
        f"no checkpoint at {str(path)!r}",
    )
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:
        raise CheckpointError(
            f"cannot read checkpoint {str(path)!r} ({describe_load_error(error, path)}); it is "
            "not a cbop-torchrl checkpoint or it is damaged. Pass the checkpoint.pt or "
            "policy.pt of a run directory; to start a damaged run over, run its command "
            "with resume=false"
        ) from None
    if not isinstance(state, dict) or state.get("format") not in (CHECKPOINT_FORMAT,):
        raise CheckpointError(
            f"{str(path)!r} is not a cbop-torchrl checkpoint (expected format "
            f"{CHECKPOINT_FORMAT!r}); pass the checkpoint.pt or policy.pt of a run directory"
        )
    check_integrity(state, path)
    return state


INTEGRITY_KEY = "integrity"
"""The SHA-256 of everything else in a checkpoint or policy file (:func:`state_digest`)."""


def state_digest(state: Any) -> str:
    """A SHA-256 of a checkpoint's content: every key, number, string and tensor byte.

    The same for a state and the one ``torch.load`` reads back from its file; any changed
    byte of a tensor (or value) gives another digest. :data:`INTEGRITY_KEY` is left out.
    """
    digest = hashlib.sha256()

    def feed(value: Any) -> None:
        if isinstance(value, torch.Tensor):
            tensor = value.detach().cpu().contiguous().reshape(-1)
            digest.update(f"T{tensor.dtype}{list(value.shape)}:".encode())
            if tensor.numel():
                digest.update(tensor.view(torch.uint8).numpy().tobytes())
        elif isinstance(value, dict):
            items = [(k, v) for k, v in value.items() if k != INTEGRITY_KEY]
            digest.update(f"D{len(items)}:".encode())
            for key, item in sorted(items, key=lambda kv: (type(kv[0]).__name__, repr(kv[0]))):
                digest.update(f"{type(key).__name__}{key!r}=".encode())
                feed(item)
        elif isinstance(value, (list, tuple)):
            digest.update(f"L{len(value)}:".encode())
            for item in value:
                feed(item)
        else:
            digest.update(f"{type(value).__name__}{value!r};".encode())

    feed(state)
    return digest.hexdigest()


def seal(state: dict[str, Any]) -> dict[str, Any]:
    """``state`` with its :func:`state_digest` under :data:`INTEGRITY_KEY` (checked on load)."""
    return {**state, INTEGRITY_KEY: state_digest(state)}


def check_integrity(state: dict[str, Any], path: str | Path) -> None:
    """Refuses a checkpoint whose content is not what was saved (a changed or damaged byte).

    Files written before the digest existed have none and are read as they are.

    Raises:
        CheckpointError: the stored digest does not match the content.
    """
    stored = state.get(INTEGRITY_KEY)
    if stored is None:
        return
    if stored != state_digest(state):
        raise CheckpointError(
            f"{str(path)!r} is damaged: its content no longer matches the SHA-256 recorded "
            "when it was written (some of its bytes changed after it was saved), so it is "
            "not used. Restore it from a copy, or start the run over with resume=false (its "
            "checkpoint, results and logs are removed); for a policy, use another "
            "policy.pt or checkpoint.pt."
        )


# ------------------------------------------------------------------------- cached stages

STAGE_KEY = "stage"
"""A cached stage's record (:func:`save_stage`): its cache entry and the data it was made on."""

_DATA_FIELDS = ("content", "fingerprint")
"""The fields of a data record that say which data it is (the others are for messages)."""


def save_stage(state: dict[str, Any], path: str | Path, data: dict[str, Any] | None) -> Path:
    """Writes a cached stage (a dynamics ``model.pt``, a BC/FQE/selection ``result.pt`` or
    ``partial.pt``) with its record and SHA-256, atomically (:func:`read_stage` checks both).

    The record holds the name of the cache entry's folder (the hash of everything the
    stage depends on: the data's fingerprint, the settings, the seed) and ``data``, the
    record of the data it was trained on (:func:`cbop_torchrl.data.data_record`, or at
    least its ``fingerprint``).
    """
    path = Path(path)
    record = {"entry": path.parent.name, "data": dict(data or {})}
    return atomic_torch_save(seal({**state, STAGE_KEY: record}), path)


def stage_problem(state: Any, path: Path, data: dict[str, Any] | None) -> str | None:
    """Why the cached stage ``state`` read from ``path`` may not be used; None when it may.

    It must carry its SHA-256 and record (:func:`save_stage`), its content must match the
    SHA-256, it must be this entry's own file (not one copied from another entry), and it
    must have been trained on ``data`` (the fields of :data:`_DATA_FIELDS` both records
    hold must be equal).
    """
    if not isinstance(state, dict) or not isinstance(state.get(STAGE_KEY), dict):
        return (
            "carries no SHA-256 and no record of its data (an earlier version wrote it, or "
            "it is not a cached stage), so what it was trained on cannot be checked"
        )
    if state.get(INTEGRITY_KEY) != state_digest(state):
        return "is damaged: its content no longer matches the SHA-256 recorded when it was written"
    record = state[STAGE_KEY]
    if record.get("entry") != path.parent.name:
        return (
            f"belongs to another cache entry ({record.get('entry')!r}, not "
            f"{path.parent.name!r}): it was copied or moved here, and was made with other "
            "data or settings"
        )
    stored = record.get("data") if isinstance(record.get("data"), dict) else {}
    given = data or {}
    for key in _DATA_FIELDS:
        if key in stored and key in given and stored[key] != given[key]:
            return (
                f"was trained on other data ({_data_name(stored)}) than this one "
                f"({_data_name(given)})"
            )
    return None


def _data_name(record: dict[str, Any]) -> str:
    name = record.get("name") or record.get("source") or "?"
    key = record.get("content") or record.get("fingerprint") or "?"
    return f"{name!r}, {str(key)[:16]}"


def read_stage(path: str | Path, data: dict[str, Any] | None, what: str) -> dict[str, Any] | None:
    """A cached stage written by :func:`save_stage`, checked; None when there is none or it
    may not be used.

    A file that cannot be read, is damaged, belongs to another entry, was trained on other
    data or carries no record is never used: one warning (a paragraph naming the file and
    the reason) says so, the file is removed and the caller trains the stage again, which
    replaces it. Read with ``torch.load(weights_only=True)``.
    """
    import warnings

    path = Path(path)
    if not path.is_file():
        return None
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
        problem = stage_problem(state, path, data)
    except Exception as error:
        problem = f"cannot be read ({describe_load_error(error, path)})"
    if problem is None:
        return state
    warnings.warn(
        f"the cache file {path} {problem} (a cached {what}); it is not used: it was removed "
        "and the stage is trained again, which replaces it.",
        stacklevel=2,
    )
    path.unlink(missing_ok=True)
    return None


#: What identifies the data a run trains on (:func:`cbop_torchrl.data.data_record`), written
#: into the run directory when the run starts and into every checkpoint.
DATA_RECORD_NAME = "data.json"


def read_data_record(run_dir: Path) -> dict[str, Any] | None:
    """The run directory's :data:`DATA_RECORD_NAME` as a dict; None when missing or unreadable."""
    path = Path(run_dir) / DATA_RECORD_NAME
    if path.is_symlink() or not path.is_file():
        return None
    try:
        record = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and "content" in record else None


def policy_metadata(
    task: Task, obs_dim: int, action_dim: int, hidden_sizes: list[int], dataset: str, step: int
) -> dict[str, Any]:
    """What :func:`load_policy` needs besides the weights (sizes come from the data)."""
    return {
        "family": task.name,
        "task": task.to_dict(),
        "obs_dim": int(obs_dim),
        "action_dim": int(action_dim),
        "hidden_sizes": list(hidden_sizes),
        "dataset": dataset,
        "step": int(step),
    }


def save_policy(path: str | Path, actor: TensorDictModuleBase, metadata: dict[str, Any]) -> Path:
    """Writes the actor alone (``policy.pt``) and its self-contained export beside it.

    ``policy.pt`` holds the weights and what :func:`load_policy` needs to
    rebuild the actor with this package; ``policy.pt2`` (:func:`export_policy`)
    runs with plain PyTorch.
    """
    state = {"format": CHECKPOINT_FORMAT, "policy": metadata, "actor": actor.state_dict()}
    path = atomic_torch_save(seal(state), path)
    export_policy(actor, metadata["obs_dim"], Path(path).with_suffix(EXPORT_SUFFIX))
    return path


EXPORT_SUFFIX = ".pt2"


class DeterministicPolicy(nn.Module):
    """``observation [B, obs_dim] -> action [B, action_dim]``: the actor's evaluation action.

    The action the evaluator takes: the actor called under
    ``ExplorationType.DETERMINISTIC`` (the tanh of the mean for the TanhNormal
    policies, the output of TD3+BC's deterministic actor).
    """

    def __init__(self, actor: TensorDictModuleBase) -> None:
        super().__init__()
        self.actor = actor

    def forward(self, observation: torch.Tensor) -> torch.Tensor:
        batch = TensorDict({"observation": observation}, batch_size=observation.shape[:-1])
        with set_exploration_type(ExplorationType.DETERMINISTIC):
            return self.actor(batch).get("action")


def export_policy(actor: TensorDictModuleBase, obs_dim: int, path: str | Path) -> Path:
    """Writes the deterministic policy as a ``torch.export`` program (``policy.pt2``), atomically.

    It needs neither this package nor TorchRL/TensorDict to run::

        policy = torch.export.load("policy.pt2").module()
        action = policy(observation)  # [B, obs_dim] float32 -> [B, action_dim], any B >= 1

    Exported on the CPU from a copy of the actor, with a dynamic batch size.
    """
    policy = DeterministicPolicy(copy.deepcopy(actor).cpu()).eval()
    example = torch.zeros(2, int(obs_dim))
    batch = torch.export.Dim("batch", min=1)
    with torch.no_grad():
        program = torch.export.export(
            policy, (example,), dynamic_shapes=({0: batch},), strict=False
        )

    def write(tmp: Path) -> None:
        with open(tmp, "wb") as handle:
            torch.export.save(program, handle)

    return atomic_write(path, write)


def load_policy(
    path: str | Path,
    device: torch.device | str = "cpu",
    command_line_gym_id: str | None = None,
) -> tuple[TensorDictModuleBase, Task, dict[str, Any]]:
    """The actor stored in a ``checkpoint.pt`` or ``policy.pt``, its task and metadata.

    The actor is built by its recorded ``actor_kind``
    (:data:`~cbop_torchrl.modules.actor_critic.ACTOR_BUILDERS`): CBOP's and most baselines'
    are TanhNormal policies (``tanh_normal``, none recorded by older files), TD3+BC's
    ``deterministic``, IQL's ``tanh_mean_gaussian``. An actor recorded with
    ``observation_norm`` standardizes its observations
    (:func:`~cbop_torchrl.modules.standardize.standardize_observation`).

    Args:
        path: the checkpoint or policy file.
        device: where the actor goes.
        command_line_gym_id: the ``task.gym_id`` the user gave on the command line (None
            when none). A recorded module-qualified id (``module:Env-v0``, which makes
            gymnasium import ``module``) is refused unless it is this same id
            (:func:`check_recorded_gym_id`).

    Raises:
        CheckpointError: the file is not a readable policy, its recorded task is invalid
            (a module-qualified gym id, equal reference scores), or its weights are not
            all finite.
    """
    state = load_checkpoint(path)
    meta = state.get("policy")
    if not isinstance(meta, dict) or not isinstance(state.get("actor"), dict):
        raise CheckpointError(
            f"{str(path)!r} holds no policy (no 'policy' metadata or 'actor' weights); pass "
            "the checkpoint.pt or policy.pt of a run directory"
        )
    check_real_weights(state["actor"], path)  # before load_state_dict casts them
    try:
        # Policies saved before tasks were recorded name a known family only.
        task = Task(**meta["task"]) if "task" in meta else get_family(meta["family"])
        build = ACTOR_BUILDERS[meta.get("actor_kind", "tanh_normal")]
        actor = build(meta["obs_dim"], meta["action_dim"], tuple(meta["hidden_sizes"]))
        if meta.get("observation_norm"):  # the dataset's statistics come with the weights
            ones = torch.ones(int(meta["obs_dim"]))
            standardize_observation(actor, torch.zeros_like(ones), ones)
        actor.load_state_dict(state["actor"])
    except (KeyError, TypeError, ValueError, RuntimeError) as error:
        raise CheckpointError(
            f"the policy recorded in {str(path)!r} is invalid ({type(error).__name__}: "
            f"{error}); the file was edited or damaged. Pass the checkpoint.pt or policy.pt "
            "of a run directory as this package wrote it"
        ) from None
    check_recorded_gym_id(task.gym_id, command_line_gym_id, f"the checkpoint {str(path)!r}")
    check_finite_weights(state["actor"], path)
    return actor.to(device), task, meta


def check_real_weights(weights: dict[str, Any], path: str | Path) -> None:
    """Raises :class:`CheckpointError` naming the first tensor of ``weights`` that holds
    complex numbers: loading it would cast it (dropping the imaginary part) with only a
    warning."""
    for name, value in weights.items():
        if isinstance(value, torch.Tensor) and value.is_complex():
            raise CheckpointError(
                f"the policy in {str(path)!r} holds {name!r} as {value.dtype}, not real "
                "floating-point weights; the file was edited or is not a policy of this "
                "package. Use the policy.pt or checkpoint.pt of a run directory as it was written"
            )


def check_recorded_gym_id(
    gym_id: str, command_line_gym_id: str | None, source: str, remedy: str | None = None
) -> None:
    """Refuses a module-qualified gymnasium id (``module:Env-v0``) read from a file.

    Gymnasium imports ``module`` to make such an environment, so an id taken from a
    checkpoint, a stored config or a dataset would let that file run code. It is accepted
    only when the user gave the same id on the command line (``task.gym_id=<id>``).

    ``remedy``: what to do instead, for a program without a ``task.gym_id`` setting.

    Raises:
        CheckpointError: ``gym_id`` names a module and is not ``command_line_gym_id``.
    """
    if ":" not in str(gym_id) or gym_id == command_line_gym_id:
        return
    remedy = remedy or (
        f"if you trust that module, pass the same id on the command line (task.gym_id="
        f"{gym_id}); otherwise pass the id of an installed environment (e.g. "
        "task.gym_id=Hopper-v4)"
    )
    raise CheckpointError(
        f"{source} records the gymnasium id {gym_id!r}, which names a Python module "
        f"({str(gym_id).partition(':')[0]!r}) that gymnasium would import, running its code. "
        f"An id read from a file is not trusted to do that: {remedy}"
    )


def check_finite_weights(weights: dict[str, Any], path: str | Path) -> None:
    """Raises :class:`CheckpointError` naming the first tensor of ``weights`` with NaN/inf."""
    for name, value in weights.items():
        if isinstance(value, torch.Tensor) and value.is_floating_point():
            if not bool(torch.isfinite(value).all()):
                raise CheckpointError(
                    f"the policy in {str(path)!r} has non-finite weights (NaN or inf in "
                    f"{name!r}); it cannot act. The file was edited or the run diverged: "
                    "use a policy.pt or checkpoint.pt with finite weights (an earlier "
                    "checkpoint, or train again)"
                )


class CheckpointHook(TrainerHookBase):
    """Saves the run every ``interval`` gradient steps and after the last one (``post_steps``).

    The hook decides when; what is saved is the run's one state dict
    (:func:`~cbop_torchrl.trainers.run_state.run_state`), which ``state`` returns for a
    step (bound by :func:`~cbop_torchrl.trainers.offline_training.build_offline_training`
    once the training exists). The hook holds no state of its own.

    Args:
        path: the checkpoint file (written atomically: a reader sees the old
            or the new file, never a partial one, even after SIGKILL).
        interval: gradient steps between saves.
        total_steps: the last step, always saved.
        payload: returns the algorithm's part of the checkpoint (``policy``, ``actor``,
            ...) for a given step.
    """

    def __init__(self, path: Path, interval: int, total_steps: int, payload: Any) -> None:
        self.path = Path(path)
        self.interval = int(interval)
        self.total_steps = int(total_steps)
        self.payload = payload
        self.state: Callable[[int], dict[str, Any]] | None = None
        self.trainer: Trainer | None = None
        self.last_saved_step: int | None = None

    def __call__(self) -> None:
        step = self.trainer.collected_frames  # one frame per gradient step
        if step % self.interval == 0 or step >= self.total_steps:
            self.save(step)

    def save(self, step: int) -> Path:
        atomic_torch_save(seal(self.state(int(step))), self.path)
        self.last_saved_step = int(step)
        return self.path

    def describe_last(self) -> str:
        if self.last_saved_step is None:
            return "none yet (the run has written no checkpoint)"
        return f"{self.path} (gradient step {self.last_saved_step})"

    def register(self, trainer: Trainer, name: str = "checkpoint") -> None:
        self.trainer = trainer
        trainer.register_op("post_steps", self)


#: The training settings that only say how long a run trains (``train.epochs *
#: train.steps_per_epoch`` gradient steps). The steps up to any step s do not depend on
#: them, so a run resumed with a larger budget continues from s; they are left out of
#: the hash and of the comparison.
BUDGET_KEYS: tuple[tuple[str, str], ...] = (("train", "epochs"), ("train", "steps_per_epoch"))


def without_budget(training_config: dict[str, Any]) -> dict[str, Any]:
    """``training_config`` without :data:`BUDGET_KEYS` (a copy; the input is unchanged)."""
    values = copy.deepcopy(dict(training_config))
    for section, key in BUDGET_KEYS:
        if isinstance(values.get(section), dict):
            values[section].pop(key, None)
    return values


def training_config_hash(training_config: dict[str, Any]) -> str:
    """Hash stored in checkpoints to refuse resuming with other training settings.

    The budget (:data:`BUDGET_KEYS`) is not in it. Checkpoints written before
    that hashed the whole dict; :func:`check_resumable` compares their stored
    ``training_config`` instead.
    """
    return config_hash(without_budget(training_config), length=16)


def check_resumable(state: dict[str, Any], training_config: dict[str, Any], path: Path) -> None:
    """Raises :class:`CheckpointError` unless ``training_config`` may continue ``state``.

    Every training setting must match except the budget, and the budget's last
    step (``train.epochs * train.steps_per_epoch``) must not be before the
    checkpoint's step: a run is continued to a larger budget, never shortened.
    """
    wanted = training_config_hash(training_config)
    stored = state.get("training_config")
    same = state.get("training_config_hash") == wanted or (
        # written before the budget left the hash: compare the stored settings themselves
        isinstance(stored, dict) and training_config_hash(stored) == wanted
    )
    if not same:
        stored = without_budget(stored) if isinstance(stored, dict) else {}
        differences = sorted(_diff(stored, without_budget(training_config)))
        shown = ", ".join(differences[:8]) + (" ..." if len(differences) > 8 else "")
        raise CheckpointError(
            f"the run directory's checkpoint {str(path)!r} was written with other training "
            f"settings (differing: {shown or 'unknown'}). Resume with the original settings, "
            "choose another run directory (hydra.run.dir=...), or pass resume=false to start "
            "over in this one."
        )
    check_budget(int(state["step"]), training_config, path)


def check_budget(step: int, training_config: dict[str, Any], path: Path) -> None:
    """Raises :class:`CheckpointError` when the budget ends before the checkpoint's ``step``."""
    train = training_config["train"]
    epochs, steps_per_epoch = int(train["epochs"]), int(train["steps_per_epoch"])
    if epochs * steps_per_epoch >= step:
        return
    needed = -(-step // steps_per_epoch)  # the fewest epochs that reach the checkpoint's step
    raise CheckpointError(
        f"the run directory's checkpoint {str(path)!r} is at gradient step {step}, past "
        f"this command's last step {epochs * steps_per_epoch} (train.epochs={epochs} x "
        f"train.steps_per_epoch={steps_per_epoch}); a run can be continued to a larger "
        f"budget, not shortened. Run the same command with train.epochs={needed} (or more) "
        f"to resume it at step {step}, or with resume=false to start over in this "
        "directory (its checkpoint, results and logs are removed)."
    )


def _diff(old: Any, new: Any, prefix: str = "") -> list[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        keys = set(old) | set(new)
        return [d for k in keys for d in _diff(old.get(k), new.get(k), f"{prefix}{k}.")]
    if old != new and not (isinstance(old, (list, tuple)) and list(old) == list(new or [])):
        return [prefix.rstrip(".")]
    return []
