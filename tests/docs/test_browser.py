"""The built site and an HTML leaderboard in a real browser (issue 38): Debian's headless
Chromium, driven by playwright. Fails on a console error or failed request, a page without its
table, a broken image, or an unstyled page (a Material CSS rule not applied); checks the
leaderboard's sorting and filtering; saves screenshots (also to /tmp/docs_screens/ when
PFLBENCH_DOCS_SCREENS names a folder). Skips when Chromium or the docs extra is missing.

``PFLBENCH_DOCS_SITE=DIR`` uses a site built already (CI builds it once with --strict)."""

from __future__ import annotations

import functools
import http.server
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("mkdocs", reason="the docs extra: pip install -e '.[docs]'")
playwright_sync = pytest.importorskip("playwright.sync_api", reason="the docs extra: pip install -e '.[docs]'")

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no chromium (apt-get install chromium)")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
# page → a CSS selector it must contain (a table where the page is about one)
PAGES = {
    "index.html": "article h1",
    "getting-started/index.html": "article table",
    "guides/sweeps/index.html": "article table",
    "reference/algorithms/index.html": "article table",
    "reference/algorithms/fedprox/index.html": "article table",
    "reference/cli/index.html": "article table",
    "reference/api/index.html": "article .doc-heading",
    "metrics/pers-acc/index.html": "article pre",
    "plugins/architecture/index.html": "article table",
}
MATERIAL_INDIGO = "rgb(64, 81, 181)"  # --md-primary-fg-color of palette "indigo" (#4051b5)


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    built = os.environ.get("PFLBENCH_DOCS_SITE")
    if built:
        return Path(built)
    folder = tmp_path_factory.mktemp("site")
    subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--quiet", "--site-dir", str(folder)],
        cwd=ROOT,
        check=True,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},
    )
    return folder


class QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the base class's name)
        """No line per request on stderr."""


@pytest.fixture(scope="module")
def server(site: Path) -> Iterator[str]:
    handler = functools.partial(QuietHandler, directory=str(site))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}/"
    httpd.shutdown()


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    with playwright_sync.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        yield launched
        launched.close()


