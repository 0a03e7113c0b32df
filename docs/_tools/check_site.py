"""Checks a built docs site: every internal link and image resolves, nothing loads from outside.

    python docs/_tools/check_site.py SITE_DIR

Parses every HTML page of ``SITE_DIR`` (``mkdocs build`` writes it; ``.ci/run`` runs this
after the strict build, which does not catch links that MkDocs leaves alone) and reports

- an internal link (``<a href>``) or resource (``<img src>``, ``<link href>``,
  ``<script src>``, ...) whose file is not in the site, or whose ``#anchor`` names no
  element of the page it points to;
- an inline code name of a TorchRL, TensorDict or PyTorch class or function
  (``external_docs.DOCS``) that is not a link to its documentation (code blocks and
  headings aside);
- a table wider than the content column at 1280 px (:data:`COLUMN_PX`), estimated from its
  min-content width: per column, the longest word of its cells (inline code wraps anywhere,
  ``stylesheets/extra.css``) at :data:`CHAR_PX` plus the cells' padding (``scripts in
  docs/_tools/page_widths.py`` measure it in a browser);
- a resource the browser would load from outside the site (an ``http(s)://`` or ``//``
  address in ``src``, ``<link href>``, ``srcset`` or a stylesheet's ``url(...)``/``@import``):
  the site must work offline. Links a reader follows to another site (``<a href>``) are fine.

Exit code 0 when the site is clean, 1 with one line per problem otherwise.
"""

from __future__ import annotations

import re
import sys
from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import unquote, urlsplit

sys.path.insert(0, str(Path(__file__).resolve().parent))
import external_docs  # noqa: E402  (a sibling script)

EXTERNAL = re.compile(r"^(?:[a-z][a-z0-9+.-]*:)?//", re.I)
OTHER_SCHEME = re.compile(r"^(?:mailto|tel|data|javascript|blob):", re.I)
CSS_URL = re.compile(r"""url\(\s*['"]?([^'")]+)['"]?\s*\)|@import\s+['"]([^'"]+)['"]""")
REPO = "repo/"
"""The repository's files the pages link (hooks.py), shown as they are: no width check."""
COLUMN_PX = 780
"""The content column's width at a 1280 px window (Material, the sidebars shown)."""
CHAR_PX = 6.8
"""A character of the tables' font (0.68rem = 13.6 px, system sans), on the wide side: the
estimate is above the width Chromium lays out (``page_widths.py``) for every table measured."""
CELL_PADDING_PX = 20.4
"""A cell's left and right padding: 0.75em each at 13.6 px (stylesheets/extra.css)."""
HEADER_MIN_PX = 60.0
"""A header cell's least width (``min-width: 3rem``, stylesheets/extra.css)."""
NOT_LOADED_RELS = {"canonical", "alternate", "author", "license"}
"""``<link rel>`` values a browser does not fetch (``canonical``: the page's published address)."""
RESOURCE_ATTRS = {
    "img": ("src", "srcset"),
    "script": ("src",),
    "link": ("href",),
    "source": ("src", "srcset"),
    "iframe": ("src",),
    "video": ("src", "poster"),
    "audio": ("src",),
    "embed": ("src",),
    "object": ("data",),
}


