"""The Live tab: stream a generation round by round, browse its rounds, export them."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections import OrderedDict

import gradio as gr

from tev.engine.decode import GenerationSummary, run_to_end
from tev.service.service import UserInputError, check_settings, records_to_json
from ui import shared
from ui.shared import _user_error
from visual import mass_by_depth_figure, text_view_html, timeline_figure, tree_figure


def _stats_markdown(records, summary: GenerationSummary | None, timing: dict | None = None) -> str:
    if not records:
        return "No rounds yet."
    lengths = [r.block_length for r in records]
    bounds = [r.flow.tau_bound for r in records]
    tokens = sum(len(r.emitted) for r in records)
    lines = [
        f"**rounds** {len(records)} · **tokens** {tokens} · **tau** (mean block length) {sum(lengths) / len(lengths):.2f} · "
        f"**mean 1 + C** {sum(bounds) / len(bounds):.2f}",
        "tau = tokens emitted per target forward (accepted draft tokens + the bonus token); see the Learn tab for other tools' figures.",
    ]
    if summary is not None:
        stopped = "you pressed Stop" if summary.stop_reason == "cancelled" else summary.stop_reason
        lines.append(f"stopped: {stopped} · time to first token {1e3 * summary.time_to_first_token:.0f} ms · "
                     f"{summary.tokens_per_second:.1f} tokens/s while the page drew each round")
    if timing:
        lines.append(_speed_verdict(timing["speculative"], timing["autoregressive"]))
    return "\n\n".join(lines)


def _speed_verdict(spec: GenerationSummary, ar: GenerationSummary) -> str:
    """The speedup of a quiet rerun over plain decoding, and why, from the rerun's stage times."""
    speedup = spec.tokens_per_second / max(ar.tokens_per_second, 1e-9)
    step_ms = 1e3 * (ar.seconds - ar.prefill_seconds) / max(1, len(ar.token_ids))  # one target step
    round_ms = 1e3 * (spec.seconds - spec.prefill_seconds) / max(1, spec.rounds)
    stage = {k: 1e3 * v / max(1, spec.rounds) for k, v in spec.stage_seconds.items()}
    cost = round_ms / max(step_ms, 1e-9)
    head = (
        f"**speed, timed again with the page idle** (same prompt, settings and seed: the same text): speculation "
        f"{spec.tokens_per_second:.1f} tokens/s, plain decoding {ar.tokens_per_second:.1f} tokens/s → **{speedup:.2f}x**"
    )
    why = (
        f"A round cost {round_ms:.0f} ms, the time of **{cost:.1f} one-token steps** ({step_ms:.0f} ms each): forward "
        f"{stage.get('forward', 0):.0f} ms, head {stage.get('head', 0):.0f} ms, verify {stage.get('verify', 0):.0f} ms, draft and build "
        f"{stage.get('draft', 0) + stage.get('build', 0):.0f} ms; it produced **tau = {spec.tau:.2f} tokens**."
    )
    if speedup < 1:
        why += (" Speculation pays only when a round yields more tokens than it costs steps: here it does not. On a CPU a "
                "forward over the B + 1 tree tokens costs more than a one-token step (on a GPU about the same); a smaller "
                "budget, T = 0, or a prompt the drafter predicts well (code, lists) shifts the balance.")
    return head + "\n\n" + why


def _round_figures(records, index: int):
    record = records[index]
    text = shared.SERVICE.token_text
    title = f"round {record.index + 1} of {len(records)} · drafter {record.drafter} · verifier {record.verifier}"
    return tree_figure(record.tree, record.flow, record.verdict, token_text=text, title=title), mass_by_depth_figure(record.flow)


# Each browser session's Stop flag: Generate clears it (arm_stop), Stop sets it, the running
# generation polls it between rounds and ends as a finished run would, its figures kept.
_STOP_FLAGS: OrderedDict[str, threading.Event] = OrderedDict()
_STOP_FLAGS_KEPT = 1024
_STOP_LOCK = threading.Lock()


