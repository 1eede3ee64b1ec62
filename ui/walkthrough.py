"""The Walkthrough tab: one speculation round on the live model, step by step (Next / Back), the
round replayed many times through the verifier lab, and the steps exported as one HTML file."""

from __future__ import annotations

import os
import tempfile
import time
from typing import Any, NamedTuple

import gradio as gr

from tev.core.verify import SAMPLING_VERIFIERS, VERIFIERS
from tev.engine.lab import LabTree, run_lab
from tev.engine.walkthrough import trace_round
from tev.service.adapted import is_adapted
from tev.service.service import DEFAULT_SAMPLING, LIMITS, as_text, check_settings
from ui import gpu, shared
from ui.components import checked_event, once_per_click
from ui.shared import COMPUTE, FORMULAS, RUN_STATE_SECONDS, _user_error, only, refuse
from visual import verifier_lab_figure
from visual.walkthrough import STEP_TITLES, walkthrough_html, walkthrough_step

KEPT_ROUNDS = 12  # rounds a session keeps for Back and the HTML export (each holds its tree's target rows)
REPLAY_DRAWS = 3000
RUN_FIRST = "press 'Run one round' first"

__all__ = ["WalkView", "ReplayView", "degenerate_note", "round_note", "check_walkthrough", "run_walkthrough", "step_walkthrough", "replay_walkthrough", "export_walkthrough", "tab"]


class WalkView(NamedTuple):
    """The walkthrough's outputs: where we are, the step's text and figure, the replay, the state."""

    where: Any
    text: Any
    plot: Any
    replay_plot: Any
    replay_table: Any
    state: Any


class ReplayView(NamedTuple):
    plot: Any
    table: Any


def _view(state: dict, replay_cleared: bool = True) -> WalkView:
    """The state's current round and step (``state["round"]`` indexes the kept traces)."""
    trace = state["traces"][state["round"]]
    step = walkthrough_step(trace, state["step"], shared.SERVICE.token_text)
    where = (f"**round {trace.round_index + 1} · step {state['step'] + 1} of {len(STEP_TITLES)}** · {trace.law.describe()} · "
             f"verifier {trace.verifier} · B = {trace.tree.size} · seed {state['seed']}")
    note = round_note(trace)  # every step of such a round says so, with how to get a richer one
    where += f"\n\n{note}" if note else ""
    cleared = dict(replay_plot=None, replay_table="") if replay_cleared else {}
    return only(WalkView, where=where, text=f"### {step.title}\n\n{step.text}", plot=step.figure, state=state, **cleared)


def degenerate_note(trace) -> str:
    """A sentence when a sampled round is degenerate, else "": its exit law puts all its mass on one node
    (at the law the target is sure of every drafted token on one path and of none below it), so every
    verifier exits there and emits the same block every time (a replay shows 1 + C with no spread)."""
    weights = trace.flow.exit_weight
    if trace.law.greedy or float(weights.max()) < 1 - 1e-6:
        return ""
    node = int(weights.argmax())
    return (f"**A degenerate round:** at {trace.law.describe()} the target is certain along one path, so the exit node is v{node} with "
            f"probability 1 and every verifier emits the same block (L = 1 + C = {trace.flow.tau_bound:.3f} every time, nothing to tell "
            "them apart). For a richer round raise T or top-p (T = 1, top-p 1.0 keep the target's whole law), press Next for another "
            "round, or give a prompt whose continuation is less certain.")


def round_note(trace) -> str:
    """Every step's flag on a round that shows less than its figures suggest, else "": a degenerate sampled round
    (:func:`degenerate_note`), a round at T = 0 (reach 1 or 0 everywhere: C(T) a whole number), a one-deep fan."""
    tree = trace.tree
    notes = [degenerate_note(trace)]
    if trace.law.greedy and tree.size > 0:
        notes.append(f"**At T = 0** the target puts all its mass on its most likely token: each reach is 1 or 0, the walk leaves the tree at "
                     f"one node, and C(T) = {trace.flow.coverage:.3f} counts the drafted tokens it agrees with along one path. To see the "
                     "mass spread over nodes, run a round at T > 0.")
    if tree.size > 1 and int(tree.depths.max()) == 1:
        notes.append(f"**A one-deep fan:** all {tree.size} nodes guess the next token and none goes past it (the drafter was unsure of "
                     "it, so best-first growth spent the whole budget there): this round can accept at most one draft token, L <= 2.")
    return "\n\n".join(note for note in notes if note)


