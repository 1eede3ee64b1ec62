"""The Live tab: stream a generation round by round, browse its rounds, export them."""

from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any, NamedTuple

import gradio as gr

from tev.engine.decode import DecodeConfig
from tev.service.adapted import ADAPTED_PREFIX, KEY_MARK, is_adapted
from tev.service.live_runs import WAITING, Asked, Finished, Round, TimingAgain, continuation
from tev.service.live_settings import LiveInput, LiveSettings
from tev.service.service import LIMITS, UserInputError, as_text
from ui import gpu, shared
from ui.components import checked_event, once_per_click, refusal_line, settings_handler
from ui.live_controls import settings_column
from ui.live_rounds import RoundView, browse_round, check_browse, export_run, records_of, round_figures
from ui.shared import COMPUTE, RUN_STATE_SECONDS, _user_error, only
from ui.workload import remember_asked
from visual import note_figure, text_view_html, timeline_figure
from visual.live_words import RETIMING, STOPPED, opened_at, round_info, run_summary, said_at_end, sharing_note, stats_markdown, teaching_round

# While a run streams the page redraws its text at most this often and its figures (plotly, costly in the browser)
# far less: at 4 redraws a second of both a 48 s run kept the browser's main thread busy 12 s.
# On the default pair each redraw of the three figures kept the browser's main thread busy about 300 ms (at one a
# second, long tasks filled 28-33% of a 25 s stream on a 2-core machine serving the page): a redraw every 3 s.
TEXT_SECONDS, FIGURE_SECONDS = 0.1, 3.0


class LiveView(NamedTuple):
    """The outputs of a generation."""

    text: Any
    tree: Any
    mass: Any
    timeline: Any
    stats: Any
    summary: Any  # the finished run in numbers (JSON beside the stats' sentences: tools read this, never the prose); cleared while a run streams
    rounds: Any  # the round browser's slider
    choice: Any  # budget auto's choice for the shown round (hidden at a fixed budget)
    state: Any
    said: Any  # under the buttons: what answers the press (how the run stopped, the re-timing, the speed), in view where the user pressed
    more: Any  # the Continue button: shown when the answer stopped at the length limit
    info: Any  # the round browser's sentence on the round the figures show


def arm_stop(request: gr.Request):
    """Generate (or Continue) pressed: the session's re-timing or streaming Continue, if one runs, ends, and this press's run starts
    as the old one ends (the event runs its last press after the current one: ``always_last``); a Stop
    from before this press does not stop the new run (:meth:`~tev.service.live_runs.LiveRuns.press`). Hides Continue at once:
    the answer it would go on from is being replaced (a press of it now would continue the old answer beside the new run)."""
    shared.RUNS.press(shared.session_of(request))
    return gr.update(visible=False)


def _pressed(line):
    """Generate pressed: ``line`` (:func:`refusal_line`) says whether the press is refused. A refused press changes
    nothing else: the answer on the page keeps its Continue and its re-timing goes on (a run that will not start
    replaces nothing); a press that runs arms it (:func:`arm_stop`). Returns (the line, Continue's update)."""

    def press(settings: LiveSettings, memory=None, request: gr.Request = None):
        said = line(*dataclasses.astuple(settings), memory)
        return said, (gr.skip() if said["visible"] else arm_stop(request))

    return press


def stop_live(request: gr.Request):
    """Stop pressed: the session's generation ends after its current round (or before it starts), and its
    re-timing, if one runs, at its next step (the run's end then says so under the buttons; a line written here
    could land after that end and hide it)."""
    shared.RUNS.stop(shared.session_of(request))


def _check(settings: LiveSettings, memory=None) -> LiveInput:
    """The press's prompt token ids and generation settings (:class:`LiveInput`); raises ``ValueError`` saying
    what to change. With ``auto`` the budget is "auto" and ``budget`` its cap. ``memory`` (the session's budget
    auto state) is not read: the check has the handler's inputs."""
    return shared.SERVICE.check_live(settings)


# The event's validator calls it and the handler takes that result (once_per_click); its parameters are /generate's.
check_live = once_per_click(settings_handler(LiveSettings, _check, more=("memory",), request=False, name="check_live"))


