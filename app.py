"""TEV Explorer: watch tree speculative decoding, see where draft trees lose target mass.

UI wiring only: every computation lives in ``tev/`` and every figure in ``visual/``.
Run ``python app.py`` (127.0.0.1:7860; GRADIO_SERVER_NAME / GRADIO_SERVER_PORT respected).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import threading
import time

import gradio as gr
import gradio.component_meta
import torch

from tev.bench.lab import run_lab, synthetic_tree, tree_from_prompt
from tev.core.verify import VERIFIERS
from tev.data.prompts import load_prompt_set
from tev.engine.decode import GenerationSummary
from tev.engine.drafters import BlockDrafter, BlockTreeDrafter
from tev.engine.evaluation import evaluate_drafter, fit_prompt
from tev.engine.models import DRAFTER_KINDS, default_pair
from tev.service.service import LIMITS, ExitTrainSlot, ModelService, UserInputError, check_number, check_settings, finite_number, records_to_json
from tev.service.live_exittrain import LIVE_CONFIG, live_trainer, load_live_data
from tev.train.exit_loss import WEIGHT_MODES
from tev.util.paths import embedded
from visual import (
    before_after_figure,
    mass_by_depth_figure,
    text_view_html,
    timeline_figure,
    training_figure,
    tree_figure,
    verifier_lab_figure,
)

# Gradio keeps every session's state and last component values in memory (about 1.5 MB per
# session here); bound how many sessions it keeps (least recently used go first) and how long a
# finished run's rounds stay browsable. Measured in docs/reliability.md.
SESSION_CAPACITY = int(os.environ.get("TEV_SESSION_CAPACITY") or 256)
RUN_STATE_SECONDS = 3600
SERVICE = ModelService(target=os.environ.get("TEV_TARGET") or None, draft=os.environ.get("TEV_DRAFT") or None)
# The live ExitTrain mode is built on the tiny code pair (its data and base drafter ship in
# assets/models); it shares the compute lock, so a fine-tune and a generation take turns.
EXITTRAIN_SERVICE = SERVICE if SERVICE.target_source is None and default_pair() == "tiny" else ModelService(pair="tiny")
EXITTRAIN_SERVICE.compute = SERVICE.compute
EXITTRAIN_SLOT = ExitTrainSlot()
CHAT_DEFAULT = SERVICE.target_source is None and default_pair() == "smollm2"  # a chat target: prompts are user messages
DRAFTER_LABELS = {"block": "block (base)", "exittrain": "block (ExitTrain)", "chain": "chain (top-1)", "ar": "AR drafter"}  # one per DRAFTER_KINDS
LAB_DRAFTERS = [kind for kind in DRAFTER_KINDS if kind != "ar"]  # the lab offers the block drafter kinds


def _examples() -> list[str]:
    if CHAT_DEFAULT:
        return [p["text"] for p in load_prompt_set("chat")[::3]]  # dialogue, code and math, held out
    try:
        heldout = load_prompt_set("heldout")
        humaneval = load_prompt_set("humaneval")
    except FileNotFoundError:
        return ["def fib(n):\n    "]
    return [p["text"] for p in heldout[3:40:6]] + [p["text"] for p in humaneval[:3]]


def _user_error(error: Exception) -> gr.Error:
    return gr.Error(str(error), print_exception=False)  # the user's mistake, not a server fault


def _finite_number(component, payload):
    """Refuse an API value that is not a finite number (a string, None, NaN, a bool) with a
    clear message; Gradio's own range check (run next) would crash on it with an opaque error."""
    try:
        return finite_number(component.label, payload, component.minimum, component.maximum)
    except UserInputError as error:
        raise _user_error(error) from None


