"""Entry points: the typed config schema of every script and Hydra's main with exit codes.

Each entry script's YAML config lists one of the schemas stored here first
in its defaults list, so Hydra checks every key's type and allowed values
while it composes the config, before any work: ``seed=abc``,
``estimator.horizon=2.5``, ``estimator.termination=bogus``, an unknown key or
an unknown logger are refused with a message that names the key and, for a
choice, the valid values. :func:`hydra_entry` turns such a refusal into one
paragraph (:func:`describe_hydra_error`: the key, what it takes, an example)
and exit code 2 (the project's code for bad input) instead of Hydra's
multi-line report and exit code 1.

Range checks that a type cannot express (positive sizes, psi >= 0, no NaN,
K <= members, ...) stay in :func:`cbop_torchrl.config.load_config`, which the
scripts call first thing.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import dataclasses
import difflib
import enum
import functools
import io
import os
import re
import shlex
import shutil
import string
import sys
import types
import typing
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import hydra
from hydra.core.config_store import ConfigStore
from hydra.core.hydra_config import HydraConfig
from hydra.errors import ConfigCompositionException, MissingConfigException, OverrideParseException
from omegaconf import MISSING, DictConfig, OmegaConf, flag_override
from omegaconf.errors import (
    InterpolationKeyError,
    InterpolationResolutionError,
    OmegaConfBaseException,
)

from cbop_torchrl.baselines import AlgoConfig, pipeline_epochs
from cbop_torchrl.config import (
    Choice,
    DynamicsActivation,
    DynamicsConfig,
    EvalBackend,
    RunConfig,
    capped_threads,
    not_a_number_or_empty,
    paper_settings,
    range_problems,
    run_name,
)
from cbop_torchrl.data.collect_sac import SACConfig
from cbop_torchrl.envs.task import TaskConfig
from cbop_torchrl.registry import d4rl_ids, parse_d4rl_id
from cbop_torchrl.trainers.logging import ProgressLines
from cbop_torchrl.trainers.rundir import LOCK_NAME, MARKER_NAME, remember_hydra_job
from cbop_torchrl.utils import (
    ForeignFileError,
    as_disk_full_error,
    cache_root,
    is_disk_full,
    is_out_of_memory,
    keep_mujoco_log_out_of_cwd,
    out_of_memory_message,
    override_value,
    program_command,
    refused_write,
    running_program,
    set_output_setting,
    unwritable_reason,
)

CONFIG_DIR = Path(__file__).resolve().parent / "configs"
"""The Hydra configs, inside the package so that an installed wheel has them too."""

EXIT_BAD_INPUT = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as shells report a process stopped by Ctrl-C
RESUMABLE_CONFIGS = frozenset(("config", "config_paper", "baseline"))
"""The programs whose interrupted run continues where it stopped when run again."""


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
    progress: bool | None = None  # null: by the terminal (resolve_progress)
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


SCHEMAS: dict[str, type] = {
    "run": RunSchema,
    "baseline": BaselineRunConfig,
    "evaluate": EvaluateConfig,
    "collect": CollectConfig,
    "train_dynamics": TrainDynamicsConfig,
    "select_psi": SelectPsiConfig,
    "report": ReportConfig,
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
    found = []
    for key, value in cfg.items():
        if key not in hints:
            found.append(f"{prefix}{key}")
        elif dataclasses.is_dataclass(hints[key]) and isinstance(value, Mapping):
            found += unknown_keys(value, hints[key], f"{prefix}{key}.")
    return found


def register_schemas() -> None:
    """Stores every entry script's schema in Hydra's ``ConfigStore`` (idempotent)."""
    store = ConfigStore.instance()
    for name, schema in SCHEMAS.items():
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
    """Removes ``run_dir`` if it holds only what this command put there, then empty parents.

    That is ``.hydra/``, Hydra's empty job log, the run marker (``.cbop-run``) and a run
    lock (``.run.lock``)
    that is free or held by this process; a lock naming another process, a log
    with content or any other file belongs to another run and keeps the directory.
    """
    run_dir = run_dir.resolve()
    if not run_dir.is_dir() or run_dir == Path.cwd().resolve():
        return
    for path in run_dir.iterdir():
        if path.name in (".hydra", MARKER_NAME):
            continue
        if path.name == LOCK_NAME:
            holder = path.read_text().strip()
            if holder and not holder.startswith(f"pid {os.getpid()} "):
                return
        elif path.suffix != ".log" or path.stat().st_size > 0:
            return  # a log with content belongs to an earlier session
    shutil.rmtree(run_dir, ignore_errors=True)
    cwd = Path.cwd().resolve()
    parent = run_dir.parent
    while parent != cwd and cwd in parent.parents and not any(parent.iterdir()):
        parent.rmdir()
        parent = parent.parent


def check_cache_writable(created_dir: str | Path | None = None) -> None:
    """Refuses (exit 2) when the cache root (``$CBOP_TORCHRL_CACHE``) cannot be created or written.

    Checked before any work, so a read-only cache is not found by a stage minutes in.
    ``created_dir``: as in :func:`refuse`.
    """
    root = cache_root()
    reason = unwritable_reason(root)
    if reason is not None:
        source = "$CBOP_TORCHRL_CACHE" if "CBOP_TORCHRL_CACHE" in os.environ else "the default"
        refuse(
            f"the cache directory {str(root)!r} ({source}) is not writable: {reason}. Point "
            "CBOP_TORCHRL_CACHE at a directory you can write to, e.g. "
            "CBOP_TORCHRL_CACHE=/tmp/cbop_cache",
            created_dir,
        )


def check_output_writable(
    key: str,
    value: str | Path,
    directory: str | Path | None = None,
    created_dir: str | Path | None = None,
) -> None:
    """Refuses (exit 2) when the output ``key=value`` cannot be written.

    ``directory``: the directory to create or write into (default: ``value`` itself;
    for an output file, its parent). ``created_dir``: as in :func:`refuse`.
    """
    reason = unwritable_reason(value if directory is None else directory)
    if reason is not None:
        refuse(
            f"{key}={value} cannot be written: {reason}; set {key}= to a path in a "
            "directory you can write to",
            created_dir,
        )


# --------------------------------------------------------------------- Hydra's errors, rephrased


def _plural(hint: Any) -> str:
    names = {int: "integers", float: "numbers", str: "strings", bool: "true/false values"}
    return names.get(hint, "values")


def describe_type(hint: Any) -> str:
    """What a value of the type ``hint`` looks like on the command line ("an integer")."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        rest = [a for a in args if a is not type(None)]
        text = " or ".join(describe_type(a) for a in rest)
        return f"null or {text}" if len(rest) < len(args) else text
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return "one of " + ", ".join(str(member.value) for member in hint)
    if origin in (list, tuple, Sequence) or hint in (list, tuple):
        return f"a list of {_plural(args[0]) if args else 'values'}"
    if origin in (dict, Mapping) or hint is dict:
        return "a mapping such as {key: value}"
    if dataclasses.is_dataclass(hint):
        return "a section with the keys " + ", ".join(f.name for f in dataclasses.fields(hint))
    simple = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
    return simple.get(hint, "any value")


