"""The real page in a real browser, for the measurements that time what a visitor meets: Debian
Chromium, headless, driven by Playwright (``requirements-dev.txt``; ``scripts/ensure-chromium.sh``
installs the browser), against an app started by :class:`tev.drive.appserver.AppServer`."""

from __future__ import annotations

import contextlib
import json
import shutil
from typing import Iterator

try:  # a development dependency: the rest of ``python -m tev`` runs without it
    from playwright.sync_api import sync_playwright
except ImportError:
    sync_playwright = None

__all__ = ["CHROMIUM", "CHROMIUM_ARGS", "BUDGET_LABEL", "AUTO_LABEL", "RAN_JS", "WATCH_RUN_JS", "STREAMED_JS", "open_page", "set_number", "live_summary"]

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"]
# the Live tab's labels, as the page shows them
BUDGET_LABEL = "budget B (draft nodes per round; 0 drafts nothing: plain decoding); with budget auto, the most a round may keep"
AUTO_LABEL = "budget auto: each round keeps the drafter's best nodes this machine pays for"


@contextlib.contextmanager
def open_page(url: str, wait_for: str = "#generate-button", scale: float | None = None) -> Iterator:
    """A page of the app at ``url`` (1400 x 1000), once ``wait_for`` shows and the models are loaded."""
    if sync_playwright is None:
        raise RuntimeError("this measurement drives a browser: pip install -r requirements-dev.txt, then bash scripts/ensure-chromium.sh")
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1400, "height": 1000}, **({"device_scale_factor": scale} if scale else {}))
            page.goto(url, wait_until="domcontentloaded")
            page.wait_for_selector(wait_for, timeout=120_000)
            page.wait_for_function("!document.body.innerText.includes('loading models')", timeout=120_000)
            yield page
        finally:
            browser.close()


def set_number(page, label: str, value) -> None:
    box = page.get_by_role("spinbutton", name=f"number input for {label}")
    box.fill(str(value))
    box.press("Enter")


# the hidden JSON output holds an object only once a run has finished; the JSON component shows the value as spaced
# JSON text, and it redraws after the stats beside it (about half a second later on a quiet machine, when the same
# page ran before: meanwhile it still shows the previous run's summary, then nothing): so the summary counts once it
# describes the run the stats describe (the same rounds and tokens, a timing when they say the answer was timed again)
_SUMMARY_SHOWN = """() => {
    const stats = document.querySelector('#live-stats').innerText;
    const counted = stats.match(/rounds (\\d+) · tokens (\\d+)/);
    let value;
    try { value = JSON.parse(document.querySelector('#live-summary').innerText); } catch (error) { return false; }
    if (value === null || typeof value !== 'object' || !counted) return false;
    if (value.rounds !== Number(counted[1]) || value.tokens !== Number(counted[2])) return false;
    const timed = stats.includes('timed again while') || stats.includes('timed again with');
    return !timed || (value.timing !== null && typeof value.timing === 'object' && 'speedup' in value.timing);
}"""


def live_summary(page, timeout_ms: int = 120_000) -> dict:
    """The Live tab's summary of the finished run its stats describe (its hidden JSON output, ``#live-summary``),
    once the page shows it."""
    page.wait_for_function(_SUMMARY_SHOWN, timeout=timeout_ms)
    return json.loads(page.inner_text("#live-summary"))


# What a streaming run costs the browser, watched from the page itself (the measurements and the browser tests share them):
# RAN_JS marks when this press's run began streaming, WATCH_RUN_JS records long tasks and tree redraws until the stats
# say it stopped, STREAMED_JS reads them back.
RAN_JS = """() => {
    window.__ran = false;
    const stats = document.querySelector('#live-stats');
    const watcher = new MutationObserver(() => {
        if (stats.innerText.includes('rounds') && !stats.innerText.includes('stopped')) { window.__ran = true; watcher.disconnect(); }
    });
    watcher.observe(stats, {childList: true, subtree: true, characterData: true});
}"""

WATCH_RUN_JS = """() => {
    // long tasks (the main thread busy 50 ms or more) and tree redraws while the answer streams (until the stats say it stopped)
    window.__run = {start: performance.now(), streamed: null, busy: 0, tasks: 0, longest: 0, titles: new Set()};
    const run = window.__run, stats = document.querySelector('#live-stats'), tree = document.querySelector('#tree-plot');
    if (!window.__tasks) {
        window.__tasks = [];
        new PerformanceObserver(list => { for (const task of list.getEntries()) window.__tasks.push(task); }).observe({type: 'longtask'});
    }
    window.__tasks.length = 0;
    new MutationObserver((_, watcher) => {  // this run's rounds first (the last run's stats said 'stopped' already)
        const text = stats.innerText;
        if (text.includes('rounds') && !text.includes('stopped')) run.running = true;
        else if (run.running && text.includes('stopped')) { run.streamed = performance.now(); watcher.disconnect(); }
    }).observe(stats, {childList: true, subtree: true, characterData: true});
    new MutationObserver((_, watcher) => {
        if (run.streamed !== null) { watcher.disconnect(); return; }
        const title = (tree.innerText.match(/round \\d+ of \\d+/) || [null])[0];
        if (title) run.titles.add(title);
    }).observe(tree, {childList: true, subtree: true, characterData: true});
}"""

STREAMED_JS = """() => {
    const run = window.__run, during = window.__tasks.filter(t => t.startTime + t.duration <= run.streamed);  // the final view's draw excluded
    return {seconds: (run.streamed - run.start) / 1e3, busy: during.reduce((s, t) => s + t.duration, 0) / 1e3, tasks: during.length,
            longest: Math.max(0, ...during.map(t => t.duration)), redraws: run.titles.size};
}"""
