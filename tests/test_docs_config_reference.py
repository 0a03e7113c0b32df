"""The configuration reference (docs/configuration.md) is generated and covers every key."""

from __future__ import annotations

import importlib
import importlib.util
import re
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from cbop_torchrl import cli

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "docs" / "configuration.md"
spec = importlib.util.spec_from_file_location(
    "config_reference", ROOT / "docs" / "_tools" / "config_reference.py"
)
config_reference = importlib.util.module_from_spec(spec)
spec.loader.exec_module(config_reference)


def rows_by_section(text: str) -> dict[str, set[str]]:
    """Section heading -> the keys (first column) of its table rows."""
    sections: dict[str, set[str]] = {}
    current = ""
    for line in text.splitlines():
        if line.startswith("#"):
            current = line.lstrip("#").strip()
        match = re.match(r"^\| `([^`]+)` \|", line)
        if match:
            sections.setdefault(current, set()).add(match[1])
    return sections


def test_the_committed_reference_is_the_generated_one():
    assert PAGE.read_text().rstrip("\n") == config_reference.generate().rstrip("\n"), (
        "docs/configuration.md is stale: regenerate it with "
        "`.venv/bin/python docs/_tools/config_reference.py > docs/configuration.md`"
    )


@pytest.mark.parametrize("name", sorted(set(cli.CONFIG_SCHEMAS) - {"config_paper"}))
def test_every_schema_key_has_a_row(name: str):
    rows = rows_by_section(PAGE.read_text()).get(f"{name}.yaml", set())
    missing = set(config_reference.schema_keys(cli.CONFIG_SCHEMAS[name])) - rows
    assert not missing, f"{name}.yaml keys with no entry in the reference: {sorted(missing)}"


def test_every_config_group_key_has_a_row():
    sections = rows_by_section(PAGE.read_text())
    for path in config_reference.group_files():
        option = path.relative_to(config_reference.CONFIGS).with_suffix("").as_posix()
        group, _, choice = option.rpartition("/")
        values = OmegaConf.to_container(OmegaConf.load(path), resolve=False)
        missing = set(config_reference.flat(values)) - sections.get(f"{group}={choice}", set())
        assert not missing, f"{option}.yaml keys with no entry in the reference: {missing}"


def test_a_key_missing_from_the_reference_is_caught():
    text = PAGE.read_text().replace("| `estimator.psi` |", "| psi |")
    rows = rows_by_section(text)["config.yaml"]
    assert "estimator.psi" not in rows
    assert "estimator.psi" in config_reference.schema_keys(cli.CONFIG_SCHEMAS["config"])


def test_a_wrapped_comment_continues_its_key_and_an_indented_one_opens_the_next(tmp_path):
    yaml = tmp_path / "c.yaml"
    yaml.write_text(
        "agent:\n"
        "  width: 3   # the first line of a long\n"
        "             # description, wrapped\n"
        "  # said above depth\n"
        "  depth: 2\n"
        "  plain: 1\n"
        "  last: 0    # the file's last key,\n"
        "             # wrapped too\n"
    )
    comments = config_reference.yaml_comments(yaml)
    assert comments["agent.width"] == "the first line of a long description, wrapped"
    assert comments["agent.depth"] == "said above depth"
    assert "agent.plain" not in comments
    assert comments["agent.last"] == "the file's last key, wrapped too"


def test_every_key_has_a_description():
    missing = config_reference.undescribed(config_reference.reference_tables())
    assert not missing, (
        "keys with no description in docs/configuration.md (write a comment on the dataclass "
        f"field or next to the key in its YAML file): {missing}"
    )


def test_every_null_says_what_it_becomes():
    unexplained = config_reference.unexplained_nulls(config_reference.reference_tables())
    assert not unexplained, (
        f"null keys whose description does not say what null means: {unexplained}"
    )


def test_a_key_without_a_description_or_with_an_unexplained_null_is_caught():
    table = config_reference.Table(
        "x.yaml",
        [],
        ("key", "type", "default", "description"),
        [("a", "int", "`1`", "said"), ("b", "int", "`2`", " "), ("c", "str", "`null`", "said")],
    )
    assert config_reference.undescribed([table]) == ["x.yaml: b"]
    assert config_reference.unexplained_nulls([table]) == ["x.yaml: c"]


SCHEMA_SOURCE = '''
from dataclasses import dataclass, field


@dataclass
class Inner:
    """A section (null: from the family).

    Attributes:
        documented, also: told in the docstring,
            over two lines.
    """

    documented: int = 1
    also: int | None = None
    plain: int = 0
    bare: str | None = None


@dataclass
class Outer:
    """The schema."""

    width: int = 3  # said on its line
    # said above it,
    # over two lines
    depth: int | None = None
    silent: float = 0.5
    inner: Inner = field(default_factory=Inner)
'''


def test_field_descriptions_come_from_line_comments_blocks_and_docstrings(tmp_path, monkeypatch):
    (tmp_path / "schema_under_test.py").write_text(SCHEMA_SOURCE)
    monkeypatch.syspath_prepend(str(tmp_path))
    module = importlib.import_module("schema_under_test")
    outer = config_reference.field_comments(module.Outer)
    assert outer["width"] == "said on its line"
    assert outer["depth"] == "said above it, over two lines"
    assert "silent" not in outer
    inner = config_reference.field_comments(module.Inner)
    assert inner["documented"] == inner["also"] == "told in the docstring, over two lines."
    assert "plain" not in inner
    rows = {key: text for key, *_, text in config_reference.schema_rows(module.Outer, {})}
    assert rows["inner.bare"] == "(null: from the family)"  # the section's null clause
    assert rows["inner.plain"] == ""
    assert rows["depth"] == "said above it, over two lines"  # a null said nothing about: kept


def test_a_paper_table_null_says_what_the_table_gives():
    psi = config_reference.with_resolution("estimator.psi", "`null`", "LCB (null: the paper's)")
    assert "(null: the paper's)" not in psi and "GENERATED_PSI" in psi and "PAPER_PSI" in psi
    assert config_reference.with_resolution("estimator.psi", "`2.0`", "LCB") == "LCB"
    horizon = config_reference.with_resolution("estimator.horizon", "`null`", "H")
    assert horizon.startswith("H; null: the paper's 10")


def test_the_psi_resolution_does_not_follow_the_psi_dicts_order(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A test that deletes and restores a GENERATED_PSI entry moves it to the dict's end, for
    the rest of its worker; the reference keeps the benchmark's set order."""
    from cbop_torchrl.config import paper

    described = config_reference.null_resolution("estimator.psi")
    reordered = dict(reversed(list(paper.GENERATED_PSI.items())))
    monkeypatch.setattr(paper, "GENERATED_PSI", reordered)
    assert config_reference.null_resolution("estimator.psi") == described
