"""The built docs site holds together: no broken internal link or image, nothing loaded from
outside, the results page's curves are images in the site, the docstrings' roles are links.

Builds the site once (``mkdocs build --strict``, about 15 s) and runs
``docs/_tools/check_site.py`` on it, as ``.ci/run`` does.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "docs" / "_tools"))
import check_site  # noqa: E402

pytest.importorskip("mkdocs")


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--quiet", "--site-dir", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return out


def test_the_site_has_no_broken_link_and_loads_nothing_from_outside(site: Path) -> None:
    assert check_site.check(site) == []


def test_the_results_curves_are_images_in_the_site(site: Path) -> None:
    markdown = (ROOT / "docs" / "results.md").read_text()
    curves = re.findall(r"!\[[^\]]*\]\(([^)]*curves_[^)]*\.png)\)", markdown)
    report = ROOT / "benchmarks" / "results" / "report"
    per_set = {p.name for p in report.glob("curves_*.png") if not p.name.startswith("curves_all_")}
    assert per_set and {Path(c).name for c in curves} == per_set  # each set's figure, shown
    html = (site / "results" / "index.html").read_text()
    sources = re.findall(r'<img[^>]+src="([^"]+\.png)"', html)
    assert len(sources) >= len(curves)
    for source in sources:
        image = (site / "results" / source).resolve()
        assert image.is_file() and image.read_bytes()[:4] == b"\x89PNG", source
    names = {Path(s).name for s in sources}
    assert {Path(c).name for c in curves} <= names
    for name in names:  # the same file as the repository's report
        assert (ROOT / "benchmarks" / "results" / "report" / name).is_file()


def test_docstring_roles_are_links_and_no_page_asks_for_a_web_font(site: Path) -> None:
    api = (site / "api" / "objectives" / "index.html").read_text()
    assert ":class:" not in api
    assert re.search(
        r'<a [^>]*href="[^"]*#cbop_torchrl[^"]*"[^>]*><code>CBOPValueEstimator</code></a>', api
    )
    for page in site.rglob("*.html"):
        assert "fonts.googleapis" not in page.read_text(), page


def test_the_checker_finds_broken_links_anchors_and_outside_requests(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "index.html").write_text(
        '<html><head><link rel="stylesheet" href="https://fonts.example/x.css">'
        '<script src="../js/here.js"></script><style>@import "//cdn.example/y.css";</style></head>'
        '<body><h2 id="top">t</h2><a href="#top">ok</a><a href="#gone">no anchor</a>'
        '<a href="../b/">missing page</a><a href="https://example.org/">away: fine</a>'
        '<img src="pic.png"><img src="missing.png"></body></html>'
    )
    (tmp_path / "a" / "pic.png").write_bytes(b"\x89PNG")
    (tmp_path / "js").mkdir()
    (tmp_path / "js" / "here.js").write_text("")
    (tmp_path / "s.css").write_text("body { background: url('https://img.example/b.png') }")
    problems = "\n".join(check_site.check(tmp_path))
    assert "https://fonts.example/x.css from outside" in problems
    assert "//cdn.example/y.css from outside" in problems
    assert "s.css: loads https://img.example/b.png" in problems
    assert "link #gone: no #gone" in problems
    assert "link ../b/ is not in the site" in problems
    assert "<img> missing.png is not in the site" in problems
    assert "example.org" not in problems and "pic.png" not in problems and "here.js" not in problems
    assert len(check_site.check(tmp_path)) == 6
