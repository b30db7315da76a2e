"""The documentation site works in a real browser: every page, reached by following links
from the home page, loads in headless Chromium without an error, fetches nothing from
outside the site, and every internal link leads to a page (or file) of the site and to an
anchor that page has.

MkDocs' strict build checks the links of the Markdown it knows; this checks what a reader
gets: the built pages, the theme's navigation and the reference's cross-links included.
The site is built as ``make docs`` builds it (``mkdocs build --strict``), into a temporary
directory, and opened from disk (``use_directory_urls: false``).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import deque
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import pytest
from _browser import render_page, require_chromium

ROOT = Path(__file__).resolve().parent.parent

pytest.importorskip("mkdocs", reason="the site needs the docs extra: pip install -e '.[docs]'")

#: Every link of a page (resolved by the browser), every id in it, and its main heading.
PAGE_JS = """(() => ({
  links: Array.from(document.querySelectorAll("a[href]"), a => a.href),
  ids: Array.from(document.querySelectorAll("[id]"), e => e.id),
  title: (document.querySelector("article h1") || {textContent: ""}).textContent.trim(),
  text: (document.querySelector("article") || {innerText: ""}).innerText.length,
}))()"""


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    require_chromium()
    out = tmp_path_factory.mktemp("site")
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        check=False,
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, f"the site does not build:\n{done.stderr[-4000:]}"
    return out


def test_every_page_renders_and_every_internal_link_leads_somewhere(
    site: Path, tmp_path: Path
) -> None:
    root = site.resolve().as_uri() + "/"
    pages = {p for p in site.rglob("*.html") if p.name != "404.html"}
    seen: dict[Path, dict[str, Any]] = {}
    links: list[tuple[Path, str]] = []
    queue = deque([site / "index.html"])
    problems: list[str] = []
    while queue:
        html = queue.popleft()
        if html in seen:
            continue
        where = html.relative_to(site)
        shown = render_page(
            html, tmp_path / "shot.png", width=1280, height=900, script=PAGE_JS, ready_wait=0
        )
        value = shown.value
        assert isinstance(value, dict), f"{where}: the page's script gave {value!r}"
        seen[html] = value
        problems += [f"{where}: {error}" for error in shown.console_errors]
        problems += [
            f"{where} fetched {url}" for url in shown.network_requests if not url.startswith(root)
        ]
        if not value["title"] or value["text"] < 200:
            problems.append(f"{where}: no heading or almost no text ({value})")
        for link in value["links"]:
            url = urlsplit(str(link))
            if url.scheme != "file":
                continue
            target = Path(unquote(url.path))
            if not str(target).startswith(str(site.resolve())):
                problems.append(f"{where}: a link out of the site: {link}")
                continue
            links.append((html, str(link)))
            if target.suffix == ".html" and target.is_file():
                queue.append(site / target.relative_to(site.resolve()))
    for html, link in links:
        url = urlsplit(link)
        target = site / Path(unquote(url.path)).relative_to(site.resolve())
        where = html.relative_to(site)
        if not target.is_file():
            problems.append(f"{where}: a link to {target.relative_to(site)}, not in the site")
        elif url.fragment and target in seen:
            ids = seen[target]["ids"]
            if unquote(url.fragment) not in ids:
                problems.append(f"{where}: {link.removeprefix(root)}: no such anchor")
    assert problems == [], "\n".join(problems)
    assert set(seen) == pages, f"pages no link reaches: {sorted(map(str, pages - set(seen)))}"
    assert len(links) > 10 * len(pages)  # the navigation alone links every page from each