class Page(HTMLParser):
    """The links, resources and element ids of one HTML page."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.links: list[str] = []
        self.resources: list[tuple[str, str]] = []  # (tag, address)
        self.ids: set[str] = set()
        self.styles: list[str] = []
        self._in_style = False
        self.unlinked: list[str] = []  # external names shown as code without their link
        self._open: list[str] = []  # a, pre, code, h1-h6 currently open
        self._code = ""
        self.tables: list[list[list[str]]] = []  # each table's rows of cells' words (no code)
        self._tables: list[list[list[str]]] = []  # the tables being read (nested ones too)
        self._cell: list[str] | None = None

    KEPT = {"a", "pre", "code", "h1", "h2", "h3", "h4", "h5", "h6"}

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = {name: value or "" for name, value in attrs}
        if tag in self.KEPT:
            self._open.append(tag)
            if tag == "code":
                self._code = ""
        for key in ("id", "name"):
            if values.get(key):
                self.ids.add(values[key])
        if tag == "a" and "href" in values:
            self.links.append(values["href"])
        if tag == "table" and not values.get("class"):
            self._tables.append([])
        elif tag == "tr" and self._tables:
            self._tables[-1].append([])
        elif tag in ("td", "th") and self._tables and self._tables[-1]:
            self._cell = []
            self._tables[-1][-1].append("")
        if tag == "link" and values.get("rel", "").lower() in NOT_LOADED_RELS:
            return  # names the page's address (site_url), not something the browser loads
        for attr in RESOURCE_ATTRS.get(tag, ()):
            if not values.get(attr):
                continue
            if attr == "srcset":
                for part in values[attr].split(","):
                    if part.strip():
                        self.resources.append((tag, part.strip().split()[0]))
            else:
                self.resources.append((tag, values[attr]))
        if values.get("style"):
            self.styles.append(values["style"])
        self._in_style = tag == "style"

    def handle_endtag(self, tag: str) -> None:
        if tag == "style":
            self._in_style = False
        if tag in ("td", "th") and self._cell is not None and self._tables:
            self._tables[-1][-1][-1] = " ".join(self._cell)
            self._cell = None
        elif tag == "table" and self._tables:
            self.tables.append(self._tables.pop())
        if tag in self.KEPT and tag in self._open:
            if tag == "code":
                outer = self._open[: len(self._open) - 1 - self._open[::-1].index("code")]
                if self._code in external_docs.DOCS and not set(outer) & (self.KEPT - {"code"}):
                    self.unlinked.append(self._code)
            while self._open and self._open.pop() != tag:
                pass

    def handle_data(self, data: str) -> None:
        if self._in_style:
            self.styles.append(data)
        if self._open and self._open[-1] == "code":
            self._code += data
        elif self._cell is not None and "pre" not in self._open:
            self._cell.append(data)


def served_path(site: Path) -> str:
    """The path the site is served under (``/name/`` for mkdocs.yml's ``site_url``), from its
    sitemap's first address; ``/`` without one. The 404 page links from that path."""
    sitemap = site / "sitemap.xml"
    if sitemap.is_file():
        found = re.search(r"<loc>([^<]+)</loc>", sitemap.read_text(errors="replace"))
        if found:
            return urlsplit(found[1]).path or "/"
    return "/"


def table_width(rows: list[list[str]]) -> float:
    """A table's estimated min-content width in px (see :data:`CHAR_PX`)."""
    columns: dict[int, float] = {}
    for row in rows:
        for index, cell in enumerate(row):
            longest = max((len(word) for word in cell.split()), default=0)
            least = HEADER_MIN_PX if index == 0 or row is rows[0] else 0.0
            width = max(longest * CHAR_PX + CELL_PADDING_PX, least)
            columns[index] = max(columns.get(index, 0.0), width)
    return sum(columns.values())


def _target(site: Path, page: Path, address: str, served: str = "/") -> tuple[Path, str]:
    """The file an internal address names (relative to ``page``) and its fragment."""
    parts = urlsplit(address)
    path = unquote(parts.path)
    if not path:
        return page, parts.fragment
    if path.startswith("/") and served != "/" and (path + "/").startswith(served):
        path = "/" + path[len(served) :]
    base = site if path.startswith("/") else page.parent
    target = (base / path.lstrip("/")).resolve()
    if path.endswith("/") or target.is_dir():
        target = target / "index.html"
    return target, parts.fragment


def check(site: str | Path) -> list[str]:
    """One line per broken internal link or image and per resource from outside the site."""
    site = Path(site).resolve()
    served = served_path(site)
    pages = {p: Page() for p in sorted(site.rglob("*.html"))}
    for path, parser in pages.items():
        parser.feed(path.read_text(errors="replace"))
    problems: list[str] = []

    def where(path: Path) -> str:
        return path.relative_to(site).as_posix()

    for path, parser in pages.items():
        problems += [
            f"{where(path)}: `{name}` is not a link to its documentation (external_docs.py)"
            for name in parser.unlinked
        ]
        problems += [
            f"{where(path)}: a table of {max(map(len, rows))} columns is about "
            f"{table_width(rows):.0f} px wide, wider than the {COLUMN_PX} px column "
            f"(first cells: {' | '.join(rows[0])[:80]})"
            for rows in parser.tables
            if rows and table_width(rows) > COLUMN_PX and not where(path).startswith(REPO)
        ]
        for css in parser.styles:
            problems += [
                f"{where(path)}: a style loads {a or b} from outside the site"
                for a, b in CSS_URL.findall(css)
                if EXTERNAL.match(a or b)
            ]
        for tag, address in parser.resources:
            if EXTERNAL.match(address):
                problems.append(f"{where(path)}: <{tag}> loads {address} from outside the site")
            elif not OTHER_SCHEME.match(address):
                target, _ = _target(site, path, address, served)
                if not target.is_file():
                    problems.append(f"{where(path)}: <{tag}> {address} is not in the site")
        for address in parser.links:
            if EXTERNAL.match(address) or OTHER_SCHEME.match(address):
                continue
            target, fragment = _target(site, path, address, served)
            if not target.is_relative_to(site) or not target.is_file():
                problems.append(f"{where(path)}: link {address} is not in the site")
            elif fragment and target in pages and unquote(fragment) not in pages[target].ids:
                problems.append(f"{where(path)}: link {address}: no #{fragment} on that page")
    for css in sorted(site.rglob("*.css")):
        problems += [
            f"{where(css)}: loads {a or b} from outside the site"
            for a, b in CSS_URL.findall(css.read_text(errors="replace"))
            if EXTERNAL.match(a or b)
        ]
    return problems


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1 or not Path(argv[0]).is_dir():
        print("usage: python docs/_tools/check_site.py SITE_DIR (a built site)", file=sys.stderr)
        return 2
    problems = check(argv[0])
    for problem in problems:
        print(problem)
    pages = len(list(Path(argv[0]).rglob("*.html")))
    print(f"check_site: {pages} pages, {len(problems)} problems", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