def _run(settings: LiveSettings, memory=None, request: gr.Request = None):
    """Stream a generation (:class:`LiveView`): text, current tree, mass by depth, stats; then the
    timeline. With ``chat`` the prompt is a user message (chat template, generation prompt added).
    With ``auto`` each round keeps the drafter's best nodes this machine pays for, at most
    ``budget`` (``memory``: the browser session's state, see :meth:`~tev.service.live_runs.LiveRuns.serve`).
    Stop (:func:`stop_live`) ends it between rounds, with every figure drawn for what ran."""
    try:
        prompt_ids, config = check_live(*dataclasses.astuple(settings), memory)  # as the validator called it: checked once
        served, serving_note = shared.SERVICE.served_drafter(settings.drafter, shared.session_of(request), config.law)
        serving_note = serving_note or _adapted_note(settings.drafter)
        speculation = shared.SERVICE.request(prompt_ids, served, config)
        remember_asked(as_text(settings.prompt), settings.chat, request)
    except ValueError as error:  # the validator refuses these first; an API call that skips it lands here
        raise _user_error(error) from None
    with shared.SERVICE.serving():  # other runs in the app's line see this one (others_waiting)
        asked = Asked(prompt_ids, as_text(settings.prompt), settings.drafter, config, bool(settings.compare_ar), session=shared.session_of(request))
        return (yield from _served(speculation, asked, memory, serving_note))


# The Live handler: /generate's parameters are LiveSettings' fields, then the session's budget auto state.
run_live = settings_handler(LiveSettings, _run, more=("memory",), name="run_live")


def check_continue(state, memory=None) -> tuple:
    """The run a Continue goes on from: (its rounds, what it was asked with); raises ``ValueError`` saying why
    there is nothing to continue."""
    records, summary, asked = records_of(state), (state or {}).get("summary"), (state or {}).get("asked")
    if not records or asked is None:
        raise UserInputError("nothing to continue yet: press Generate first")
    if summary.stop_reason != "max_new_tokens":
        raise UserInputError(f"nothing to continue: the last answer was not cut at the length limit ({STOPPED.get(summary.stop_reason, summary.stop_reason)})")
    if is_adapted(asked.drafter):  # an adapted drafter the server no longer keeps is refused here, under the buttons
        shared.SERVICE.served_drafter(asked.drafter, asked.session, asked.config.law)
    return records, asked


def continue_live(state, memory=None, request: gr.Request = None):
    """Continue pressed: the answer cut at the length limit goes on from its last token, with the same drafter and
    settings, for up to max new tokens more; its rounds join the answer's (the text, the round browser, the
    stats over the whole answer). The target reads the prompt and the answer so far as its context and the
    continuation samples with a seed of its own (:func:`~tev.service.live_runs.continuation_seed`), so prompt + answer stays a sample of
    the target's law (at T = 0, the one longer greedy answer); the speed comparison, when asked for, times the new part."""
    try:
        records, asked = check_continue(state)
        speculation, asked, serving_note = continuation(shared.SERVICE, records, asked, shared.session_of(request))
    except ValueError as error:  # the validator refuses these first; an API call that skips it lands here
        raise _user_error(error) from None
    superseded = shared.RUNS.ended_by_next_press(shared.session_of(request))
    with shared.SERVICE.serving():
        return (yield from _served(speculation, asked, memory, serving_note or _adapted_note(asked.drafter), earlier=records, superseded=superseded))


def _served(speculation, asked: Asked, memory, serving_note: str | None, earlier: list = (), superseded: threading.Event | None = None):
    """The run's events (:meth:`~tev.service.live_runs.LiveRuns.serve`) drawn: each round's text and stats at most
    :data:`TEXT_SECONDS` apart and its figures at most :data:`FIGURE_SECONDS` apart (the first round draws both),
    the line under the buttons while the answer is timed again, then the finished view; ``serving_note`` (why
    another drafter than the one chosen runs) above the stats throughout."""
    events = shared.RUNS.serve(shared.SERVICE, speculation, asked, memory, list(earlier), superseded)
    last_text = last_figures = float("-inf")
    try:  # Gradio closes this generator when the client leaves: the run's generator is closed with it
        for event in events:
            if isinstance(event, Round):
                now = time.perf_counter()
                if now - last_text < TEXT_SECONDS:
                    continue
                first, figures = last_text == float("-inf"), now - last_figures >= FIGURE_SECONDS
                view, last_text, last_figures = _drawn(event, asked.prompt, first, figures), now, (now if figures else last_figures)
            elif isinstance(event, TimingAgain):
                view = only(LiveView, stats=stats_markdown(event.records, event.summary, asked.config, event.speed, shared.SERVICE.machine()), said=_said(RETIMING))
            elif event is WAITING:
                view = only(LiveView)
            else:
                view = _finished(event, asked.config, asked.prompt)
            yield _with_note(view, serving_note)
    finally:
        events.close()


