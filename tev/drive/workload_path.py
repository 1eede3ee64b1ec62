"""A visitor's workload path on the default pair, timed in a real browser: paste prompts in the
ExitTrain tab, adapt within the minutes, then choose "adapted: my prompts" in Live and generate on
the workload's held-out prompts at the page's opening law (T = 0.7, top-p 0.9) and a fixed budget,
beside the shipped block drafter.

Starts ``python app.py`` on the default pair and drives Debian Chromium with Playwright; records the
minutes from the paste to the first finished Live answer with the adapted drafter, and each
held-out prompt's tau (from the run summary the page gives beside its stats) with both drafters.

    python -m tev bench workload-path --workload runs/shell-prompts.json --json runs/workload-path.json
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from tev.drive.appserver import AppServer
from tev.drive.browser import AUTO_LABEL, BUDGET_LABEL, live_summary, open_page, set_number
from tev.engine.models import DEFAULT_PAIR
from tev.pipelines.workload_data import load_workload, split_workload
from tev.util.paths import assets_dir
from tev.util.stored import write_result

ADAPTED = "adapted: my prompts"
MINUTES_LABEL = "minutes (the whole run: answers, fine-tunes, held-out measurement)"


def live_tau(page, drafter: str, prompt: str) -> float:
    """Generate ``prompt`` in the Live tab with ``drafter``; the page's tau for it."""
    page.locator("#live-drafter").get_by_label(drafter, exact=True).check()
    page.get_by_label("your message to the model", exact=False).fill(prompt)
    before = page.inner_text("#live-stats")
    page.click("#generate-button")
    # this run's own text view shows its prompt (a run of another prompt, or stale stats, never counts)
    page.wait_for_function("""([before, start]) => {
        const text = document.querySelector('#live-stats').innerText;
        return text !== before && document.querySelector('#text-view').innerText.includes(start) && text.includes('stopped')
            && (text.includes('timed again') || text.includes('No speed comparison'));
    }""", arg=[before, prompt[:40]], timeout=600_000)
    summary = live_summary(page)
    if summary["drafter"] != drafter:
        raise RuntimeError(f"the page ran another drafter than {drafter!r}: {summary['drafter']!r}")
    return summary["tau"]


def adapt(page, prompts: list[str], minutes: float, result: dict) -> float:
    """The ExitTrain tab's workload mode on ``prompts``, timed from the paste (``adapt_minutes``);
    returns when the paste began (``time.monotonic``)."""
    page.get_by_role("tab", name="ExitTrain").click()
    page.get_by_label("my own prompts (below)").check()
    set_number(page, MINUTES_LABEL, f"{minutes:g}")
    start = time.monotonic()
    page.get_by_label("your prompts, one per line", exact=False).fill("\n".join(prompts))
    page.click("#workload-start")
    page.wait_for_function("document.querySelector('#workload-status').innerText.includes('finished in')", timeout=int(2 * minutes * 60_000))
    page.wait_for_function("!document.querySelector('#workload-status').innerText.includes('drawing')", timeout=300_000)
    result["status"] = page.inner_text("#workload-status")
    result["table"] = page.inner_text("#workload-table")
    result["adapt_minutes"] = (time.monotonic() - start) / 60
    print(f"adapted in {result['adapt_minutes']:.1f} min: {result['status'][:160]}", flush=True)
    return start


def compare(page, heldout: list[str], budget: int, start: float, result: dict) -> None:
    """Each held-out prompt in Live with the adapted drafter, then the shipped one."""
    page.get_by_role("tab", name="Live").click()
    # a fixed budget, so tau compares the drafters (at budget auto a round may keep no node, and tau is then 1)
    page.get_by_label(AUTO_LABEL).set_checked(False)
    set_number(page, BUDGET_LABEL, budget)
    for i, prompt in enumerate(heldout):
        adapted = live_tau(page, ADAPTED, prompt)
        if i == 0:
            result["to_live_minutes"] = (time.monotonic() - start) / 60
            print(f"first Live answer with the adapted drafter {result['to_live_minutes']:.1f} min after the paste", flush=True)
        base = live_tau(page, "block", prompt)
        result["rows"].append({"prompt": prompt, "tau_adapted": adapted, "tau_base": base})
        print(f"held-out {i}: tau base {base:.2f}, adapted {adapted:.2f}", flush=True)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workload", required=True, help="a JSON list of user messages (at least 16)")
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--heldout", type=int, default=3, help="held-out prompts generated in Live with each drafter")
    parser.add_argument("--budget", type=int, default=16, help="the fixed budget of the Live runs (the page's other settings stay at their opening values)")
    parser.add_argument("--threads", default="1")
    parser.add_argument("--json")


def run(args: argparse.Namespace) -> int:
    prompts = load_workload(args.workload)
    _, heldout = split_workload(prompts)
    server = AppServer(assets_dir(), Path(tempfile.mkdtemp()) / "app.log", extra_env={"TEV_PAIR": DEFAULT_PAIR.name, "TEV_THREADS": args.threads})
    result = {"workload": args.workload, "minutes_allowed": args.minutes, "threads": args.threads, "budget": args.budget, "rows": []}
    try:
        print(f"app ready in {server.wait_ready():.1f}s", flush=True)
        with open_page(server.url) as page:
            start = adapt(page, prompts, args.minutes, result)
            if "kept for this browser session" in result["status"]:
                compare(page, heldout[: args.heldout], args.budget, start, result)
            else:
                print("no adapted drafter was kept: nothing to run in Live", flush=True)
    finally:
        server.stop()
    if result["rows"]:
        result["median_tau_ratio"] = statistics.median(r["tau_adapted"] / r["tau_base"] for r in result["rows"])
        print(f"median tau adapted / base over {len(result['rows'])} held-out prompts: {result['median_tau_ratio']:.2f}")
    if args.json:
        write_result(args.json, "workload-path", result)
    return 0