@once_per_click
def check_walkthrough(prompt, drafter, verifier, budget, temperature, top_p, seed):
    """The round's settings and context; raises ``ValueError`` saying what to change (the event's
    validator calls it and the handler takes that result: :func:`once_per_click`)."""
    bundle = shared.SERVICE.bundle()
    config = check_settings(verifier, budget, temperature, 1, seed, top_p=top_p)
    shared.SERVICE.check_drafter_choice(drafter)  # a drafter the target lacks is refused here
    return config, shared.SERVICE.encode(as_text(prompt), chat=bundle.is_chat)


def run_walkthrough(prompt, drafter, verifier, budget, temperature, top_p, seed, request: gr.Request = None) -> WalkView:
    """Run one round on the prompt and show its first step."""
    try:
        config, context = check_walkthrough(prompt, drafter, verifier, budget, temperature, top_p, seed)
        bundle = shared.SERVICE.bundle()
        chosen = shared.SERVICE.chosen_drafter(drafter, shared.session_of(request))
        trace = shared.SERVICE.call_with(chosen, trace_round, bundle.runner, chosen, context, config.law, config.verifier, config.budget, config.seed)
    except ValueError as error:  # the validator refuses bad settings first; an API call that skips it lands here
        raise _user_error(error) from None
    return _view({"traces": [trace], "round": 0, "step": 0, "seed": config.seed, "drafter": drafter, "prompt": as_text(prompt)})


def step_walkthrough(delta, state, request: gr.Request = None) -> WalkView:
    """Back / Next through the kept rounds' steps; Next after the last step of the last round
    runs the next round from the new context (and Back can return to every kept round)."""
    if not state or not state.get("traces"):
        return refuse(RUN_FIRST, WalkView)
    traces, index, step = state["traces"], state["round"], state["step"] + int(delta)
    if step < 0:
        if index == 0:
            return refuse(f"this is the first step of the first round kept (a session keeps the last {KEPT_ROUNDS} rounds)", WalkView)
        index, step = index - 1, len(STEP_TITLES) - 1
    elif step >= len(STEP_TITLES):
        step = 0
        if index + 1 < len(traces):
            index += 1
        else:
            last = traces[-1]
            bundle = shared.SERVICE.bundle()
            try:
                chosen = shared.SERVICE.chosen_drafter(state["drafter"], shared.session_of(request))
                trace = shared.SERVICE.call_with(chosen, trace_round, bundle.runner, chosen, last.next_context, last.law, last.verifier, last.tree.size,
                                                 state["seed"], round_index=last.round_index + 1)
            except ValueError as error:  # the context is full: say so
                raise _user_error(error) from None
            traces = (traces + [trace])[-KEPT_ROUNDS:]
            index = len(traces) - 1
    moved = index != state["round"] or traces is not state["traces"]
    return _view({**state, "traces": traces, "round": index, "step": step}, replay_cleared=moved)


def replay_walkthrough(state, progress=gr.Progress()) -> ReplayView:
    """The shown round's tree through each sampling verifier many times (the verifier lab)."""
    if not state or not state.get("traces"):
        return refuse(RUN_FIRST, ReplayView)
    trace = state["traces"][state["round"]]
    if trace.law.greedy:
        return refuse("at T = 0 the decision is deterministic (one argmax walk): replaying it gives the same block every time; run a round at T > 0", ReplayView)
    lab = LabTree(trace.tree, trace.rows, trace.flow, "walkthrough")
    verifiers = SAMPLING_VERIFIERS
    result = shared.SERVICE.compute.call(run_lab, lab, verifiers, draws=REPLAY_DRAWS, seed=state["seed"],
                                         on_verifier=lambda name, i: progress(i / len(verifiers), desc=f"{name}: {REPLAY_DRAWS} draws"))
    lines = [f"Round {trace.round_index + 1}'s tree, each verifier run {REPLAY_DRAWS} times: the exit frequencies follow the same exit law $w(v)$ "
             f"as step 5, and the mean block length is $1 + C$ = {trace.flow.tau_bound:.3f}.", "",
             "| verifier | mean block length (± s.e.) |", "|---|---|"]
    lines += [f"| {name} | {result.mean_lengths[name]:.3f} ± {result.length_se[name]:.3f} |" for name in verifiers]
    note = degenerate_note(trace)
    lines += ["", note] if note else []
    return ReplayView(verifier_lab_figure(trace.tree, trace.flow, result.frequencies, result.mean_lengths, token_text=shared.SERVICE.token_text), "\n".join(lines))


