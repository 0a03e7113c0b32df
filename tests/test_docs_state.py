"""The pages say where the project stands, not how it was made.

No page or README of the repository (README.md, CHANGELOG.md, docs/, the READMEs under
benchmarks/) nor mkdocs.yml speaks of the sessions the work was done in or shows a path
of one particular machine; a change is dated with a date, a version or a commit.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = sorted(
    {
        ROOT / "README.md",
        ROOT / "CHANGELOG.md",
        ROOT / "mkdocs.yml",
        *(ROOT / "docs").rglob("*.md"),
        *(ROOT / "benchmarks").rglob("README*.md"),
        *(ROOT / "benchmarks" / "results" / "report").glob("*.md"),
    }
)
FORBIDDEN = {
    r"\bsessions?\b": "a session (say when with a date, a version or a commit)",
    r"/work/|\bfresh16\b|\brun\.sh\b|\brunf\.sh\b|\bruns\.sh\b": "a path of one machine",
    r"\bthe lead's\b": "who edits a page",
    r"results issue": "an issue the reader does not see (say what the bar is)",
}


def offences(text: str) -> list[str]:
    found = []
    for number, line in enumerate(text.splitlines(), 1):
        for pattern, what in FORBIDDEN.items():
            for match in re.finditer(pattern, line, flags=re.I):
                found.append(f"line {number}: {match[0]!r} ({what})")
    return found


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_the_page_speaks_of_the_project_state(page: Path) -> None:
    assert not offences(page.read_text()), f"{page.relative_to(ROOT)}: {offences(page.read_text())}"


def test_the_check_catches_a_session_and_a_machine_path() -> None:
    assert offences("Since session 16 the preset ...")
    assert offences("results: /work/fresh16/runs/demo/results.json")
    assert not offences("benchmarks/gpu_session.sh runs the screen (Nov 26 2026, commit 5bc7ba6)")


def test_the_package_states_its_version_and_the_changelog_names_it() -> None:
    import cbop_torchrl

    assert re.fullmatch(r"\d+\.\d+\.\d+", cbop_torchrl.__version__)
    assert f"## {cbop_torchrl.__version__}" in (ROOT / "CHANGELOG.md").read_text()
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert f'version = "{cbop_torchrl.__version__}"' in pyproject
    for name in ("LICENSE", "CITATION.cff"):
        assert (ROOT / name).exists(), name
    assert "MIT" in (ROOT / "LICENSE").read_text()
