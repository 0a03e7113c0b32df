"""Generates the configuration reference (docs/configuration.md) from the config schema.

Every program's typed schema (``cbop_torchrl.cli.CONFIG_SCHEMAS``, dataclasses) gives the keys,
their types, choices and defaults. A key's description is the comment next to it in the
program's YAML file (``cbop_torchrl/configs/<name>.yaml``), else the dataclass field's: the
comment on its line, the comment lines right above it, or its entry in the class docstring's
``Attributes:``. A config group option's key (``preset/``, ``logger/``, ``algo/``, ...) has its
file's comment, else the program's description of that key. A null says what it becomes: a
table-fed key's resolution is written from :mod:`cbop_torchrl.config.paper`'s tables, others
say it in their description (or share their section's ``null: ...``). The docs build runs this
(``docs/_tools/hooks.py``), so the site cannot drift from the code;
``tests/test_docs_config_reference.py`` checks that every key has a row and a description,
every null is explained, and the committed page is the generated one.
"""

from __future__ import annotations

import dataclasses
import enum
import inspect
import re
import sys
import typing
from pathlib import Path
from typing import Any

from omegaconf import MISSING, OmegaConf

# The page documents the checkout it sits in, whichever copy of the package the environment
# installed (an editable install may point at another checkout).
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from cbop_torchrl import cli  # noqa: E402
from cbop_torchrl.config import paper  # noqa: E402

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
    last_indent = 0

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
            continue_last_key(last_indent)  # a wrapped comment that a blank line ends
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
        last_dotted, last_indent = dotted, indent
        pending = []
    continue_last_key(0)  # the file's last key
    return comments


def class_comments(klass: type) -> dict[str, str]:
    """Field name -> its description in one dataclass's own source.

    The comment on the field's line, else the comment lines right above it (a block that
    runs up to the field), else its entry in the class docstring's ``Attributes:`` section
    (``name: text`` or ``a, b: text``, continued on deeper-indented lines).
    """
    comments: dict[str, str] = {}
    block: list[str] = []
    for line in inspect.getsource(klass).splitlines()[1:]:
        stripped = line.strip()
        if stripped.startswith("#"):
            block.append(stripped.lstrip("#").strip())
            continue
        match = re.match(r"^\s+(\w+):[^#]*?(#\s*(?P<comment>.+))?$", line)
        if match and not stripped.startswith(("def ", "@", '"')):
            text = match["comment"] or " ".join(block)
            if text:
                comments[match[1]] = text
        block = []
    attributes = (inspect.getdoc(klass) or "").partition("Attributes:")[2]
    for names, text in re.findall(r"^ {4}([\w, ]+): (.+(?:\n {5,}.+)*)", attributes, re.M):
        for name in names.split(","):
            comments.setdefault(name.strip(), " ".join(text.split()))
    return comments


def field_comments(schema: type) -> dict[str, str]:
    """Field name -> its description in the dataclass's source (a subclass's wins)."""
    comments: dict[str, str] = {}
    for klass in reversed(schema.__mro__):
        if dataclasses.is_dataclass(klass):
            comments.update(class_comments(klass))
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


NULL_CLAUSE = re.compile(r"\bnull(?: means|:)\s*([^;|()]+)", re.I)
"""A section comment's "null: ..." clause, which its keys that do not say their own share."""


def schema_rows(
    schema: type, yaml: dict[str, str], prefix: str = "", section_null: str = ""
) -> list[tuple[str, ...]]:
    """(key, type, default, description) for every key of ``schema``, sections first-level.

    A null key whose description does not say what null means gets its section's
    ``null: ...`` clause (``task:  # ... (null: from the dataset's known family)``).
    """
    rows = []
    hints = typing.get_type_hints(schema)
    own = field_comments(schema)
    node = OmegaConf.structured(schema)
    for field in dataclasses.fields(schema):
        key, hint = prefix + field.name, hints[field.name]
        if dataclasses.is_dataclass(hint):
            doc = (inspect.getdoc(hint) or "").split("\n\n")[0].replace("\n", " ")
            description = yaml.get(key) or doc
            clause = NULL_CLAUSE.search(description)
            rows.append((key, "section", "", description))
            rows += schema_rows(hint, yaml, key + ".", clause[1].strip() if clause else "")
            continue
        default = OmegaConf.to_container(node, resolve=False).get(field.name)
        if field.default is MISSING:
            default = MISSING
        description = yaml.get(key) or own.get(field.name, "")
        if yaml.get(key, "").startswith("null:") and own.get(field.name):  # says null alone
            description = f"{own[field.name]}; {yaml[key]}"
        if default is None and section_null and "null" not in description.lower():
            description = f"{description.rstrip('.')} (null: {section_null})".lstrip()
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
    """A table cell: one line, its ``|`` escaped (already escaped ones kept) and ``<`` outside
    code spans written as ``&lt;`` (Markdown shows a code span's text as it is)."""
    pieces = re.split(r"(`[^`]*`)", " ".join(cell.split()))
    text = "".join(p if p.startswith("`") else p.replace("<", "&lt;") for p in pieces)
    return re.sub(r"(?<!\\)\|", r"\\|", text)


