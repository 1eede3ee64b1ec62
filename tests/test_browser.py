"""A real browser (Debian Chromium, headless, driven by Playwright) loads the app, clicks
Generate and sees the draft tree render."""

import os
import shutil

import pytest

pytestmark = pytest.mark.browser
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


@pytest.fixture(scope="module")
def browser():
    if os.environ.get("TEV_SKIP_BROWSER") == "1":
        pytest.skip("TEV_SKIP_BROWSER=1 was set explicitly")
    assert os.path.exists(CHROMIUM), "Chromium is missing: `make test` installs it (scripts/ensure-chromium.sh)"
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            args=["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"],
        )
        try:
            yield browser
        finally:
            browser.close()


def test_page_generates_and_draws_the_tree(app_server, browser, tmp_path):
    page = browser.new_page(viewport={"width": 1400, "height": 2200})
    page.goto(app_server.url, wait_until="domcontentloaded")
    page.wait_for_selector("#generate-button", timeout=60_000)
    page.get_by_label("prompt (Python code to continue)").fill("def add(a, b):\n    ")
    page.click("#generate-button")
    # the tree plot is a plotly graph with node markers; the stats line counts rounds
    page.wait_for_selector("#tree-plot .js-plotly-plot .scatterlayer .trace", timeout=90_000)
    page.wait_for_function("document.querySelector('#live-stats') && document.querySelector('#live-stats').innerText.includes('rounds')", timeout=90_000)
    page.wait_for_function("document.querySelector('#live-stats').innerText.includes('stopped')", timeout=120_000)
    stats = page.inner_text("#live-stats")
    assert "tau" in stats and "tokens/s" in stats
    traces = page.locator("#tree-plot .scatterlayer .trace").count()
    assert traces >= 3  # edges, nodes, exit node (and bonus token)
    legend = page.inner_text("#tree-plot")
    assert "exit node" in legend and "bonus token" in legend
    text_view = page.inner_text("#text-view")
    assert text_view.strip()
    shot = tmp_path / "app.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000
    print(f"screenshot: {shot}")
    page.close()
