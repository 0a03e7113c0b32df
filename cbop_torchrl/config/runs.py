"""Several runs over one dataset in one process: the ``runs`` section and its expansion.

``runs.seeds=[0,1,2] runs.psi=[0.5,2,3,5]`` asks for the product, 12 runs; each is the run
``seed=S estimator.psi=P`` would be alone, in its own directory ``<job dir>/psi<P>-seed<S>``
(``seed<S>`` when only seeds are listed, ``psi<P>`` when only psi is).
``runs.set=["agent.actor_lr=1e-4", "agent.actor_lr=3e-4 agent.critic_lr=1e-4"]`` adds a
general axis: each entry is a list of overrides applied to its runs. The runs may differ
only in settings that keep every tensor's shape and that one process can hold for all of
them (:data:`SHARED_KEYS`); :func:`expand_runs` refuses anything else before any work.

The trainer that runs them is :mod:`cbop_torchrl.trainers.side_by_side`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cbop_torchrl.config.load import RUN_AXES, ConfigError

SHAPE_KEYS = frozenset(
    {
        "agent.num_qvalue_nets",
        "agent.hidden_sizes",
        "agent.critic_hidden_sizes",
        "agent.critic_layer_norm",
        "train.batch_size",
        "bc.batch_size",
        "fqe.batch_size",
        "estimator.horizon",
        "estimator.sampling",
        "estimator.mode",
        "dynamics.num_members",
        "dynamics.num_elites",
        "dynamics.hidden_size",
        "dynamics.num_layers",
        "eval.episodes",
        "eval.mc_states",
        "eval.start_states",
    }
)
"""Settings that change the shape of a tensor of the CBOP step: one value for every run."""

PROCESS_KEYS = frozenset(
    {"env", "preset", "device", "threads", "compile", "cuda_graph", "resume", "progress"}
)
"""Settings of the process (its data, device and threads): one value for every run."""

SHARED_SECTIONS = ("task", "logger", "runs")
"""Sections whose every key is the same for all runs."""


@dataclass
class RunsConfig:
    """``runs``: several runs of ``cbop-train`` over one dataset, trained side by side."""

    # seeds of the runs, e.g. [0,1,2] (null: the one seed=); each run's directory is
    # <job dir>/seed<S> (or psi<P>-seed<S> with runs.psi)
    seeds: list[int] | None = None
    # LCB coefficients of the runs, e.g. [0.5,2,3,5] (null: the one estimator.psi=); the
    # runs are the product with runs.seeds
    psi: list[float] | None = None
    # more run axes: each entry one run's overrides, space-separated, e.g.
    # ["agent.actor_lr=1e-4","agent.actor_lr=3e-4"] (null: none); settings that change a
    # tensor's shape (agent.num_qvalue_nets, ...) are refused
    set: list[str] | None = None
    # true: before the runs take turns, the dynamics models, BC actors and FQE critics of
    # every distinct seed whose cache entry is missing train together in one go
    # (trainers/pretrain_together.py), each as it trains alone; false: each run pretrains
    # in its first turn, one after another
    pretrain_together: bool = True

    @classmethod
    def from_values(cls, values: Mapping[str, Any] | None) -> RunsConfig:
        values = dict(values or {})
        together = values.get("pretrain_together")
        return cls(
            values.get("seeds"), values.get("psi"), values.get("set"),
            True if together is None else bool(together),
        )  # fmt: skip

    @property
    def given(self) -> bool:
        """Whether any list was given (an empty one too: :func:`expand_runs` refuses it)."""
        return any(getattr(self, axis) is not None for axis in RUN_AXES)


@dataclass(frozen=True)
class RunSpec:
    """One run of a side-by-side job: its directory name and the overrides that make it."""

    name: str
    overrides: tuple[tuple[str, Any], ...]  # (dotted key, value), applied in order


def psi_label(psi: float) -> str:
    """``psi0.5``, ``psi2``: a psi value as it appears in a run directory's name."""
    return f"psi{float(psi):g}"


def _set_label(words: Sequence[str]) -> str:
    return "-".join(re.sub(r"[^A-Za-z0-9._-]+", "_", word).strip("_") for word in words)


