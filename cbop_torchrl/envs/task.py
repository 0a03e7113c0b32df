"""The ``task`` config group and its resolution: which environment a dataset belongs to.

A dataset of a known family (D4RL's MuJoCo locomotion tasks, recognised from
the dataset's name or metadata) needs no settings. For any other gymnasium
task, the command line says what the data cannot:

    cbop-train env=/data/swimmer.hdf5 task.gym_id=Swimmer-v4 task.termination=none \
        estimator.psi=1.0

``task.ref_min_score``/``task.ref_max_score`` turn returns into normalized
scores; without them results report the raw return only.
"""

from __future__ import annotations

import re
import shlex
import sys
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from cbop_torchrl.data.errors import DatasetError
from cbop_torchrl.data.info import DatasetInfo
from cbop_torchrl.registry import (
    NO_TERMINATION,
    Task,
    families,
    families_in_name,
    families_of_sizes,
    family_of_gym_id,
    get_family,
    layout_for,
    termination_names,
)
from cbop_torchrl.runtime import program_command, running_program


class TaskError(DatasetError):
    """The task cannot be resolved, or the data does not fit its environment.

    A :class:`~cbop_torchrl.data.DatasetError`, so every entry script reports it
    in one paragraph and exits with code 2.
    """


@dataclass
class TaskConfig:
    """The ``task`` config group; a null means "from the dataset's known family".

    Attributes:
        gym_id: gymnasium id to evaluate on (``Swimmer-v4``).
        gym_kwargs: keyword arguments of ``gymnasium.make``, merged over the family's.
        ref_min_score, ref_max_score: returns normalized to 0 and 100 (both or neither).
        termination: a registered termination function name, or ``none``.
    """

    gym_id: str | None = None
    gym_kwargs: dict[str, Any] = field(default_factory=dict)
    ref_min_score: float | None = None
    ref_max_score: float | None = None
    termination: str | None = None

    @classmethod
    def from_dict(cls, values: Mapping[str, Any] | None) -> TaskConfig:
        values = dict(values or {})
        values["gym_kwargs"] = dict(values.get("gym_kwargs") or {})
        return cls(**values)


TASK_KEYS = ("task.gym_id", "task.termination")


def unknown_task_message(info: DatasetInfo) -> str:
    """Why the task of ``info``'s data is unknown, and the ``task.gym_id`` (with
    ``task.termination`` where the id is no known family's) that names it: for each known
    family of the data's sizes a command that runs as written, else an example."""
    named = families_in_name(info.name)
    if named:
        said = f"its name names more than one known family ({', '.join(named)})"
    else:
        said = f"its name names no known family ({', '.join(sorted(families()))})"
    fitting = families_of_sizes(info.obs_dim, info.action_dim)
    if fitting:
        fixes = " or ".join(
            f"for {task.name} data `{example_command(info, task.gym_id, None)}`" for task in fitting
        )
        how = (
            f"Name the task on the command line: its sizes ({info.obs_dim} observations, "
            f"{info.action_dim} actions) are those of {' and '.join(t.name for t in fitting)}, "
            f"so {fixes}"
        )
    else:
        how = (
            "Name the task on the command line with task.gym_id=<its gymnasium id> and "
            "task.termination=none (or a registered termination), e.g. for Swimmer-v4 data "
            f"`{example_command(info, 'Swimmer-v4')}`"
        )
    return (
        f"cannot tell which environment the dataset {info.name!r} was recorded on: {said} "
        f"and it records no gymnasium id (metadata/env_id). {how}."
    )