def _command_line_value(value: Any) -> str:
    if isinstance(value, enum.Enum):
        return str(value.value)
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_command_line_value(v) for v in value) + "]"
    return str(value)


def _field(owner: Any, name: Any) -> tuple[Any, Any] | None:
    """``(type hint, default)`` of the dataclass field ``owner.name``; None if there is none."""
    if not (isinstance(owner, type) and dataclasses.is_dataclass(owner)) or not isinstance(
        name, str
    ):
        return None
    fields = {f.name: f for f in dataclasses.fields(owner)}
    if name not in fields:
        return None
    spec = fields[name]
    default = spec.default
    if spec.default_factory is not dataclasses.MISSING:
        default = spec.default_factory()
    if default is dataclasses.MISSING or default == MISSING:
        default = None
    return typing.get_type_hints(owner).get(name, Any), default


def _describe_bad_value(cause: OmegaConfBaseException, override: str) -> str:
    """``key=value: key must be <type>, e.g. key=<default>`` for a value the schema refused."""
    full_key = str(cause.full_key)
    detail = str(cause.msg).splitlines()[0].rstrip(".")
    element = re.fullmatch(r"(.*)\[(\d+)\]", full_key)
    if element is not None:  # one item of a list: the field is the list
        list_type = getattr(cause, "ref_type", None)
        item_types = typing.get_args(list_type)
        item_type = item_types[0] if item_types else Any
        return (
            f"{override}: {element[1]} must be a list of {_plural(item_type)}; item "
            f"{element[2]} ({cause.value!r}) is not {describe_type(item_type)} ({detail})"
        )
    found = _field(cause.object_type, cause.key)
    if found is None:
        return f"{override}: {full_key}: {detail}"
    hint, default = found
    example = ""
    if isinstance(default, (int, float, str, list, tuple)) and not isinstance(default, bool):
        example = f", e.g. {full_key}={_command_line_value(default)}"
    return f"{override}: {full_key} must be {describe_type(hint)}{example} ({detail})"


