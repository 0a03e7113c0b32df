"""Entry points: the typed config schema of every script and Hydra's main with exit codes.

Each entry script's YAML config lists one of the schemas stored here first
in its defaults list, so Hydra checks every key's type and allowed values
while it composes the config, before any work: ``seed=abc``,
``estimator.horizon=2.5``, ``estimator.termination=bogus``, an unknown key or
an unknown logger are refused with a message that names the key and, for a
choice, the valid values. :func:`hydra_entry` turns such a refusal into exit
code 2 (the project's code for bad input) instead of Hydra's 1.

Range checks that a type cannot express (positive sizes, psi >= 0, no NaN,
K <= members, ...) stay in :func:`cbop_torchrl.config.load_config`, which the
scripts call first thing.
"""

from __future__ import annotations

import functools
import shutil
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import hydra
from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from omegaconf import MISSING, DictConfig, OmegaConf

from cbop_torchrl.baselines import AlgoConfig
from cbop_torchrl.config import Choice, EvalBackend, RunConfig, run_name
from cbop_torchrl.data.collect_sac import SACConfig
from cbop_torchrl.envs.task import TaskConfig
from cbop_torchrl.registry import parse_d4rl_id
from cbop_torchrl.trainers.dynamics import DynamicsConfig

CONFIG_DIR = Path(__file__).resolve().parent / "configs"
"""The Hydra configs, inside the package so that an installed wheel has them too."""

EXIT_BAD_INPUT = 2


@dataclass
class DynamicsSchema(DynamicsConfig):
    """:class:`DynamicsConfig` as a schema: sizes may be null (the paper preset's "from the
    table"); :func:`cbop_torchrl.config.load_config` fills and checks them."""

    num_members: int | None = 30
    num_elites: int | None = 20

    def __post_init__(self) -> None:  # checked on the filled config, not on the schema
        pass


@dataclass
class RunSchema(RunConfig):
    """``scripts/cbop.py``: :class:`RunConfig` with the dynamics sizes nullable."""

    dynamics: DynamicsSchema = field(default_factory=DynamicsSchema)


@dataclass
class BaselineRunConfig(RunSchema):
    """``scripts/baseline.py``: the CBOP run config plus the baseline's ``algo`` section."""

    algo: AlgoConfig = field(default_factory=AlgoConfig)


@dataclass
class EvaluateConfig:
    """``scripts/evaluate.py``: a saved policy scored on its task."""

    checkpoint: str = MISSING  # path to a run's checkpoint.pt or policy.pt
    episodes: int = 10
    max_steps: int = 1000
    seed: int = 0
    device: str = "auto"
    backend: EvalBackend = EvalBackend.serial
    output: str | None = None
    task: TaskConfig = field(default_factory=TaskConfig)


class MediumReference(Choice):
    best = "best"
    d4rl = "d4rl"


class RolloutExploration(Choice):
    random = "random"
    deterministic = "deterministic"


class Compression(Choice):
    gzip = "gzip"
    lzf = "lzf"


@dataclass
class CollectConfig:
    """``scripts/collect.py``: D4RL-recipe behaviour data from a SAC run."""

    env: str = "hopper"
    task: TaskConfig = field(default_factory=TaskConfig)
    kind: Any = "medium-replay"  # one kind, a list of kinds, or "all"
    seed: int = 0
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
    progress: bool = True
    compression: Compression | None = Compression.gzip
    compression_level: int = 4
    sac: SACConfig = field(default_factory=SACConfig)


@dataclass
class TrainDynamicsConfig:
    """``scripts/train_dynamics.py``: the dynamics ensemble alone."""

    env: str = "demo"
    task: TaskConfig = field(default_factory=TaskConfig)
    device: str = "auto"
    threads: int | None = None
    use_cache: bool = True
    progress: bool = True
    output_dir: str = MISSING
    dynamics: DynamicsConfig = field(default_factory=DynamicsConfig)


SCHEMAS: dict[str, type] = {
    "run": RunSchema,
    "baseline": BaselineRunConfig,
    "evaluate": EvaluateConfig,
    "collect": CollectConfig,
    "train_dynamics": TrainDynamicsConfig,
}
"""The ``schema`` config group (package ``_global_``): a YAML config lists ``schema: <name>``
first in its defaults, and ``baseline.yaml`` overrides the ``run`` schema of the
``config.yaml`` it includes."""