def _parse_set_entry(entry: str, index: int) -> list[tuple[str, Any]]:
    """The ``(key, value)`` overrides of one ``runs.set`` entry, with Hydra's parser."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.core.override_parser.types import OverrideType

    words = str(entry).split()
    if not words:
        raise ConfigError(
            f"runs.set[{index}] is empty; give each entry one or more key=value overrides, "
            'e.g. runs.set=["agent.actor_lr=1e-4","agent.actor_lr=3e-4"]'
        )
    try:
        parsed = OverridesParser.create().parse_overrides(words)
    except Exception as error:  # Hydra's grammar error names the word
        raise ConfigError(
            f"runs.set[{index}]={entry!r} is not a list of key=value overrides ({error}); "
            'write e.g. runs.set=["agent.actor_lr=1e-4"]'
        ) from None
    pairs = []
    for override in parsed:
        plain = override.type is OverrideType.CHANGE and not override.is_sweep_override()
        if not plain:
            raise ConfigError(
                f"runs.set[{index}]: {override.input_line!r} is not a plain key=value "
                "override; each entry sets existing keys to one value each, e.g. "
                '"agent.actor_lr=1e-4"'
            )
        pairs.append((override.key_or_group, override.value()))
    return pairs


def _refuse_shared_keys(keys: Sequence[str]) -> None:
    for key in keys:
        section = key.partition(".")[0]
        if key in SHAPE_KEYS:
            why = "changes the shape of a tensor the runs' steps share"
        elif key in PROCESS_KEYS or section in SHARED_SECTIONS:
            why = "is a setting of the whole process (its data, device, threads, logger)"
        else:
            continue
        raise ConfigError(
            f"runs.set sets {key}, which {why}, so every run side by side must have the same "
            f"value; set {key}=<value> once on the command line for all runs, or run a "
            f"separate cbop-train command (or a -m multirun) per value of {key}. The runs may "
            "differ in seed (runs.seeds), psi (runs.psi) and settings that keep every shape "
            "(learning rates, tau, eta, bc_weight, ...)."
        )


def expand_runs(runs: RunsConfig) -> list[RunSpec]:
    """The runs of a ``runs`` section: the product of its lists, seeds outermost.

    Raises:
        ConfigError: an empty list, a ``runs.set`` entry that is not a list of plain
            overrides or that sets a shared setting (:data:`SHAPE_KEYS`,
            :data:`PROCESS_KEYS`, :data:`SHARED_SECTIONS`), or two runs with the same
            directory (a repeated seed or psi).
    """
    for name in ("seeds", "psi", "set"):
        if getattr(runs, name) is not None and len(getattr(runs, name)) == 0:
            raise ConfigError(
                f"runs.{name}=[] lists no run; give one or more values (e.g. runs.seeds=[0,1,2] "
                f"or runs.psi=[0.5,2]), or leave runs.{name} out for a single run"
            )
    seeds: list[int | None] = list(runs.seeds) if runs.seeds is not None else [None]
    psis: list[float | None] = list(runs.psi) if runs.psi is not None else [None]
    sets: list[tuple[str, list[tuple[str, Any]]] | None] = [None]
    if runs.set is not None:
        sets = []
        for index, entry in enumerate(runs.set):
            pairs = _parse_set_entry(entry, index)
            _refuse_shared_keys([key for key, _ in pairs])
            sets.append((_set_label(str(entry).split()), pairs))
    specs: list[RunSpec] = []
    for seed in seeds:
        for psi in psis:
            for extra in sets:
                parts, overrides = [], []
                if psi is not None:
                    parts.append(psi_label(psi))
                    overrides.append(("estimator.psi", float(psi)))
                if extra is not None:
                    parts.append(extra[0])
                    overrides += extra[1]
                if seed is not None:
                    parts.append(f"seed{seed}")
                    overrides.append(("seed", int(seed)))
                specs.append(RunSpec("-".join(parts), tuple(overrides)))
    _refuse_same_directories(specs)
    return specs


def _refuse_same_directories(specs: Sequence[RunSpec]) -> None:
    seen: dict[str, int] = {}
    for index, spec in enumerate(specs):
        if spec.name in seen:
            raise ConfigError(
                f"runs {seen[spec.name] + 1} and {index + 1} of the runs section would both "
                f"write to the run directory {spec.name!r} (a seed or psi listed twice, e.g. "
                "runs.psi=[2,2.0]); list each value once, e.g. runs.seeds=[0,1,2]"
            )
        seen[spec.name] = index


__all__ = ["PROCESS_KEYS", "SHAPE_KEYS", "RunSpec", "RunsConfig", "expand_runs", "psi_label"]