def _describe_unknown_key(cause: OmegaConfBaseException, override: str) -> str:
    full_key = str(cause.full_key)
    parent = full_key.rpartition(".")[0]
    owner = cause.object_type
    names = (
        [f.name for f in dataclasses.fields(owner)]
        if isinstance(owner, type) and dataclasses.is_dataclass(owner)
        else []
    )
    prefix = f"{parent}." if parent else ""
    if parent.endswith("gym_kwargs"):  # an open mapping: Hydra adds its keys only with "+"
        return (
            f"{override}: keyword arguments of gymnasium.make are added with a '+', one "
            f"override per argument: +{full_key}=<value>"
        )
    close = difflib.get_close_matches(str(cause.key), names, n=1)
    text = f"{override}: {full_key} is not a setting of this script"
    if close:
        text += f" (did you mean {prefix}{close[0]}?)"
    if names:
        where = f"of {parent}" if parent else "at the top level"
        text += f"; the keys {where} are {', '.join(names)}"
    return text


def _yaml_error(error: BaseException | None) -> BaseException | None:
    """The ``yaml.YAMLError`` ``error`` is or was raised from, if any."""
    import yaml

    seen = 0
    while error is not None and seen < 16:
        if isinstance(error, yaml.YAMLError):
            return error
        error, seen = error.__cause__ or error.__context__, seen + 1
    return None


def describe_yaml_error(error: BaseException) -> str:
    """One paragraph for a config file that is not plain YAML: the file, line and problem.

    A tag such as ``!!python/object/apply:os.system`` is refused by the safe loader that
    Hydra uses (nothing runs); the message says so instead of PyYAML's report.
    """
    mark = getattr(error, "problem_mark", None) or getattr(error, "context_mark", None)
    where = f"{mark.name!r}, line {mark.line + 1}" if mark is not None else "a config file"
    problem = str(getattr(error, "problem", None) or error).splitlines()[0].strip()
    if "constructor for the tag" in problem:
        tag = re.search(r"'([^']+)'", problem)
        return (
            f"the config file {where} uses the YAML tag {tag[1] if tag else ''!r}, which "
            "names a Python object to build; configs are read as plain YAML, so it was not "
            "run and the command stops here. Write the value itself (e.g. seed: 0) and run "
            "the command again."
        )
    return (
        f"the config file {where} is not valid YAML ({problem}); fix that line (or leave "
        "the file out of --config-dir) and run the command again."
    )