# Gradio's component metaclass writes a ``.pyi`` stub beside the module that defines a
# component subclass (a custom-component development aid); the app must not write into its
# own folder (nor fail where that folder is read-only), so the two subclasses are made with
# that writer switched off.
_write_stub = gradio.component_meta.create_or_modify_pyi
gradio.component_meta.create_or_modify_pyi = lambda *args, **kwargs: None
try:
    class Slider(gr.Slider):
        """``gr.Slider`` (same front end) whose input check refuses non-numbers clearly."""

        is_template = True

        def preprocess(self, payload):
            return super().preprocess(_finite_number(self, payload))

    class Number(gr.Number):
        """``gr.Number`` (same front end) whose input check refuses non-numbers clearly; an empty
        field (None) goes on to the handler, which names the missing value."""

        is_template = True

        def preprocess(self, payload):
            return super().preprocess(payload if payload is None else _finite_number(self, payload))
finally:
    gradio.component_meta.create_or_modify_pyi = _write_stub


# ----------------------------------------------------------------------------------- Live
def _stats_markdown(records, summary: GenerationSummary | None, ar_tps: float | None) -> str:
    if not records:
        return "No rounds yet."
    lengths = [r.block_length for r in records]
    bounds = [r.flow.tau_bound for r in records]
    tokens = sum(len(r.emitted) for r in records)
    seconds = summary.seconds if summary else sum(sum(r.timings.values()) for r in records)
    tps = summary.tokens_per_second if summary else tokens / max(seconds, 1e-9)
    lines = [
        f"**rounds** {len(records)} · **tokens** {tokens} · **tau** (mean block length) {sum(lengths) / len(lengths):.2f} · "
        f"**mean 1 + C** {sum(bounds) / len(bounds):.2f} · **tokens/s** {tps:.1f}",
        "tau = tokens emitted per target forward (accepted draft tokens + the bonus token); see the Learn tab for other tools' figures.",
    ]
    if summary is not None:
        lines.append(f"stopped: {summary.stop_reason} · time to first token {1e3 * summary.time_to_first_token:.0f} ms")
        if ar_tps:
            lines.append(f"autoregressive run of the same prompt: {ar_tps:.1f} tokens/s → **speedup {summary.tokens_per_second / ar_tps:.2f}x**")
    return "\n\n".join(lines)


def _round_figures(records, index: int):
    record = records[index]
    text = SERVICE.token_text
    title = f"round {record.index + 1} of {len(records)} · drafter {record.drafter} · verifier {record.verifier}"
    return tree_figure(record.tree, record.flow, record.verdict, token_text=text, title=title), mass_by_depth_figure(record.flow)


def run_live(prompt, drafter, verifier, budget, temperature, max_new_tokens, seed, compare_ar, chat=False):
    """Stream a generation: text, current tree, mass by depth, stats; then the timeline.
    With ``chat`` the prompt is a user message (chat template, generation prompt added)."""
    try:
        bundle = SERVICE.bundle()
        if chat and not bundle.is_chat:
            raise UserInputError("this target has no chat template; untick 'chat' to continue the text as it is")
        prompt_ids = SERVICE.encode(prompt, chat=bool(chat))
        config = check_settings(drafter, verifier, budget, temperature, max_new_tokens, seed, list(bundle.drafters))
    except ValueError as error:  # the user's input, or models that could not be loaded
        raise _user_error(error) from None
    records, summary = [], None
    text = SERVICE.token_text
    last_draw = 0.0
    events = SERVICE.generate(prompt_ids, drafter, config)
    try:  # Gradio closes this generator when the client cancels or leaves: stop generating then
        for event in events:
            if isinstance(event, GenerationSummary):
                summary = event
                break
            records.append(event)
            now = time.perf_counter()
            if len(records) == 1 or now - last_draw > 0.25:  # redraw at most 4 times a second
                last_draw = now
                tree, mass = _round_figures(records, len(records) - 1)
                yield (text_view_html(records, token_text=text, prompt_text=prompt), tree, mass, gr.skip(), _stats_markdown(records, None, None), gr.skip(), {"records": records, "summary": None})
    finally:
        events.close()
    ar_tps = None
    if compare_ar and summary is not None:
        waiting = (gr.skip(),) * 4 + (_stats_markdown(records, summary, None) + "\n\ntiming an autoregressive run of the same prompt…", gr.skip(), gr.skip())
        yield waiting
        ar = yield from _in_worker(lambda stop: SERVICE.autoregressive(prompt_ids, config, should_stop=stop), tick=(gr.skip(),) * 7)
        ar_tps = ar.tokens_per_second
    state = {"records": records, "summary": summary, "settings": {"prompt": prompt, "drafter": drafter, **dataclasses.asdict(config)}}
    if not records:
        yield ("", None, None, None, "The generation produced no rounds.", gr.update(minimum=1, maximum=2, value=1, interactive=False), state)
        return
    tree, mass = _round_figures(records, len(records) - 1)
    yield (
        text_view_html(records, token_text=text, prompt_text=prompt),
        tree,
        mass,
        timeline_figure(records),
        _stats_markdown(records, summary, ar_tps),
        gr.update(minimum=1, maximum=max(2, len(records)), value=len(records), step=1, interactive=len(records) > 1),  # a slider needs min < max
        state,
    )


