"""Time the app on the default pair as a user meets it: `python scripts/app_timings.py`.

Starts `python app.py` (the default pair, SmolLM2-135M-Instruct) and reports how long until it
answers, then presses Generate through the API and reports when the first round streamed back
and the server's peak resident memory. With `--starts 2` the server is started twice (the second
start loads the converted target from the cache). Numbers from a shared CPU are noisy.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from gradio_client import Client  # noqa: E402

from tests.appserver import AppServer  # noqa: E402
from tev.util.paths import assets_dir  # noqa: E402


def peak_rss_mb(pid: int) -> float:
    """The process's peak resident set (VmHWM), MB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--starts", type=int, default=2)
    parser.add_argument("--prompt", default="What is the capital of France?")
    parser.add_argument("--pair", default="smollm2")
    args = parser.parse_args()
    for start in range(1, args.starts + 1):
        server = AppServer(assets_dir(), Path(tempfile.mkdtemp()) / "app.log", extra_env={"TEV_PAIR": args.pair})
        try:
            ready = server.wait_ready(timeout=300)
            client = Client(server.url, verbose=False)
            client.view_api(print_info=False)  # the page's first load also waits for the models
            pressed = time.perf_counter()
            job = client.submit(args.prompt, "block", "tev", 32, 0.0, 64, 0, False, True, api_name="/generate")
            first = None
            while not job.done():
                if first is None and job.outputs():
                    first = time.perf_counter() - pressed
                time.sleep(0.02)
            job.result()
            first = first if first is not None else time.perf_counter() - pressed
            total = time.perf_counter() - pressed
            print(
                f"start {start}: ready after {ready:.1f} s; first streamed round {first:.2f} s after Generate "
                f"(includes model loading if it was still under way); 64 tokens in {total:.1f} s; server peak memory {peak_rss_mb(server.process.pid):.0f} MB",
                flush=True,
            )
        finally:
            server.stop()


if __name__ == "__main__":
    main()
