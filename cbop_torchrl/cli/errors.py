"""Hydra's, OmegaConf's and YAML's errors, rephrased as one paragraph each.

Each message names the key, what it takes and an example, and ends with the YAML file that
lists every setting of the program (:func:`describe_hydra_error`); the entry point
(:func:`cbop_torchrl.cli.hydra_entry`) prints it and exits with code 2.
"""

from __future__ import annotations

import dataclasses
import difflib
import enum
import re
import sys
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any

from hydra.errors import ConfigCompositionException, MissingConfigException, OverrideParseException
from omegaconf import MISSING
from omegaconf.errors import (
    InterpolationKeyError,
    InterpolationResolutionError,
    OmegaConfBaseException,
)

from cbop_torchrl.cli.schemas import config_file


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
