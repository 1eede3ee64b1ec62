"""TEV Explorer: watch tree speculative decoding, see where draft trees lose target mass.

UI wiring only: every computation lives in ``tev/`` and every figure in ``visual/``; the tabs'
handlers live in ``ui/``, and this file lays the page out and launches it.
Run ``python app.py`` (127.0.0.1:7860; GRADIO_SERVER_NAME / GRADIO_SERVER_PORT respected).
"""

from __future__ import annotations

import os
import sys

import gradio as gr
import torch

from tev.core.verify import VERIFIERS
from tev.data.prompts import load_prompt_set
from tev.engine.models import DRAFTER_KINDS
from tev.service.live_exittrain import live_settings
from tev.train.data import DOMAINS
from tev.service.service import DEFAULT_SAMPLING, LIMITS
from tev.train.losses import TREE_TERMS
from tev.util.cpus import available_cpus
from tev.util.memory import limit_malloc_arenas
from ui import shared
from ui.components import Number, Slider
from ui.exittrain import CHAT_TAB_STEPS, cancel_exittrain, compare_shipped, run_exittrain
from ui.gpu import ZERO_GPU, gpu_task, quota_note
from ui.lab import run_verifier_lab
from ui.learn import LEARN
from ui.live import arm_stop, browse_round, export_run, run_live, step_round, stop_live
from ui.walkthrough import export_walkthrough, replay_walkthrough, run_walkthrough, step_walkthrough
from ui.workload import MAX_MINUTES, MIN_MINUTES, OWN, pack_names, run_workload

# Gradio keeps every session's state and last component values in memory (about 1.5 MB per
# session here); bound how many sessions it keeps (least recently used go first) and how long a
# finished run's rounds stay browsable. Measured in docs/reliability.md.
SESSION_CAPACITY = int(os.environ.get("TEV_SESSION_CAPACITY") or 256)
RUN_STATE_SECONDS = 3600
DRAFTER_LABELS = {"block": "block (base)", "exittrain": "block (ExitTrain)", "chain": "chain (top-1)", "ar": "AR drafter"}  # one per DRAFTER_KINDS
LAB_DRAFTERS = [kind for kind in DRAFTER_KINDS if kind != "ar"]  # the lab offers the block drafter kinds


def _examples() -> list[str]:
    if shared.CHAT_DEFAULT:
        return [p["text"] for p in load_prompt_set("chat")[::3]]  # dialogue, code and math, held out
    try:
        heldout = load_prompt_set("heldout")
        humaneval = load_prompt_set("humaneval")
    except FileNotFoundError:
        return ["def fib(n):\n    "]
    return [p["text"] for p in heldout[3:40:6]] + [p["text"] for p in humaneval[:3]]


def _walkthrough_example(examples: list[str]) -> str:
    """The walkthrough's opening prompt: for the chat pair the first code request, whose first round
    already accepts a few draft tokens (a greeting's first word is often missed at the root)."""
    if shared.CHAT_DEFAULT:
        code = [p["text"] for p in load_prompt_set("chat") if p.get("domain") == "code"]
        if code:
            return code[0]
    return examples[2] if len(examples) > 2 else examples[0]


# ----------------------------------------------------------------------------------- page
CSS = """
.tev-text { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: 13px; line-height: 1.5; }
"""


def _device_markdown() -> str:
    try:
        info = shared.SERVICE.info()
    except Exception as error:  # a missing or broken asset must show, not crash the page
        return f"**Models could not be loaded:** {error}"
    sizes = ", ".join(f"{name} {count / 1e6:.2f}M" for name, count in info["parameters"].items())
    pair = {"smollm2": "SmolLM2-135M-Instruct + this project's block drafter", "tiny": "tiny 7M code pair"}.get(info["pair"], info["target_source"])
    precision = ""
    if info["dtype"] != "float32" and info["device"].startswith("cpu"):
        precision = (f" · **{info['dtype']}** (TEV_DTYPE): faster on this CPU, but a tree forward and a one-token forward round differently, so "
                     "greedy speculation can part from greedy decoding where the model's two best tokens nearly tie (see the README)")
    return (
        f"**models** {pair} · **device** {info['device']} · **dtype** {info['dtype']} · **threads** {info['threads']} · **context** {info['context']} tokens · "
        f"**vocabulary** {info['vocab']} · **parameters** {sizes}{precision}"
    )


