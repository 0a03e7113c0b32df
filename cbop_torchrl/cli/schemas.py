"""Every program's typed config schema and its registration with Hydra.

Each entry script's YAML config lists one of the schemas stored here first
in its defaults list, so Hydra checks every key's type and allowed values
while it composes the config, before any work: ``seed=abc``,
``estimator.horizon=2.5``, ``estimator.termination=bogus``, an unknown key or
an unknown logger are refused with a message that names the key and, for a
choice, the valid values (:func:`cbop_torchrl.cli.describe_hydra_error` rephrases it).

Range checks that a type cannot express (positive sizes, psi >= 0, no NaN,
K <= members, ...) stay in :func:`cbop_torchrl.config.load_config` and
:func:`cbop_torchrl.config.range_problems`.

The schemas name the baselines' ``algo`` section and the SAC collector's ``sac`` section,
so this module sits with the entry points (:mod:`cbop_torchrl.cli`), above the trainers
and baselines, and the package's ``__init__`` does not import it.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore
from omegaconf import MISSING, DictConfig, OmegaConf

from cbop_torchrl.baselines import AlgoConfig, pipeline_epochs
from cbop_torchrl.config.choices import (
    Compression,
    DynamicsActivation,
    EvalBackend,
    MediumReference,
    RolloutExploration,
)
from cbop_torchrl.config.paper import paper_settings
from cbop_torchrl.config.runs import RunsConfig
from cbop_torchrl.config.runtime import run_name
from cbop_torchrl.config.sections import DynamicsConfig, RunConfig
from cbop_torchrl.data.collect_sac import SACConfig
from cbop_torchrl.envs.task import TaskConfig
from cbop_torchrl.io import cache_root
from cbop_torchrl.registry import d4rl_ids, parse_d4rl_id

CONFIG_DIR = Path(__file__).resolve().parent.parent / "configs"
"""The Hydra configs, inside the package so that an installed wheel has them too."""


@dataclass
class TrainDynamicsSchema(DynamicsConfig):
    """:class:`DynamicsConfig` as a schema: the activation is a choice, so a name the ensemble
    does not know is refused while Hydra composes the config (before any stage)."""

    activation: DynamicsActivation = DynamicsActivation.silu

    def __post_init__(self) -> None:  # checked on the plain config, not on the schema
        pass


@dataclass
class DynamicsSchema(TrainDynamicsSchema):
    """:class:`TrainDynamicsSchema` with nullable sizes (the paper preset's "from the
    table"); :func:`cbop_torchrl.config.load_config` fills and checks them."""

    num_members: int | None = 30
    num_elites: int | None = 20


@dataclass
class RunSchema(RunConfig):
    """``scripts/cbop.py``: :class:`RunConfig` with the dynamics sizes nullable."""

    dynamics: DynamicsSchema = field(default_factory=DynamicsSchema)
    progress: bool | None = None  # null: by the terminal (resolve_progress)
    runs: RunsConfig = field(default_factory=RunsConfig)  # several runs side by side


@dataclass
class BaselineRunConfig(RunSchema):
    """``scripts/baseline.py``: the CBOP run config plus the baseline's ``algo`` section."""

    algo: AlgoConfig = field(default_factory=AlgoConfig)


@dataclass
class EvaluateConfig:
    """``scripts/evaluate.py``: a saved policy scored on its task."""

    checkpoint: str = MISSING  # path to a run's checkpoint.pt or policy.pt
    episodes: int = 10
    max_steps: int = 1000  # the episode cap
    seed: int = 0  # seed of the evaluation episodes
    device: str = "auto"  # auto | cpu | cuda | cuda:<index>
    backend: EvalBackend = EvalBackend.serial
    output: str | None = None
    task: TaskConfig = field(default_factory=TaskConfig)


@dataclass
class CollectConfig:
    """``scripts/collect.py``: D4RL-recipe behaviour data from a SAC run."""

    env: str = "hopper"
    task: TaskConfig = field(default_factory=TaskConfig)
    kind: Any = "medium-replay"  # one kind, a list of kinds, or "all"
    seed: int = 0  # the SAC run's seed (and the rollouts')
    tag: str | None = None
    out_dir: str | None = None
    runs_dir: str | None = None
    medium_fraction: float = 1 / 3
    medium_reference: MediumReference = MediumReference.d4rl
    medium_min_normalized: float | None = 30.0  # floor on the medium policy's recorded score
    stop_at_medium: bool = True  # end the SAC run at the first checkpoint reaching medium
    rollout_transitions: int = 1_000_000
    rollout_exploration: RolloutExploration = RolloutExploration.random
    num_threads: int = 1
    progress: bool | None = None  # null: by the terminal (resolve_progress)
    compression: Compression | None = Compression.gzip
    compression_level: int = 4  # gzip level, 0 (fastest) to 9 (smallest)
    sac: SACConfig = field(default_factory=SACConfig)


@dataclass
class TrainDynamicsConfig:
    """``scripts/train_dynamics.py``: the dynamics ensemble alone."""

    env: str = "demo"
    task: TaskConfig = field(default_factory=TaskConfig)
    device: str = "auto"
    threads: int | None = None
    use_cache: bool = True
    progress: bool | None = None  # null: by the terminal (resolve_progress)
    output_dir: str = MISSING
    dynamics: TrainDynamicsSchema = field(default_factory=TrainDynamicsSchema)


@dataclass
class SelectPsiConfig:
    """``cbop-select-psi``: a sweep's runs ranked by fitted Q evaluation of their policies."""

    sweep_dir: str = MISSING  # a multirun's hydra.sweep.dir
    steps: int | None = None  # null: each run's fqe.steps
    batch_size: int | None = None  # null: each run's fqe.batch_size
    qvalue_nets: int = 2
    device: str = "auto"
    threads: int | None = None
    json: str | None = None  # also write the rankings to this file
    progress: bool | None = None  # null: by the terminal (resolve_progress)
    task: TaskConfig = field(default_factory=TaskConfig)


@dataclass
class ReportConfig:
    """``cbop-report``: results table, learning curves and the paper's figures."""

    paths: Any = MISSING  # one path or a list of paths (run, sweep or summary directories)
    out: str = "report"
    analysis: bool = True  # false: no checkpoint is loaded (no R_h, A/(A+B), conservatism)
    figure_prefix: str | None = None  # null: out relative to the working directory
    rliable_reps: int = 2000  # bootstrap resamples behind rliable's 95% intervals


@dataclass
class ScoreConfig:
    """``cbop-score``: the snapshots of runs scored on the CPU, written as seed summaries."""

    paths: Any = MISSING  # a run directory, a folder of run directories, or a list of them
    results: str = "benchmarks/results"
    threads: int | None = 1


SCHEMAS: dict[str, type] = {
    "run": RunSchema,
    "baseline": BaselineRunConfig,
    "evaluate": EvaluateConfig,
    "collect": CollectConfig,
    "train_dynamics": TrainDynamicsConfig,
    "select_psi": SelectPsiConfig,
    "report": ReportConfig,
    "score": ScoreConfig,
}
"""The ``schema`` config group (package ``_global_``): a YAML config lists ``schema: <name>``
first in its defaults, and ``baseline.yaml`` overrides the ``run`` schema of the
``config.yaml`` it includes."""


CONFIG_SCHEMAS: dict[str, type] = {
    "config": RunSchema,
    "config_paper": RunSchema,
    **{name: schema for name, schema in SCHEMAS.items() if name != "run"},
}
"""The schema each entry script's primary config (``configs/<name>.yaml``) is checked against."""


PAPER_DATASET_CONFIG = "config_paper_"
"""Prefix of the primary configs ``config_paper_<D4RL id>`` (:func:`register_schemas`):
``config_paper`` with that dataset's row of the paper's table filled in."""


def base_config_name(config_name: str) -> str:
    """The YAML config a primary config is (``config_paper_<id>`` -> ``config_paper``)."""
    return "config_paper" if config_name.startswith(PAPER_DATASET_CONFIG) else config_name


def config_file(config_name: str) -> Path:
    """The YAML file that lists every setting of the primary config ``config_name``."""
    return CONFIG_DIR / f"{base_config_name(config_name)}.yaml"


def paper_dataset_config(env: str) -> str | None:
    """``config_paper_<env>`` for a D4RL id (its table values filled at composition, so
    ``--cfg job`` shows the values the run uses), else None."""
    return f"{PAPER_DATASET_CONFIG}{env}" if parse_d4rl_id(env) is not None else None


def unknown_keys(cfg: Mapping[str, Any], schema: type, prefix: str = "") -> list[str]:
    """Dotted keys of ``cfg`` that ``schema`` (a dataclass) has no field for.

    Hydra's ``+key=value`` adds a key the schema does not know; this finds it.
    Mappings the schema leaves open (``task.gym_kwargs``) are not looked into.
    """
    if isinstance(cfg, DictConfig):  # plain values, missing (???) ones left unread
        cfg = OmegaConf.to_container(cfg, resolve=False)
    hints = typing.get_type_hints(schema)
    fields = {f.name for f in dataclasses.fields(schema)}  # not the sections' RANGES tables
    found = []
    for key, value in cfg.items():
        if key not in fields:
            found.append(f"{prefix}{key}")
        elif dataclasses.is_dataclass(hints[key]) and isinstance(value, Mapping):
            found += unknown_keys(value, hints[key], f"{prefix}{key}.")
    return found


def register_schemas() -> None:
    """Stores every entry script's schema in Hydra's ``ConfigStore`` (idempotent)."""
    store = ConfigStore.instance()
    stored = store.repo.get("schema", {})
    for name, schema in SCHEMAS.items():
        if f"{name}.yaml" in stored:  # a schema is a constant; building it costs ~20 ms
            continue
        node = OmegaConf.structured(schema)
        if name == "collect":  # SACConfig is a frozen dataclass; its fields stay typed
            OmegaConf.set_readonly(node.sac, False)
        store.store(group="schema", name=name, node=node, package="_global_")
    for dataset_id in d4rl_ids():
        family, kind = parse_d4rl_id(dataset_id)
        table: dict[str, dict[str, Any]] = {}
        for dotted, value in paper_settings(family, kind).items():
            section, _, key = dotted.partition(".")
            table.setdefault(section, {})[key] = value
        # the row after config_paper's preset; command-line overrides still win
        node = {"defaults": ["config_paper", "_self_"], **table}
        store.store(name=f"{PAPER_DATASET_CONFIG}{dataset_id}", node=node)
    OmegaConf.register_new_resolver("cbop_run_name", run_name, replace=True)
    OmegaConf.register_new_resolver("cbop_overrides", lambda text: text or "default", replace=True)
    # ${cbop_pipeline_epochs:...}: a baseline's default train.epochs (configs/baseline.yaml)
    OmegaConf.register_new_resolver("cbop_pipeline_epochs", pipeline_epochs, replace=True)
    # ${cbop_cache:}: where the reporting programs' multiruns keep Hydra's files (not the cwd)
    OmegaConf.register_new_resolver("cbop_cache", lambda: str(cache_root()), replace=True)


def config_values(cfg: DictConfig) -> dict[str, Any]:
    """The composed config as plain Python values (choices as their strings)."""
    return OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)
