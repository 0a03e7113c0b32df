"""What cannot come from the data: known tasks' gymnasium ids, D4RL's score constants, terminations.

Everything else about an environment is read where it lives: observation and
action sizes from the dataset's tensors, action bounds from the gymnasium
environment's TorchRL specs (:mod:`cbop_torchrl.envs.gym`). A dataset of a
task listed here (D4RL's MuJoCo locomotion families) needs no settings; any
other gymnasium task is described on the command line with ``task.gym_id``,
``task.termination`` and optionally ``task.ref_min_score``/``task.ref_max_score``
(:func:`cbop_torchrl.envs.task.resolve_task`).

The termination functions are the healthy-state rules of the gymnasium
environments (MBPO/MOPO-style "static" functions), applied to predicted next
observations in model rollouts.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

TerminationFn = Callable[[torch.Tensor], torch.Tensor]
"""Maps predicted next observations ``[..., obs_dim]`` to a bool ``[...]`` tensor."""

D4RL_KINDS = ("random", "medium", "medium-replay", "medium-expert", "expert", "full-replay")

NO_TERMINATION = "none"
"""``task.termination=none``: model rollouts never terminate (a warning says so)."""


def hopper_termination(next_obs: torch.Tensor) -> torch.Tensor:
    """Hopper falls when its height, torso angle or any state leaves the healthy range.

    Args:
        next_obs: ``[..., 11]`` observations (height, angle, 3 joint angles, 6 velocities).

    Returns:
        ``[...]`` bool, True where the episode terminates.
    """
    height, angle = next_obs[..., 0], next_obs[..., 1]
    alive = (
        torch.isfinite(next_obs).all(-1)
        & (next_obs[..., 1:].abs() < 100).all(-1)
        & (height > 0.7)
        & (angle.abs() < 0.2)
    )
    return ~alive


def walker2d_termination(next_obs: torch.Tensor) -> torch.Tensor:
    """Walker2d falls when its height leaves (0.8, 2.0) or its angle leaves (-1, 1).

    Args:
        next_obs: ``[..., 17]`` observations (height, angle, joint angles, velocities).

    Returns:
        ``[...]`` bool, True where the episode terminates.
    """
    height, angle = next_obs[..., 0], next_obs[..., 1]
    alive = (height > 0.8) & (height < 2.0) & (angle > -1.0) & (angle < 1.0)
    return ~alive


def ant_termination(next_obs: torch.Tensor) -> torch.Tensor:
    """Ant is unhealthy when its torso height leaves [0.2, 1.0] or a state is not finite.

    Args:
        next_obs: ``[..., 27]`` or ``[..., 111]`` observations (torso height first;
            D4RL's layout appends 84 contact forces).

    Returns:
        ``[...]`` bool, True where the episode terminates.
    """
    height = next_obs[..., 0]
    alive = torch.isfinite(next_obs).all(-1) & (height >= 0.2) & (height <= 1.0)
    return ~alive


def never_terminates(next_obs: torch.Tensor) -> torch.Tensor:
    """For tasks such as halfcheetah whose episodes only end by timeout."""
    return torch.zeros(next_obs.shape[:-1], dtype=torch.bool, device=next_obs.device)


_TERMINATIONS: dict[str, TerminationFn] = {NO_TERMINATION: never_terminates}


def register_termination(name: str, fn: TerminationFn) -> TerminationFn:
    """Makes ``fn`` usable as ``task.termination=<name>``; registering a name twice is an error."""
    if name in _TERMINATIONS:
        raise ValueError(f"termination function {name!r} is already registered")
    _TERMINATIONS[name] = fn
    return fn


def termination_names() -> list[str]:
    """The names ``task.termination`` accepts (``none`` included)."""
    return sorted(_TERMINATIONS)


def get_termination(name: str) -> TerminationFn:
    """The termination function registered as ``name``, with a helpful error otherwise."""
    try:
        return _TERMINATIONS[name]
    except KeyError:
        raise KeyError(
            f"unknown termination function {name!r}; registered: {termination_names()} "
            "(`none`: model rollouts never terminate). Register another with "
            "cbop_torchrl.registry.register_termination(name, fn)."
        ) from None


@dataclass(frozen=True)
class Task:
    """The environment a dataset was recorded on, as far as training and evaluation need it.

    Attributes:
        name: the family name of a known task (``hopper``), else the gymnasium id.
        gym_id: gymnasium id evaluation runs on (``Hopper-v4``).
        gym_kwargs: keyword arguments of ``gymnasium.make`` (``use_contact_forces``).
        ref_min_score, ref_max_score: returns that normalize to 0 and 100 (D4RL's
            random and expert scores), or None: then no normalized score exists.
        termination: name of a registered termination function, or ``none``.
    """

    name: str
    gym_id: str
    gym_kwargs: Mapping[str, Any] = field(default_factory=dict)
    ref_min_score: float | None = None
    ref_max_score: float | None = None
    termination: str = NO_TERMINATION

    def __post_init__(self) -> None:
        refs = (self.ref_min_score, self.ref_max_score)
        if (refs[0] is None) != (refs[1] is None):
            raise ValueError(
                f"task {self.name!r} needs both ref_min_score and ref_max_score or neither; "
                f"got {refs[0]!r} and {refs[1]!r}"
            )
        if refs[0] is not None and not (math.isfinite(refs[1] - refs[0]) and refs[1] != refs[0]):
            raise ValueError(
                f"task {self.name!r}: ref_min_score={refs[0]!r} and ref_max_score={refs[1]!r} "
                "must be finite and differ"
            )
        object.__setattr__(self, "gym_kwargs", dict(self.gym_kwargs))

    @property
    def has_reference_scores(self) -> bool:
        return self.ref_min_score is not None

    def normalized_score(self, episode_return: float) -> float | None:
        """D4RL's normalized score (0 random, 100 expert); None without reference scores."""
        if not self.has_reference_scores:
            return None
        span = self.ref_max_score - self.ref_min_score
        return 100.0 * (episode_return - self.ref_min_score) / span

    @property
    def termination_fn(self) -> TerminationFn:
        return get_termination(self.termination)

    def to_dict(self) -> dict[str, Any]:
        """Plain values for checkpoints and ``results.json`` (inverse: ``Task(**d)``)."""
        return {
            "name": self.name,
            "gym_id": self.gym_id,
            "gym_kwargs": dict(self.gym_kwargs),
            "ref_min_score": self.ref_min_score,
            "ref_max_score": self.ref_max_score,
            "termination": self.termination,
        }


_FAMILIES: dict[str, Task] = {}


def register_family(task: Task) -> Task:
    """Adds a known task, found by its ``name`` in dataset names (``ant-medium-v2``)."""
    if task.name in _FAMILIES:
        raise ValueError(f"task family {task.name!r} is already registered")
    get_termination(task.termination)
    _FAMILIES[task.name] = task
    return task


def families() -> dict[str, Task]:
    """All known task families by name."""
    return dict(_FAMILIES)


def get_family(name: str) -> Task:
    """The known task called ``name`` (``"hopper"``), with a helpful error otherwise."""
    try:
        return _FAMILIES[name]
    except KeyError:
        raise KeyError(
            f"unknown task family {name!r}; known families are {sorted(_FAMILIES)}. For "
            "another gymnasium task pass task.gym_id=<id> and task.termination=<name or none> "
            "on the command line (see the README's dataset section)."
        ) from None


def family_of_gym_id(gym_id: str) -> Task | None:
    """The known family evaluated on exactly ``gym_id`` (``Hopper-v4``), or None."""
    for task in _FAMILIES.values():
        if task.gym_id == gym_id:
            return task
    return None


_LAYOUTS: dict[str, dict[int, dict[str, Any]]] = {}


def register_layouts(family: str, layouts: Mapping[int, Mapping[str, Any]]) -> None:
    """Declares the observation layouts one family's gymnasium id can produce.

    ``layouts``: observation width -> the ``gymnasium.make`` keyword arguments that give
    it (Ant-v4: 27 by default, 111 with ``use_contact_forces=True``). A dataset of one of
    these widths is evaluated with that layout (:func:`layout_for`).
    """
    get_family(family)
    _LAYOUTS[family] = {int(width): dict(kwargs) for width, kwargs in layouts.items()}


def layout_for(family: str, obs_dim: int) -> dict[str, Any] | None:
    """The ``gymnasium.make`` keyword arguments of ``family`` for observations ``obs_dim``
    wide; None when the family declares no layouts or none of that width."""
    chosen = _LAYOUTS.get(family, {}).get(int(obs_dim))
    return None if chosen is None else dict(chosen)


def d4rl_ids() -> list[str]:
    """The D4RL MuJoCo v2 dataset ids of every known family."""
    return [f"{name}-{kind}-v2" for name in _FAMILIES for kind in D4RL_KINDS]


_WORD = re.compile(r"[^\W_]+")  # a run of letters and digits, in any script


def name_words(name: str) -> list[str]:
    """The words of a (file) name: its runs of letters and digits, in any script, each then
    case-folded and in Unicode's compatibility form (NFKC: full-width letters are letters).
    Every other character (spaces, dots, dashes of any kind, underscores, symbols such as
    a trade mark sign) separates words."""
    return [
        word
        for raw in _WORD.findall(name)
        for word in _WORD.findall(unicodedata.normalize("NFKC", raw).casefold())
    ]


def _named(words: list[str], term: str) -> int | None:
    """Where the term (a family or kind, its words joined: ``medium-replay`` is
    ``mediumreplay``) begins in ``words``, spelled as one word or as 2-3 consecutive ones
    (``walker2d``, ``walker 2d``; ``medium replay``, ``MediumReplay``), or None."""
    compact = "".join(name_words(term))
    for start in range(len(words)):
        for stop in range(start + 1, min(start + 3, len(words)) + 1):
            if "".join(words[start:stop]) == compact:
                return start
    return None


def families_in_name(name: str) -> list[str]:
    """The known families a (file) name names, in the order they appear (by
    :func:`name_words`: ``Hopper Medium.hdf5``, ``hopper.medium.hdf5``,
    ``hopper–medium`` with any dash, ``my-hopper-data``); empty when it names none."""
    words = name_words(name)
    where = {family: _named(words, family) for family in _FAMILIES}
    return sorted((f for f, i in where.items() if i is not None), key=lambda f: where[f])


def family_in_name(name: str) -> str | None:
    """The one known family a (file) name names (:func:`families_in_name`), or None when it
    names none or more than one (the name then does not say)."""
    named = families_in_name(name)
    return named[0] if len(named) == 1 else None


def kind_in_name(name: str) -> str | None:
    """The D4RL kind a (file) name names (``hopper-medium-replay-gen`` -> ``medium-replay``,
    ``Hopper Medium Expert.hdf5`` -> ``medium-expert``), by :func:`name_words`; longer kinds
    first, so ``medium-expert`` is not read as ``medium``. None when it names none."""
    words = name_words(name)
    for kind in sorted(D4RL_KINDS, key=len, reverse=True):
        if _named(words, kind) is not None:
            return kind
    return None


_SIZES: dict[str, tuple[tuple[int, ...], int]] = {}


def families_of_sizes(obs_dim: int, action_dim: int) -> list[Task]:
    """The known families whose environment has observations ``obs_dim`` wide and actions
    ``action_dim`` wide (hopper 11/3; walker2d and halfcheetah both 17/6; ant 111 or 27/8)."""
    return [
        _FAMILIES[name]
        for name, (widths, actions) in _SIZES.items()
        if obs_dim in widths and action_dim == actions
    ]


def parse_d4rl_id(dataset_id: str) -> tuple[Task, str] | None:
    """Splits ``"hopper-medium-replay-v2"`` into its family and kind, or returns None."""
    if not dataset_id.endswith("-v2"):
        return None
    family_name, _, kind = dataset_id[: -len("-v2")].partition("-")
    if family_name in _FAMILIES and kind in D4RL_KINDS:
        return _FAMILIES[family_name], kind
    return None


# D4RL's MuJoCo locomotion families. Score constants: D4RL's REF_MIN_SCORE (random
# policy) and REF_MAX_SCORE (expert policy). D4RL's ant data has 111-dim observations:
# the 27 positions and velocities, then 84 contact forces, which gymnasium's Ant-v4
# appends with use_contact_forces=True (Ant-v4's own default is 27).
for _name, _termination in (
    ("hopper", hopper_termination),
    ("walker2d", walker2d_termination),
    ("halfcheetah", never_terminates),
    ("ant", ant_termination),
):
    register_termination(_name, _termination)
register_family(Task("hopper", "Hopper-v4", {}, -20.272305, 3234.3, "hopper"))
register_family(Task("walker2d", "Walker2d-v4", {}, 1.629008, 4592.3, "walker2d"))
register_family(Task("halfcheetah", "HalfCheetah-v4", {}, -280.178953, 12135.0, "halfcheetah"))
register_family(Task("ant", "Ant-v4", {"use_contact_forces": True}, -325.6, 3879.7, "ant"))
# The data decides: 111-wide ant data is D4RL's layout, 27-wide data gymnasium's default.
register_layouts("ant", {111: {"use_contact_forces": True}, 27: {"use_contact_forces": False}})
_SIZES.update(hopper=((11,), 3), walker2d=((17,), 6), halfcheetah=((17,), 6), ant=((111, 27), 8))