def describe_hydra_error(error: BaseException, config_name: str) -> str | None:
    """One paragraph for an error Hydra raised before the task ran; None when it is not bad input.

    Covers a value of the wrong type or not among the choices, an unknown key, an
    unknown config group option (``algo=sac``), an override Hydra cannot parse, and
    a run directory that cannot be created. Each message names the key and what
    it takes; ``configs/<config_name>.yaml`` lists every key with its meaning.
    """
    see = f"Every setting and its meaning: {config_file(config_name)}."
    if (yaml_error := _yaml_error(error)) is not None:
        return describe_yaml_error(yaml_error)
    if isinstance(error, MissingConfigException) and error.options:
        group, _, option = str(error.missing_cfg_file).rpartition("/")
        return (
            f"{group}={option}: there is no {group} called {option!r}; the choices are "
            f"{', '.join(error.options)}. {see}"
        )
    if isinstance(error, OverrideParseException):
        lines = [line.strip() for line in str(error).splitlines() if line.strip()]
        return f"cannot read a command-line override: {'; '.join(lines)}. {see}"
    if isinstance(error, ConfigCompositionException):
        first = str(error).splitlines()[0] if str(error) else ""
        match = re.match(r"(?:Error merging override|Could not override) '?([^'\n]*)'?", first)
        override = match[1].rstrip(".") if match else first
        if append := re.search(r"use \+(\S+)", str(error)):  # "Could not override 'foo'"
            override = append[1]
        cause = error.__cause__
        if isinstance(cause, OmegaConfBaseException) and getattr(cause, "full_key", None):
            if "not in" in str(cause.msg) and isinstance(cause, (KeyError, AttributeError)):
                return f"{_describe_unknown_key(cause, override)}. {see}"
            return f"{_describe_bad_value(cause, override)}. {see}"
        lines = [
            line.strip()
            for line in f"{error}\n{cause or ''}".splitlines()
            if line.strip() and not re.match(r"\s*(full_key|reference_type|object_type)", line)
        ]
        return f"{' '.join(lines)} {see}"
    if isinstance(error, InterpolationKeyError) and "hydra" in sys.argv[1:]:
        # --cfg hydra --resolve: Hydra resolves its own node alone, but the run directory
        # names the job's settings (${env}, ${preset}, ...), which that node does not hold.
        reason = str(error).splitlines()[0].rstrip(".")
        return (
            f"--cfg hydra --resolve cannot resolve Hydra's settings on their own: {reason} "
            "(hydra.run.dir and hydra.sweep.dir are built from the job's settings). Use "
            "--cfg all --resolve to see them resolved with the job's settings, or --cfg hydra "
            "without --resolve"
        )
    if isinstance(error, InterpolationResolutionError):
        return describe_interpolation_error(error)
    # Hydra's file logger that cannot open its log raises ValueError from the OSError
    while not isinstance(error, OSError) and (error.__cause__ or error.__context__) is not None:
        error = error.__cause__ or error.__context__
    if isinstance(error, OSError) and error.filename is not None:
        key = "hydra.sweep.dir" if {"-m", "--multirun"} & set(sys.argv[1:]) else "hydra.run.dir"
        return (
            f"cannot create the run directory or write in it: {error.strerror}: "
            f"{str(error.filename)!r}. Run "
            f"from a directory you can write to, or pass {key}=<a writable directory>"
        )
    return None


def describe_interpolation_error(error: OmegaConfBaseException) -> str:
    """One paragraph for a ``${...}`` in the config that cannot be resolved.

    On the command line ``seed='${seed}'`` refers to itself and ``${oc.env:NAME}`` to an
    environment variable that may be unset; OmegaConf's report is a long traceback.
    """
    reason = str(getattr(error, "msg", None) or error).splitlines()[0].rstrip(".")
    reason = reason.removeprefix("KeyError raised while resolving interpolation: ")
    given = [arg for arg in sys.argv[1:] if "${" in arg]
    where = ", ".join(given) if given else f"{getattr(error, 'full_key', None) or 'a setting'}"
    key = given[0].partition("=")[0].lstrip("+~") if given else "seed"
    example = f"{key}={'0' if key == 'seed' else '<value>'}"
    return (
        f"cannot resolve the interpolation in {where}: {reason}. On the command line, "
        "${other.key} takes another setting's value (never the key's own) and "
        "${oc.env:NAME} an environment variable, which must be set (or give a default: "
        f"${{oc.env:NAME,default}}); or give the value itself, e.g. {example}"
    )


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


