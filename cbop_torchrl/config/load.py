"""From the composed Hydra tree to a checked :class:`RunConfig`.

Hydra composes ``cbop_torchrl/configs/config.yaml`` (a preset, a logger, the dynamics
group) and the command-line overrides into one tree; :func:`load_config` turns that tree
into a :class:`RunConfig`, fills the paper's values into its nulls
(:mod:`cbop_torchrl.config.paper`) and checks it before any work starts. Every problem
found is reported at once in a :class:`ConfigError`.
"""

from __future__ import annotations

import copy
import dataclasses
import sys
from collections.abc import Callable, Mapping
from typing import Any

from cbop_torchrl.config.paper import PAPER_SHARED, fill_nulls
from cbop_torchrl.config.ranges import check_ranges
from cbop_torchrl.config.runtime import capped_threads
from cbop_torchrl.config.sections import (
    SECTIONS,
    DynamicsConfig,
    RunConfig,
    ensemble_size_problems,
    prefixed,
)
from cbop_torchrl.config.validation import validate
from cbop_torchrl.registry import Task


class ConfigError(ValueError):
    """The configuration is invalid; the message lists every problem and how to fix it."""


DatasetLookup = Callable[[str], tuple[Task | str | None, str]]
"""Maps ``env`` to its known family (None for other tasks) and clean dataset name; raises
when the dataset is missing."""

_BUILT = {name: kind for name, kind in SECTIONS.items() if name != "dynamics"}
"""The sections built as they are given (the dynamics section is built with placeholders
while its sizes are reported, :func:`_dynamics_placeholders`)."""


def load_config(
    values: Mapping[str, Any], lookup_dataset: DatasetLookup
) -> tuple[RunConfig, list[str]]:
    """The validated :class:`RunConfig` of a plain nested dict (the composed Hydra tree).

    Null table-fed fields are filled from :func:`paper_settings` for the dataset
    that ``lookup_dataset(values["env"])`` names.

    Returns:
        The config and the dotted keys that were filled from the paper table.

    Raises:
        ConfigError: listing every problem at once: unknown keys, a missing dataset
            (the message of the exception ``lookup_dataset`` raised), a null with no
            table value, psi < 0, H < 0, more elites than trained members,
            non-positive sizes, unknown choices.
    """
    values = copy.deepcopy(dict(values))
    values["threads"], note = capped_threads(values.get("threads"))
    if note is not None:
        print(f"note: {note}", file=sys.stderr)
    if values.get("progress") is None:  # the programs decide by the terminal; the API shows bars
        values["progress"] = True
    problems = _runs_problems(values.pop("runs", None))
    problems += _unknown_keys(values, RunConfig, "")
    for name, section_type in {**_BUILT, "dynamics": DynamicsConfig}.items():
        values[name] = dict(values.get(name) or {})
        problems += _unknown_keys(values[name], section_type, f"{name}.")

    filled: list[str] = []
    env = str(values.get("env", RunConfig.env))
    try:
        family, dataset_name = lookup_dataset(env)
    except Exception as error:  # the dataset layer's message says what is missing
        problems.append(f"env={env!r}: {error}")
    else:
        filled, missing = fill_nulls(values, family, dataset_name)
        problems += missing

    config, build_problems = _build(values)
    problems += build_problems
    problems += validate(config)
    if problems:
        raise ConfigError(_format(list(dict.fromkeys(problems))))
    return config, filled


def _build(values: dict[str, Any]) -> tuple[RunConfig, list[str]]:
    """The :class:`RunConfig` of checked-for-unknown-keys values, and the problems found while
    building it (the dynamics section's sizes, as given)."""
    sections = {}
    for name, section_type in _BUILT.items():
        known = _field_names(section_type)
        sections[name] = section_type(**{k: v for k, v in values[name].items() if k in known})
    known = _field_names(DynamicsConfig)
    dynamics_values = {k: v for k, v in values["dynamics"].items() if k in known}
    problems = _check_ensemble_sizes(dynamics_values)
    try:
        dynamics = DynamicsConfig(**_dynamics_placeholders(dynamics_values))
    except (TypeError, ValueError) as error:
        problems.append(str(error))
        dynamics = DynamicsConfig()
    top = {
        name: values[name]
        for name in _field_names(RunConfig)
        if name in values and name not in sections and name != "dynamics"
    }
    config = RunConfig(dynamics=dynamics, **top, **sections)
    # as given, before placeholders
    problems += check_ranges(
        {"dynamics": dynamics_values}, prefixed(DynamicsConfig.RANGES, "dynamics.")
    )
    return config, problems


RUN_AXES = ("seeds", "psi", "set")
"""The ``runs`` keys that list runs (:class:`~cbop_torchrl.config.runs.RunsConfig`); its other
keys say how the runs train and are ignored by a program that trains one run."""


def _runs_problems(runs: Mapping[str, Any] | None) -> list[str]:
    """A ``runs`` section (several runs side by side) given to a program that trains one run.

    ``cbop-train`` expands it first (:func:`cbop_torchrl.config.runs.expand_runs`) and loads
    each run's config without it; an unset section (every list null) is dropped.
    """
    given = sorted(key for key, value in dict(runs or {}).items()
                   if key in RUN_AXES and value is not None)  # fmt: skip
    if not given:
        return []
    return [
        f"{', '.join(f'runs.{key}' for key in given)} asks for several runs side by side, "
        "which only cbop-train (and cbop_torchrl.train_side_by_side) trains; leave runs.* "
        "out here and give one seed= and estimator.psi= per command"
    ]


def _field_names(kind: type) -> list[str]:
    return [f.name for f in dataclasses.fields(kind)]


def _unknown_keys(values: Mapping[str, Any], known: type, where: str) -> list[str]:
    names = set(_field_names(known))
    unknown = sorted(set(values) - names)
    if not unknown:
        return []
    return [
        f"unknown key{'s' if len(unknown) > 1 else ''} "
        + ", ".join(f"{where}{key}" for key in unknown)
        + f" (valid keys in {where.rstrip('.') or 'the top level'}: {', '.join(sorted(names))})"
    ]


def _check_ensemble_sizes(dynamics: Mapping[str, Any]) -> list[str]:
    members, elites = dynamics.get("num_members"), dynamics.get("num_elites")
    if isinstance(members, int) and isinstance(elites, int):
        return ensemble_size_problems(members, elites)
    return []


def _dynamics_placeholders(dynamics: Mapping[str, Any]) -> dict[str, Any]:
    """Sizes that keep ``DynamicsConfig`` constructible while other problems are reported."""
    values = dict(dynamics)
    for key in ("num_members", "num_elites"):
        if values.get(key) is None:
            values[key] = PAPER_SHARED[f"dynamics.{key}"]
    if values["num_elites"] > values["num_members"]:  # already reported by the size check
        values["num_elites"] = values["num_members"]
    return values


def _format(problems: list[str]) -> str:
    problems = [problem.rstrip(". ") for problem in problems]
    if len(problems) == 1:
        return f"invalid configuration: {problems[0]}."
    return "invalid configuration:\n" + "\n".join(f"  - {p}." for p in problems)
