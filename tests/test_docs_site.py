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


def test_the_checker_finds_wide_tables_and_unlinked_torchrl_names(tmp_path: Path) -> None:
    wide = "<tr>" + "".join(f"<th>column_number_{i}</th>" for i in range(9)) + "</tr>"
    narrow = (
        "<tr><th>a</th><th>b</th></tr><tr><td>1</td><td><code>a_very_long_key_name</code></td></tr>"
    )
    (tmp_path / "index.html").write_text(
        f"<html><body><table>{wide}</table><table>{narrow}</table>"
        '<p><code>SACLoss</code> <a href="https://x"><code>TensorDict</code></a></p>'
        "<pre><code>SACLoss</code></pre><h2><code>SACLoss</code></h2></body></html>"
    )
    problems = check_site.check(tmp_path)
    assert any("a table of 9 columns" in p for p in problems)  # the wide one only
    assert sum("a table of" in p for p in problems) == 1
    assert [p for p in problems if "not a link" in p] == [
        "index.html: `SACLoss` is not a link to its documentation (external_docs.py)"
    ]


def test_the_front_page_has_the_set_up_the_paper_and_a_headline(site: Path) -> None:
    home = (site / "index.html").read_text()
    text = re.sub(r"<[^>]+>", "", home).replace("&amp;", "&")  # the code block's spans
    assert "bash setup.sh && .venv/bin/python scripts/cbop.py" in text
    assert "bash setup.sh && .venv/bin/python -m pytest -q" in text
    assert "https://openreview.net/forum?id=dNqxZgyjcYA" in home
    assert "<table>" in home and "CBOP (20,000 steps)" in home
    assert 'href="https://github.com/cbop-torchrl/cbop-torchrl"' in home


def test_pages_are_short_and_state_not_history() -> None:
    docs = ROOT / "docs"
    for page in [ROOT / "README.md", *docs.rglob("*.md")]:
        lines = page.read_text().count("\n")
        assert lines <= 800 or page.name == "configuration.md", f"{page}: {lines} lines"
        assert not re.search(r"\blent\b", page.read_text()), f"{page}: 'lent'"
    hashes = re.compile(r"\bcommits? [0-9a-f]{7,}\b|\(commit [0-9a-f]{7,}")
    notebook = {"results.md", "learning.md", "earlier.md"}  # earlier.md: the superseded record
    for page in [ROOT / "README.md", *docs.glob("*.md")]:
        if page.name not in notebook:
            assert not hashes.search(page.read_text()), f"{page}: a commit hash"


def test_every_curve_page_shows_its_figure_and_links_its_numbers(site: Path) -> None:
    pages = sorted((ROOT / "docs" / "curves").glob("exp*.md"))
    assert pages
    for page in pages:
        html = (site / "curves" / page.stem / "index.html").read_text()
        assert re.search(rf'<img [^>]*src="[^"]*{re.escape(page.stem)}\.png"', html), page.name
        assert f"{page.stem}.csv" in html and "<table>" in html  # the columns explained
    for page in sorted((ROOT / "docs" / "learning").glob("experiment-*.md")):
        for image in re.findall(r"\]\((figures/[^)]+\.png)\)", page.read_text()):
            assert (page.parent / image).is_file(), (page.name, image)


def test_the_maths_is_rendered_by_the_katex_the_site_holds(site: Path) -> None:
    html = (site / "algorithm" / "index.html").read_text()
    assert html.count('class="arithmatex"') >= 10
    scripts = re.findall(r'<script src="([^"]+)"', html)
    katex = [s for s in scripts if "katex" in s]
    assert katex and all(not s.startswith(("http", "//")) for s in katex)
    for source in katex:
        assert (site / "algorithm" / source.split("?")[0]).resolve().is_file(), source
    assert (site / "assets" / "katex" / "fonts" / "KaTeX_Main-Regular.woff2").is_file()


def test_the_curve_pages_and_figures_are_current() -> None:
    sys.path.insert(0, str(ROOT / "docs" / "_tools"))
    import curve_pages

    assert curve_pages.main(["--check"]) == 0