def _said(text: str | None):
    """The line under the buttons that answers a press: ``text``, or hidden when there is none (kept in the page:
    removed and mounted again when shown, it came after the stats it answers, and a loaded machine's browser test saw it not come)."""
    return gr.update(value=text or "", visible=True if text else "hidden")


def _adapted_note(drafter: str) -> str | None:
    """Above the stats when Live serves the adapted drafter chosen (as it says when it serves the shipped one instead)."""
    if not is_adapted(drafter):
        return None
    return (f"**served: your adapted drafter {drafter.split(KEY_MARK)[0].removeprefix(ADAPTED_PREFIX)}** (adapted in this browser session; "
            "at this law its held-out decoding gave no fewer tokens per forward than the shipped drafter)")


def _with_note(view: LiveView, note: str | None) -> LiveView:
    """``view`` with ``note`` (why Live runs another drafter than the one chosen) above its stats."""
    if not note or not isinstance(view.stats, str):
        return view
    return view._replace(stats=note + "\n\n" + view.stats)


def _drawn(event: Round, prompt: str, first: bool, figures: bool) -> LiveView:
    """A round's redraw: the text and stats (and the round's figures when ``figures``); the ``first`` round also
    clears what the last run left under the buttons."""
    records = event.records
    words = {"text": text_view_html(records, token_text=shared.SERVICE.token_text, prompt_text=prompt), "summary": None,
             "said": _said(None) if first else gr.skip(), "more": gr.update(visible=False) if first else gr.skip(), "info": "" if first else gr.skip(),
             "stats": stats_markdown(records, None) + sharing_note(event.active, event.background), "state": {"records": records, "summary": None}}
    if figures:
        words["tree"], words["mass"], words["choice"] = round_figures(records, len(records) - 1)
    return only(LiveView, **words)


def _finished(event: Finished, config: DecodeConfig, prompt: str) -> LiveView:
    """The finished run's view: every figure, the stats and the summary, what answers the press under the buttons,
    the round browser at the round a visitor learns most from (:func:`~visual.live_words.teaching_round`)."""
    records, summary, speed, state = event.records, event.summary, event.speed, event.state
    machine = shared.SERVICE.machine()
    said = _said(said_at_end(summary, config, speed, machine))
    if not records:
        message = "Stopped before the first round." if summary.stop_reason == "cancelled" else "The generation produced no rounds."
        return LiveView("", None, None, None, message, None, gr.update(minimum=1, maximum=2, value=1, interactive=False), gr.update(value=None, visible=False), state, said,
                        gr.update(visible=False), "")
    shown = teaching_round(records)
    tree, mass, chosen = round_figures(records, shown)
    return LiveView(
        text=text_view_html(records, token_text=shared.SERVICE.token_text, prompt_text=prompt),
        tree=tree,
        mass=mass,
        timeline=timeline_figure(records),
        stats=stats_markdown(records, summary, config, speed, machine) + opened_at(records, shown, config.temperature == 0),
        summary=run_summary(records, summary, speed, machine),
        rounds=gr.update(minimum=1, maximum=max(2, len(records)), value=shown + 1, step=1, interactive=len(records) > 1),  # a slider needs min < max
        choice=chosen,
        state=state,
        said=said,
        more=gr.update(visible=summary.stop_reason == "max_new_tokens"),
        info=round_info(records[shown]),
    )