def _in_worker(work, tick, poll: float = 0.25):
    """Run ``work(should_stop)`` in a worker thread, yielding ``tick`` every ``poll`` seconds
    while it runs; returns its result (use with ``yield from``).

    A long call inside a generator handler would hold the request's slot, and keep computing,
    after its client cancelled or left: Gradio can only close the generator between yields.
    Here closing it sets the stop flag that ``work`` polls, so the work ends within a step.
    """
    stop = threading.Event()
    box = {}

    def target():
        try:
            box["value"] = work(stop.is_set)
        except BaseException as error:  # re-raised in the request's own thread below
            box["error"] = error

    worker = threading.Thread(target=target, name="tev-worker", daemon=True)
    worker.start()
    try:
        while worker.is_alive():
            worker.join(poll)
            if worker.is_alive():
                yield tick
    finally:
        stop.set()
    if "error" in box:
        raise box["error"]
    return box["value"]


def browse_round(round_number, state):
    records = (state or {}).get("records") or []
    if not records:
        raise gr.Error("generate first: there are no rounds to browse yet", print_exception=False)
    try:
        index = int(round_number) - 1
    except (TypeError, ValueError):
        raise gr.Error("round must be a whole number", print_exception=False) from None
    index = min(max(index, 0), len(records) - 1)
    tree, mass = _round_figures(records, index)
    record = records[index]
    info = (
        f"round {index + 1}: budget {record.tree.budget}, coverage C = {record.flow.coverage:.3f}, 1 + C = {record.flow.tau_bound:.3f}, "
        f"block length L = {record.block_length} (accepted {len(record.accepted_tokens)} + bonus), exit node {record.verdict.exit_node} "
        f"at depth {int(record.tree.depths[record.verdict.exit_node])}"
    )
    return tree, mass, info


def step_round(round_number, delta, state):
    records = (state or {}).get("records") or []
    if not records:
        raise gr.Error("generate first: there are no rounds to browse yet", print_exception=False)
    value = min(max(int(round_number or 1) + delta, 1), len(records))
    return gr.update(value=value)


def export_run(state):
    records = (state or {}).get("records") or []
    if not records:
        raise gr.Error("generate first: there is no run to export yet", print_exception=False)
    return records_to_json(records, state.get("summary"), state.get("settings", {}))


