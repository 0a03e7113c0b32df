"""Opens every page of a built site in headless Chromium at 1280 px and reports what does not fit.

    python docs/_tools/check_layout.py SITE_DIR [--pages learning/ results/ ...]
    python docs/_tools/check_layout.py --self-check

Reported, naming the page and the element:

- a code block whose content is wider than its box (it scrolls sideways: the reader sees it
  clipped at the column edge), or whose box passes the article's column;
- a table wider than its container (Material's scrolling wrapper, else its parent);
- a name split across lines: inline code in a table cell that holds one word
  (``hydra.sweeper.params.seed``, ``parallel``) and wraps inside it (not after a ``-``,
  ``/`` or ``:``, where a reader expects a name to break).

``--self-check`` first builds a tiny page with one over-wide code block, one over-wide table and
one split name (and one of each that fits) and fails unless exactly the three bad ones are
reported, so a pass over the site cannot be a check that sees nothing. Exit code 0 when nothing
is reported, 1 otherwise, 2 without a browser. Chromium (``apt-get install chromium
chromium-driver``) is driven through Selenium (a CI-only dependency: ``.ci/run`` installs it);
the flags keep it off the network (the site is read from files). ``page_widths.py`` measures
the other elements (images, maths) by hand; this one is the CI check.
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from pathlib import Path

WIDTH = 1280
"""The viewport's width in CSS pixels (a laptop's browser window)."""

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
]
"""Chromium without a display, a sandbox or any request of its own to the network."""

MEASURE = """
const article = document.querySelector("article.md-content__inner") || document.body;
const column = article.getBoundingClientRect();
const found = [];
function where(el) {
  let heading = null;
  for (let node = el; node && !heading; node = node.previousElementSibling || node.parentElement) {
    if (/^H[1-6]$/.test(node.tagName)) heading = node;
  }
  const label = heading ? " under \\"" + heading.textContent.replace("\\u00b6", "").trim()
    .slice(0, 50) + "\\"" : "";
  return label + ": " + JSON.stringify(el.textContent.trim().slice(0, 60));
}
article.querySelectorAll("pre").forEach(function (pre, index) {
  const code = pre.querySelector("code") || pre;
  const over = code.scrollWidth - code.clientWidth;
  const past = pre.getBoundingClientRect().right - column.right;
  if (over > 1 || past > 1) {
    found.push("code block " + (index + 1) + " (" + Math.max(over, past) +
      " px too wide)" + where(pre));
  }
});
article.querySelectorAll("table").forEach(function (table, index) {
  const box = table.closest(".md-typeset__scrollwrap") || table.parentElement;
  const over = table.getBoundingClientRect().width - box.clientWidth;
  if (over > 1) {
    found.push("table " + (index + 1) + " (" + Math.round(over) + " px wider than its " +
      "container)" + where(table));
  }
});
// a break inside a name: the character before it is not a separator the name is read by
function splitMidName(code) {
  const text = code.firstChild;
  if (!text || text.nodeType !== Node.TEXT_NODE || code.childNodes.length !== 1) return false;
  const range = document.createRange();
  let top = null;
  for (let i = 0; i < text.length; i++) {
    range.setStart(text, i);
    range.setEnd(text, i + 1);
    const rect = range.getBoundingClientRect();
    if (top !== null && rect.top > top + 2 && !"-/:".includes(text.data[i - 1])) return true;
    top = rect.top;
  }
  return false;
}
article.querySelectorAll("td code").forEach(function (code) {
  if (!/\\s/.test(code.textContent.trim()) && code.getClientRects().length > 1 &&
      splitMidName(code)) {
    found.push("name split across lines" + where(code));
  }
});
return {width: window.innerWidth, found: found};
"""
"""The measurement, run in the loaded page (Selenium's ``execute_script``)."""

SELF_CHECK_PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><style>
  body { margin: 0; font: 16px sans-serif; }
  article { width: 600px; margin: 0 auto; }
  pre > code { display: block; overflow: auto; }
  .md-typeset__scrollwrap { overflow-x: auto; }
  td { padding: 4px; }
  td code { overflow-wrap: anywhere; }  /* what split names on the site */
</style></head><body><article class="md-content__inner">
<h2>Too wide</h2>
<pre><code>CLIPPED = "{long}"</code></pre>
<div class="md-typeset__scrollwrap"><table><tr>{cells}</tr></table></div>
<table style="width: 300px"><tr><td><code>{key}</code></td><td>a key that wraps</td></tr>
</table>
<h2>Fits</h2>
<pre><code>FITS = 1</code></pre>
<div class="md-typeset__scrollwrap"><table><tr><td>a</td><td>b</td></tr></table></div>
<table><tr><td><code>short.key</code></td><td>fits</td></tr></table>
</article></body></html>
"""
"""One code block, one table and one key that do not fit (under "Too wide") and one of each
that does (under "Fits")."""


def self_check_page(folder: Path) -> Path:
    """Writes the self-check's page into ``folder``."""
    page = folder / "index.html"
    page.write_text(
        SELF_CHECK_PAGE.replace("{long}", "x" * 400)
        .replace("{cells}", "".join(f"<td>column_{i}_of_a_wide_table</td>" for i in range(20)))
        .replace("{key}", "-".join(["a_long_key_name_that_must_wrap"] * 6).replace("-", ""))
    )
    return page


def browser(chromium: str, chromedriver: str, profile: Path):
    """A headless Chromium at a ``WIDTH`` x 900 viewport, through Selenium."""
    from selenium import webdriver  # a CI-only dependency, imported where it is used
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in [*FLAGS, f"--user-data-dir={profile}", f"--window-size={WIDTH},900"]:
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(executable_path=chromedriver), options=options)
    # the viewport itself, whatever the window's frame takes
    driver.execute_cdp_cmd(
        "Emulation.setDeviceMetricsOverride",
        {"width": WIDTH, "height": 900, "deviceScaleFactor": 1, "mobile": False},
    )
    driver.set_page_load_timeout(60)
    return driver


