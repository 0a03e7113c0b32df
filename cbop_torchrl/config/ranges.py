"""Numeric ranges: the :class:`Range` of a setting, the check of values against a table of
them, and the values no setting of any program takes.

Each section of the run config holds its own table (:mod:`cbop_torchrl.config.sections`);
the other programs' settings have theirs here (:data:`PROGRAM_RANGES`). Together they are
:data:`cbop_torchrl.config.SETTING_RANGES`, the one table of every numeric setting of every
program.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

SEED_RANGE = (0, 2**32 - 1)
"""The seeds NumPy (and so every seeded part of a run) accepts."""


@dataclass(frozen=True)
class Range:
    """The allowed values of one numeric setting, wherever a program has it.

    ``key``: the dotted key as the programs' configs spell it (``dynamics.lr``,
    ``compression_level``, ``algo.expectile``; in a section's own table, the key within the
    section: ``lr``); ``low``/``high``: the bounds (None: none),
    open when ``low_open``/``high_open``; ``integer``: whole numbers only; ``items``: the
    value is a list whose every item holds the bounds and which has at least ``min_items``
    items; ``reason``: why (the message adds it with an example).
    """

    key: str
    low: float | None = None
    high: float | None = None
    low_open: bool = False
    high_open: bool = False
    integer: bool = False
    reason: str = ""
    items: bool = False
    min_items: int = 1

    def describe(self) -> str:
        """``an integer >= 1``, ``a number in (0, 1]``, ``a positive number``, ..."""
        kind = "an integer" if self.integer else "a number"
        if self.low is not None and self.high is not None:
            left, right = "(" if self.low_open else "[", ")" if self.high_open else "]"
            text = f"{kind} in {left}{self.low:g}, {self.high:g}{right}"
        elif self.low is not None:
            if self.low == 0 and self.low_open and not self.integer:
                text = "a positive number"
            else:
                text = f"{kind} {'>' if self.low_open else '>='} {self.low:g}"
        elif self.high is not None:
            text = f"{kind} {'<' if self.high_open else '<='} {self.high:g}"
        else:
            text = f"a finite {kind.split()[1]}"
        if self.items:
            plural = "s" * (self.min_items != 1)
            text = f"a list of at least {self.min_items} item{plural}, each {text}"
        return text

    def holds(self, value: Any) -> bool:
        """Whether ``value`` is allowed (None is left to the schema: nullable keys)."""
        if self.items:
            return (
                isinstance(value, (list, tuple))
                and len(value) >= self.min_items
                and all(self._number_holds(item) for item in value)
            )
        return self._number_holds(value)

    def _number_holds(self, value: Any) -> bool:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        if not math.isfinite(value) or (self.integer and value != int(value)):
            return False
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return self.high is None or (value < self.high if self.high_open else value <= self.high)


def positive(key: str, reason: str = "", integer: bool = False) -> Range:
    """``key`` is a positive number (an integer >= 1 when ``integer``)."""
    if integer:
        return Range(key, 1, integer=True, reason=reason)
    return Range(key, 0, low_open=True, reason=reason)


def non_negative(key: str, reason: str = "", integer: bool = False) -> Range:
    """``key`` is a number >= 0."""
    return Range(key, 0, integer=integer, reason=reason)


def fraction(key: str, reason: str = "", high_open: bool = True) -> Range:
    """``key`` is in (0, 1) (or (0, 1] when not ``high_open``)."""
    return Range(key, 0, 1, low_open=True, high_open=high_open, reason=reason)


LR = "a learning rate; 0 would train nothing, e.g. {key}=0.0003"
SIZE = "a count of steps, rows or networks, e.g. {key}={example}"

PROGRAM_RANGES: tuple[Range, ...] = (
    # cbop-baseline's algo section
    positive("algo.batch_size", "the recipe's batch, or null for train.batch_size, e.g. "
             "algo.batch_size=256", integer=True),
    Range("algo.hidden_sizes", 1, integer=True, items=True,
          reason="the actor's and critics' hidden widths, or null for agent.hidden_sizes, e.g. "
          "algo.hidden_sizes=[256,256]"),
    positive("algo.actor_lr", "the recipe's actor learning rate, or null for agent.actor_lr, "
             "e.g. algo.actor_lr=0.0003"),
    positive("algo.critic_lr", "the recipe's critic learning rate, or null for "
             "agent.critic_lr, e.g. algo.critic_lr=0.0003"),
    positive("algo.num_qvalue_nets", "e.g. algo.num_qvalue_nets=2", integer=True),
    positive("algo.policy_delay", "e.g. algo.policy_delay=2", integer=True),
    non_negative("algo.alpha", "TD3+BC's weight of Q against BC, e.g. algo.alpha=2.5"),
    non_negative("algo.policy_noise", "e.g. algo.policy_noise=0.2"),
    non_negative("algo.noise_clip", "e.g. algo.noise_clip=0.5"),
    non_negative("algo.temperature", "IQL's advantage temperature beta: 0 is plain BC, larger "
                 "values follow the advantage more; e.g. algo.temperature=3.0"),
    fraction("algo.expectile", "e.g. algo.expectile=0.7"),
    positive("algo.value_lr", "e.g. algo.value_lr=0.0003"),
    non_negative("algo.min_q_weight", "e.g. algo.min_q_weight=5.0"),
    positive("algo.num_random", "CQL's random actions per state, e.g. algo.num_random=10",
             integer=True),
    positive("algo.cql_temperature", "e.g. algo.cql_temperature=1.0"),
    Range("algo.lagrange_thresh", reason="e.g. algo.lagrange_thresh=10.0"),
    # cbop-evaluate
    positive("episodes", "episodes run side by side, e.g. episodes=10", integer=True),
    positive("max_steps", "the episode cap, e.g. max_steps=1000", integer=True),
    # cbop-select-psi
    positive("steps", "FQE gradient steps per run, or null for each run's fqe.steps",
             integer=True),
    positive("batch_size", "FQE's batch size, or null for each run's fqe.batch_size",
             integer=True),
    Range("qvalue_nets", 2, integer=True, reason="the fitted Q-ensemble's members: FQE "
          "trains each on its own bootstrap resample and needs at least 2, e.g. qvalue_nets=2"),
    # cbop-collect
    Range("compression_level", 0, 9, integer=True, reason="gzip's level, e.g. "
          "compression_level=4"),
    fraction("medium_fraction", "e.g. medium_fraction=0.333", high_open=False),
    positive("rollout_transitions", "e.g. rollout_transitions=1000000", integer=True),
    positive("num_threads", "e.g. num_threads=1", integer=True),
    Range("medium_min_normalized", reason="a floor on the medium policy's normalized score, "
          "or null"),
    *(positive(f"sac.{k}", SIZE, integer=True)
      for k in ("total_steps", "frames_per_batch", "checkpoint_every", "eval_episodes",
                "batch_size")),
    non_negative("sac.warmup_steps", "uniform random steps before the policy acts",
                 integer=True),
    positive("sac.lr", LR),
    fraction("sac.gamma", "the discount, e.g. sac.gamma=0.99", high_open=False),
    fraction("sac.tau", "the critics' Polyak rate, e.g. sac.tau=0.005", high_open=False),
    Range("sac.hidden_sizes", 1, integer=True, items=True,
          reason="hidden layer widths, e.g. sac.hidden_sizes=[256,256]"),
    positive("sac.max_episode_steps", "or null for the family's cap", integer=True),
)  # fmt: skip
"""The ranges of the programs' settings outside the run config (``algo`` of cbop-baseline,
cbop-evaluate's, cbop-select-psi's, cbop-collect's and its ``sac`` section), by dotted key."""