def register_schemas() -> None:
    """Stores every entry script's schema in Hydra's ``ConfigStore`` (idempotent)."""
    store = ConfigStore.instance()
    for name, schema in SCHEMAS.items():
        node = OmegaConf.structured(schema)
        if name == "collect":  # SACConfig is a frozen dataclass; its fields stay typed
            OmegaConf.set_readonly(node.sac, False)
        store.store(group="schema", name=name, node=node, package="_global_")
    OmegaConf.register_new_resolver("cbop_run_name", run_name, replace=True)
    OmegaConf.register_new_resolver(
        "cbop_overrides", lambda text: text or "default", replace=True
    )


def config_values(cfg: DictConfig) -> dict[str, Any]:
    """The composed config as plain Python values (choices as their strings)."""
    return OmegaConf.to_container(cfg, resolve=True, enum_to_str=True)


def refuse(message: object, created_dir: str | Path | None = None) -> NoReturn:
    """Prints ``error: <message>`` and exits with code 2 (bad input).

    ``created_dir``: a run directory Hydra made for this command; removed (with
    parents that become empty, up to the working directory) when it holds
    nothing but Hydra's own files, so a refused command leaves nothing behind.
    """
    print(f"error: {message}", file=sys.stderr)
    if created_dir is not None:
        remove_if_only_hydra_files(Path(created_dir))
    sys.exit(EXIT_BAD_INPUT)


def remove_if_only_hydra_files(run_dir: Path) -> None:
    """Removes ``run_dir`` if it holds only ``.hydra/`` and Hydra's job log, then empty parents."""
    run_dir = run_dir.resolve()
    if not run_dir.is_dir() or run_dir == Path.cwd().resolve():
        return
    entries = list(run_dir.iterdir())
    if any(not (p.name == ".hydra" or p.suffix == ".log") for p in entries):
        return
    if any(p.suffix == ".log" and p.stat().st_size > 0 for p in entries):
        return  # a log with content belongs to an earlier session
    shutil.rmtree(run_dir, ignore_errors=True)
    cwd = Path.cwd().resolve()
    parent = run_dir.parent
    while parent != cwd and cwd in parent.parents and not any(parent.iterdir()):
        parent.rmdir()
        parent = parent.parent


def wants_paper_preset(overrides: Sequence[str]) -> bool:
    """Whether command-line overrides name only D4RL ids in ``env=`` and no ``preset=``.

    ``python scripts/cbop.py env=hopper-medium-v2`` trains with the paper's
    settings. Hydra cannot choose a config group from a plain field's value,
    so the entry point chooses its primary config instead (``config_paper``,
    which is ``config`` with ``override preset: paper``); the command line
    itself is passed to Hydra untouched, so ``--cfg job``, ``--help`` and
    ``-m`` keep working.
    """
    for arg in overrides:
        key, _, value = arg.partition("=")
        if key.lstrip("+~") == "preset":
            return False
    for arg in overrides:
        key, _, value = arg.partition("=")
        if key == "env" and value:
            return all(parse_d4rl_id(item) is not None for item in value.split(","))
    return False


def hydra_entry(config_name: str) -> Callable[[Callable[[DictConfig], Any]], Callable[[], Any]]:
    """``hydra.main`` over :data:`CONFIG_DIR`, with exit code 2 for a config Hydra refuses.

    Hydra reports a composition error (a type mismatch, an unknown key or
    config group option, a missing value) in one paragraph without a
    traceback and exits with 1; the same exit before the task function has
    started means the input was refused, so it becomes 2. Failures inside the
    task function keep their own exit codes.
    """
    register_schemas()

    def decorate(task_function: Callable[[DictConfig], Any]) -> Callable[[], Any]:
        started = False

        @functools.wraps(task_function)
        def task(cfg: DictConfig) -> Any:
            nonlocal started
            missing = sorted(OmegaConf.missing_keys(cfg))
            if missing:
                refuse(
                    f"{', '.join(missing)} must be given on the command line "
                    f"({' '.join(f'{key}=...' for key in missing)}); see "
                    f"{CONFIG_DIR / config_name}.yaml for what each key holds",
                    HydraConfig.get().runtime.output_dir,
                )
            started = True
            return task_function(cfg)

        hydra_main = hydra.main(
            config_path=str(CONFIG_DIR), config_name=config_name, version_base="1.3"
        )(task)

        @functools.wraps(task_function)
        def main() -> Any:
            try:
                return hydra_main()
            except SystemExit as exit_:
                if exit_.code == 1 and not started:
                    sys.exit(EXIT_BAD_INPUT)
                raise

        return main

    return decorate
