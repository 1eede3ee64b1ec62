"""The Live page's speed figure, read from a real browser, for comparison with ``bench e2e``.

Starts ``python app.py`` on the default pair, drives Debian Chromium with Playwright through the
same held-out chat prompts ``bench e2e --prompts chat --num-prompts N`` uses, at each temperature
(the page's opening budget: auto with a cap of 16, or ``--budget B``; 64 new tokens, the page's
top-p at T > 0, its opening drafter), and records the speedup of the page's quiet rerun against plain
decoding, from the run summary the page gives beside its stats (``--api``: through the API, no browser;
there ``--drafters path block`` times each prompt with each drafter in turn).
``--omp-wait-policy`` starts the server with that ``OMP_WAIT_POLICY`` (the thread setting's other
half). Compare with the "vs own AR" column of

    python -m tev bench e2e --prompts chat --num-prompts 6 --budgets 16 --temperatures 0 0.7 --top-p 0.9 --skip-memory

run with the same threads (``TEV_THREADS``, default 2 here, and torch's default of 2 there).
``--threads auto`` leaves ``TEV_THREADS`` unset: the server's own policy (a visitor's steps at every core the container
may use, one fewer while another process holds a core); each row records the threads its rerun ran with.

    python -m tev bench page-speed --prompts 6 --json runs/page-speed.json
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

from tev.data.prompts import load_prompt_set, spread_evenly
from tev.drive.appserver import AppServer
from tev.drive.browser import AUTO_LABEL, BUDGET_LABEL, live_summary, open_page, set_number
from tev.drive.loadtest import generate_outputs, live_request, new_client, submit
from tev.engine.models import DEFAULT_PAIR
from tev.util.paths import assets_dir
from tev.util.stored import write_result


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--prompts", type=int, default=6)
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 0.7])
    parser.add_argument("--threads", default=os.environ.get("TEV_THREADS", "2"), help="TEV_THREADS for the server, or auto: unset (the server's policy)")
    parser.add_argument("--json", help="write the per-prompt figures here")
    parser.add_argument("--api", action="store_true", help="call the page's Generate through the API instead (no browser on this machine)")
    parser.add_argument("--budget", default="auto", help="auto (the page's opening setting, cap 16) or a fixed budget B")
    parser.add_argument("--drafters", nargs="+", default=[DEFAULT_PAIR.default_drafter],
                        help="drafters to time, each prompt with each in turn (--api only; default: the page's opening drafter)")
    parser.add_argument("--omp-wait-policy", choices=["PASSIVE", "ACTIVE"], help="OMP_WAIT_POLICY for the server (unset: OpenMP's default)")


def run(args: argparse.Namespace) -> int:
    prompts = spread_evenly(load_prompt_set("chat"), args.prompts)
    env = {"TEV_PAIR": DEFAULT_PAIR.name, "TEV_THREADS": "" if args.threads == "auto" else str(args.threads)}  # empty: unset
    if args.omp_wait_policy:
        env["OMP_WAIT_POLICY"] = args.omp_wait_policy
    budget_is_auto = args.budget == "auto"
    budget = 16 if budget_is_auto else int(args.budget)  # at budget auto the slider holds its cap
    server = AppServer(assets_dir(), Path(tempfile.mkdtemp()) / "app.log", extra_env=env)
    try:
        print(f"app ready in {server.wait_ready():.1f}s", flush=True)
        if args.api:
            rows = api_rows(server.url, prompts, args.temperatures, budget, budget_is_auto, args.drafters)
        else:
            rows = browser_rows(server.url, prompts, args.temperatures, budget, budget_is_auto)
    finally:
        server.stop()
    for temperature in args.temperatures:
        for drafter in sorted({r["drafter"] for r in rows}):
            mine = [r["speedup"] for r in rows if r["temperature"] == temperature and r["drafter"] == drafter and r["speedup"] is not None]
            if not mine:
                print(f"T={temperature:g}, drafter {drafter}: no prompt was re-timed")
                continue
            print(f"T={temperature:g}, drafter {drafter}: median page speedup {statistics.median(mine):.2f}x over {len(mine)} prompts")
    if args.json:
        write_result(args.json, "page-speed", {"threads": args.threads, "omp_wait_policy": args.omp_wait_policy, "budget": args.budget, "api": args.api, "rows": rows})
    return 0


def row(summary: dict, temperature: float, prompt: dict) -> dict:
    """One prompt's figures from the page's run summary."""
    timing = summary["timing"]
    if timing is None:  # not re-timed: too few tokens to time (an answer that ended early), other runs in the app's line, a Stop
        print(f"T={temperature:g} {prompt['id']}: not re-timed ({summary['tokens']} tokens, stopped by {summary['stop_reason']}, "
              f"other runs waiting: {summary.get('not_retimed_for') or 0})", flush=True)
        return {"temperature": temperature, "prompt": prompt["id"], "domain": prompt.get("domain"), "drafter": summary["drafter"], "speedup": None,
                "not_retimed_for": summary.get("not_retimed_for"), "tokens_per_second_live": summary["tokens_per_second"]}
    speedup, live, quiet = timing["speedup"], summary["tokens_per_second"], timing["speculative_tokens_per_second"]
    print(f"T={temperature:g} {prompt['id']} drafter {summary['drafter']}: page speedup {speedup:.2f}x (speculation {quiet:.1f} tok/s quiet, "
          f"{live:.1f} as the page received the answer)", flush=True)
    return {"temperature": temperature, "prompt": prompt["id"], "domain": prompt.get("domain"), "drafter": summary["drafter"], "speedup": speedup,
            "tokens_per_second_live": live, "tokens_per_second_quiet": quiet, "threads": timing.get("threads"), "others": timing.get("others")}


def api_rows(url: str, prompts: list[dict], temperatures, budget: int, budget_is_auto: bool, drafters: list[str]) -> list[dict]:
    """Each prompt with each drafter in turn (the order alternating prompt by prompt), through ``/generate``."""
    client = new_client(url)
    summary_at = generate_outputs(client)["summary"]
    rows = []
    for temperature in temperatures:
        for index, prompt in enumerate(prompts):
            for drafter in drafters if index % 2 == 0 else drafters[::-1]:
                settings = live_request(prompt["text"], drafter, "tev", budget, temperature, 64, 0, compare_ar=True, chat=True, top_p=0.9, auto=budget_is_auto)
                outputs = submit(settings, client).result()
                rows.append(row(outputs[summary_at], temperature, prompt))
    return rows


def browser_rows(url: str, prompts: list[dict], temperatures, budget: int, budget_is_auto: bool) -> list[dict]:
    rows = []
    with open_page(url) as page:
        set_number(page, "max new tokens", 64)
        box = page.get_by_label(AUTO_LABEL)
        if box.is_checked() != budget_is_auto:
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
                rows.append(row(live_summary(page), temperature, prompt))
    return rows
