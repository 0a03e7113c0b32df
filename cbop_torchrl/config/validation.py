"""The checks of a run config: every setting in its range, and each section's own checks.

:data:`SETTING_RANGES` is the one table of every numeric setting of every program: the run
config's sections' tables (:mod:`cbop_torchrl.config.sections`) and the other programs'
(:data:`~cbop_torchrl.config.ranges.PROGRAM_RANGES`). It is checked before any work by
:func:`range_problems` (every entry point through :func:`cbop_torchrl.cli.hydra_entry`)
and by :func:`validate` (:func:`cbop_torchrl.config.load_config`, the Python API).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from cbop_torchrl.config.ranges import (
    PROGRAM_RANGES,
    Range,
    check_ranges,
    not_a_number_or_empty,
)
from cbop_torchrl.config.sections import SECTION_RANGES, RunConfig

SETTING_RANGES: tuple[Range, ...] = (
    *RunConfig.RANGES,
    *(
        dataclasses.replace(entry, key=f"{name}.{entry.key}")
        for name, table in SECTION_RANGES.items()
        for entry in table
    ),
    *PROGRAM_RANGES,
)
"""Every numeric setting of every program and its allowed range, by dotted key."""

RANGES: dict[str, Range] = {entry.key: entry for entry in SETTING_RANGES}


def range_problems(values: Mapping[str, Any], prefix: str = "") -> list[str]:
    """One line for each setting of ``values`` (a program's config as plain values) outside
    its range in :data:`SETTING_RANGES`; None values are left to the schema (nullable keys)."""
    return check_ranges(values, RANGES, prefix)


def validate(config: RunConfig) -> list[str]:
    """Semantic checks of a filled config; returns the problems (empty when valid).

    Every setting against its section's table of ranges, values no setting takes (NaN, an
    empty string, a seed out of range), then each section's own checks: its choices and the
    settings that must fit together.
    """
    values = config.to_dict()
    problems = list(dict.fromkeys(config.range_problems() + not_a_number_or_empty(values)))
    for section in (
        config.agent,
        config.fqe,
        config.estimator,
        config.dynamics,
        config.eval,
        config.logger,
        config,
    ):
        problems += section.problems()
    return problems
