"""A run's checkpoint: one explicit dict, built by :func:`run_state`, restored by
:func:`load_run_state`.

The dict's keys name what they hold (:data:`RUN_STATE_KEYS`); the run's part of it (its
step, settings, policy, data record, decisions) comes from
:meth:`~cbop_torchrl.trainers.offline_run.OfflineRun.checkpoint_record`, and the training's
part from the objects listed in a :class:`RunParts`. TorchRL's ``Trainer`` runs the loop and
its hooks carry logging, evaluation and checkpoint timing; none of them holds state a
checkpoint restores through ``Trainer.state_dict()``: the state is read from, and written
back to, the objects themselves here.

A checkpoint written before this layout (the whole ``Trainer.state_dict()`` under
``trainer``) is translated on load (:func:`upgrade_run_state`), so such a run resumes.
"""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass
from typing import Any

import torch
from torchrl.trainers import Trainer

from cbop_torchrl.runtime import program_command, running_program
from cbop_torchrl.trainers.checkpoint import CheckpointError
from cbop_torchrl.trainers.hooks import ActorWeightAverage, EvaluationHook
from cbop_torchrl.trainers.logging import MetricsHook
from cbop_torchrl.trainers.portable import PortableRNGState, load_generator_state

#: The ``layout`` of a checkpoint written by :func:`run_state`.
RUN_STATE_LAYOUT = 2

#: The keys of a run's checkpoint and what each holds.
RUN_STATE_KEYS: dict[str, str] = {
    "format": "the file family (cbop_torchrl.trainers.checkpoint.CHECKPOINT_FORMAT)",
    "layout": "this dict's layout (RUN_STATE_LAYOUT)",
    "step": "the gradient steps done",
    "total_steps": "the run's last step when it was written",
    "training_config": "the settings that change what is trained",
    "training_config_hash": "their hash without the budget",
    "decisions": "the run's device, dtype, capture and seeds (RunDecisions.record)",
    "policy": "what load_policy needs to rebuild the actor",
    "actor": "the actor's weights",
    "wall_time_s": "seconds spent on the run over all its sessions",
    "loss_module": "the loss module's weights (actor, critics, targets, alpha, ...)",
    "optimizer": "the optimizer's state",
    "sampler_generator": "the replay buffer's sampling generator's state",
    "trainer_loop": "the Trainer's loop counters",
    "metrics_windows": "the first and last logged windows of training metrics",
    "evaluation_history": "the evaluation records so far",
    "actor_average": "the evaluated weight average's weights (only with eval.actor_average)",
    "diagnostics_history": "the learning diagnostics' records so far (only with them on)",
    "rng": "the process's random states (torch CPU/CUDA, NumPy, Python)",
    "integrity": "the SHA-256 of everything else",
}
"""Besides these, ``data`` (the record of the data, when the run directory has one) and,
for CBOP, ``rollout_choice``."""


@dataclass
class RunParts:
    """The objects of a training whose state a checkpoint holds.

    ``average`` and ``diagnostics`` are None when the run keeps none
    (``eval.actor_average=0``, ``eval.diagnostics=false``).
    """

    trainer: Trainer
    loss: torch.nn.Module
    optimizer: torch.optim.Optimizer
    generator: torch.Generator
    metrics: MetricsHook
    evaluation: EvaluationHook
    average: ActorWeightAverage | None = None
    diagnostics: Any | None = None  # a LearningDiagnostics


def run_state(parts: RunParts, record: dict[str, Any]) -> dict[str, Any]:
    """The checkpoint dict: the run's ``record`` and the training's state.

    The measurements still running in the background are waited for first, so the
    histories are complete up to the step; the random states are read last.

    Args:
        parts: the training's objects.
        record: the run's part (:meth:`OfflineRun.checkpoint_record`: format, step,
            settings, policy, actor, data record, decisions, ...).
    """
    parts.evaluation.drain()
    if parts.diagnostics is not None:
        parts.diagnostics.drain()
    trainer, metrics = parts.trainer, parts.metrics
    state = {
        **record,
        "layout": RUN_STATE_LAYOUT,
        "loss_module": parts.loss.state_dict(),
        "optimizer": parts.optimizer.state_dict(),
        "sampler_generator": parts.generator.get_state(),
        # The Trainer's own counters (TorchRL keeps them private; Trainer.load_state_dict
        # sets them the same way).
        "trainer_loop": {
            "collected_frames": trainer.collected_frames,
            "optim_steps": trainer._optim_count,
            "last_log": dict(trainer._last_log),
            "last_save": trainer._last_save,
        },
        "metrics_windows": {
            "first_window": dict(metrics.first_window),
            "last_window": dict(metrics.last_window),
        },
        "evaluation_history": [dict(r) for r in parts.evaluation.history],
    }
    if parts.average is not None:
        state["actor_average"] = parts.average.state_dict()
    if parts.diagnostics is not None:
        state["diagnostics_history"] = [dict(r) for r in parts.diagnostics.history]
    state["rng"] = PortableRNGState().state_dict()  # last: nothing above draws from it
    return state