def example_command(info: DatasetInfo, gym_id: str, termination: str | None = "none") -> str:
    """A complete command that runs on ``info``'s data once its task is named.

    Run from one of the package's programs, it is the user's own command line with
    ``task.gym_id`` and ``task.termination`` (unless None) set (and psi for
    ``cbop-train``, whose paper table knows D4RL data only); from Python, a ``cbop-train``
    command. Either is written for the user's shell (:func:`cbop_torchrl.runtime.program_command`).
    """
    from cbop_torchrl.runtime import override_word  # quoted so that Hydra reads the value back

    program = running_program()
    words = [w for w in sys.argv[1:] if w.partition("=")[0].lstrip("+~") not in TASK_KEYS]
    if program is None:
        program, words = "cbop-train", [override_word("env", str(info.source))]
    words.append(override_word("task.gym_id", gym_id))
    if termination is not None:  # a known family's id brings its own
        words.append(override_word("task.termination", termination))
    if program == "cbop-train" and not any(w.startswith("estimator.psi=") for w in words):
        words.append("estimator.psi=1.0")
    return f"{program_command(program)} {shlex.join(words)}"


def resolve_task(config: TaskConfig | Mapping[str, Any] | None, info: DatasetInfo) -> Task:
    """The :class:`Task` of a dataset: the command line's ``task.*`` over the known family's.

    The gymnasium id comes from ``task.gym_id``, else the dataset's known family,
    else the gymnasium id recorded in the data's metadata. A known family (found
    by that gym id or the dataset's name) supplies the gym kwargs, score constants
    and termination function that the command line leaves out. Where the family's id
    has more than one observation layout (Ant-v4: 27 or 111 wide), the data's width
    picks the gym kwargs (:func:`cbop_torchrl.registry.layout_for`); an explicit
    ``+task.gym_kwargs.<name>=<value>`` still wins.

    Raises:
        TaskError: no gymnasium id, no termination function for an unknown task,
            an unknown termination name, or only one of the two reference scores.
    """
    if not isinstance(config, TaskConfig):
        config = TaskConfig.from_dict(config)
    gym_id = config.gym_id
    if gym_id is None and info.family is None:
        gym_id = info.env_id
        if gym_id is not None and ":" in gym_id:
            raise TaskError(
                f"the dataset {info.name!r} records the gymnasium id {gym_id!r}, which names "
                f"a Python module ({gym_id.partition(':')[0]!r}) that gymnasium would import, "
                "running its code; an id read from a file is not trusted to do that. If you "
                f"trust that module, pass the id on the command line (task.gym_id={gym_id}); "
                "otherwise the id of an installed environment (e.g. task.gym_id=Hopper-v4)."
            )
    if gym_id is not None:
        base = family_of_gym_id(gym_id)
    else:
        base = get_family(info.family) if info.family is not None else None
    if gym_id is None and base is None:
        raise TaskError(unknown_task_message(info))
    gym_id = gym_id or base.gym_id

    termination = config.termination or (base.termination if base is not None else None)
    if termination is None:
        raise TaskError(
            f"task.gym_id={gym_id} is not a known task, so no termination function is known "
            "for its model rollouts. Pass task.termination=none (rollouts never terminate) "
            f"or one of the registered functions ({', '.join(termination_names())}), e.g. "
            f"`{example_command(info, gym_id)}`."
        )
    if termination not in termination_names():
        raise TaskError(
            f"task.termination={termination!r} is not a registered termination function; "
            f"use one of {', '.join(termination_names())} (none: rollouts never terminate) "
            "or register one with cbop_torchrl.registry.register_termination(name, fn)."
        )

    refs = (config.ref_min_score, config.ref_max_score)
    if (refs[0] is None) != (refs[1] is None):
        raise TaskError(
            f"task.ref_min_score={refs[0]} and task.ref_max_score={refs[1]}: give both (the "
            "returns that normalize to 0 and 100) or neither (results then report the raw "
            "return only)."
        )
    if refs[0] is None and base is not None:
        refs = (base.ref_min_score, base.ref_max_score)
    if refs[0] is not None and not float(refs[1]) != float(refs[0]):
        raise TaskError(
            f"task.ref_min_score and task.ref_max_score are both {refs[0]}; they must differ."
        )

    if termination == NO_TERMINATION:
        warnings.warn(
            f"task.termination=none: model rollouts on {gym_id} never terminate, so the "
            "dynamics model may imagine states past the end of an episode.",
            stacklevel=2,
        )
    family_kwargs = dict(base.gym_kwargs) if base is not None else {}
    if base is not None and (layout := layout_for(base.name, info.obs_dim)) is not None:
        family_kwargs = layout  # the layout of the data's width; task.gym_kwargs still win
    return Task(
        name=base.name if base is not None else gym_id,
        gym_id=gym_id,
        gym_kwargs={**family_kwargs, **config.gym_kwargs},
        ref_min_score=None if refs[0] is None else float(refs[0]),
        ref_max_score=None if refs[1] is None else float(refs[1]),
        termination=termination,
    )