def check_ranges(
    values: Mapping[str, Any], ranges: Mapping[str, Range], prefix: str = ""
) -> list[str]:
    """One line for each setting of ``values`` (plain values, nested mappings for sections)
    outside its range in ``ranges`` (dotted key -> :class:`Range`); None values are left to
    the schema (nullable keys)."""
    problems = []
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            if key != "gym_kwargs":
                problems += check_ranges(value, ranges, f"{name}.")
            continue
        entry = ranges.get(name)
        if entry is None or value is None or entry.holds(value):
            continue
        if isinstance(value, float) and not math.isfinite(value):  # as not_a_number_or_empty
            problems += not_a_number_or_empty({key: value}, prefix)
            continue
        shown = list(value) if isinstance(value, (list, tuple)) else value
        reason = entry.reason.format(key=name, example=_EXAMPLES.get(name.rpartition(".")[2], 1))
        problems.append(
            f"{name}={_shown(shown)} must be {entry.describe()}{f' ({reason})' if reason else ''}"
        )
    return problems


_EXAMPLES = {"batch_size": 256, "steps": 50000, "checkpoint_interval": 5000, "epochs": 100,
             "steps_per_epoch": 1000, "log_interval": 1000, "num_members": 30,
             "num_elites": 20, "hidden_size": 200, "num_layers": 4, "max_holdout": 5000,
             "patience": 5, "max_epochs": 100, "holdout": 1000, "total_steps": 100000,
             "frames_per_batch": 1000, "checkpoint_every": 5000, "eval_episodes": 10}  # fmt: skip


def _shown(value: Any) -> str:
    if isinstance(value, list):
        return "[" + ",".join(_shown(item) for item in value) + "]"
    return repr(value) if isinstance(value, str) else f"{value}"


def not_a_number_or_empty(values: Mapping[str, Any], prefix: str = "") -> list[str]:
    """Values no setting of any program takes, anywhere in a config dict (the schema lets them
    through): NaN and infinite numbers, empty strings, and a ``seed`` outside
    :data:`SEED_RANGE`."""
    problems = []
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            if key != "gym_kwargs":  # keyword arguments of gymnasium.make: not ours to judge
                problems += not_a_number_or_empty(value, f"{name}.")
        elif isinstance(value, float) and math.isnan(value):
            problems.append(f"{name}=nan is not a number; give a finite value")
        elif isinstance(value, float) and math.isinf(value):
            problems.append(f"{name}={value} is not finite; give a finite value")
        elif isinstance(value, str) and not value.strip():
            problems.append(f"{name} is an empty string; give it a value")
        elif (
            key == "seed"
            and isinstance(value, int)
            and not isinstance(value, bool)
            and not SEED_RANGE[0] <= value <= SEED_RANGE[1]
        ):
            problems.append(
                f"{name}={value} must be an integer from {SEED_RANGE[0]} to 2**32 - 1 "
                f"({SEED_RANGE[1]}), e.g. {name}=0"
            )
    return problems
