"""The page's header: what the page shows, and the models, the machine and the precision each part runs in."""

from __future__ import annotations

import gradio as gr

from tev.engine.models import PAIRS
from tev.util.precision import precision_record
from ui import shared

INTRO = (
    "# TEV Explorer\nSpeculative decoding makes a language model write several tokens per step: a small drafter guesses a "
    "**tree** of continuations and the model checks them all in one pass, keeping the longest path it agrees with, with exactly "
    "the text it would have written alone. **Press Generate** and watch each round's tree: a node's colour is how much of the "
    "model's probability reaches it, its size how much leaves the tree there, the thick path is what the model kept and the red "
    "ring where it left the tree. The Learn tab explains each quantity."
)


def target_precision_words(info: dict) -> tuple[str, str | None]:
    """How the target computes here and what that means for exactness, in a few words; and why (the start's
    measurement, whose figures vary from start to start), kept out of view until asked for: a longer reason
    once wrapped the header a line further and pushed the answer below a 1000-pixel window's first screen."""
    chosen = info.get("target_forward")
    why = chosen["reason"] if chosen else None
    if chosen and chosen["forward"] == "row-invariant":
        how = "forced with TEV_TARGET_FORWARD" if chosen["reason"].startswith("forced") else "chosen by measurement on this machine"
        return (f"**row-invariant {chosen['dtype']}** ({how}): a row comes out bit for bit the same inside a tree as alone, so greedy "
                "speculation equals greedy decoding by construction",
                f"{why}. Its matrix products run in {chosen['dtype']}; norms, attention and the residual stream in float32 "
                "(`TEV_TARGET_FORWARD` forces another forward).")
    if info["dtype"] == "float32":
        return ("float32 through transformers: exact in law; a tree's rows differ from one-token steps in their last bits, so greedy "
                "speculation equals greedy decoding wherever those bits flip no near-tie (every prompt tested), not by construction", why)
    return (f"{info['dtype']} through transformers (TEV_DTYPE): a tree forward and a one-token forward round differently, so greedy "
            "speculation can part from greedy decoding where the model's two best tokens nearly tie (see the README)", why)


def device_markdown() -> str:
    """The models, the machine, and which precision each part runs in and why."""
    try:
        info = shared.SERVICE.info()
        drafters = {kind: str(next(drafter.model.parameters()).dtype).removeprefix("torch.") for kind, drafter in shared.SERVICE.bundle().drafters.items() if kind != "chain"}
    except Exception as error:  # a missing or broken asset must show, not crash the page
        return f"**Models could not be loaded:** {error}"
    sizes = ", ".join(f"{name} {count / 1e6:.2f}M" for name, count in info["parameters"].items())
    pair = PAIRS[info["pair"]].description if info["pair"] in PAIRS else info["target_source"]
    machine = precision_record(info["device"].split(" ")[0])
    target, why = target_precision_words(info)
    speed = f", bfloat16 products {machine['bf16_matmul_speedup']:.2f}x float32's speed" if "bf16_matmul_speedup" in machine else ""
    server_threads = shared.SERVICE.compute.threads  # the server's count (app.py); none set: torch's count
    threads = server_threads.describe() if server_threads is not None else info["threads"]
    threads_note = shared.SERVICE.threads_note()  # which drafters keep the reduced thread count, and why
    drafter_note = ("A drafter only proposes: its precision changes how often its guesses are kept, never the output; the block "
                    "drafters run in the bfloat16 they are stored in.")
    return (
        f"**models** {pair} · **device** {info['device']} · **threads** {threads} · **context** {info['context']} tokens · "
        f"**vocabulary** {info['vocab']} · **parameters** {sizes}\n\n**precision** target {target} · drafters "
        f"{', '.join(f'{kind} {dtype}' for kind, dtype in drafters.items())} · this CPU: {machine['cpu_capability']}{speed}"
        f"\n\n<details><summary>why this forward and these threads</summary>\n\n{why + ' ' if why else ''}"
        f"{threads_note + ' ' if threads_note else ''}{drafter_note}\n\n</details>"
    )


def tab(demo: gr.Blocks) -> None:
    """The header's two paragraphs; the second is filled in when the page loads (the models load first)."""
    gr.Markdown(INTRO)
    device_info = gr.Markdown("loading models…", elem_id="device-info")
    demo.load(device_markdown, outputs=device_info, api_name=False)