def table(header: tuple[str, ...], rows: list[tuple[str, ...]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        lines.append("| " + " | ".join(escape(cell) for cell in row) + " |")
    return lines


HYDRA_KEYS = {
    "hydra.sweep.dir": "the multirun's folder: one run directory per combination of the swept "
    "values",
    "hydra.launcher.n_jobs": "runs at once (joblib worker processes)",
    "hydra.launcher.tasks_per_node": "Slurm tasks per node: one run per task",
    "hydra.launcher.nodes": "nodes per run",
    "hydra.launcher.partition": "Slurm partition (null: the cluster's default)",
    "hydra.launcher.account": "Slurm account to charge (null: the user's default)",
    "hydra.launcher.qos": "Slurm quality of service (null: the partition's default)",
    "hydra.launcher.constraint": "Slurm node features required, e.g. a100 (null: any node)",
    "hydra.launcher.ray.remote.num_cpus": "CPU cores Ray reserves per run",
}
"""Hydra's and its launcher plugins' own keys that the group files set (their schemas are the
plugins'); ``hydra.sweeper.params.<key>`` is described by :func:`group_description`."""

GROUP_PACKAGE = {"preset": "", "sweep": "", "hydra/launcher": "hydra.launcher."}
"""Where a group's keys sit in the composed config (``# @package``); other groups: their name."""


def _plain(text: str) -> str:
    """A docstring's reStructuredText code (````x````) and roles (``:func:`x```) as Markdown
    code (```x```)."""
    text = re.sub(r":\w+:`~?([^`]+)`", r"`\1`", text)
    return re.sub(r"``([^`]+)``", r"`\1`", text)


def null_resolution(key: str) -> str | None:
    """What a null ``key`` of the paper's table (:mod:`cbop_torchrl.config.paper`) becomes."""
    if key in paper.PAPER_SHARED:
        return f"null: the paper's {paper.PAPER_SHARED[key]} (`PAPER_SHARED`, config/paper.py)"
    if key == "agent.num_qvalue_nets":
        special = ", ".join(f"{n} for {family}" for family, n in paper.PAPER_QVALUE_NETS.items())
        return (
            f"null: the paper's M, {special}, {paper.PAPER_DEFAULT_QVALUE_NETS} otherwise "
            "(`PAPER_QVALUE_NETS`, config/paper.py)"
        )
    if key == "estimator.psi":
        from cbop_torchrl.evaluation.headline import SETS

        copies = {name: copy for copy, name in paper.SAME_FILE_AS.items()}
        # The benchmark's set order, not the dict's: a test that deletes and restores an
        # entry (monkeypatch.delitem) moves it to the end for the rest of its worker.
        order = {name: index for index, name in enumerate(SETS)}
        names = sorted(paper.GENERATED_PSI, key=lambda name: (order.get(name, len(order)), name))
        chosen = ", ".join(
            f"{name} {paper.GENERATED_PSI[name]:g}"
            + (f" (also {copies[name]})" if name in copies else "")
            for name in names
        )
        example = paper.PAPER_PSI["hopper"]["medium-replay"]
        return (
            f"null: this project's FQE choice on a generated set (`GENERATED_PSI`: {chosen}), "
            "else the paper's psi for the family and kind in the dataset's name (`PAPER_PSI`, "
            f"e.g. hopper-medium-replay {example:g}); config/paper.py"
        )
    return None


def with_resolution(key: str, value: str, description: str) -> str:
    """``description`` with what a null ``value`` of a table-fed ``key`` resolves to (in
    place of a hand-written null clause, which the generated one keeps from going stale)."""
    resolution = null_resolution(key) if value == "`null`" else None
    if resolution is None:
        return description
    hand = re.sub(r"\s*\(null:[^()]*\)|(?:^|;\s*)null:[^;]*", "", description).strip(" ;.")
    return f"{hand}; {resolution}" if hand else resolution


def group_description(key: str, comment: str, described: dict[str, str]) -> str:
    """A group file's key: its own comment, else the program's description of that key."""
    if comment:
        return comment
    if key.startswith("hydra.sweeper.params."):
        swept = key.removeprefix("hydra.sweeper.params.")
        return f"the values of `{swept}` the multirun sweeps, one run each"
    return described.get(key) or HYDRA_KEYS.get(key, "")


def program_rows(name: str) -> list[tuple[str, ...]]:
    """(key, type, default, description) rows of one program's table."""
    path = CONFIGS / f"{name}.yaml"
    yaml = yaml_comments(path)
    if name == "baseline":  # baseline.yaml includes config.yaml: its comments apply
        yaml = {**yaml_comments(CONFIGS / "config.yaml"), **yaml}
    if name in ("config", "baseline", "train_dynamics"):  # and dynamics/default.yaml's
        dynamics = yaml_comments(CONFIGS / "dynamics" / "default.yaml")
        yaml = {**{f"dynamics.{k}": v for k, v in dynamics.items()}, **yaml}
    return [
        (key, kind, default, _plain(description))
        for key, kind, default, description in schema_rows(cli.CONFIG_SCHEMAS[name], yaml)
    ]


class Table(typing.NamedTuple):
    """One table of the page: its heading, the text above it, its columns and rows.

    ``rows`` are (key, ..., description) with the key unquoted and the value or default as
    :func:`show` writes it in the second-last-but-one or second column.
    """

    heading: str
    intro: list[str]
    header: tuple[str, ...]
    rows: list[tuple[str, ...]]


def program_tables() -> tuple[list[Table], dict[str, str]]:
    """One table per program's primary config (``configs/<name>.yaml``), and cbop-train's
    and cbop-baseline's descriptions by dotted key (for the config groups' tables)."""
    tables = []
    described: dict[str, str] = {}  # dotted key -> cbop-train's (or the baseline's) text
    for name, program in PROGRAMS.items():
        schema = cli.CONFIG_SCHEMAS[name]
        intro = [f"{program}; schema `{schema.__name__}`."]
        if name == "config_paper":
            path = CONFIGS / f"{name}.yaml"
            yaml = yaml_comments(path)
            values = flat(OmegaConf.to_container(OmegaConf.load(path), resolve=False))
            rows = [
                (key, show(value), group_description(key, yaml.get(key, ""), described))
                for key, value in values.items()
            ]
            intro.append("The `cbop-train` keys above; this file sets:")
            tables.append(Table(f"{name}.yaml", intro, ("key", "value", "description"), rows))
            continue
        rows = program_rows(name)
        if name in ("config", "baseline"):  # cbop-train's text first (the presets are its)
            described = {**{key: text for key, _, _, text in rows}, **described}
        rows = [(key, *rest, with_resolution(key, rest[-1], text)) for key, *rest, text in rows]
        header = ("key", "type", "default", "description")
        tables.append(Table(f"{name}.yaml", intro, header, rows))
    return tables, described


def group_tables(described: dict[str, str]) -> list[Table]:
    """One table per config group option (``configs/<group>/<option>.yaml``)."""
    tables = []
    for path in group_files():
        option = path.relative_to(CONFIGS).with_suffix("").as_posix()
        group, _, choice = option.rpartition("/")
        header = [
            line.lstrip("#").strip()
            for line in path.read_text().splitlines()
            if line.startswith("#") and "@package" not in line
        ]
        values = flat(OmegaConf.to_container(OmegaConf.load(path), resolve=False))
        comments = yaml_comments(path)
        package = GROUP_PACKAGE.get(group, f"{group}.")
        rows = []
        for key, value in values.items():
            text = group_description(package + key, comments.get(key, ""), described)
            rows.append((key, show(value), with_resolution(package + key, show(value), text)))
        intro = [" ".join(header)] if header else []
        tables.append(Table(f"{group}={choice}", intro, ("key", "value", "description"), rows))
    return tables


def reference_tables() -> list[Table]:
    """Every table of the page, in its order: the programs', then the config groups'."""
    programs, described = program_tables()
    return programs + group_tables(described)


def undescribed(tables: list[Table]) -> list[str]:
    """``table: key`` of every row with no description."""
    return [f"{t.heading}: {key}" for t in tables for key, *row in t.rows if not row[-1].strip()]


def unexplained_nulls(tables: list[Table]) -> list[str]:
    """``table: key`` of every null default or value whose description does not say what
    null means (the word ``null`` in it)."""
    return [
        f"{t.heading}: {key}"
        for t in tables
        for key, *row in t.rows
        if row[-2] == "`null`" and "null" not in row[-1].lower()
    ]


def generate() -> str:
    lines = [
        "# Configuration reference",
        "",
        "Generated from the typed schemas (`cbop_torchrl/cli/schemas.py`, "
        "`cbop_torchrl/config/sections.py`) and the YAML files in `cbop_torchrl/configs/` by "
        "`docs/_tools/config_reference.py`: do not edit this page; edit the comment next to "
        "the key in the YAML file, or the dataclass field's comment.",
        "",
        "Every key is set on the command line as `key=value` (`estimator.psi=0.5`); "
        "`--cfg job` prints the composed config without running anything. The defaults below "
        "are the schema's; the program's YAML file and then the preset (for `cbop-train` and "
        "`cbop-baseline`) set the sizes, listed under [Config groups](#config-groups). Each "
        "`null` says what it becomes.",
        "",
    ]
    groups_started = False
    for table_ in reference_tables():
        if "=" in table_.heading and not groups_started:  # the first config group's table
            groups_started = True
            lines += [
                "## Config groups",
                "",
                "Chosen with `group=option` (`preset=debug`, `logger=wandb`, `algo=iql`, "
                "`+sweep=psi_grid`, `hydra/launcher=slurm`); each option's file sets these keys.",
                "",
            ]
        level = "###" if "=" in table_.heading else "##"
        lines += [f"{level} {table_.heading}", ""]
        lines += [line for text in table_.intro for line in (text, "")]
        rows = [(f"`{key}`", *rest) for key, *rest in table_.rows]
        lines += table(table_.header, rows) + [""]
    return "\n".join(lines)


if __name__ == "__main__":
    print(generate())
