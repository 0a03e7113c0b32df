"""The suite's file order: conftest's longest-first list names real files, and xdist keeps it."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from conftest import LONGEST_FIRST, pytest_collection_modifyitems

TESTS = Path(__file__).resolve().parent


def test_every_file_of_the_longest_first_list_exists_once() -> None:
    assert len(set(LONGEST_FIRST)) == len(LONGEST_FIRST)
    missing = [name for name in LONGEST_FIRST if not (TESTS / name).is_file()]
    assert not missing, f"renamed or removed test files still in LONGEST_FIRST: {missing}"


def test_xdist_keeps_the_collection_order_of_files(pytestconfig: pytest.Config) -> None:
    # without it pytest-xdist's loadfile scheduler sorts files by their number of tests
    addopts = pytestconfig.getini("addopts")
    assert "--dist" in addopts and addopts[addopts.index("--dist") + 1] == "loadfile"
    assert "--no-loadscope-reorder" in addopts


def test_the_listed_files_come_first_in_their_order_and_files_stay_whole() -> None:
    first, second = LONGEST_FIRST[1], LONGEST_FIRST[0]
    paths = ["test_a.py", first, "test_a.py", second, "test_z.py", second]
    items = [SimpleNamespace(path=TESTS / name, index=i) for i, name in enumerate(paths)]
    pytest_collection_modifyitems(items)
    assert [(item.path.name, item.index) for item in items] == [
        (second, 3),
        (second, 5),
        (first, 1),
        ("test_a.py", 0),
        ("test_a.py", 2),
        ("test_z.py", 4),
    ]
