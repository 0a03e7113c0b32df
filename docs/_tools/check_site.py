"""Checks a built docs site: every internal link and image resolves, nothing loads from outside.

    python docs/_tools/check_site.py SITE_DIR

Parses every HTML page of ``SITE_DIR`` (``mkdocs build`` writes it; ``.ci/run`` runs this
after the strict build, which does not catch links that MkDocs leaves alone) and reports

- an internal link (``<a href>``) or resource (``<img src>``, ``<link href>``,
  ``<script src>``, ...) whose file is not in the site, or whose ``#anchor`` names no
  element of the page it points to;
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

EXTERNAL = re.compile(r"^(?:[a-z][a-z0-9+.-]*:)?//", re.I)
OTHER_SCHEME = re.compile(r"^(?:mailto|tel|data|javascript|blob):", re.I)
CSS_URL = re.compile(r"""url\(\s*['"]?([^'")]+)['"]?\s*\)|@import\s+['"]([^'"]+)['"]""")
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

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = {name: value or "" for name, value in attrs}
        for key in ("id", "name"):
            if values.get(key):
                self.ids.add(values[key])
        if tag == "a" and "href" in values:
            self.links.append(values["href"])
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

    def handle_data(self, data: str) -> None:
        if self._in_style:
            self.styles.append(data)


def _target(site: Path, page: Path, address: str) -> tuple[Path, str]:
    """The file an internal address names (relative to ``page``) and its fragment."""
    parts = urlsplit(address)
    path = unquote(parts.path)
    if not path:
        return page, parts.fragment
    base = site if path.startswith("/") else page.parent
    target = (base / path.lstrip("/")).resolve()
    if path.endswith("/") or target.is_dir():
        target = target / "index.html"
    return target, parts.fragment


def check(site: str | Path) -> list[str]:
    """One line per broken internal link or image and per resource from outside the site."""
    site = Path(site).resolve()
    pages = {p: Page() for p in sorted(site.rglob("*.html"))}
    for path, parser in pages.items():
        parser.feed(path.read_text(errors="replace"))
    problems: list[str] = []

    def where(path: Path) -> str:
        return path.relative_to(site).as_posix()

    for path, parser in pages.items():
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
                target, _ = _target(site, path, address)
                if not target.is_file():
                    problems.append(f"{where(path)}: <{tag}> {address} is not in the site")
        for address in parser.links:
            if EXTERNAL.match(address) or OTHER_SCHEME.match(address):
                continue
            target, fragment = _target(site, path, address)
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