@pytest.fixture(scope="module")
def screens(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("screens")


def keep(shot: Path) -> None:
    folder = os.environ.get("PFLBENCH_DOCS_SCREENS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(folder) / shot.name)


def open_page(browser: Any, url: str) -> tuple[Any, list[str]]:
    """A new page at ``url``; the list collects console errors, page errors and failed requests."""
    page = browser.new_page(viewport={"width": 1280, "height": 900})
    problems: list[str] = []
    page.on("console", lambda m: problems.append(f"console {m.type}: {m.text}") if m.type == "error" else None)
    page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
    page.on("requestfailed", lambda r: problems.append(f"request failed: {r.url} {r.failure}"))
    page.on("response", lambda r: problems.append(f"HTTP {r.status}: {r.url}") if r.status >= 400 else None)
    page.goto(url, wait_until="load")
    page.wait_for_load_state("networkidle")
    return page, problems


def broken_images(page: Any) -> list[str]:
    return page.evaluate("Array.from(document.images).filter(i => !i.complete || i.naturalWidth === 0).map(i => i.src)")


@pytest.mark.parametrize("path", list(PAGES))
def test_site_pages_render_styled_without_errors(browser: Any, server: str, screens: Path, path: str) -> None:
    page, problems = open_page(browser, server + path)
    try:
        assert page.locator(PAGES[path]).count() > 0, f"{path}: no {PAGES[path]}"
        assert broken_images(page) == []
        header = page.locator("header.md-header")
        assert header.count() == 1, f"{path}: no Material header (theme not applied)"
        assert header.evaluate("e => getComputedStyle(e).backgroundColor") == MATERIAL_INDIGO
        assert header.evaluate("e => getComputedStyle(e).position") == "sticky"
        assert page.locator("nav.md-nav--primary").count() > 0
        if path == "reference/algorithms/fedprox/index.html":
            shot = screens / "docs_algorithm_page.png"
            page.screenshot(path=str(shot), full_page=False)
            keep(shot)
        assert problems == [], problems
    finally:
        page.close()


def test_site_search_index_loads(browser: Any, server: str) -> None:
    page, problems = open_page(browser, server + "index.html")
    try:
        # the search worker builds its index in the page (seconds on a busy machine): type the
        # query again until it answers
        search = page.locator(".md-search__input")
        search.click()
        deadline = time.monotonic() + 120
        while page.locator(".md-search-result__item").count() == 0 and time.monotonic() < deadline:
            search.fill("")
            search.type("FedProx", delay=20)
            page.wait_for_timeout(3000)
        assert "FedProx (fedprox)" in page.locator(".md-search-result").inner_text()
        assert problems == [], problems
    finally:
        page.close()


@pytest.fixture(scope="module")
def leaderboard(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny sweep (3 algorithms of 3 families × 2 seeds, 2 rounds) and its HTML leaderboard."""
    folder = tmp_path_factory.mktemp("board")
    pflbench = [sys.executable, "-c", "from pflbench.cli import main; main()"]
    common = ["--datasets", "digits", "--alphas", "0.1", "--model", "mlp", "--num-clients", "3", "--rounds", "2"]
    subprocess.run(
        [*pflbench, "sweep", "--algos", "fedavg,fedper,local", "--seeds", "0,1", *common, "--out", "b", "--quiet"],
        cwd=folder,
        check=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    page = folder / "leaderboard.html"
    subprocess.run(
        [*pflbench, "leaderboard", "b", "--families", "--format", "html", "--output", str(page)],
        cwd=folder,
        check=True,
    )
    return page


def visible_rows(page: Any) -> list[str]:
    return page.evaluate(
        "Array.from(document.querySelectorAll('tbody tr')).filter(r => r.style.display !== 'none')"
        ".map(r => r.cells[0].textContent.trim())"
    )


def curve_of(out: Path, algo: str) -> list[list[float]]:
    """[[round, mean over seeds of pers_acc in %], ...] from the runs' rounds.jsonl."""
    by_round: dict[int, list[float]] = {}
    for run in sorted((out / "runs").glob(f"{algo}__*")):
        for line in (run / "rounds.jsonl").read_text().splitlines():
            record = json.loads(line)
            by_round.setdefault(record["round"], []).append(record["pers_acc"])
    return [[float(r), pytest.approx(100 * sum(v) / len(v))] for r, v in sorted(by_round.items())]


def test_html_leaderboard_is_styled_sortable_and_filterable(browser: Any, leaderboard: Path, screens: Path) -> None:
    page, problems = open_page(browser, leaderboard.as_uri())
    try:
        table = page.locator("table")
        assert table.count() == 1 and page.locator("tbody tr").count() == 3
        assert table.evaluate("e => getComputedStyle(e).borderCollapse") == "collapse"  # the inline CSS applied
        assert broken_images(page) == []
        # sort by the accuracy column: ascending, then descending, "—" never first
        values = page.evaluate(
            "Array.from(document.querySelectorAll('tbody tr')).map(r => [r.cells[0].textContent.trim(),"
            " parseFloat(r.cells[2].textContent)])"
        )
        by_value = [name for name, _ in sorted(values, key=lambda v: v[1])]
        column = page.locator("thead th.sortable", has_text="α=0.1")
        column.click()
        assert column.get_attribute("aria-sort") == "ascending" and visible_rows(page) == by_value
        column.click()
        assert column.get_attribute("aria-sort") == "descending" and visible_rows(page) == by_value[::-1]
        page.locator("thead th.sortable", has_text="Algorithm").click()
        assert visible_rows(page) == ["FedAvg", "FedPer", "Local"]
        # filter by family, then by name
        page.select_option("select[aria-label=Family]", "decoupling")
        assert visible_rows(page) == ["FedPer"]
        page.select_option("select[aria-label=Family]", "")
        page.fill("input[aria-label='Filter algorithms']", "fed")
        assert visible_rows(page) == ["FedAvg", "FedPer"]
        page.fill("input[aria-label='Filter algorithms']", "")
        # a click on a row's name draws its per-round curve: the mean over seeds of rounds.jsonl
        page.locator("tbody th.has-curve", has_text="FedPer").click()
        figure = page.locator("figure.curve")
        assert figure.is_visible() and "FedPer: Personalized accuracy (%) per round" in figure.inner_text()
        assert figure.locator("polyline").count() == 1 and figure.locator("circle").count() == 2
        shown = page.evaluate("JSON.parse(document.getElementById('curves').textContent).rows")
        row = visible_rows(page).index("FedPer")
        position = page.evaluate(f"document.querySelectorAll('tbody tr')[{row}].getAttribute('data-row')")
        assert shown[position] == {"digits α=0.1": curve_of(leaderboard.parent / "b", "fedper")}
        page.locator("tbody th.has-curve", has_text="FedPer").click()
        assert not figure.is_visible()
        page.locator("tbody th.has-curve", has_text="Local").click()
        shot = screens / "leaderboard_html.png"
        page.screenshot(path=str(shot), full_page=True)
        keep(shot)
        assert problems == [], problems
    finally:
        page.close()