# ----------------------------------------------------------------------------------- Verifier lab
def run_verifier_lab(source, prompt, drafter, budget, temperature, draws, seed, progress=gr.Progress()):
    try:
        draws = check_number("draws", draws, 100, LIMITS.max_lab_draws, integer=True)
        seed = check_number("seed", seed, 0, LIMITS.max_seed, integer=True)
        if source == "synthetic example":
            lab = synthetic_tree()
            token_text = str
        else:
            bundle = SERVICE.bundle()
            budget = check_number("budget", budget, 1, LIMITS.max_lab_budget, integer=True)
            temperature = check_number("temperature", temperature, LIMITS.min_lab_temperature, LIMITS.max_temperature)
            if drafter not in bundle.drafters:
                raise UserInputError(f"unknown drafter {drafter!r}")
            ids = SERVICE.encode(prompt, chat=bundle.is_chat)
            with SERVICE.compute:
                lab = tree_from_prompt(bundle.target, bundle.drafter(drafter), ids, budget, temperature)
            token_text = SERVICE.token_text
    except ValueError as error:
        raise _user_error(error) from None
    progress(0.1, desc=f"running each verifier {draws} times")
    with SERVICE.compute:
        result = run_lab(lab, draws=draws, seed=seed)
    figure = verifier_lab_figure(lab.tree, lab.flow, result.frequencies, result.mean_lengths)
    tree = tree_figure(lab.tree, lab.flow, None, token_text=token_text, title=f"the fixed tree ({lab.source}), budget {lab.tree.budget}")
    rows = [
        "| verifier | mean block length (± s.e.) | 1 + C | median decision time |",
        "|---|---|---|---|",
    ]
    for name in result.mean_lengths:
        rows.append(f"| {name} | {result.mean_lengths[name]:.3f} ± {result.length_se[name]:.3f} | {lab.flow.tau_bound:.3f} | {1e6 * result.seconds[name]:.0f} µs |")
    note = (
        f"{draws} draws per verifier on the same tree. All three are exact and saturated: their exit frequencies follow the exit "
        "law w(v) and their mean block length is 1 + C(T) up to sampling error, whatever the verifier."
    )
    return figure, tree, "\n".join(rows) + "\n\n" + note


# ----------------------------------------------------------------------------------- ExitTrain
def run_exittrain(weights, steps, lambda_exit, request: gr.Request, progress=gr.Progress()):
    """A short live fine-tune of the base drafter; then base vs trained on held-out prompts."""
    owner = getattr(request, "session_hash", None) or "anonymous"
    try:
        steps = check_number("steps", steps, LIMITS.min_exittrain_steps, LIMITS.max_exittrain_steps, integer=True)
        lambda_exit = check_number("lambda", lambda_exit, 0, LIMITS.max_lambda_exit)
        config = dataclasses.replace(LIVE_CONFIG, weights=weights, steps=steps, lambda_exit=lambda_exit)
        train, heldout, first_anchor = load_live_data()
        bundle = EXITTRAIN_SERVICE.bundle()
        if "block" not in bundle.drafters:
            raise UserInputError("ExitTrain needs the block drafter, which is not loaded")
    except (ValueError, FileNotFoundError) as error:
        raise _user_error(error) from None
    if not EXITTRAIN_SLOT.acquire(owner):
        raise gr.Error("another ExitTrain run is in progress on this server; wait for it to finish, then start again", print_exception=False)
    try:
        trainer = live_trainer(bundle.target, config, (train, heldout, first_anchor))
        EXITTRAIN_SLOT.trainer = trainer
        with SERVICE.compute:
            before = trainer.heldout_expected_tau()
        history = [{"step": 0, "loss": float("nan"), "loss_tok": float("nan"), "loss_exit": float("nan"), "expected_tau": before, "heldout_expected_tau": before}]
        events = trainer.run()
        while True:
            with SERVICE.compute:
                event = next(events, None)
            if event is None:
                break
            history.append(event.__dict__)
            progress(event.step / config.steps, desc=f"step {event.step}/{config.steps} · loss {event.loss:.3f}")
            if event.step % 5 == 0 or event.step == config.steps:
                yield training_figure(history), f"step {event.step}/{config.steps} · batch 1 + C {event.expected_tau:.3f}", gr.skip(), gr.skip()
        status = "cancelled" if trainer.cancelled else "finished"
        trained = trainer.accelerator.unwrap_model(trainer.drafter).eval().to(torch.bfloat16)  # served like the shipped drafters
        yield training_figure(history), f"{status} after {trainer.step} steps; comparing on held-out prompts…", gr.skip(), gr.skip()
        rows, table = _compare(bundle, {"base": BlockTreeDrafter(BlockDrafter.from_pretrained(embedded("block"), bundle.target), name="base"), f"ExitTrain ({weights}, live)": BlockTreeDrafter(trained, name="live")})
        yield training_figure(history), f"{status} after {trainer.step} steps", before_after_figure(rows), table
    finally:
        EXITTRAIN_SLOT.release()