def export_walkthrough(state):
    """Every kept round of this walkthrough, every step, as one HTML file that opens offline."""
    if not state or not state.get("traces"):
        return refuse(RUN_FIRST)
    page = walkthrough_html(state["traces"], shared.SERVICE.token_text)
    path = os.path.join(tempfile.mkdtemp(prefix="tev-walk-"), f"tev-walkthrough-{time.strftime('%Y%m%d-%H%M%S')}.html")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(page)
    return path


def tab(prompt_text: str) -> gr.Radio:
    """The Walkthrough tab's components and events; returns its drafter choice (a workload run adds the session's adapted drafters)."""
    gr.Markdown(
        "Watch **one round** happen, step by step: the drafter's guesses, the tree, the one target forward, where the target's "
        "mass flows and leaves, the verifier's decision, the bonus token, the commit. Every number is this round's. "
        "The defaults sample (T = 0.7, top-p 0.9) so the reach is graded; at T = 0 every reach is 0 or 1 and step 6 is an argmax walk."
    )
    with gr.Row():
        with gr.Column(scale=3):
            prompt = gr.Textbox(label=f"prompt · at most {LIMITS.max_prompt_chars:,} characters", value=prompt_text, lines=3, elem_id="walk-prompt")
        with gr.Column(scale=2):
            drafter = gr.Radio(shared.SERVICE.drafter_kinds(), value=shared.SERVICE.default_drafter_kind(), label="drafter q", elem_id="walk-drafter")
            verifier = gr.Radio(list(VERIFIERS), value="tev", label="verifier")
            with gr.Row():  # two to a row: four in one cut the sliders' end labels (the budget's 64 read "6")
                budget = gr.Slider(0, LIMITS.max_lab_budget, value=16, step=1, label="budget B", elem_id="walk-budget")
                temperature = gr.Slider(0.0, LIMITS.max_temperature, value=DEFAULT_SAMPLING.temperature, step=0.05, label="temperature T")
            with gr.Row():
                top_p = gr.Slider(LIMITS.min_top_p, 1.0, value=DEFAULT_SAMPLING.top_p, step=0.01, label="top-p")
                seed = gr.Number(value=0, precision=0, minimum=0, maximum=LIMITS.max_seed, label="seed (same settings and seed: the same round)")
    run = gr.Button("Run one round", variant="primary", elem_id="walk-run")
    where = gr.Markdown("Press **Run one round**.", elem_id="walk-where")
    with gr.Row():
        back = gr.Button("◀ Back", elem_id="walk-back")
        forward = gr.Button("Next ▶", elem_id="walk-next")
    text = gr.Markdown(elem_id="walk-text", latex_delimiters=FORMULAS)
    plot = gr.Plot(label="this step", elem_id="walk-plot")
    with gr.Row():
        replay = gr.Button("Replay this round's tree 3,000 times (each verifier)", elem_id="walk-replay")
        export = gr.Button("Export the walkthrough as HTML", elem_id="walk-export")
    replay_table = gr.Markdown(elem_id="walk-replay-table", latex_delimiters=FORMULAS)
    replay_plot = gr.Plot(label="the verifiers on this round's tree", elem_id="walk-replay-plot")
    file = gr.File(label="walkthrough HTML (opens offline)", interactive=False)
    state = gr.State({}, time_to_live=RUN_STATE_SECONDS)

    inputs = [prompt, drafter, verifier, budget, temperature, top_p, seed]
    views = list(WalkView(where, text, plot, replay_plot, replay_table, state))
    checked_event(run.click, gpu.gpu_task("generate")(run_walkthrough), inputs, views, check_walkthrough, also={drafter: is_adapted}, api_name="walkthrough", **COMPUTE)
    back.click(step_walkthrough, [gr.State(-1), state], views, api_name=False, **COMPUTE)
    forward.click(gpu.gpu_task("generate")(step_walkthrough), [gr.State(1), state], views, api_name="walkthrough_next", **COMPUTE)
    replay.click(gpu.gpu_task("verifier_lab")(replay_walkthrough), state, list(ReplayView(replay_plot, replay_table)), api_name="walkthrough_replay", **COMPUTE)
    export.click(export_walkthrough, state, file, api_name="walkthrough_export")
    return drafter
