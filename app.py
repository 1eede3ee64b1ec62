"""TEV Explorer: watch tree speculative decoding, see where draft trees lose target mass.

UI only: every computation lives in ``tev/`` and every figure in ``visual/``; each tab's module in
``ui/`` builds its components and wires its events beside its handlers, and this file lays the
tabs out and launches the page.
Run ``python app.py`` (127.0.0.1:7860; GRADIO_SERVER_NAME / GRADIO_SERVER_PORT respected).
"""

from __future__ import annotations

import os
import sys

import gradio as gr
import torch

from tev.data.prompts import load_prompt_set
from tev.util.collector import freeze_long_lived
from tev.util.cpu_load import OtherLoad
from tev.util.cpus import ServerThreads, available_cpus, server_threads
from tev.util.memory import limit_malloc_arenas
from ui import exittrain, gpu, header, lab, learn, live, shared, walkthrough, workload
from ui.components import PAGE_JS

# Gradio keeps every session's state and last component values in memory (about 1.5 MB per
# session here); bound how many sessions it keeps (least recently used go first). Measured in docs/reliability.md.
SESSION_CAPACITY = int(os.environ.get("TEV_SESSION_CAPACITY") or 256)
CSS = ".tev-text { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: 13px; line-height: 1.5; }"


def _examples() -> list[str]:
    if shared.CHAT_DEFAULT:
        return [p["text"] for p in load_prompt_set("chat")[::3]]  # dialogue, code and math, held out
    try:
        heldout, humaneval = load_prompt_set("heldout"), load_prompt_set("humaneval")
    except FileNotFoundError:
        return ["def fib(n):\n    "]
    return [p["text"] for p in heldout[3:40:6]] + [p["text"] for p in humaneval[:3]]


def _walkthrough_example(examples: list[str]) -> str:
    """The walkthrough's opening prompt: for the chat pair the first code request, whose first round
    already accepts a few draft tokens (a greeting's first word is often missed at the root)."""
    code = [p["text"] for p in load_prompt_set("chat") if p.get("domain") == "code"] if shared.CHAT_DEFAULT else []
    return code[0] if code else examples[2] if len(examples) > 2 else examples[0]


def build_app() -> gr.Blocks:
    examples = _examples()
    with gr.Blocks(title="TEV Explorer") as demo:
        header.tab(demo)
        with gr.Tab("Live"):
            drafters = [live.tab(examples)]
        with gr.Tab("Walkthrough"):
            drafters.append(walkthrough.tab(_walkthrough_example(examples)))
        with gr.Tab("Verifier lab"):
            lab.tab(examples[1] if len(examples) > 1 else examples[0])
        with gr.Tab("ExitTrain"):
            exittrain.tab()
            workload.tab(drafters)
        with gr.Tab("Learn"):
            learn.tab()
    return demo


def _warm_up() -> None:
    """Load the models; a failure is reported here in one line, and again on the page and to
    every request (they retry the load), never as a crash."""
    try:
        shared.SERVICE.bundle()
    except Exception as error:  # noqa: BLE001 - shown, not raised: the page still serves and says why
        print(f"TEV Explorer: models could not be loaded: {error}", file=sys.stderr, flush=True)


def _server_threads() -> ServerThreads:
    """Torch threads for the compute thread's steps (:func:`~tev.util.cpus.server_threads`): ``TEV_THREADS``
    fixes one count; else every core the container may use for interactive steps and one fewer for background
    work and while another process holds a core (one count where the target's forward would round a row
    differently at another)."""
    try:
        return server_threads()
    except ValueError as error:
        raise SystemExit(str(error)) from None


def main() -> None:
    limit_malloc_arenas()  # before the server's request threads allocate (see tev/util/memory.py)
    # Only the compute thread may run a team of several OpenMP threads: a second team anywhere in the process
    # (the main thread's, at load) makes GNU OpenMP's threads outnumber the cores, and it then puts every waiting
    # thread to sleep instead of spinning; on a 2-core AVX2 EPYC plain decoding at 2 threads in a worker thread fell
    # from 17-19 to 10-12 tokens/s (1 thread: 15). The models load and are timed in the compute thread.
    torch.set_num_threads(1)
    # set in the compute thread before each step; the full count only while no other process holds a core
    shared.SERVICE.compute.use_threads(_server_threads(), torch.set_num_threads, OtherLoad(available_cpus()).holds_a_core)
    demo = build_app()
    # Load the models before serving (a few seconds): the first Generate then streams at once
    # instead of waiting on a load, and ZeroGPU moves the weights to its GPU at start-up.
    _warm_up()
    freeze_long_lived()  # the models' and the page's objects: a full collection then stops the rounds for milliseconds, not 50-270 ms
    if not gpu.ZERO_GPU:  # there the target reaches its GPU only inside a request: the first auto request measures
        shared.SERVICE.warm_in_background()
    demo.queue(max_size=32, default_concurrency_limit=2).launch(
        server_name=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"),
        server_port=int(os.environ.get("GRADIO_SERVER_PORT", "7860")),
        share=False,
        max_file_size="1mb",
        state_session_capacity=SESSION_CAPACITY,
        css=CSS,
        js=PAGE_JS,
        theme=gr.themes.Soft(),
    )


if __name__ == "__main__":
    main()
