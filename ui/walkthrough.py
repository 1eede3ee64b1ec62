"""The Walkthrough tab: one speculation round on the live model, step by step (Next / Back), the
round replayed many times through the verifier lab, and the steps exported as one HTML file."""

from __future__ import annotations

import os
import tempfile
import time

import gradio as gr

from tev.bench.lab import LabTree, run_lab
from tev.engine.walkthrough import trace_round
from tev.service.service import check_settings
from ui import shared
from ui.shared import _user_error
from visual import verifier_lab_figure
from visual.walkthrough import STEP_TITLES, walkthrough_html, walkthrough_step

KEPT_ROUNDS = 12  # rounds a session keeps for the HTML export (each holds its tree's target rows)
REPLAY_DRAWS = 3000

__all__ = ["run_walkthrough", "step_walkthrough", "replay_walkthrough", "export_walkthrough"]


def _view(state: dict):
    """(position line, step title and text, figure) of the state's current round and step."""
    trace = state["traces"][-1]
    step = walkthrough_step(trace, state["step"], shared.SERVICE.token_text)
    where = (f"**round {trace.round_index + 1} · step {state['step'] + 1} of {len(STEP_TITLES)}** · {trace.law.describe()} · "
             f"verifier {trace.verifier} · B = {trace.tree.budget} · seed {state['seed']}")
    return where, f"### {step.title}\n\n{step.text}", step.figure


def run_walkthrough(prompt, drafter, verifier, budget, temperature, top_p, seed):
    """Run one round on the prompt and show its first step."""
    try:
        bundle = shared.SERVICE.bundle()
        config = check_settings(verifier, budget, temperature, 1, seed, top_p=top_p)
        context = shared.SERVICE.encode(prompt, chat=bundle.is_chat)
        with shared.SERVICE.compute:
            trace = trace_round(bundle.target, bundle.drafter(drafter), context, config.law, config.verifier, config.budget, config.seed)
    except ValueError as error:
        raise _user_error(error) from None
    state = {"traces": [trace], "step": 0, "seed": config.seed, "drafter": drafter, "prompt": prompt}
    return (*_view(state), state, None, "")


def step_walkthrough(delta, state):
    """Back / Next; Next after the last step runs the next round from the new context."""
    if not state or not state.get("traces"):
        raise gr.Error("press 'Run one round' first", print_exception=False)
    step = state["step"] + int(delta)
    if step < 0:
        step = 0
    elif step >= len(STEP_TITLES):
        last = state["traces"][-1]
        bundle = shared.SERVICE.bundle()
        try:
            with shared.SERVICE.compute:
                trace = trace_round(bundle.target, bundle.drafter(state["drafter"]), last.next_context, last.law, last.verifier,
                                    last.tree.budget, state["seed"], round_index=last.round_index + 1)
        except ValueError as error:
            raise _user_error(error) from None
        state = {**state, "traces": (state["traces"] + [trace])[-KEPT_ROUNDS:]}
        step = 0
    state = {**state, "step": step}
    return (*_view(state), state)


def replay_walkthrough(state, progress=gr.Progress()):
    """The current round's tree through each sampling verifier many times (the verifier lab)."""
    if not state or not state.get("traces"):
        raise gr.Error("press 'Run one round' first", print_exception=False)
    trace = state["traces"][-1]
    if trace.law.greedy:
        raise gr.Error("at T = 0 the decision is deterministic (one argmax walk): replaying it gives the same block every time; run a round at T > 0", print_exception=False)
    lab = LabTree(trace.tree, trace.rows, trace.flow, "walkthrough")
    verifiers = ("tev", "predraw", "sequential")
    with shared.SERVICE.compute:
        result = run_lab(lab, verifiers, draws=REPLAY_DRAWS, seed=state["seed"],
                         on_verifier=lambda name, i: progress(i / len(verifiers), desc=f"{name}: {REPLAY_DRAWS} draws"))
    lines = [f"This round's tree, each verifier run {REPLAY_DRAWS} times: the exit frequencies follow the same exit law $w(v)$ "
             f"as step 5, and the mean block length is $1 + C$ = {trace.flow.tau_bound:.3f}.", "",
             "| verifier | mean block length (± s.e.) |", "|---|---|"]
    lines += [f"| {name} | {result.mean_lengths[name]:.3f} ± {result.length_se[name]:.3f} |" for name in verifiers]
    return verifier_lab_figure(trace.tree, trace.flow, result.frequencies, result.mean_lengths, token_text=shared.SERVICE.token_text), "\n".join(lines)


def export_walkthrough(state):
    """Every round of this walkthrough, every step, as one HTML file that opens offline."""
    if not state or not state.get("traces"):
        raise gr.Error("press 'Run one round' first", print_exception=False)
    page = walkthrough_html(state["traces"], shared.SERVICE.token_text)
    path = os.path.join(tempfile.mkdtemp(prefix="tev-walk-"), f"tev-walkthrough-{time.strftime('%Y%m%d-%H%M%S')}.html")
    with open(path, "w", encoding="utf-8") as handle:
        handle.write(page)
    return path