def _stop_flag(request) -> threading.Event:
    key = getattr(request, "session_hash", None) or "anonymous"
    with _STOP_LOCK:
        flag = _STOP_FLAGS.pop(key, None) or threading.Event()
        _STOP_FLAGS[key] = flag  # most recent last
        while len(_STOP_FLAGS) > _STOP_FLAGS_KEPT:
            _STOP_FLAGS.popitem(last=False)
        return flag


def arm_stop(request: gr.Request):
    """Generate pressed: a Stop from before this press does not stop it."""
    _stop_flag(request).clear()


def stop_live(request: gr.Request):
    """Stop pressed: the session's generation ends after its current round (or before it starts)."""
    _stop_flag(request).set()


def run_live(prompt, drafter, verifier, budget, temperature, max_new_tokens, seed, compare_ar, chat=False, top_p=1.0, top_k=0, request: gr.Request = None):
    """Stream a generation: text, current tree, mass by depth, stats; then the timeline.
    With ``chat`` the prompt is a user message (chat template, generation prompt added).
    Stop (:func:`stop_live`) ends it between rounds, with every figure drawn for what ran."""
    try:
        bundle = shared.SERVICE.bundle()
        if chat and not bundle.is_chat:
            raise UserInputError("this target has no chat template; untick 'chat' to continue the text as it is")
        prompt_ids = shared.SERVICE.encode(prompt, chat=bool(chat))
        config = check_settings(verifier, budget, temperature, max_new_tokens, seed, top_p=top_p, top_k=top_k)
        speculation = shared.SERVICE.request(prompt_ids, drafter, config)
    except ValueError as error:  # the user's input, or models that could not be loaded
        raise _user_error(error) from None
    stop = _stop_flag(request)
    records, summary = [], None
    text = shared.SERVICE.token_text
    last_draw = 0.0
    events = shared.SERVICE.generate(speculation, should_stop=stop.is_set)
    try:  # Gradio closes this generator when the client leaves: stop generating then
        for event in events:
            if isinstance(event, GenerationSummary):
                summary = event
                break
            records.append(event)
            now = time.perf_counter()
            if len(records) == 1 or now - last_draw > 0.25:  # redraw at most 4 times a second
                last_draw = now
                tree, mass = _round_figures(records, len(records) - 1)
                yield (text_view_html(records, token_text=text, prompt_text=prompt), tree, mass, gr.skip(), _stats_markdown(records, None), gr.skip(), {"records": records, "summary": None})
    finally:
        events.close()
    timing = None
    if compare_ar and summary is not None and summary.stop_reason != "cancelled" and records:
        waiting = (gr.skip(),) * 4 + (_stats_markdown(records, summary) + "\n\ntiming speculation and plain decoding again, with the page idle…", gr.skip(), gr.skip())
        yield waiting

        def quiet_runs(should_stop):
            def halted():
                return should_stop() or stop.is_set()
            quiet = run_to_end(shared.SERVICE.generate(speculation, should_stop=halted))[1]
            return quiet, shared.SERVICE.autoregressive(prompt_ids, config, should_stop=halted)

        quiet, ar = yield from _in_worker(quiet_runs, tick=(gr.skip(),) * 7)
        if "cancelled" not in (quiet.stop_reason, ar.stop_reason):
            timing = {"speculative": quiet, "autoregressive": ar}
    state = {"records": records, "summary": summary, "settings": {"prompt": prompt, "drafter": drafter, **dataclasses.asdict(config)}}
    if not records:
        message = "Stopped before the first round." if summary is not None and summary.stop_reason == "cancelled" else "The generation produced no rounds."
        yield ("", None, None, None, message, gr.update(minimum=1, maximum=2, value=1, interactive=False), state)
        return
    tree, mass = _round_figures(records, len(records) - 1)
    yield (
        text_view_html(records, token_text=text, prompt_text=prompt),
        tree,
        mass,
        timeline_figure(records),
        _stats_markdown(records, summary, timing),
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
    return records_to_json(records, state.get("summary"), state.get("settings", {}), token_text=shared.SERVICE.token_text)
