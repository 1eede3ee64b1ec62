"""The Live tab: stream a generation round by round, browse its rounds, export them."""

from __future__ import annotations

import dataclasses
import threading
import time

import gradio as gr

from tev.engine.decode import GenerationSummary
from tev.service.service import UserInputError, check_settings, records_to_json
from ui import shared
from ui.shared import _user_error
from visual import mass_by_depth_figure, text_view_html, timeline_figure, tree_figure


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
    text = shared.SERVICE.token_text
    title = f"round {record.index + 1} of {len(records)} · drafter {record.drafter} · verifier {record.verifier}"
    return tree_figure(record.tree, record.flow, record.verdict, token_text=text, title=title), mass_by_depth_figure(record.flow)


def run_live(prompt, drafter, verifier, budget, temperature, max_new_tokens, seed, compare_ar, chat=False):
    """Stream a generation: text, current tree, mass by depth, stats; then the timeline.
    With ``chat`` the prompt is a user message (chat template, generation prompt added)."""
    try:
        bundle = shared.SERVICE.bundle()
        if chat and not bundle.is_chat:
            raise UserInputError("this target has no chat template; untick 'chat' to continue the text as it is")
        prompt_ids = shared.SERVICE.encode(prompt, chat=bool(chat))
        config = check_settings(drafter, verifier, budget, temperature, max_new_tokens, seed, list(bundle.drafters))
    except ValueError as error:  # the user's input, or models that could not be loaded
        raise _user_error(error) from None
    records, summary = [], None
    text = shared.SERVICE.token_text
    last_draw = 0.0
    events = shared.SERVICE.generate(prompt_ids, drafter, config)
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
        ar = yield from _in_worker(lambda stop: shared.SERVICE.autoregressive(prompt_ids, config, should_stop=stop), tick=(gr.skip(),) * 7)
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
