"""Generates the configuration reference (docs/configuration.md) from the config schema.

Every program's typed schema (``cbop_torchrl.cli.CONFIG_SCHEMAS``, dataclasses) gives the keys,
their types, choices and defaults; the comment next to a key in the program's YAML file
(``cbop_torchrl/configs/<name>.yaml``), or else next to the dataclass field, gives its
description. The config groups (``preset/``, ``logger/``, ``algo/``, ...) are listed from their
YAML files. The docs build runs this (``docs/_tools/hooks.py``), so the page cannot drift from
the code; ``tests/test_docs_config_reference.py`` checks that every key has a row.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import re
import typing
from pathlib import Path
from typing import Any

from omegaconf import MISSING, OmegaConf

from cbop_torchrl import cli

CONFIGS = cli.CONFIG_DIR
PROGRAMS = {  # primary config -> the console script and the script that compose it
    "config": "`cbop-train` (`scripts/cbop.py`)",
    "config_paper": "`cbop-train` with `preset=paper` or a D4RL id (`scripts/cbop.py`)",
    "baseline": "`cbop-baseline` (`scripts/baseline.py`)",
    "evaluate": "`cbop-evaluate` (`scripts/evaluate.py`)",
    "collect": "`cbop-collect` (`scripts/collect.py`)",
    "train_dynamics": "`cbop-train-dynamics` (`scripts/train_dynamics.py`)",
    "select_psi": "`cbop-select-psi` (`scripts/select_psi.py`)",
    "report": "`cbop-report` (`scripts/report.py`)",
    "score": "`cbop-score` (`scripts/score.py`)",
}
KEY_LINE = re.compile(
    r"^(?P<indent>\s*)(?P<key>[A-Za-z_][\w\-]*):(?P<value>[^#]*?)\s*(#\s*(?P<comment>.*))?$"
)


def yaml_comments(path: Path) -> dict[str, str]:
    """Dotted key -> the comment on its line (or the comment lines right above it).

    A comment line indented deeper than the next key continues the comment of the key before
    it (a wrapped description); one at the next key's own indent is that key's comment above.
    """
    comments: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    pending: list[tuple[int, str]] = []  # (column of '#', text) since the last key line
    last_dotted = ""

    def continue_last_key(deeper_than: int) -> None:
        wrapped = [text for column, text in pending if column > deeper_than]
        if wrapped and last_dotted in comments:
            comments[last_dotted] = " ".join([comments[last_dotted], *wrapped])

    for line in path.read_text().splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            if not stripped.startswith("# @package"):
                pending.append((len(line) - len(line.lstrip()), stripped.lstrip("#").strip()))
            continue
        match = KEY_LINE.match(line)
        if not match or stripped.startswith("-"):
            pending = []
            continue
        indent = len(match["indent"])
        continue_last_key(indent)
        above = [text for column, text in pending if column <= indent]
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, match["key"]))
        dotted = ".".join(key for _, key in stack)
        comment = match["comment"] or (" ".join(above) if indent > 0 else "")
        if comment:
            comments[dotted] = comment
        last_dotted = dotted
        pending = []
    continue_last_key(0)  # the file's last key
    return comments


def field_comments(schema: type) -> dict[str, str]:
    """Field name -> the comment on its line in the dataclass's source (and its bases')."""
    comments: dict[str, str] = {}
    for klass in reversed(schema.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        for line in inspect.getsource(klass).splitlines():
            match = re.match(r"^\s+(\w+):[^#]*#\s*(.+)$", line)
            if match:
                comments[match[1]] = match[2]
    return comments


def type_name(hint: Any) -> str:
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if isinstance(hint, type) and issubclass(hint, enum.Enum):
        return " \\| ".join(f"`{member.value}`" for member in hint)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        named = [type_name(arg) for arg in args if arg is not type(None)]
        return " or ".join(named) + (" or null" if type(None) in args else "")
    if origin in (list, tuple):
        return f"list of {type_name(args[0])}" if args else "list"
    if origin is dict:
        return "mapping"
    if dataclasses.is_dataclass(hint):
        return "section"
    return getattr(hint, "__name__", str(hint))


def show(value: Any) -> str:
    if value is MISSING or value == "???":
        return "required"
    if isinstance(value, enum.Enum):
        value = value.value
    if isinstance(value, list | tuple | dict):
        text = OmegaConf.to_yaml({"v": value}).split(":", 1)[1].strip()
        text = (
            text
            if not text.startswith("-")
            else "[" + ", ".join(item.lstrip("- ").strip() for item in text.splitlines()) + "]"
        )
    else:
        text = "null" if value is None else OmegaConf.to_yaml({"v": value})[3:].strip()
    return f"`{text}`" if text else "`''`"


def schema_rows(schema: type, yaml: dict[str, str], prefix: str = "") -> list[tuple[str, ...]]:
    """(key, type, default, description) for every key of ``schema``, sections first-level."""
    rows = []
    hints = typing.get_type_hints(schema)
    own = field_comments(schema)
    node = OmegaConf.structured(schema)
    for field in dataclasses.fields(schema):
        key, hint = prefix + field.name, hints[field.name]
        if dataclasses.is_dataclass(hint):
            doc = (inspect.getdoc(hint) or "").split("\n\n")[0].replace("\n", " ")
            rows.append((key, "section", "", yaml.get(key) or doc))
            rows += schema_rows(hint, yaml, key + ".")
            continue
        default = OmegaConf.to_container(node, resolve=False).get(field.name)
        if field.default is MISSING:
            default = MISSING
        description = yaml.get(key) or own.get(field.name, "")
        rows.append((key, type_name(hint), show(default), description))
    return rows


def schema_keys(schema: type, prefix: str = "") -> list[str]:
    """Every dotted key of a schema (sections included), for the test."""
    keys = []
    for field in dataclasses.fields(schema):
        hint = typing.get_type_hints(schema)[field.name]
        keys.append(prefix + field.name)
        if dataclasses.is_dataclass(hint):
            keys += schema_keys(hint, prefix + field.name + ".")
    return keys


def flat(values: Any, prefix: str = "") -> dict[str, Any]:
    if not isinstance(values, dict) or not values:
        return {prefix.rstrip("."): values}
    out: dict[str, Any] = {}
    for key, value in values.items():
        if key == "defaults":
            continue
        out.update(flat(value, f"{prefix}{key}."))
    return out


def group_files() -> list[Path]:
    return sorted(path for path in CONFIGS.rglob("*.yaml") if path.parent != CONFIGS)


def escape(cell: str) -> str:
    """A table cell: one line, its ``|`` escaped (already escaped ones kept)."""
    return re.sub(r"(?<!\\)\|", r"\\|", cell.replace("\n", " ").replace("<", "&lt;"))


def table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        lines.append("| " + " | ".join(escape(cell) for cell in row) + " |")
    return lines


def generate() -> str:
    lines = [
        "# Configuration reference",
        "",
        "Generated at build time from the typed schema (`cbop_torchrl/cli.py`, "
        "`cbop_torchrl/config.py`) and the YAML files in `cbop_torchrl/configs/` by "
        "`docs/_tools/config_reference.py`: do not edit this page, edit the comment next to "
        "the key in the YAML file (or the dataclass field).",
        "",
        "Every key is set on the command line as `key=value` (`estimator.psi=0.5`); "
        "`--cfg job` prints the composed config without running anything. A `null` in a "
        "paper-table field means *the paper's value for this dataset*. The defaults below are "
        "the schema's; the program's YAML file and then the preset (for `cbop-train` and "
        "`cbop-baseline`) set the sizes, listed under [Config groups](#config-groups).",
        "",
    ]
    for name, program in PROGRAMS.items():
        schema = cli.CONFIG_SCHEMAS[name]
        path = CONFIGS / f"{name}.yaml"
        lines += [f"## {name}.yaml", "", f"{program}; schema `{schema.__name__}`.", ""]
        yaml = yaml_comments(path)
        if name == "baseline":  # baseline.yaml includes config.yaml: its comments apply
            yaml = {**yaml_comments(CONFIGS / "config.yaml"), **yaml}
        if name in ("config", "baseline"):  # and dynamics/default.yaml's, under dynamics.
            dynamics = yaml_comments(CONFIGS / "dynamics" / "default.yaml")
            yaml = {**{f"dynamics.{k}": v for k, v in dynamics.items()}, **yaml}
        if name == "config_paper":
            values = flat(OmegaConf.to_container(OmegaConf.load(path), resolve=False))
            rows = [(f"`{key}`", show(value), yaml.get(key, "")) for key, value in values.items()]
            lines += ["The `cbop-train` keys above; this file sets:", ""]
            lines += table(("key", "value", "description"), rows) + [""]
            continue
        rows = [
            (f"`{key}`", kind, default, description)
            for key, kind, default, description in schema_rows(schema, yaml)
        ]
        lines += table(("key", "type", "default", "description"), rows) + [""]
    lines += [
        "## Config groups",
        "",
        "Chosen with `group=option` (`preset=debug`, `logger=wandb`, `algo=iql`, "
        "`+sweep=psi_grid`, `hydra/launcher=slurm`); each option's file sets these keys.",
        "",
    ]
    for path in group_files():
        option = path.relative_to(CONFIGS).with_suffix("").as_posix()
        group, _, choice = option.rpartition("/")
        text = path.read_text()
        header = [
            line.lstrip("#").strip()
            for line in text.splitlines()
            if line.startswith("#") and "@package" not in line
        ]
        values = flat(OmegaConf.to_container(OmegaConf.load(path), resolve=False))
        comments = yaml_comments(path)
        lines += [f"### {group}={choice}", ""]
        if header:
            lines += [" ".join(header), ""]
        rows = [(f"`{key}`", show(value), comments.get(key, "")) for key, value in values.items()]
        lines += table(("key", "value", "description"), rows) + [""]
    return "\n".join(lines)


if __name__ == "__main__":
    print(generate())
