"""Time the app on the default pair as a user meets it: `python scripts/app_timings.py`.

Starts `python app.py` (the default pair, SmolLM2-135M-Instruct) and reports how long until it
answers, then presses Generate through the API and reports when the first round streamed back
and the server's peak resident memory. With `--starts 2` the server is started twice (the second
start loads the converted target from the cache). With `--tabs` the first start also times the
verifier lab's default run and the ExitTrain tab's default run (its limit is 3 minutes, scoring
included). Numbers from a shared CPU are noisy.
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

from tev.bench.appserver import AppServer  # noqa: E402
from tev.engine.models import DEFAULT_PAIR, PAIRS  # noqa: E402
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
    parser.add_argument("--pair", choices=list(PAIRS), default=DEFAULT_PAIR.name)
    parser.add_argument("--tabs", action="store_true", help="also time the verifier lab's and the ExitTrain tab's default runs")
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
            if args.tabs and start == 1:
                time_tabs(client)
        finally:
            server.stop()


def time_tabs(client: Client) -> None:
    """The verifier lab and the ExitTrain tab at their default settings, as the page sends them."""
    from tev.data.prompts import load_prompt_set
    from tev.service.live_exittrain import CHAT_LIVE_SETTINGS
    from ui.exittrain import CHAT_TAB_STEPS

    prompt = load_prompt_set("chat")[3]["text"]  # the lab's default prompt (the page's second example)
    started = time.perf_counter()
    _, _, table = client.predict("prompt", prompt, "block", 16, 1.0, 3000, 0, api_name="/verifier_lab")
    print(f"verifier lab, default run (3,000 draws per verifier, B = 16): {time.perf_counter() - started:.1f} s", flush=True)
    print("   " + " | ".join(line for line in table.splitlines() if line.startswith("| t") or line.startswith("| p") or line.startswith("| s")), flush=True)
    started = time.perf_counter()
    outputs = client.predict("dialogue", "exit", CHAT_TAB_STEPS, CHAT_LIVE_SETTINGS.lambda_tree, api_name="/exittrain")
    print(f"ExitTrain tab, default run ({CHAT_TAB_STEPS} steps, dialogue): {time.perf_counter() - started:.1f} s; {outputs[1]}", flush=True)
    print("   " + outputs[3].split("\n")[0], flush=True)


if __name__ == "__main__":
    main()