def _sweep_dir(argv: Sequence[str]) -> Path | None:
    """The sweep directory a ``-m`` command line makes (``hydra.sweep.dir``, default
    ``multirun`` as in the configs), or None without ``-m``."""
    if not {"-m", "--multirun"} & set(argv):
        return None
    given = [arg.partition("=")[2] for arg in argv if arg.startswith("hydra.sweep.dir=")]
    return Path(given[-1] if given else "multirun")


OUTPUT_SETTINGS = {
    "config": "hydra.run.dir", "config_paper": "hydra.run.dir", "baseline": "hydra.run.dir",
    "evaluate": "output", "collect": "out_dir", "train_dynamics": "output_dir",
    "select_psi": "json", "report": "out",
}  # fmt: skip
"""The setting that chooses where each program writes (suggested when a write is refused)."""


def hydra_entry(
    config_name: str, uses_cache: bool = False, check_values: bool = True
) -> Callable[[Callable[[DictConfig], Any]], Callable[[], Any]]:
    """``hydra.main`` over :data:`CONFIG_DIR`, with one paragraph and exit code 2 for bad input.

    An error Hydra raises before the task function starts (a value of the wrong
    type, an unknown key or config group option, a run directory it cannot
    create) is bad input: it is printed by :func:`describe_hydra_error` and the
    command exits with 2. Failures inside the task function keep Hydra's report
    and their own exit codes. ``uses_cache``: the script writes under
    ``$CBOP_TORCHRL_CACHE``, which is then checked to be writable first thing.
    ``check_values``: refuse NaN numbers and empty strings (which the schema lets
    through) before the task; False where ``load_config`` reports them among every
    other problem.
    """
    register_schemas()

    def decorate(task_function: Callable[[DictConfig], Any]) -> Callable[[], Any]:
        started = False
        user_full_error = "HYDRA_FULL_ERROR" in os.environ
        raised_by_task: list[BaseException] = []

        @functools.wraps(task_function)
        def task(cfg: DictConfig) -> Any:
            nonlocal started
            started = True
            if not user_full_error:  # from here on Hydra reports failures its own way
                os.environ.pop("HYDRA_FULL_ERROR", None)
            run_dir = HydraConfig.get().runtime.output_dir
            remember_hydra_job(copy.deepcopy(cfg), HydraConfig.instance().cfg)
            set_output_setting(OUTPUT_SETTINGS.get(base_config_name(config_name)))
            keep_mujoco_log_out_of_cwd()
            try:  # a ${...} that cannot be resolved fails here, not in the middle of the work
                OmegaConf.to_container(cfg, resolve=True)
            except InterpolationResolutionError as error:
                refuse(describe_interpolation_error(error), run_dir)
            for key in ("threads", "num_threads"):
                if key in cfg:
                    cfg[key], note = capped_threads(cfg[key])
                    if note is not None:
                        print(f"note: {note}", file=sys.stderr)
            if extra := unknown_keys(cfg, CONFIG_SCHEMAS[base_config_name(config_name)]):
                refuse(
                    f"{', '.join(extra)}: not a setting of this script (added with +); see "
                    f"{config_file(config_name)} for every setting",
                    run_dir,
                )
            missing = sorted(OmegaConf.missing_keys(cfg))
            if missing:
                refuse(
                    f"{', '.join(missing)} must be given on the command line "
                    f"({' '.join(f'{key}=...' for key in missing)}); see "
                    f"{config_file(config_name)} for what each key holds",
                    run_dir,
                )
            if check_values and (problems := not_a_number_or_empty(config_values(cfg))):
                refuse("; ".join(problems), run_dir)
            # every numeric setting against its range (config.SETTING_RANGES), before any work
            # (cbop-train and cbop-baseline: load_config, with every other problem at once)
            if check_values and (problems := range_problems(config_values(cfg))):
                refuse("; ".join(problems), run_dir)
            if uses_cache:
                check_cache_writable(run_dir)
            lines = resolve_progress(cfg)
            try:
                result = task_function(cfg)
            except Exception as error:
                if raised_while_interrupted(error):
                    raise KeyboardInterrupt from None
                if is_disk_full(error):  # wherever it happened: one message, exit 2
                    refuse(as_disk_full_error(error, run_dir), run_dir)
                if isinstance(error, ForeignFileError):  # a file no program of ours wrote
                    refuse(error, run_dir)
                if (refused := refused_write(error)) is not None:  # read-only, no permission
                    refuse(refused, run_dir)
                if is_out_of_memory(error):  # past the estimate (memory.py): no traceback
                    refuse(out_of_memory_message(error), run_dir)
                raised_by_task.append(error)
                raise
            finally:
                if lines is not None:
                    lines.close_bars()
                    sys.stderr = lines.stream
            if not user_full_error and not raised_by_task:
                # A multirun composes its next job's config after this job ends: raised
                # (not reported by Hydra), a bad value there is refused like the first job's.
                os.environ["HYDRA_FULL_ERROR"] = "1"
            return result

        hydra_main = hydra.main(
            config_path=str(CONFIG_DIR), config_name=config_name, version_base="1.3"
        )(task)

        @functools.wraps(task_function)
        def main() -> Any:
            # Hydra prints a composition error over several lines (with OmegaConf's
            # reference_type/object_type) and exits with 1. HYDRA_FULL_ERROR, Hydra's
            # public switch, makes it raise the error instead, so it can be rephrased;
            # the task function switches it off again before any work.
            if not user_full_error:
                os.environ["HYDRA_FULL_ERROR"] = "1"
            sweep_dir = _sweep_dir(sys.argv[1:])
            new_sweep_dir = sweep_dir is not None and not sweep_dir.exists()

            def remove_refused_sweep_dir() -> None:
                # A multirun whose first job's values were refused wrote only multirun.yaml.
                if (
                    new_sweep_dir
                    and sweep_dir.is_dir()
                    and {p.name for p in sweep_dir.iterdir()} <= {"multirun.yaml"}
                ):
                    shutil.rmtree(sweep_dir)

            try:
                help_args = help_arguments(sys.argv[1:])
                if help_args is not None and print_help(config_name, task, help_args):
                    sys.exit(0)  # as Hydra after its help
                return hydra_main()
            except KeyboardInterrupt:
                interrupted(config_name)
            except SystemExit as exit_:
                if exit_.code == 1 and not started:
                    sys.exit(EXIT_BAD_INPUT)
                if exit_.code == EXIT_BAD_INPUT:
                    remove_refused_sweep_dir()
                raise
            except Exception as error:
                # Raised here: Hydra's own failure before a job (a task's failure is reported
                # by Hydra, HYDRA_FULL_ERROR being off while and after it runs).
                from_task = any(error is raised for raised in raised_by_task)
                message = None
                if not (from_task or user_full_error):
                    message = describe_hydra_error(error, config_name)
                if message is None:
                    raise
                remove_refused_sweep_dir()
                refuse(message)
            finally:
                if not user_full_error:
                    os.environ.pop("HYDRA_FULL_ERROR", None)

        return main

    return decorate