def build_app() -> gr.Blocks:
    examples = _examples()
    with gr.Blocks(title="TEV Explorer") as demo:
        gr.Markdown(
            "# TEV Explorer\nSpeculative decoding makes a language model write several tokens per step: a small drafter guesses a "
            "**tree** of continuations and the model checks them all in one pass, keeping the longest path it agrees with, with exactly "
            "the text it would have written alone. **Press Generate** and watch each round's tree: a node's colour is how much of the "
            "model's probability reaches it, its size how much leaves the tree there, the thick path is what the model kept and the red "
            "ring where it left the tree. The Learn tab explains each quantity."
        )
        device_info = gr.Markdown("loading models…")
        with gr.Tab("Live"):
            with gr.Row():
                with gr.Column(scale=3):
                    prompt = gr.Textbox(  # no max_length: a longer prompt is refused with a message, never cut silently
                        label=("your message to the model" if shared.CHAT_DEFAULT else "prompt (Python code to continue)") + f" · at most {LIMITS.max_prompt_chars:,} characters",
                        value=examples[0], lines=6 if shared.CHAT_DEFAULT else 8, max_lines=20,
                    )
                    chat = gr.Checkbox(value=shared.CHAT_DEFAULT, label="chat: send the prompt as a user message (chat template, stops at the end of the answer); untick to continue the raw text")
                    gr.Examples(
                        examples=[[e] for e in examples], inputs=[prompt],
                        label="held-out chat prompts: dialogue, code, math" if shared.CHAT_DEFAULT else "held-out stdlib functions and HumanEval prompts",
                    )
                with gr.Column(scale=2):
                    drafter = gr.Radio(list(DRAFTER_KINDS), value="block", label="drafter q", info=" · ".join(f"{kind}: {DRAFTER_LABELS[kind]}" for kind in DRAFTER_KINDS))
                    verifier = gr.Radio(list(VERIFIERS), value="tev", label="verifier (greedy needs T = 0; at T = 0 every verifier is greedy)")
                    budget = Slider(0, LIMITS.max_budget, value=16, step=1, label="budget B (draft nodes per round; 0 drafts nothing: plain decoding)")
                    temperature = Slider(0.0, LIMITS.max_temperature, value=DEFAULT_SAMPLING.temperature, step=0.05, label="temperature T (0: greedy)")
                    with gr.Row():
                        top_p = Slider(LIMITS.min_top_p, 1.0, value=DEFAULT_SAMPLING.top_p, step=0.01, label="top-p (1: off)")
                        top_k = Slider(0, LIMITS.max_top_k, value=DEFAULT_SAMPLING.top_k, step=1, label="top-k (0: off)")
                    max_new_tokens = Slider(1, LIMITS.max_new_tokens, value=96, step=1, label="max new tokens")
                    with gr.Row():
                        seed = Number(value=0, precision=0, minimum=0, maximum=LIMITS.max_seed, label="seed")
                        compare_ar = gr.Checkbox(value=True, label="also time an autoregressive run (speedup)")
                    with gr.Row():
                        generate = gr.Button("Generate", variant="primary", elem_id="generate-button")
                        stop = gr.Button("Stop", elem_id="stop-button")
                    gr.Markdown(quota_note("generate"), visible=ZERO_GPU)
            stats = gr.Markdown("Press **Generate**.", elem_id="live-stats")
            text_view = gr.HTML(elem_id="text-view", elem_classes="tev-text")
            with gr.Row():
                tree_plot = gr.Plot(label="draft tree of the round", elem_id="tree-plot")
            with gr.Row():
                mass_plot = gr.Plot(label="where the tree loses target mass")
                timeline_plot = gr.Plot(label="rounds", elem_id="timeline-plot")
            with gr.Row():
                round_slider = Slider(1, 2, value=1, step=1, label="browse rounds", interactive=False, elem_id="round-slider")
                previous_round = gr.Button("◀ previous", scale=0)
                next_round = gr.Button("next ▶", scale=0)
            round_info = gr.Markdown()
            with gr.Row():
                export = gr.Button("Export rounds as JSON", scale=0)
                export_file = gr.File(label="rounds JSON", interactive=False)
            run_state = gr.State({"records": [], "summary": None}, time_to_live=RUN_STATE_SECONDS)

        with gr.Tab("Walkthrough"):
            gr.Markdown(
                "Watch **one round** happen, step by step: the drafter's guesses, the tree, the one target forward, where the target's "
                "mass flows and leaves, the verifier's decision, the bonus token, the commit. Every number is this round's. "
                "The defaults sample (T = 0.7, top-p 0.9) so the reach is graded; at T = 0 every reach is 0 or 1 and step 6 is an argmax walk."
            )
            with gr.Row():
                with gr.Column(scale=3):
                    wk_prompt = gr.Textbox(label=f"prompt · at most {LIMITS.max_prompt_chars:,} characters", value=_walkthrough_example(examples), lines=3, elem_id="walk-prompt")
                with gr.Column(scale=2):
                    wk_drafter = gr.Radio(list(DRAFTER_KINDS), value="block", label="drafter q")
                    wk_verifier = gr.Radio(list(VERIFIERS), value="tev", label="verifier")
                    with gr.Row():
                        wk_budget = Slider(0, LIMITS.max_lab_budget, value=16, step=1, label="budget B")
                        wk_temperature = Slider(0.0, LIMITS.max_temperature, value=DEFAULT_SAMPLING.temperature, step=0.05, label="temperature T")
                        wk_top_p = Slider(LIMITS.min_top_p, 1.0, value=DEFAULT_SAMPLING.top_p, step=0.01, label="top-p")
                        wk_seed = Number(value=0, precision=0, minimum=0, maximum=LIMITS.max_seed, label="seed (same settings and seed: the same round)")
            wk_run = gr.Button("Run one round", variant="primary", elem_id="walk-run")
            wk_where = gr.Markdown("Press **Run one round**.", elem_id="walk-where")
            with gr.Row():
                wk_back = gr.Button("◀ Back", elem_id="walk-back")
                wk_next = gr.Button("Next ▶", elem_id="walk-next")
            wk_text = gr.Markdown(elem_id="walk-text", latex_delimiters=[{"left": "$", "right": "$", "display": False}])
            wk_plot = gr.Plot(label="this step", elem_id="walk-plot")
            with gr.Row():
                wk_replay = gr.Button("Replay this round's tree 3,000 times (each verifier)", elem_id="walk-replay")
                wk_export = gr.Button("Export the walkthrough as HTML", elem_id="walk-export")
            wk_replay_table = gr.Markdown(elem_id="walk-replay-table", latex_delimiters=[{"left": "$", "right": "$", "display": False}])
            wk_replay_plot = gr.Plot(label="the verifiers on this round's tree")
            wk_file = gr.File(label="walkthrough HTML (opens offline)", interactive=False)
            wk_state = gr.State({}, time_to_live=RUN_STATE_SECONDS)

        with gr.Tab("Verifier lab"):
            gr.Markdown("Fix **one** tree and run each exact verifier many times: the exit-node frequencies follow the exit law w(v) and the mean block length is 1 + C(T), for TEV, predraw and sequential alike (fixed-tree equivalence).")
            with gr.Row():
                lab_source = gr.Radio(["prompt", "synthetic example"], value="prompt", label="tree from")
                lab_drafter = gr.Radio(LAB_DRAFTERS, value="block", label="drafter")
                lab_budget = Slider(1, LIMITS.max_lab_budget, value=16, step=1, label="budget B")
                lab_temperature = Slider(LIMITS.min_lab_temperature, LIMITS.max_temperature, value=1.0, step=0.05, label="temperature T")
                lab_draws = Slider(100, LIMITS.max_lab_draws, value=3000, step=100, label="draws per verifier")
                lab_seed = Number(value=0, precision=0, minimum=0, maximum=LIMITS.max_seed, label="seed")
            lab_prompt = gr.Textbox(label=f"prompt · at most {LIMITS.max_prompt_chars:,} characters", value=examples[1] if len(examples) > 1 else examples[0], lines=4)
            lab_run = gr.Button("Run the verifiers", variant="primary", elem_id="lab-run")
            gr.Markdown(quota_note("verifier_lab"), visible=ZERO_GPU)
            lab_table = gr.Markdown(elem_id="lab-table")
            lab_plot = gr.Plot(label="exit law vs empirical exit frequencies")
            lab_tree = gr.Plot(label="the fixed tree")

        with gr.Tab("ExitTrain"):
            live = live_settings(shared.EXITTRAIN_CHAT)
            gr.Markdown(
                "Fine-tune the base block drafter with **ExitTrain** (a run takes at most 3 minutes, scoring included; Cancel stops it at any point): the frozen target scores the trees the drafter "
                "actually builds, and the loss pushes draft probability toward nodes where target mass exits. Before and after, the same "
                "held-out rounds are scored, so the change in `1 + C` is paired, with its standard error; the bars below show at which "
                "depth the target's mass leaves each drafter's trees. One run at a time per server; generations take turns with it. "
                + ("Pick a domain: the drafter fine-tunes on that domain's conversations (written by the target itself) and is judged on "
                   "its held-out ones." if shared.EXITTRAIN_CHAT else "This tab runs on the **tiny code pair**, whose training data ships with the app.")
            )
            with gr.Row():
                et_domain = gr.Radio(list(DOMAINS), value="dialogue", label="domain (train and judge on it; the base drafter does worst on dialogue)", visible=shared.EXITTRAIN_CHAT)
                et_weights = gr.Radio(list(TREE_TERMS), value="exit", label="tree term (exit: the method; prefix, none: controls)")
                et_steps = Slider(LIMITS.min_exittrain_steps, LIMITS.max_exittrain_steps, value=CHAT_TAB_STEPS if shared.EXITTRAIN_CHAT else live.steps, step=1, label="steps (training stops early if the 3 minutes run out)")
                et_lambda = Slider(0, LIMITS.max_lambda_exit, value=live.lambda_tree, step=1, label="lambda_tree (weight of L_tree)")
            with gr.Row():
                et_start = gr.Button("Start fine-tune", variant="primary", elem_id="exittrain-start")
                et_cancel = gr.Button("Cancel", elem_id="exittrain-cancel")
                et_shipped = gr.Button("Compare the shipped ExitTrain drafter instead")
            gr.Markdown(quota_note("exittrain"), visible=ZERO_GPU)
            et_status = gr.Markdown(elem_id="exittrain-status")
            et_curve = gr.Plot(label="training")
            et_compare = gr.Plot(label="tau before / after")
            et_table = gr.Markdown(elem_id="exittrain-table")
            et_mass = gr.Plot(label="where the target's mass leaves the trees, before / after")
            with gr.Row():
                et_tree_base = gr.Plot(label="base drafter's tree")
                et_tree_trained = gr.Plot(label="ExitTrain drafter's tree")
            gr.Markdown(
                "### Adapt the drafter to your workload\n"
                "A drafter gains most where it meets text it has not learned: pick a workload pack or paste your own prompts (one per "
                "line, at least 16). The target answers three quarters of them, the drafter is fine-tuned on those answers (the token "
                "loss plus ExitTrain's tree term on the trees it builds there), and the last quarter, never trained on, measures "
                "`tau` before and after, with the token-only control beside it. Cancel stops it at once; nothing is saved to the server.",
                visible=shared.EXITTRAIN_CHAT,
            )
            with gr.Row(visible=shared.EXITTRAIN_CHAT):
                wl_pack = gr.Radio(pack_names() + [OWN], value=(pack_names() or [OWN])[0], label="workload")
                wl_minutes = Slider(MIN_MINUTES, MAX_MINUTES, value=5, step=0.5, label="minutes (answers, fine-tune and held-out measurement)")
            wl_text = gr.Textbox(label=f"your prompts, one per line (at least 16; each at most {LIMITS.max_prompt_chars} characters)", lines=6,
                                 max_lines=30, max_length=200_000, visible=shared.EXITTRAIN_CHAT)
            with gr.Row(visible=shared.EXITTRAIN_CHAT):
                wl_start = gr.Button("Adapt to this workload", variant="primary", elem_id="workload-start")
                wl_cancel = gr.Button("Cancel")
            wl_status = gr.Markdown(visible=shared.EXITTRAIN_CHAT, elem_id="workload-status")
            wl_table = gr.Markdown(visible=shared.EXITTRAIN_CHAT, elem_id="workload-table")
            wl_mass = gr.Plot(label="where the target's mass leaves the trees on the held-out answers: base / adapted", visible=shared.EXITTRAIN_CHAT)
            with gr.Row(visible=shared.EXITTRAIN_CHAT, elem_id="workload-trees"):
                wl_tree_base = gr.Plot(label="base drafter's tree (held-out prompt)")
                wl_tree_adapted = gr.Plot(label="adapted drafter's tree (same prompt)")

        with gr.Tab("Learn"):
            gr.Markdown(LEARN, latex_delimiters=[{"left": "$", "right": "$", "display": False}])

        # ------------------------------------------------------------------ events
        demo.load(_device_markdown, outputs=device_info, api_name=False)
        live_outputs = [text_view, tree_plot, mass_plot, timeline_plot, stats, round_slider, run_state]
        # Stop is a flag the generation polls between rounds (not Gradio's cancel, which would
        # mark every output as failed and leave the figures of a half-drawn run)
        generate.click(arm_stop, None, None, queue=False, api_name=False).then(
            gpu_task("generate")(run_live), [prompt, drafter, verifier, budget, temperature, max_new_tokens, seed, compare_ar, chat, top_p, top_k],
            live_outputs, api_name="generate", concurrency_limit=2, concurrency_id="compute",
        )
        stop.click(stop_live, None, None, queue=False, api_name=False)
        round_slider.release(browse_round, [round_slider, run_state], [tree_plot, mass_plot, round_info], api_name="browse_round")
        previous_round.click(step_round, [round_slider, gr.State(-1), run_state], round_slider, api_name=False).then(browse_round, [round_slider, run_state], [tree_plot, mass_plot, round_info], api_name=False)
        next_round.click(step_round, [round_slider, gr.State(1), run_state], round_slider, api_name=False).then(browse_round, [round_slider, run_state], [tree_plot, mass_plot, round_info], api_name=False)
        export.click(export_run, run_state, export_file, api_name="export")
        wk_outputs = [wk_where, wk_text, wk_plot, wk_state]
        wk_run.click(gpu_task("generate")(run_walkthrough), [wk_prompt, wk_drafter, wk_verifier, wk_budget, wk_temperature, wk_top_p, wk_seed],
                     wk_outputs + [wk_replay_plot, wk_replay_table], api_name="walkthrough", concurrency_limit=2, concurrency_id="compute")
        wk_back.click(step_walkthrough, [gr.State(-1), wk_state], wk_outputs, api_name=False, concurrency_limit=2, concurrency_id="compute")
        wk_next.click(gpu_task("generate")(step_walkthrough), [gr.State(1), wk_state], wk_outputs, api_name="walkthrough_next", concurrency_limit=2, concurrency_id="compute")
        wk_replay.click(gpu_task("verifier_lab")(replay_walkthrough), wk_state, [wk_replay_plot, wk_replay_table], api_name="walkthrough_replay", concurrency_limit=2, concurrency_id="compute")
        wk_export.click(export_walkthrough, wk_state, wk_file, api_name="walkthrough_export")
        lab_run.click(gpu_task("verifier_lab")(run_verifier_lab), [lab_source, lab_prompt, lab_drafter, lab_budget, lab_temperature, lab_draws, lab_seed], [lab_plot, lab_tree, lab_table], api_name="verifier_lab", concurrency_limit=2, concurrency_id="compute")
        et_start.click(gpu_task("exittrain")(run_exittrain), [et_domain, et_weights, et_steps, et_lambda], [et_curve, et_status, et_compare, et_table, et_mass, et_tree_base, et_tree_trained], api_name="exittrain", concurrency_limit=2, concurrency_id="compute")
        et_cancel.click(cancel_exittrain, None, et_status, api_name="exittrain_cancel")
        wl_start.click(gpu_task("exittrain")(run_workload), [wl_pack, wl_text, wl_minutes], [wl_status, wl_table, wl_mass, wl_tree_base, wl_tree_adapted], api_name="exittrain_workload", concurrency_limit=2, concurrency_id="compute")
        wl_cancel.click(cancel_exittrain, None, wl_status, api_name="exittrain_workload_cancel")
        et_shipped.click(gpu_task("compare_shipped")(compare_shipped), None, [et_compare, et_table, et_mass, et_tree_base, et_tree_trained], api_name="compare_shipped", concurrency_limit=2, concurrency_id="compute")
    return demo


