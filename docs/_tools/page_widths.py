"""Measures a built site's pages in headless Chromium at 1280 px: no element wider than its column.

    python docs/_tools/page_widths.py SITE_DIR [--pages learning/ results/ ...] [--chromium PATH]
    python docs/_tools/page_widths.py SITE_DIR --screenshots OUT_DIR --pages index.html ...

For each HTML page (every page but the repository files under ``repo/`` unless ``--pages``
names them), loads a copy of it with a measuring script in Chromium (``--headless
--dump-dom``, 1280x800) and reports every table, image, maths block or other element of the
article that is wider than the article's column (code blocks, which scroll, aside). The
static estimate of ``check_site.py`` (tables only) runs in CI; this one needs a browser
(``apt-get install chromium``), so it is run by hand, not by the test command. Exit code 0
when nothing is too wide, 1 otherwise, 2 without a browser.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
    "--hide-scrollbars",
    "--window-size=1280,800",
    "--virtual-time-budget=4000",
]
MEASURE = """
<script>
window.addEventListener("load", function () {
  setTimeout(function () {
    var article = document.querySelector("article.md-content__inner") || document.body;
    var column = article.getBoundingClientRect();
    var right = column.right + 1;  // Material's table wrapper reaches into the padding
    var found = [], flagged = [];
    article.querySelectorAll("*").forEach(function (el) {
      if (el.closest("pre, .highlight, .md-clipboard, .katex-mathml")) return;
      if (flagged.some(function (f) { return f.contains(el); })) return;  // the outermost only
      var box = el.getBoundingClientRect();
      var tag = el.tagName.toLowerCase();
      var measured;
      if (el.classList.contains("md-typeset__scrollwrap")) {
        // Material's wrapper of a table reaches 0.8rem past the column on each side by
        // design; the table is too wide when it scrolls inside it
        var over = el.scrollWidth - el.clientWidth;
        measured = over > 1 ? right + over : 0;
      } else if (el.closest(".md-typeset__scrollwrap")) {
        return;
      } else {
        measured = tag === "img" || el.classList.contains("arithmatex")
          ? Math.max(box.right, box.left + el.scrollWidth) : box.right;
      }
      if (box.width > 0 && measured > right) {
        flagged.push(el);
        found.push(tag + (el.className ? "." + String(el.className).split(" ")[0] : "") + ": " +
          Math.round(measured - column.left) + " px in " + Math.round(right - column.left) +
          " px: " + (el.textContent || el.getAttribute("src") || "").trim().slice(0, 60));
      }
    });
    var out = document.createElement("pre");
    out.id = "page-widths";
    out.textContent = JSON.stringify({column: Math.round(right - column.left), wide: found});
    document.body.appendChild(out);
  }, 500);
});
</script>
"""


def chromium(explicit: str | None) -> str | None:
    for name in [explicit, "chromium", "chromium-browser", "google-chrome"]:
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def measure(browser: str, page: Path) -> dict:
    text = page.read_text(errors="replace")
    with tempfile.NamedTemporaryFile("w", suffix=".html", dir=page.parent, delete=False) as f:
        f.write(text.replace("</body>", MEASURE + "</body>"))
        copy = Path(f.name)
    try:
        done = subprocess.run(
            [browser, *FLAGS, "--dump-dom", copy.as_uri()],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
    finally:
        copy.unlink()
    found = re.search(r'<pre id="page-widths">(.*?)</pre>', done.stdout, re.S)
    if not found:
        return {"column": 0, "wide": [f"no measurement ({done.stderr.strip()[-200:]})"]}
    return json.loads(found[1].replace("&quot;", '"').replace("&amp;", "&").replace("&lt;", "<")
                      .replace("&gt;", ">"))  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("site", type=Path)
    parser.add_argument("--pages", nargs="*", default=None, help="pages or folders of the site")
    parser.add_argument("--chromium", default=None)
    parser.add_argument("--screenshots", type=Path, default=None, help="PNG per page here")
    args = parser.parse_args(argv)
    browser = chromium(args.chromium)
    if browser is None:
        print("page_widths: no Chromium (apt-get install chromium)", file=sys.stderr)
        return 2
    site = args.site.resolve()
    if args.pages:
        pages = []
        for name in args.pages:
            target = site / name
            pages += sorted(target.rglob("index.html")) if target.is_dir() else [target]
    else:
        pages = [p for p in sorted(site.rglob("*.html")) if not p.relative_to(site).as_posix()
                 .startswith(("repo/", "404"))]  # fmt: skip
    if args.screenshots:
        args.screenshots.mkdir(parents=True, exist_ok=True)
        for page in pages:
            name = page.relative_to(site).parent.as_posix().replace("/", "-").strip(".") or "home"
            subprocess.run(
                [browser, *FLAGS[:-2], "--window-size=1280,2400",
                 f"--screenshot={args.screenshots / (name + '.png')}", page.as_uri()],
                capture_output=True, timeout=60,
            )  # fmt: skip
        return 0
    problems = 0
    for page in pages:
        result = measure(browser, page)
        for line in result["wide"]:
            problems += 1
            print(f"{page.relative_to(site).as_posix()}: {line}")
    print(f"page_widths: {len(pages)} pages, {problems} elements wider than the column",
          file=sys.stderr)  # fmt: skip
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