# ---------------------------------------------------------------------------------- --help
# Hydra's own --help (``Hydra.app_help``) fills every variable of the help template, and for
# $APP_CONFIG_GROUPS and $HYDRA_CONFIG_GROUPS it lists each config group's options, which
# deep-copies its config repository once per group: about 13 s per --help on the 2-core
# development machine, although the programs' templates (``hydra.help.template`` in
# configs/*.yaml) use only $CONFIG. So the entry point composes the config and prints the
# template itself, as ``app_help`` does; a template that names any other variable still gets
# Hydra's path.


def help_arguments(argv: Sequence[str]) -> argparse.Namespace | None:
    """Hydra's reading of ``argv`` when it asks for the program's ``--help`` (``-h``) with the
    program's own config, else None (also for a command line Hydra refuses: Hydra reports it)."""
    if not any(word.startswith("-") for word in argv):
        return None
    from hydra._internal.utils import get_args_parser  # the parser of hydra.main

    try:
        with contextlib.redirect_stderr(io.StringIO()):
            args = get_args_parser().parse_args(list(argv))
    except SystemExit:
        return None
    own_config = args.config_path is None and args.config_name is None and args.config_dir is None
    if args.help and not args.hydra_help and args.experimental_rerun is None and own_config:
        return args
    return None


