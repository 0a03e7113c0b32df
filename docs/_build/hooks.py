"""MkDocs hooks (mkdocs.yml ``hooks:``): the generated configuration reference, and links to
repository files outside docs/ (the benchmark report, configs, scripts).

A link such as ``../benchmarks/results/report/results.md`` names a file of the repository,
not of the site. MkDocs would report it as not found; here it is checked to exist (a
missing one is a warning, so ``mkdocs build --strict`` fails) and pointed at the file in the
checkout the site was built in (``site/`` sits in the repository root).
"""

from __future__ import annotations

import logging
import posixpath
import re
import sys
from pathlib import Path

from mkdocs.structure.files import File, Files

DOCS = Path(__file__).resolve().parents[1]
ROOT = DOCS.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
import config_reference  # noqa: E402  (a sibling script, not a package)

log = logging.getLogger("mkdocs.hooks.cbop")
REPO_LINK = re.compile(r"\]\((\.\./[^)#\s]*)(#[^)\s]*)?\)")
REPO_SCHEME = "cbop-repository:"
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)


def on_files(files: Files, config) -> Files:
    # docs/configuration.md is committed (it reads on GitHub too); the site gets a fresh one,
    # and tests/test_docs_config_reference.py fails when the committed one is stale
    committed = files.get_file_from_path("configuration.md")
    if committed is not None:
        files.remove(committed)
    files.append(File.generated(config, "configuration.md", content=config_reference.generate()))
    return files


def on_page_markdown(markdown: str, page, config, files) -> str:
    source_dir = posixpath.dirname(page.file.src_uri)
    # the page's HTML lives at site/<dest dir>/; the repository root is that many levels up
    depth = len(Path(page.file.dest_uri).parent.parts) + 1

    def to_repository(match: re.Match) -> str:
        target = (DOCS / source_dir / match[1]).resolve()
        if target.is_relative_to(DOCS):  # a page of the site: MkDocs checks it
            return match[0]
        if not target.is_relative_to(ROOT) or not target.exists():
            log.warning(f"{page.file.src_uri} links to {match[1]}, which is not in the repository")
            return match[0]
        # a scheme makes MkDocs leave the link alone; on_page_content makes it relative
        relative = target.relative_to(ROOT).as_posix()
        return f"]({REPO_SCHEME}{'../' * depth}{relative}{match[2] or ''})"

    parts, last = [], 0
    for fence in FENCE.finditer(markdown):  # leave code blocks alone
        parts.append(REPO_LINK.sub(to_repository, markdown[last : fence.start()]))
        parts.append(fence[0])
        last = fence.end()
    parts.append(REPO_LINK.sub(to_repository, markdown[last:]))
    return "".join(parts)


def on_page_content(html: str, page, config, files) -> str:
    return html.replace(f'href="{REPO_SCHEME}', 'href="')
