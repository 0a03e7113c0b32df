"""The package's shape: short modules and functions, no packaging tool inside, no history.

Modules of at most 600 lines and functions of at most 100; the few that are still longer
are listed below, and the list may only shrink. The wheel bundler is a checkout tool
(``tools/bundle.py``), not part of the installed package. Comments and docstrings name
subjects, not the issues or experiments that led to them.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "cbop_torchrl"
MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 100
#: Modules still over the limit (to be split by job); the list may only shrink.
LONG_MODULES: set[str] = set()
#: Functions still over the limit, as ``module:function``; the list may only shrink.
LONG_FUNCTIONS: set[str] = set()
HISTORY = re.compile(r"\bissues? #?\d|\bexperiments? \d|\bexp\d|\(#\d+\)", re.IGNORECASE)


def package_files(*suffixes: str) -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*") if p.suffix in suffixes and p.is_file())


def name(path: Path) -> str:
    return path.relative_to(PACKAGE).as_posix()


def test_no_module_is_longer_than_600_lines_but_the_listed_ones() -> None:
    long = {
        name(p) for p in package_files(".py") if len(p.read_text().splitlines()) > MAX_MODULE_LINES
    }
    assert long <= LONG_MODULES, sorted(long - LONG_MODULES)


def test_no_function_is_longer_than_100_lines_but_the_listed_ones() -> None:
    long = set()
    for path in package_files(".py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if node.end_lineno - node.lineno + 1 > MAX_FUNCTION_LINES:
                    long.add(f"{name(path)}:{node.name}")
    assert long <= LONG_FUNCTIONS, sorted(long - LONG_FUNCTIONS)


def test_the_wheel_bundler_is_a_checkout_tool_not_a_package_module() -> None:
    assert not (PACKAGE / "apps" / "bundle.py").exists()
    assert (PACKAGE.parent / "tools" / "bundle.py").is_file()
    for path in package_files(".py"):
        assert not re.search(r"^\s*(from|import) tools\b", path.read_text(), re.M), path


def test_package_comments_name_no_issue_or_experiment_numbers() -> None:
    found = [
        f"{name(path)}:{number}: {line.strip()}"
        for path in package_files(".py", ".yaml")
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if HISTORY.search(line)
    ]
    assert not found, found


#: Name parts that number a round of work instead of naming a subject.
ROUND_WORDS = {"first", "second", "third", "fourth", "fifth", "one", "two", "three", "four",
               "five", "ii", "iii", "iv", "vi", "round", "part"}  # fmt: skip


def test_no_test_file_is_named_after_an_issue_or_a_numbered_round() -> None:
    """A test file says what it tests (``test_refusals_disk_and_cache.py``), not which issue or
    which numbered round of work added it (``test_issue_28.py``, ``test_checks_four.py``)."""
    named_by_history = [
        path.name
        for path in sorted((PACKAGE.parent / "tests").glob("*.py"))
        if any(
            "issue" in part or part.isdigit() or part in ROUND_WORDS
            for part in path.stem.lower().split("_")
        )
    ]
    assert not named_by_history, named_by_history
