"""The configuration reference (docs/configuration.md) is generated and covers every key."""

from __future__ import annotations

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