def template_variables(template: string.Template) -> set[str] | None:
    """The ``$NAME`` variables ``template`` uses; None when it has a ``$`` that is not valid."""
    names: set[str] = set()
    for match in template.pattern.finditer(template.template):
        if match["invalid"] is not None:
            return None
        if name := match["named"] or match["braced"]:
            names.add(name)
    return names


def print_help(config_name: str, task: Callable[..., Any], args: argparse.Namespace) -> bool:
    """Prints the program's ``--help`` as ``hydra.main`` would (``Hydra.app_help``: the same
    composition, overrides and ``--resolve``); False, printing nothing, when the help
    template uses more than ``$CONFIG`` (left to Hydra then)."""
    from hydra._internal.utils import (
        detect_calling_file_or_module_from_task_function,
        detect_task_name,
    )
    from hydra.core.global_hydra import GlobalHydra
    from hydra.types import RunMode

    job_name = detect_task_name(*detect_calling_file_or_module_from_task_function(task))
    with hydra.initialize_config_dir(str(CONFIG_DIR), job_name=job_name, version_base="1.3"):
        cfg = GlobalHydra.instance().hydra.compose_config(  # as app_help composes it
            config_name, args.overrides, run_mode=RunMode.RUN, with_log_configuration=True
        )
        template = string.Template(cfg.hydra.help.template)
        if template_variables(template) not in ({"CONFIG"}, set()):
            return False
        HydraConfig.instance().set_config(cfg)
        job = copy.deepcopy(cfg)
        with flag_override(job, ["struct", "readonly"], [False, False]):
            del job["hydra"]
        print(template.substitute(CONFIG=OmegaConf.to_yaml(job, resolve=args.resolve)))
    return True


def resolve_progress(cfg: DictConfig) -> ProgressLines | None:
    """Turns ``progress: null`` (the default) into bars that suit where stderr goes.

    On a terminal: live bars (``progress=true``). Otherwise (a file, a pipe, ``nohup``, a
    cluster job): bars too, but ``sys.stderr`` becomes a :class:`ProgressLines` that keeps a
    few whole lines per bar; it is returned so the caller restores ``sys.stderr`` after the
    task. An explicit ``progress=true|false`` is left as it is (None returned).
    """
    if "progress" not in cfg or cfg.progress is not None:
        return None
    cfg.progress = True
    if sys.stderr.isatty():
        return None
    lines = ProgressLines(sys.stderr)
    sys.stderr = lines
    return lines


def raised_while_interrupted(error: BaseException) -> bool:
    """Whether ``error`` was raised while a KeyboardInterrupt was being handled.

    Some context managers fail on their way out of an interrupt (tensordict's
    parameter swap raises "Converting a tensordict to boolean value is not permitted"),
    which would hide the Ctrl-C behind their own error.
    """
    seen: set[int] = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, KeyboardInterrupt):
            return True
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return False


