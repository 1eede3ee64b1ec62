"""The Live tab's round browser: a finished run's rounds one at a time (its tree, where its mass leaves, budget
auto's choice), and the run exported as JSON."""

from __future__ import annotations

from typing import Any, NamedTuple

import gradio as gr

from tev.service.service import UserInputError, records_to_json
from ui import shared
from ui.shared import _user_error, refuse
from visual import mass_by_depth_figure, tree_figure
from visual.budget_view import budget_figure
from visual.live_words import round_info


class RoundView(NamedTuple):
    """The round browser's outputs."""

    rounds: Any  # its slider
    tree: Any
    mass: Any
    info: Any
    choice: Any  # budget auto's choice for that round


def round_figures(records, index: int):
    """The round's tree, its mass by depth, and budget auto's choice (a hidden plot at a fixed budget)."""
    record = records[index]
    text = shared.SERVICE.token_text
    title = f"round {record.index + 1} of {len(records)} · drafter {record.drafter} · verifier {record.verifier}"
    chosen = gr.update(value=budget_figure(record), visible=True) if record.choice is not None else gr.update(value=None, visible=False)
    return tree_figure(record.tree, record.flow, record.verdict, token_text=text, title=title), mass_by_depth_figure(record.flow), chosen


def records_of(state) -> list:
    """The rounds of the run a session's state holds (none before its first run)."""
    return (state or {}).get("records") or []


def check_browse(round_number, state, delta=0):
    """Refuses browsing before a generation; any round number is taken to the nearest round."""
    if not records_of(state):
        raise UserInputError("generate first: there are no rounds to browse yet")


def browse_round(round_number, state, delta=0) -> RoundView:
    """Round ``round_number + delta`` (clamped to the run's rounds): its tree, mass and numbers."""
    try:
        check_browse(round_number, state)
    except ValueError as error:  # the validator refuses this first; an API call that skips it lands here
        raise _user_error(error) from None
    records = records_of(state)
    index = min(max(int(round_number or 1) + int(delta) - 1, 0), len(records) - 1)
    tree, mass, chosen = round_figures(records, index)
    return RoundView(gr.update(value=index + 1) if delta else gr.skip(), tree, mass, round_info(records[index]), chosen)


def export_run(state):
    """The run as a JSON file (its rounds, summary and settings), or a refusal before the first run."""
    records = records_of(state)
    if not records:
        return refuse("generate first: there is no run to export yet")
    return records_to_json(records, state.get("summary"), state.get("settings", {}), token_text=shared.SERVICE.token_text)