def cancel_exittrain(request: gr.Request):
    owner = getattr(request, "session_hash", None) or "anonymous"
    return "cancelling after this step…" if EXITTRAIN_SLOT.cancel(owner) else "no ExitTrain run of yours is in progress"


def compare_shipped(progress=gr.Progress()):
    try:
        bundle = EXITTRAIN_SERVICE.bundle()
    except ValueError as error:  # the models could not be loaded: say why
        raise _user_error(error) from None
    if "exittrain" not in bundle.drafters:
        raise gr.Error("no shipped ExitTrain drafter in assets/models; run `python -m tev exittrain --install` first", print_exception=False)
    rows, table = _compare(bundle, {"base": bundle.drafter("block"), "ExitTrain (shipped)": bundle.drafter("exittrain")})
    prompt = fit_prompt(bundle.tokenizer, load_prompt_set("heldout")[5], bundle.context_length - 8)
    trees = []
    for name in ("block", "exittrain"):
        with SERVICE.compute:
            lab = tree_from_prompt(bundle.target, bundle.drafter(name), prompt, 32, 1.0)
        trees.append(tree_figure(lab.tree, lab.flow, None, token_text=EXITTRAIN_SERVICE.token_text, title=f"{name} drafter, same prompt"))
    return before_after_figure(rows), table, trees[0], trees[1]


def _compare(bundle, drafters: dict):
    prompts = load_prompt_set("heldout")[1::8][:6]
    rows, lines = [], ["| drafter | T | tau | 1 + C | per-prompt tau q25-q75 |", "|---|---|---|---|---|"]
    for name, drafter in drafters.items():
        with SERVICE.compute:
            measured = evaluate_drafter(bundle.target, bundle.tokenizer, drafter, prompts, budgets=(32,), temperatures=(0.0, 1.0), max_new_tokens=48, progress=False)
        for row in measured:
            rows.append({"drafter": name, "temperature": row["temperature"], "tau": row["tau"], "tau_q25": row["prompt_tau_q25"], "tau_q75": row["prompt_tau_q75"]})
            lines.append(f"| {name} | {row['temperature']:g} | {row['tau']:.3f} | {row['tau_bound']:.3f} | {row['prompt_tau_q25']:.2f}-{row['prompt_tau_q75']:.2f} |")
    return rows, "\n".join(lines) + f"\n\nB = 32, {len(prompts)} held-out prompts, 48 new tokens each, TEV (greedy at T = 0)."