def tab(examples: list[str]) -> gr.Radio:
    """The Live tab's components and events; returns its drafter choice (a workload run adds the session's adapted drafters)."""
    with gr.Row():
        with gr.Column(scale=3):
            prompt = gr.Textbox(  # no max_length: a longer prompt is refused with a message, never cut silently
                label=("your message to the model" if shared.CHAT_DEFAULT else "prompt (Python code to continue)") + f" · at most {LIMITS.max_prompt_chars:,} characters",
                value=examples[0], lines=5 if shared.CHAT_DEFAULT else 8, max_lines=12,  # a long prompt scrolls: Generate and its refusal stay in view
            )
            with gr.Row():  # right under the prompt: in view without scrolling
                generate = gr.Button("Generate", variant="primary", elem_id="generate-button")
                stop = gr.Button("Stop", elem_id="stop-button")
                more = gr.Button("Continue", elem_id="continue-button", visible=False)  # shown when an answer stopped at the length limit
            # a refused press says why here, where the user pressed (the validator's message sits under the input, maybe out of sight)
            refused = gr.Markdown(visible=False, elem_id="live-refusal")
            said_line = gr.Markdown(visible="hidden", elem_id="live-said")  # what answers a press (Stop, the re-timing, the speed), above the answer
            gr.Markdown(gpu.quota_note("generate"), visible=gpu.ZERO_GPU)
            # the answer streams under the prompt, in the first screen (beneath the settings it started out of sight)
            text_view = gr.HTML(elem_id="text-view", elem_classes="tev-text")
            stats = gr.Markdown("Press **Generate**.", elem_id="live-stats")
            run_summary = gr.JSON(visible="hidden", elem_id="live-summary")  # the run in numbers, for tools (the page shows the stats)
            chat = gr.Checkbox(value=shared.CHAT_DEFAULT, label="chat: send the prompt as a user message (chat template, stops at the end of the answer); untick to continue the raw text")
            gr.Examples(
                examples=[[e] for e in examples], inputs=[prompt],
                label="held-out chat prompts: dialogue, code, math" if shared.CHAT_DEFAULT else "held-out stdlib functions and HumanEval prompts",
            )
        fields = {"prompt": prompt, "chat": chat, **settings_column()}
    with gr.Row():
        # a note, not an empty frame, until the first round; drawing it at page load also loads plotly then, not in the first run
        tree_plot = gr.Plot(note_figure("Press Generate: each round's draft tree is drawn here, coloured by the target's reach", height=240),
                            label="draft tree of the round", elem_id="tree-plot")
    with gr.Row():
        mass_plot = gr.Plot(label="where the tree loses target mass", elem_id="mass-plot")
        timeline_plot = gr.Plot(label="rounds", elem_id="timeline-plot")
    with gr.Row():
        budget_plot = gr.Plot(label="budget auto: how this round's tree size was chosen", elem_id="budget-plot", visible=False)
    with gr.Row():
        round_slider = gr.Slider(1, 2, value=1, step=1, label="browse rounds", interactive=False, elem_id="round-slider")
        previous_round = gr.Button("◀ previous", scale=0)
        next_round = gr.Button("next ▶", scale=0)
    round_info = gr.Markdown(elem_id="round-info")
    with gr.Row():
        export = gr.Button("Export rounds as JSON", scale=0)
        export_file = gr.File(label="rounds JSON", interactive=False)
    run_state = gr.State({"records": [], "summary": None}, time_to_live=RUN_STATE_SECONDS)
    budget_memory = gr.State({})  # this browser session's budget auto calibration and rate, per drafter

    inputs = [fields[name] for name in LiveSettings.names()] + [budget_memory]  # in the handler's order: its parameters name /generate's
    # Stop is a flag the generation polls between rounds (not Gradio's cancel, which would
    # mark every output as failed and leave the figures of a half-drawn run)
    # the line under Generate first, then the run (chained, not beside it: see refusal_line)
    press = settings_handler(LiveSettings, _pressed(refusal_line(inputs, check_live, also={fields["drafter"]: is_adapted})), more=("memory",), name="press")
    said = generate.click(press, inputs, [refused, more], queue=False, preprocess=False, api_name=False)
    # always_last: a press while a run (or its re-timing) is on starts one run as soon as it ends
    outputs = list(LiveView(text_view, tree_plot, mass_plot, timeline_plot, stats, run_summary, round_slider, budget_plot, run_state, said_line, more, round_info))
    checked_event(said.then, gpu.gpu_task("generate")(run_live), inputs, outputs, check_live, also={fields["drafter"]: is_adapted}, api_name="generate",
                  trigger_mode="always_last", **COMPUTE)
    # Continue: the answer cut at the length limit goes on, in the same way (refused under the buttons when there is none)
    pressed = more.click(arm_stop, None, more, queue=False, api_name=False)
    said = pressed.then(refusal_line([run_state, budget_memory], check_continue), [run_state, budget_memory], refused, queue=False, preprocess=False, api_name=False)
    checked_event(said.then, gpu.gpu_task("generate")(continue_live), [run_state, budget_memory], outputs, check_continue, api_name=False,
                  trigger_mode="always_last", **COMPUTE)
    stop.click(stop_live, None, None, queue=False, api_name=False)
    views = list(RoundView(round_slider, tree_plot, mass_plot, round_info, budget_plot))
    # release: the slider dragged; input: a round number typed into its box
    for event, api_name in ((round_slider.release, "browse_round"), (round_slider.input, False)):
        checked_event(event, browse_round, [round_slider, run_state], views, check_browse, api_name=api_name, trigger_mode="always_last")
    for button, delta in ((previous_round, -1), (next_round, 1)):
        inputs = [round_slider, run_state, gr.State(delta)]
        checked_event(button.click, browse_round, inputs, views, check_browse, api_name=False)
    export.click(export_run, run_state, export_file, api_name="export")
    return fields["drafter"]
