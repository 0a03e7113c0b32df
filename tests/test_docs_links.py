"""Every link in the README and in docs/ resolves inside the repository.

Relative links must name a file or directory of the repository (not a path
outside it, like the design notes that once lived in ``../shared``), and
``#anchor`` links a heading of the page they point to (GitHub's slugs). The only links out of
the repository are to the paper, the repository itself and the TorchRL, TensorDict and
PyTorch documentation (:data:`OUTSIDE`).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PAGES += sorted(p for p in (ROOT / "docs" / "learning").glob("*.md") if p.name != "_template.md")
OUTSIDE = (
    "https://openreview.net/forum?id=dNqxZgyjcYA",
    "https://arxiv.org/abs/2210.03802",
    "https://github.com/cbop-torchrl/cbop-torchrl",
    "https://docs.pytorch.org/",
)
"""Addresses outside the repository a page may link (a reader follows them; nothing loads)."""
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)|!\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to dashes."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    text = FENCE.sub("", page.read_text())
    return {slug(m.group(1)) for m in re.finditer(r"^#{1,6}\s+(.+?)\s*$", text, re.M)}


def links(page: Path) -> list[str]:
    text = FENCE.sub("", page.read_text())
    return [a or b for a, b in LINK.findall(text)]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_link_resolves_inside_the_repository(page: Path) -> None:
    found = links(page)
    if page == ROOT / "README.md":
        assert "docs/design.md" in found
    broken = []
    for target in found:
        if target.startswith(OUTSIDE):
            continue
        if re.match(r"^[a-z]+://", target) or target.startswith("mailto:"):
            broken.append(f"{target} (outside the repository)")
            continue
        path_part, _, anchor = target.partition("#")
        path = (page.parent / path_part).resolve() if path_part else page
        if not path.is_relative_to(ROOT) or not path.exists():
            broken.append(f"{target} (no such file in the repository)")
        elif anchor and path.suffix == ".md" and anchor not in anchors(path):
            broken.append(f"{target} (no heading with that anchor)")
    assert not broken, f"{page.name}: {broken}"
    # A path named in prose (`../shared/DESIGN.md`) must not point outside the repository either.
    outside = re.findall(r"`(\.\./[^`]+)`", FENCE.sub("", page.read_text()))
    assert not outside, f"{page.name} names paths outside the repository: {outside}"


def test_the_link_check_catches_a_link_outside_the_repository(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("See [notes](../shared/DESIGN.md) and [here](#a-heading).\n\n## A heading\n")
    assert links(page) == ["../shared/DESIGN.md", "#a-heading"]
    assert "a-heading" in anchors(page)
    assert not (page.parent / "../shared/DESIGN.md").resolve().is_relative_to(ROOT)