# ----------------------------------------------------------------------------------- page
LEARN = r"""
### Speculative decoding with a draft tree

A small **draft model `q`** proposes a tree of possible next tokens; the **target model `p`** scores every node of
the tree in **one** forward pass (tree attention); a **verifier** keeps a path of the tree and adds one **bonus token**
drawn from the target. The output is distributed exactly as if the target had generated it alone.

**Reach.** With $p_v$ the target's next-token distribution at node $v$: $P(r) = 1$, $P(v) = P(\mathrm{pa}(v))\, p_{\mathrm{pa}(v)}(x_v)$,
the probability that plain sampling from $p$ walks to $v$. *Live tab: node colour.*

**Exit law (missing mass).** $\rho(v) = 1 - \sum_{u \in \mathrm{Ch}(v)} p_v(x_u)$ and $w(v) = P(v)\,\rho(v)$: the target mass that
**leaves the tree at $v$**. The $w(v)$ sum to 1. Adding a child with token $a$ under $v$ raises coverage by $P(v)\,p_v(a)$. *Live tab: node ring; mass-by-depth chart.*

**Coverage bound.** $C(T) = \sum_{v \ne r} P(v)$. Every exact verifier has expected block length $E[L] \le 1 + C(T)$.
*Live tab: the timeline plots each round's $L$ against $1 + C$.*

**tau, and other tools' acceptance figures.** $\tau$ is the mean **output-block length** per round: accepted draft
tokens plus the one bonus token, so $\tau$ = tokens emitted per target forward. It is the same number as EAGLE's
"average acceptance length" and SGLang's `spec_accept_length` (both count the bonus token) and the DFlash/DDTree "acceptance length".
Without the bonus token, the mean accepted draft length is $\tau - 1$. An acceptance *rate* per drafted token (vLLM's
`draft_acceptance_rate`) divides $\tau - 1$ by the tokens drafted per round (the chain length, or $B$ for a tree), so it falls
as the tree grows while $\tau$ rises. The speedup over plain decoding is about $\tau$ divided by the cost of one round
relative to one plain forward (tree forward + drafter + verifier). *Live tab: stats line and timeline.*

**TEV (Tree Exit Verification).** Draw the exit node $V \sim w$ in one step, then the bonus $Y$ from the residual
$p_V^{\mathrm{res}}(a) \propto p_V(a)\,[a \notin \mathrm{Ch}(V)]$. It attains the bound, needs only the parent rows normalised, and one
host sync. Predraw-and-follow and sequential residual verification reach the same law by other routes.
*Verifier lab: all three match $w(v)$ and $1 + C$ on one fixed tree.*

**ExitTrain.** Fine-tune the drafter on the trees inference actually builds:
$\mathcal{L} = \mathcal{L}_{tok} + \lambda\,\mathcal{L}_{exit}$ with
$\mathcal{L}_{exit} = -\sum_i \sum_{v \ne r} w_i(v) \log q_{\theta, d(v)}(x_v \mid c_i) / \sum_i (|V_i| - 1)$:
probability moves toward the nodes where target mass exits. *ExitTrain tab.*
"""

CSS = """
.tev-text { font-family: ui-monospace, SFMono-Regular, Menlo, monospace; font-size: 13px; line-height: 1.5; }
"""


def _device_markdown() -> str:
    try:
        info = SERVICE.info()
    except Exception as error:  # a missing or broken asset must show, not crash the page
        return f"**Models could not be loaded:** {error}"
    sizes = ", ".join(f"{name} {count / 1e6:.2f}M" for name, count in info["parameters"].items())
    pair = {"smollm2": "SmolLM2-135M-Instruct + this project's block drafter", "tiny": "tiny 7M code pair"}.get(info["pair"], info["target_source"])
    return (
        f"**models** {pair} · **device** {info['device']} · **dtype** {info['dtype']} · **threads** {info['threads']} · **context** {info['context']} tokens · "
        f"**vocabulary** {info['vocab']} · **parameters** {sizes}"
    )