def interrupted(config_name: str) -> NoReturn:
    """Ctrl-C (SIGINT): one line saying how to go on, and exit code 130 (128 + SIGINT)."""
    program = running_program()
    start = [program_command(program)] if program else [sys.executable, sys.argv[0]]
    command = shlex.join([*start, *sys.argv[1:]])
    if config_name in RESUMABLE_CONFIGS:
        how = f"resume with the same command (it continues from the last checkpoint): {command}"
    else:
        how = f"run the same command to start again: {command}"
    print(f"\ninterrupted; {how}", file=sys.stderr)
    sys.exit(EXIT_INTERRUPTED)


def run_entry(main: Callable[[], Any], argv: Sequence[str] | None = None) -> int:
    """Runs a :func:`hydra_entry` program in this process and returns its exit code.

    ``argv``: the command-line arguments (Hydra overrides and flags such as
    ``-m`` or ``--cfg job``); None reads them from ``sys.argv`` like a console
    script. For callers that want a code rather than ``SystemExit`` (tests).
    """
    saved = sys.argv
    if argv is not None:
        sys.argv = [saved[0] if saved else "cbop", *argv]
    try:
        main()
    except SystemExit as exit_:
        code = exit_.code
        return code if isinstance(code, int) else (0 if code is None else 1)
    finally:
        sys.argv = saved
    return 0


HYDRA_FLAGS_WITH_VALUE = frozenset(
    ("--cfg", "-c", "--package", "-p", "--info", "-i", "--config-path", "-cp",
     "--config-name", "-cn", "--config-dir", "-cd", "--experimental-rerun")
)  # fmt: skip
"""Hydra's command-line flags that take the next word as their value."""


def translate_old_arguments(
    argv: Sequence[str], positional: str, options: Mapping[str, str]
) -> list[str] | None:
    """Hydra overrides for a command line in the argparse syntax a program had before.

    ``positional``: the key the positional arguments become (``sweep_dir``; a
    list ``[a,b]`` when there are several); ``options``: ``--flag`` -> the key it sets, or
    ``key=value`` for a flag without a value (``--no-progress`` ->
    ``progress=false``). Returns None when ``argv`` has nothing in the old
    syntax; Hydra's own flags and ``key=value`` words are kept as they are.
    """
    words: list[str] = []
    paths: list[str] = []
    changed = False
    index = 0
    while index < len(argv):
        arg = argv[index]
        index += 1
        name, equals, value = arg.partition("=")
        if arg in HYDRA_FLAGS_WITH_VALUE:
            words.append(arg)
            if index < len(argv) and "=" not in argv[index] and not argv[index].startswith("-"):
                words.append(argv[index])
                index += 1
        elif name in options:
            changed = True
            if "=" in options[name]:
                words.append(options[name])
                continue
            if not equals and index < len(argv):
                value = argv[index]
                index += 1
            words.append(f"{options[name]}={override_value(value)}")
        elif not arg.startswith("-") and not equals:
            changed = True
            paths.append(arg)
        else:
            words.append(arg)
    if not changed:
        return None
    if paths:
        values = [override_value(path) for path in paths]
        joined = values[0] if len(values) == 1 else f"[{','.join(values)}]"
        words.insert(0, f"{positional}={joined}")
    return words


def refuse_old_arguments(
    argv: Sequence[str],
    program: str,
    config_name: str,
    positional: str,
    options: Mapping[str, str],
) -> None:
    """Refuses (exit 2) a command line in the program's old argparse syntax, printing the
    same command in ``key=value`` overrides (:func:`translate_old_arguments`)."""
    translated = translate_old_arguments(argv, positional, options)
    if translated is None:
        return
    refuse(
        f"{program} takes key=value settings (Hydra overrides), not bare paths and --options; "
        f"the same command: {program_command(program)} {shlex.join(translated)}. Every "
        f"setting and its meaning: {config_file(config_name)}"
    )