def load_run_state(parts: RunParts, state: dict[str, Any]) -> int:
    """Puts a checkpoint's training state back into ``parts``; returns its step.

    ``state`` is in this layout (:func:`upgrade_run_state` translates an older one). A
    run with an actor average resumed from a checkpoint without one starts the average
    at the checkpoint's weights.
    """
    parts.loss.load_state_dict(state["loss_module"])
    parts.optimizer.load_state_dict(state["optimizer"])
    load_generator_state(parts.generator, state["sampler_generator"])  # resumes across devices
    windows = state.get("metrics_windows") or {}
    parts.metrics.first_window = dict(windows.get("first_window", {}))
    parts.metrics.last_window = dict(windows.get("last_window", {}))
    parts.evaluation.history = [dict(r) for r in state.get("evaluation_history") or []]
    if parts.diagnostics is not None:
        parts.diagnostics.history = [dict(r) for r in state.get("diagnostics_history") or []]
    if parts.average is not None:
        if state.get("actor_average") is None:
            parts.average.restart()  # at the checkpoint's weights, just loaded
        else:
            parts.average.averaged.load_state_dict(state["actor_average"])
    PortableRNGState().load_state_dict(state["rng"])
    loop = state["trainer_loop"]
    trainer = parts.trainer
    trainer.collected_frames = loop["collected_frames"]
    trainer._optim_count = loop["optim_steps"]
    trainer._last_log = dict(loop["last_log"])
    trainer._last_save = loop["last_save"]
    return int(state["step"])


#: Old ``Trainer.state_dict()`` entries -> this layout's keys.
_TRAINER_ENTRIES = {
    "loss_module": "loss_module",
    "optimizer": "optimizer",
    "actor_average": "actor_average",
    "rng": "rng",
}


def upgrade_run_state(state: dict[str, Any], path: Any = "checkpoint.pt") -> dict[str, Any]:
    """``state`` in this layout: a checkpoint of the earlier layout, whose training state is
    TorchRL's ``Trainer.state_dict()`` under ``trainer``, translated; others as they are.

    Raises:
        CheckpointError: an earlier checkpoint that lacks an entry a resume needs.
    """
    if state.get("layout") is not None or "trainer" not in state:
        return state
    old = dict(state)
    trainer = old.pop("trainer")
    try:
        entries = {new: trainer[key] for key, new in _TRAINER_ENTRIES.items() if key in trainer}
        upgraded = {**old, **entries}
        upgraded["layout"] = RUN_STATE_LAYOUT
        upgraded["sampler_generator"] = trainer["replay_sampler"]["generator"]
        loop = trainer["state"]
        upgraded["trainer_loop"] = {
            "collected_frames": loop["collected_frames"],
            "optim_steps": loop["_optim_count"],
            "last_log": dict(loop["_last_log"]),
            "last_save": loop["_last_save"],
        }
        upgraded["metrics_windows"] = dict(trainer.get("metrics") or {})
        upgraded["evaluation_history"] = list((trainer.get("evaluation") or {}).get("history", []))
        if "diagnostics" in trainer:
            upgraded["diagnostics_history"] = list(trainer["diagnostics"].get("history", []))
        for needed in ("loss_module", "optimizer", "rng"):
            if needed not in upgraded:
                raise KeyError(needed)
    except (KeyError, TypeError, AttributeError) as error:
        raise CheckpointError(
            f"{str(path)!r} is a checkpoint of an earlier layout without its {error} entry, so "
            "the run cannot be resumed from it. Start it over in this directory (its "
            f"checkpoint, results and logs are removed) with {restart_command()}, or pass "
            "another run directory (hydra.run.dir=...) to keep this one as it is."
        ) from None
    return upgraded


def restart_command() -> str:
    """The running program's command line with ``resume=false`` (any ``resume=`` replaced),
    as :func:`~cbop_torchrl.runtime.program_command` spells the program; from Python (no
    program), ``resume=false``."""
    program = running_program()
    if program is None:
        return "resume=false"
    kept = [word for word in sys.argv[1:] if not word.startswith("resume=")]
    return f"{program_command(program)} {shlex.join([*kept, 'resume=false'])}"  # already quoted


def loss_weights(state: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The loss module's weights of a checkpoint of either layout."""
    return upgrade_run_state(state)["loss_module"]


__all__ = [
    "RUN_STATE_KEYS",
    "RUN_STATE_LAYOUT",
    "RunParts",
    "load_run_state",
    "loss_weights",
    "run_state",
    "upgrade_run_state",
]