def build_app() -> gr.Blocks:
    examples = _examples()
    with gr.Blocks(title="TEV Explorer") as demo:
        gr.Markdown(
            "# TEV Explorer\nTree speculative decoding, made visible and exact: each round a drafter `q` proposes a tree, the target `p` "
            "scores it in one forward, and **TEV** keeps a path plus a bonus token. Node colour is the target's **reach P(v)**, the ring is "
            "the **missing mass w(v)** that leaves the tree there."
        )
        device_info = gr.Markdown("loading models…")
        with gr.Tab("Live"):
            with gr.Row():
                with gr.Column(scale=3):
                    prompt = gr.Textbox(
                        label="your message to the model" if CHAT_DEFAULT else "prompt (Python code to continue)",
                        value=examples[0], lines=6 if CHAT_DEFAULT else 8, max_lines=20, max_length=LIMITS.max_prompt_chars,
                    )
                    chat = gr.Checkbox(value=CHAT_DEFAULT, label="chat: send the prompt as a user message (chat template, stops at the end of the answer); untick to continue the raw text")
                    gr.Examples(
                        examples=[[e] for e in examples], inputs=[prompt],
                        label="held-out chat prompts: dialogue, code, math" if CHAT_DEFAULT else "held-out stdlib functions and HumanEval prompts",
                    )
                with gr.Column(scale=2):
                    drafter = gr.Radio(list(DRAFTER_KINDS), value="block", label="drafter q", info=" · ".join(f"{kind}: {DRAFTER_LABELS[kind]}" for kind in DRAFTER_KINDS))
                    verifier = gr.Radio(list(VERIFIERS), value="tev", label="verifier (greedy needs T = 0; at T = 0 every verifier is greedy)")
                    budget = Slider(1, LIMITS.max_budget, value=32, step=1, label="budget B (draft nodes per round)")
                    temperature = Slider(0.0, LIMITS.max_temperature, value=1.0, step=0.05, label="temperature T")
                    max_new_tokens = Slider(1, LIMITS.max_new_tokens, value=96, step=1, label="max new tokens")
                    with gr.Row():
                        seed = Number(value=0, precision=0, minimum=0, maximum=LIMITS.max_seed, label="seed")
                        compare_ar = gr.Checkbox(value=True, label="also time an autoregressive run (speedup)")
                    with gr.Row():
                        generate = gr.Button("Generate", variant="primary", elem_id="generate-button")
                        stop = gr.Button("Stop")
            stats = gr.Markdown("Press **Generate**.", elem_id="live-stats")
            text_view = gr.HTML(elem_id="text-view", elem_classes="tev-text")
            with gr.Row():
                tree_plot = gr.Plot(label="draft tree of the round", elem_id="tree-plot")
            with gr.Row():
                mass_plot = gr.Plot(label="where the tree loses target mass")
                timeline_plot = gr.Plot(label="rounds")
            with gr.Row():
                round_slider = Slider(1, 2, value=1, step=1, label="browse rounds", interactive=False)
                previous_round = gr.Button("◀ previous", scale=0)
                next_round = gr.Button("next ▶", scale=0)
            round_info = gr.Markdown()
            with gr.Row():
                export = gr.Button("Export rounds as JSON", scale=0)
                export_file = gr.File(label="rounds JSON", interactive=False)
            run_state = gr.State({"records": [], "summary": None}, time_to_live=RUN_STATE_SECONDS)

        with gr.Tab("Verifier lab"):
            gr.Markdown("Fix **one** tree and run each exact verifier many times: the exit-node frequencies follow the exit law w(v) and the mean block length is 1 + C(T), for TEV, predraw and sequential alike (fixed-tree equivalence).")
            with gr.Row():
                lab_source = gr.Radio(["prompt", "synthetic example"], value="prompt", label="tree from")
                lab_drafter = gr.Radio(LAB_DRAFTERS, value="block", label="drafter")
                lab_budget = Slider(1, LIMITS.max_lab_budget, value=16, step=1, label="budget B")
                lab_temperature = Slider(LIMITS.min_lab_temperature, LIMITS.max_temperature, value=1.0, step=0.05, label="temperature T")
                lab_draws = Slider(100, LIMITS.max_lab_draws, value=3000, step=100, label="draws per verifier")
                lab_seed = Number(value=0, precision=0, minimum=0, maximum=LIMITS.max_seed, label="seed")
            lab_prompt = gr.Textbox(label="prompt", value=examples[1] if len(examples) > 1 else examples[0], lines=4, max_length=LIMITS.max_prompt_chars)
            lab_run = gr.Button("Run the verifiers", variant="primary")
            lab_table = gr.Markdown()
            lab_plot = gr.Plot(label="exit law vs empirical exit frequencies")
            lab_tree = gr.Plot(label="the fixed tree")

        with gr.Tab("ExitTrain"):
            gr.Markdown(
                "Fine-tune the base block drafter for a minute or two with **ExitTrain**: the frozen target scores the trees the drafter "
                "actually builds, and the loss pushes draft probability toward nodes where target mass exits. One run at a time per server. "
                "This tab runs on the **tiny code pair** (the 7M target and its drafter), whose training data ships with the app."
            )
            with gr.Row():
                et_weights = gr.Radio(list(WEIGHT_MODES), value="exit", label="weights (exit: the method; prefix, none: controls)")
                et_steps = Slider(LIMITS.min_exittrain_steps, LIMITS.max_exittrain_steps, value=LIVE_CONFIG.steps, step=5, label="steps")
                et_lambda = Slider(0, LIMITS.max_lambda_exit, value=LIVE_CONFIG.lambda_exit, step=1, label="lambda (weight of L_exit)")
            with gr.Row():
                et_start = gr.Button("Start fine-tune", variant="primary")
                et_cancel = gr.Button("Cancel")
                et_shipped = gr.Button("Compare the shipped ExitTrain drafter instead")
            et_status = gr.Markdown()
            et_curve = gr.Plot(label="training")
            et_compare = gr.Plot(label="tau before / after")
            et_table = gr.Markdown()
            with gr.Row():
                et_tree_base = gr.Plot(label="base drafter's tree")
                et_tree_trained = gr.Plot(label="ExitTrain drafter's tree")

        with gr.Tab("Learn"):
            gr.Markdown(LEARN, latex_delimiters=[{"left": "$", "right": "$", "display": False}])

        # ------------------------------------------------------------------ events
        demo.load(_device_markdown, outputs=device_info, api_name=False)
        live_outputs = [text_view, tree_plot, mass_plot, timeline_plot, stats, round_slider, run_state]
        generate_event = generate.click(
            run_live, [prompt, drafter, verifier, budget, temperature, max_new_tokens, seed, compare_ar, chat], live_outputs, api_name="generate", concurrency_limit=2, concurrency_id="compute"
        )
        stop.click(None, cancels=[generate_event], api_name=False)
        round_slider.release(browse_round, [round_slider, run_state], [tree_plot, mass_plot, round_info], api_name="browse_round")
        previous_round.click(step_round, [round_slider, gr.State(-1), run_state], round_slider, api_name=False).then(browse_round, [round_slider, run_state], [tree_plot, mass_plot, round_info], api_name=False)
        next_round.click(step_round, [round_slider, gr.State(1), run_state], round_slider, api_name=False).then(browse_round, [round_slider, run_state], [tree_plot, mass_plot, round_info], api_name=False)
        export.click(export_run, run_state, export_file, api_name="export")
        lab_run.click(run_verifier_lab, [lab_source, lab_prompt, lab_drafter, lab_budget, lab_temperature, lab_draws, lab_seed], [lab_plot, lab_tree, lab_table], api_name="verifier_lab", concurrency_limit=2, concurrency_id="compute")
        et_start.click(run_exittrain, [et_weights, et_steps, et_lambda], [et_curve, et_status, et_compare, et_table], api_name="exittrain", concurrency_limit=2, concurrency_id="compute")
        et_cancel.click(cancel_exittrain, None, et_status, api_name="exittrain_cancel")
        et_shipped.click(compare_shipped, None, [et_compare, et_table, et_tree_base, et_tree_trained], api_name="compare_shipped", concurrency_limit=2, concurrency_id="compute")
    return demo


def _warm_up() -> None:
    """Load the models in the background; a failure is reported here in one line, and again
    on the page and to every request (they retry the load), never as a crash."""
    try:
        SERVICE.bundle()
    except Exception as error:  # noqa: BLE001 - shown, not raised, in a background thread
        print(f"TEV Explorer: models could not be loaded: {error}", file=sys.stderr, flush=True)


def _compute_threads() -> int:
    """Torch threads for the server: ``TEV_THREADS``, else one core fewer than the machine has.

    The server also builds figures and the browser (often on the same machine) renders them
    while tokens are generated; with every core given to torch, its threads wait on each
    other: on 2 cores, 2 threads gave 39 tokens/s while the page rendered, 1 thread 145.
    """
    text = os.environ.get("TEV_THREADS", "").strip()
    if text:
        if not text.isdigit() or int(text) < 1:
            raise SystemExit(f"TEV_THREADS must be a whole number >= 1, got {text!r}")
        return int(text)
    return max(1, (os.cpu_count() or 1) - 1)


def main() -> None:
    torch.set_num_threads(_compute_threads())
    demo = build_app()
    threading.Thread(target=_warm_up, daemon=True).start()  # load the models while the page loads
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