def _warm_up() -> None:
    """Load the models; a failure is reported here in one line, and again on the page and to
    every request (they retry the load), never as a crash."""
    try:
        shared.SERVICE.bundle()
    except Exception as error:  # noqa: BLE001 - shown, not raised: the page still serves and says why
        print(f"TEV Explorer: models could not be loaded: {error}", file=sys.stderr, flush=True)


def _compute_threads() -> int:
    """Torch threads for the server: ``TEV_THREADS``, else one core fewer than the container may use.

    The server also builds figures and the browser (often on the same machine) renders them
    while tokens are generated; with every core given to torch, its threads wait on each
    other: on 2 cores, 2 threads gave 39 tokens/s while the page rendered, 1 thread 145.
    """
    text = os.environ.get("TEV_THREADS", "").strip()
    if text:
        if not text.isdigit() or int(text) < 1:
            raise SystemExit(f"TEV_THREADS must be a whole number >= 1, got {text!r}")
        return int(text)
    return max(1, available_cpus() - 1)


def main() -> None:
    limit_malloc_arenas()  # before the server's request threads allocate (see tev/util/memory.py)
    torch.set_num_threads(_compute_threads())
    demo = build_app()
    # Load the models before serving (a few seconds): the first Generate then streams at once
    # instead of waiting on a load, and ZeroGPU moves the weights to its GPU at start-up.
    _warm_up()
    demo.queue(max_size=32, default_concurrency_limit=2).launch(
        server_name=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"),
        server_port=int(os.environ.get("GRADIO_SERVER_PORT", "7860")),
        share=False,
        max_file_size="1mb",
        state_session_capacity=SESSION_CAPACITY,
        css=CSS,
        theme=gr.themes.Soft(),
    )


if __name__ == "__main__":
    main()
