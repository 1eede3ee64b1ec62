"""The Live page's speed figure, read from a real browser, for comparison with `bench e2e`.

Starts `python app.py` on the default pair, drives Debian Chromium with Playwright through the
same held-out chat prompts `bench e2e --prompts chat --num-prompts N` uses, at each temperature
(the page's opening budget: auto with a cap of 16, or ``--budget B``; 64 new tokens, the page's
top-p at T > 0), and records the speedup the page prints (its quiet rerun against plain decoding).
``--omp-wait-policy`` starts the server with that ``OMP_WAIT_POLICY`` (the thread setting's other half). Compare with the "vs own AR" column of

    python -m tev bench e2e --prompts chat --num-prompts 6 --budgets 16 --temperatures 0 0.7 --top-p 0.9 --skip-memory

run with the same threads (`TEV_THREADS`, default 2 here, and torch's default of 2 there).

    python scripts/page_speed.py --prompts 6 --json runs/page-speed.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.appserver import AppServer  # noqa: E402
from tev.data.prompts import load_prompt_set, spread_evenly  # noqa: E402
from tev.engine.models import DEFAULT_PAIR  # noqa: E402
from tev.util.paths import assets_dir  # noqa: E402

BUDGET_LABEL = "budget B (draft nodes per round; 0 drafts nothing: plain decoding); with budget auto, the most a round may keep"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def set_number(page, label: str, value) -> None:
    box = page.get_by_role("spinbutton", name=f"number input for {label}")
    box.fill(str(value))
    box.press("Enter")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=6)
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 0.7])
    parser.add_argument("--threads", default=os.environ.get("TEV_THREADS", "2"))
    parser.add_argument("--json", help="write the per-prompt figures here")
    parser.add_argument("--api", action="store_true", help="call the page's Generate through the API instead (no browser on this machine)")
    parser.add_argument("--budget", default="auto", help="auto (the page's opening setting, cap 16) or a fixed budget B")
    parser.add_argument("--omp-wait-policy", choices=["PASSIVE", "ACTIVE"], help="OMP_WAIT_POLICY for the server (unset: OpenMP's default)")
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    prompts = spread_evenly(load_prompt_set("chat"), args.prompts)
    log = Path(tempfile.mkdtemp()) / "app.log"
    env = {"TEV_PAIR": DEFAULT_PAIR.name, "TEV_THREADS": str(args.threads)}
    if args.omp_wait_policy:
        env["OMP_WAIT_POLICY"] = args.omp_wait_policy
    auto = args.budget == "auto"
    budget = 16 if auto else int(args.budget)
    server = AppServer(assets_dir(), log, extra_env=env)
    rows = []
    try:
        print(f"app ready in {server.wait_ready():.1f}s", flush=True)
        if args.api:
            rows = api_rows(server.url, prompts, args.temperatures, budget, auto)
        else:
            rows = browser_rows(server.url, prompts, args.temperatures, budget, auto, sync_playwright)
    finally:
        server.stop()
    for temperature in args.temperatures:
        mine = [r["speedup"] for r in rows if r["temperature"] == temperature]
        print(f"T={temperature:g}: median page speedup {statistics.median(mine):.2f}x over {len(mine)} prompts")
    if args.json:
        Path(args.json).write_text(json.dumps({"threads": args.threads, "omp_wait_policy": args.omp_wait_policy, "budget": args.budget, "api": args.api, "rows": rows}, indent=1))


def parse(stats: str, temperature: float, prompt: dict) -> dict:
    stats = stats.replace("**", "")  # the API gives markdown, the page its text
    speedup = float(re.search(r"→ (\d+\.\d+)x", stats).group(1))
    live = float(re.search(r"(\d+\.\d+) tokens/s while the page drew", stats).group(1))
    quiet = float(re.search(r"speculation (\d+\.\d+) tokens/s", stats).group(1))
    print(f"T={temperature:g} {prompt['id']}: page speedup {speedup:.2f}x (speculation {quiet:.1f} tok/s quiet, {live:.1f} while drawing)", flush=True)
    return {"temperature": temperature, "prompt": prompt["id"], "domain": prompt.get("domain"), "speedup": speedup,
            "tokens_per_second_live": live, "tokens_per_second_quiet": quiet}


def api_rows(url: str, prompts: list[dict], temperatures, budget: int, auto: bool) -> list[dict]:
    from gradio_client import Client

    client = Client(url, verbose=False)
    rows = []
    for temperature in temperatures:
        for prompt in prompts:
            stats = client.predict(prompt["text"], "block", "tev", budget, temperature, 64, 0, True, True, 0.9, 0, auto, api_name="/generate")[4]
            rows.append(parse(stats, temperature, prompt))
    return rows


def browser_rows(url: str, prompts: list[dict], temperatures, budget: int, auto: bool, sync_playwright) -> list[dict]:
    rows = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path="/usr/bin/chromium", headless=True, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.goto(url, wait_until="domcontentloaded")
        page.wait_for_function("!document.body.innerText.includes('loading models')", timeout=120_000)
        set_number(page, "max new tokens", 64)
        box = page.get_by_label("budget auto: each round keeps the drafter's best nodes this machine pays for")
        if box.is_checked() != auto:
            box.click()
        set_number(page, BUDGET_LABEL, budget)
        for temperature in temperatures:
            set_number(page, "temperature T (0: greedy)", temperature)
            for prompt in prompts:
                page.get_by_label("your message to the model").fill(prompt["text"])
                page.click("#generate-button")
                # this run's text view shows its own prompt from its first round, in the same update
                # that replaces the previous run's stats; its stats say 'timed again' only at the end
                page.wait_for_function(
                    "start => document.querySelector('#text-view').innerText.includes(start) && "
                    "document.querySelector('#live-stats').innerText.includes('timed again')",
                    arg=prompt["text"][:40], timeout=300_000)
                rows.append(parse(page.inner_text("#live-stats"), temperature, prompt))
        browser.close()
    return rows


if __name__ == "__main__":
    main()
