"""The Live tab's settings column (beside the prompt): the drafter, verifier, budget, law, length, seed and
whether to time the answer again, one input per :class:`~tev.service.live_settings.LiveSettings` field."""

from __future__ import annotations

import gradio as gr

from tev.core.verify import VERIFIERS
from tev.engine.models import DRAFTERS
from tev.service.service import DEFAULT_SAMPLING, LIMITS
from ui import shared
from ui.components import KEEP_TYPED

# Budget auto at the page's opening: measured at least as fast as B = 16 at the opening law (T = 0.7, top-p 0.9) on each
# of 9 chat prompts, interleaved prompt by prompt (docs/benchmarks.md, budget "auto").
AUTO_DEFAULT = True
# Long enough for most default-prompt answers to end on their own: on the default pair (T = 0.7, top-p 0.9, the 8
# example prompts, seeds 0 and 1) 11 of 16 answers ended within 224 tokens (median 190), 2 of 16 within 96.
DEFAULT_NEW_TOKENS = 224


def settings_column() -> dict:
    """The Live tab's settings column (beside the prompt): its inputs by :class:`LiveSettings` field, but the prompt and chat."""
    with gr.Column(scale=2, elem_classes=KEEP_TYPED):  # a number typed out of a slider's range is refused under Generate, not clamped
        kinds = shared.SERVICE.drafter_kinds()
        drafter = gr.Radio(kinds, value=shared.SERVICE.default_drafter_kind(), label="drafter q", info=" · ".join(f"{kind}: {DRAFTERS[kind].label}" for kind in kinds)
                           + " · adapted: yours, from a workload run in the ExitTrain tab", elem_id="live-drafter")
        verifier = gr.Radio(list(VERIFIERS), value="tev", label="verifier (greedy needs T = 0; at T = 0 every verifier is greedy)")
        with gr.Row():
            budget = gr.Slider(0, LIMITS.max_budget, value=16, step=1, scale=3,
                                label="budget B (draft nodes per round; 0 drafts nothing: plain decoding); with budget auto, the most a round may keep")
            auto = gr.Checkbox(value=AUTO_DEFAULT, scale=1, label="budget auto: each round keeps the drafter's best nodes this machine pays for",
                               info="the sizes follow this machine's timing, so a seed repeats the text only at a fixed budget or T = 0")
        temperature = gr.Slider(0.0, LIMITS.max_temperature, value=DEFAULT_SAMPLING.temperature, step=0.05, label="temperature T (0: greedy)")
        with gr.Row():
            top_p = gr.Slider(LIMITS.min_top_p, 1.0, value=DEFAULT_SAMPLING.top_p, step=0.01, label="top-p (1: off)")
            top_k = gr.Slider(0, LIMITS.max_top_k, value=DEFAULT_SAMPLING.top_k, step=1, label="top-k (0: off)")
        max_new_tokens = gr.Slider(1, LIMITS.max_new_tokens, value=DEFAULT_NEW_TOKENS, step=1, label="max new tokens")
        with gr.Row():
            seed = gr.Number(value=0, precision=0, minimum=0, maximum=LIMITS.max_seed, label="seed", elem_id="live-seed")
            compare_ar = gr.Checkbox(value=True, label="also time an autoregressive run (speedup)")
    return {"drafter": drafter, "verifier": verifier, "budget": budget, "auto": auto, "temperature": temperature, "top_p": top_p, "top_k": top_k,
            "max_new_tokens": max_new_tokens, "seed": seed, "compare_ar": compare_ar}