def override_task(task: Task, config: TaskConfig | Mapping[str, Any] | None) -> Task:
    """``task`` (e.g. the one a policy was trained on) with the ``task.*`` values that are set.

    Used where the task is already known, as in ``cbop-evaluate``: a given
    ``task.gym_id`` evaluates elsewhere, given ``task.ref_*`` scores normalize.
    """
    if not isinstance(config, TaskConfig):
        config = TaskConfig.from_dict(config)
    ours, theirs = _family_of(task.gym_id), _family_of(config.gym_id or task.gym_id)
    if ours is not None and theirs is not None and ours != theirs:
        raise TaskError(
            f"task.gym_id={config.gym_id} is the {theirs} environment, but this is a {ours} "
            f"task ({task.gym_id}): its observations and actions mean other things there, even "
            f"where the sizes agree. Leave task.gym_id out (or give another {ours} version)."
        )
    refs = (config.ref_min_score, config.ref_max_score)
    if (refs[0] is None) != (refs[1] is None):
        raise TaskError(
            f"task.ref_min_score={refs[0]} and task.ref_max_score={refs[1]}: give both or neither."
        )
    if refs[0] is None:
        refs = (task.ref_min_score, task.ref_max_score)
    termination = config.termination or task.termination
    if termination not in termination_names():
        raise TaskError(
            f"task.termination={termination!r} is not a registered termination function; "
            f"use one of {', '.join(termination_names())}."
        )
    try:
        return Task(
            name=task.name if config.gym_id in (None, task.gym_id) else config.gym_id,
            gym_id=config.gym_id or task.gym_id,
            gym_kwargs={**task.gym_kwargs, **config.gym_kwargs},
            ref_min_score=refs[0],
            ref_max_score=refs[1],
            termination=termination,
        )
    except ValueError as error:
        raise TaskError(str(error)) from None


def _family_of(gym_id: str) -> str | None:
    """The known family whose environment ``gym_id`` is, in any version (``HalfCheetah-v5``)."""
    exact = family_of_gym_id(gym_id)
    if exact is not None:
        return exact.name
    base = re.sub(r"-v\d+$", "", gym_id.split("/")[-1]).lower()
    return base if base in families() else None


def collection_task(name: str, config: TaskConfig | Mapping[str, Any] | None) -> Task:
    """The task ``cbop-collect env=<name>`` generates data on.

    A known family (``hopper``) with any ``task.*`` values replaced; any other
    ``name`` needs ``task.gym_id`` (the files are then called ``<name>-<kind>-gen.hdf5``).
    """
    if not isinstance(config, TaskConfig):
        config = TaskConfig.from_dict(config)
    if name in families():
        return override_task(get_family(name), config)
    if config.gym_id is None:
        raise TaskError(
            f"env={name} is not a known family ({', '.join(sorted(families()))}); to generate "
            f"data on another gymnasium task, name it: `{program_command('cbop-collect')} "
            f"env={name} task.gym_id=Swimmer-v4 kind=random`."
        )
    try:
        return Task(
            name=name,
            gym_id=config.gym_id,
            gym_kwargs=config.gym_kwargs,
            ref_min_score=config.ref_min_score,
            ref_max_score=config.ref_max_score,
            termination=config.termination or NO_TERMINATION,
        )
    except ValueError as error:
        raise TaskError(str(error)) from None