def measure(driver, page: Path) -> list[str]:
    """What does not fit on ``page`` (a file), one line each."""
    driver.get(page.as_uri())
    result = driver.execute_script(MEASURE)
    if result["width"] != WIDTH:
        return [f"the viewport is {result['width']} px wide, not {WIDTH}"]
    return result["found"]


def site_pages(site: Path, names: list[str] | None) -> list[Path]:
    """The HTML pages of ``site`` (those under ``names``, folders or files, when given)."""
    if not names:
        return sorted(site.rglob("*.html"))
    pages: list[Path] = []
    for name in names:
        target = site / name
        pages += sorted(target.rglob("*.html")) if target.is_dir() else [target]
    return pages


def self_check(driver, folder: Path) -> list[str]:
    """Problems with the check itself: the bad page's three elements must be reported, and
    nothing else."""
    found = measure(driver, self_check_page(folder))
    expected = ("code block 1 ", "table 1 ", "name split across lines")
    problems = [f"not reported: {name.strip()}" for name in expected
                if not any(line.startswith(name) for line in found)]  # fmt: skip
    problems += [f"reported, but fits: {line}" for line in found if '"Fits"' in line]
    if len(found) != len(expected):
        problems.append(f"reported {len(found)} elements, expected {len(expected)}: {found}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("site", type=Path, nargs="?", help="a built site (mkdocs build)")
    parser.add_argument("--pages", nargs="*", default=None, help="pages or folders of the site")
    parser.add_argument("--self-check", action="store_true", help="check the check, then stop")
    parser.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium")
    parser.add_argument(
        "--chromedriver", default=shutil.which("chromedriver") or "/usr/bin/chromedriver"
    )
    args = parser.parse_args(argv)
    if not args.self_check and args.site is None:
        parser.error("give a built site's folder (SITE_DIR) or --self-check")
    for path in (args.chromium, args.chromedriver):
        if not Path(path).is_file():
            print(
                f"check_layout: {path} not found; install Chromium and its driver "
                "(apt-get install -y chromium chromium-driver) or pass --chromium/--chromedriver",
                file=sys.stderr,
            )
            return 2
    with tempfile.TemporaryDirectory() as scratch:
        driver = browser(args.chromium, args.chromedriver, Path(scratch) / "profile")
        try:
            if args.self_check:
                problems = self_check(driver, Path(scratch))
                for line in problems:
                    print(f"check_layout self-check: {line}")
                print(
                    "check_layout self-check: "
                    + ("failed" if problems else "the deliberately clipped page is reported"),
                    file=sys.stderr,
                )
                return 1 if problems else 0
            site = args.site.resolve()
            pages = site_pages(site, args.pages)
            count = 0
            for page in pages:
                for line in measure(driver, page):
                    count += 1
                    print(f"{page.relative_to(site).as_posix()}: {line}")
        finally:
            driver.quit()
    print(
        f"check_layout: {len(pages)} pages at {WIDTH} px, {count} code blocks or tables "
        "that do not fit",
        file=sys.stderr,
    )
    return 1 if count else 0


if __name__ == "__main__":
    sys.exit(main())
