"""What a streaming answer costs the visitor's browser: the long tasks on the page's main thread.

Starts ``python app.py`` on the default pair (the server's own thread count unless ``TEV_THREADS`` is set),
opens Debian Chromium on the Live tab and presses Generate at the opening settings with the re-timing off
(``--runs`` answers, one after the other), watching from the page itself (:data:`~tev.drive.browser.WATCH_RUN_JS`)
every long task (the main thread busy 50 ms or more) from the press until the stats say the answer stopped,
and each tree redraw. The browser runs on the same machine as the server, as a visitor of a Space does not:
what it measures is the page's own weight on a small machine, at its worst.

    python -m tev bench page-load --runs 3 --json runs/page-load.json
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

from tev.drive.appserver import AppServer
from tev.drive.browser import RAN_JS, STREAMED_JS, WATCH_RUN_JS, open_page
from tev.engine.models import DEFAULT_PAIR
from tev.util.paths import assets_dir
from tev.util.stored import write_result

__all__ = ["add_arguments", "run", "streamed_runs"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--runs", type=int, default=3, help="answers streamed one after the other (the first also loads the page's figures)")
    parser.add_argument("--json", help="write each run's figures here")


def streamed_runs(page, runs: int) -> list[dict]:
    """Each of ``runs`` answers at the page's current settings: its streaming seconds, long tasks (their count, total and
    longest, ms) and tree redraws, as the page saw them."""
    rows = []
    for _ in range(runs):
        page.evaluate(WATCH_RUN_JS)
        page.evaluate(RAN_JS)
        page.click("#generate-button")
        page.wait_for_function("window.__ran && document.querySelector('#live-stats').innerText.includes('stopped')", timeout=600_000)
        page.wait_for_timeout(1500)  # the finished view's draw (not counted: it ends the stream)
        run = page.evaluate(STREAMED_JS)
        rows.append({**run, "busy_share": run["busy"] / max(run["seconds"], 1e-9)})
        print(f"streamed {run['seconds']:.1f} s: {run['tasks']} long tasks, {run['busy']:.2f} s in all ({100 * rows[-1]['busy_share']:.1f}%), "
              f"longest {run['longest']:.0f} ms, {run['redraws']} tree redraws", flush=True)
    return rows


def run(args: argparse.Namespace) -> int:
    server = AppServer(assets_dir(), Path(tempfile.mkdtemp()) / "app.log", extra_env={"TEV_PAIR": DEFAULT_PAIR.name})
    try:
        print(f"app ready in {server.wait_ready(300):.1f}s", flush=True)
        with open_page(server.url) as page:
            page.get_by_label("also time an autoregressive run (speedup)").set_checked(False)  # the stream alone: what the page draws
            rows = streamed_runs(page, args.runs)
    finally:
        server.stop()
    share = statistics.median(row["busy_share"] for row in rows)
    print(f"long tasks: median {100 * share:.1f}% of the streaming time, longest {max(row['longest'] for row in rows):.0f} ms over {len(rows)} runs")
    if args.json:
        write_result(args.json, "page-load", {"runs": rows, "median_busy_share": share})
    return 0
