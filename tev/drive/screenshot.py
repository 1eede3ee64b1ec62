"""Take the README screenshot from the real app: `python -m tev bench screenshot [--out assets/screenshot.png]`.

Starts `python app.py` on the default pair (SmolLM2-135M-Instruct and its opening drafter), drives
Debian Chromium with Playwright (Generate on a chat prompt at the page's default sampling, T = 0.7,
top-p 0.9), and saves a PNG of the Live tab. `--all DIR` also saves the other tabs;
`--workload PACK --out FILE` instead runs the ExitTrain tab's workload mode on a shipped pack and saves the page.
"""

from __future__ import annotations

import argparse
import re
import tempfile
from pathlib import Path

from PIL import Image  # gradio's dependency

from tev.drive.appserver import AppServer
from tev.drive.browser import open_page
from tev.engine.models import DEFAULT_PAIR
from tev.util.paths import REPO_ROOT, assets_dir


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default=str(REPO_ROOT / "assets" / "screenshot.png"))
    parser.add_argument("--all", help="also save every tab as PNG into this folder")
    parser.add_argument("--prompt", default="Write a Python function that checks whether a number is prime.")
    parser.add_argument("--workload", help="instead: adapt the drafter to this shipped pack in the ExitTrain tab and save the result (e.g. json-records)")
    parser.add_argument("--walkthrough", type=int, help="instead: run one round in the Walkthrough tab and save this step (1-9) into --out")
    parser.add_argument("--walkthrough-all", help="instead: run one round in the Walkthrough tab and save every step into this folder (step1.png ..)")


def _with_palette(path) -> None:
    """Rewrite the PNG at ``path`` with a 256-colour palette: the page's flat colours survive, the
    file shrinks by about two thirds (it is committed in ``assets/``)."""
    with Image.open(path) as image:
        small = image.convert("RGB").quantize(colors=256, method=Image.Quantize.MEDIANCUT)
    small.save(path, optimize=True)


def run(args: argparse.Namespace) -> int:
    server = AppServer(assets_dir(), Path(tempfile.mkdtemp()) / "app.log", extra_env={"TEV_PAIR": DEFAULT_PAIR.name})
    try:
        print(f"app ready in {server.wait_ready():.1f}s")
        with open_page(server.url, scale=1) as page:
            if args.workload:
                workload_screenshot(page, args.workload, args.out)
            elif args.walkthrough or args.walkthrough_all:
                walkthrough_screenshots(page, args.walkthrough, args.out, args.walkthrough_all)
            else:
                live_screenshot(page, args.prompt, args.out)
                if args.all:
                    tab_screenshots(page, Path(args.all))
    finally:
        server.stop()
    return 0


def live_screenshot(page, prompt: str, out: str) -> None:
    """The Live tab after one generation of ``prompt`` at the page's opening settings."""
    page.get_by_label("your message to the model").fill(prompt)
    page.click("#generate-button")
    # the final stats carry the speedup of the quiet rerun over plain decoding, timed after the generation
    page.wait_for_function("document.querySelector('#live-stats').innerText.includes('timed again')", timeout=240_000)
    page.wait_for_timeout(1500)
    print("stats:", " | ".join(page.locator("#live-stats").inner_text().split("\n")))
    page.locator("#text-view").scroll_into_view_if_needed()
    # down to the draft tree (the answer and the stats above it push it below 2,000 px since the answer streams under the prompt)
    page.screenshot(path=out, clip={"x": 0, "y": 0, "width": 1400, "height": 2700}, full_page=True)
    _with_palette(out)
    print(f"saved {out}")


def tab_screenshots(page, folder: Path) -> None:
    """The whole Live page, then each other tab after its default run."""
    folder.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(folder / "live-full.png"), full_page=True)
    for tab, button in (("lab", "Run the verifiers"), ("exittrain", "Compare the shipped ExitTrain drafter instead")):
        page.get_by_role("tab", name={"lab": "Verifier lab", "exittrain": "ExitTrain"}[tab]).click()
        page.get_by_role("button", name=button).click()
        page.wait_for_timeout(30_000)
        page.screenshot(path=str(folder / f"{tab}.png"), full_page=True)
    page.get_by_role("tab", name="Learn").click()
    page.wait_for_timeout(1000)
    page.screenshot(path=str(folder / "learn.png"), full_page=True)
    print(f"saved tabs into {folder}")


def walkthrough_screenshots(page, step: int | None, out: str, folder: str | None) -> None:
    """Steps of one round in the Walkthrough tab, at the tab's defaults: ``step`` into ``out``, or
    every step into ``folder``."""
    page.get_by_role("tab", name="Walkthrough").click()
    page.click("#walk-run")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
    page.wait_for_function("/step 1 of \\d+/.test(document.querySelector('#walk-where').innerText)", timeout=120_000)
    steps = int(re.search(r"step 1 of (\d+)", page.inner_text("#walk-where")).group(1))  # as many as the page has
    last = step or steps
    for number in range(1, last + 1):
        if number > 1:
            page.click("#walk-next")
        page.wait_for_function(f"document.querySelector('#walk-where').innerText.includes('step {number} of {steps}')", timeout=120_000)
        if folder or number == step:
            page.wait_for_timeout(1500)
            top = page.locator("#walk-where").bounding_box()["y"] - 10
            target = str(Path(folder) / f"step{number}.png") if folder else out
            page.screenshot(path=target, clip={"x": 0, "y": top, "width": 1400, "height": 1150}, full_page=True)
            print(f"saved {target}: " + page.locator("#walk-text").inner_text()[:120].replace("\n", " "))


def workload_screenshot(page, pack: str, out: str) -> None:
    """The ExitTrain tab's workload mode on one shipped pack, run to the end in the browser."""
    page.get_by_role("tab", name="ExitTrain").click()
    page.get_by_label(pack).check()
    page.click("#workload-start")
    page.wait_for_function("document.querySelector('#workload-status').innerText.includes('finished in')", timeout=900_000)
    page.wait_for_function("document.querySelectorAll('#workload-trees .js-plotly-plot').length == 2", timeout=120_000)
    page.wait_for_timeout(1500)
    print("status:", page.locator("#workload-status").inner_text())
    print(page.locator("#workload-table").inner_text())
    page.locator("#workload-status").scroll_into_view_if_needed()
    page.screenshot(path=out, full_page=True)
    print(f"saved {out}")
