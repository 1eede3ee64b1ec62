"""The server objects every tab shares: the models, the ExitTrain slot, the chat default.

Handlers read them as ``shared.SERVICE`` (never ``from ui.shared import SERVICE``), so a test
that replaces ``ui.shared.SERVICE`` replaces it for every handler.
"""

from __future__ import annotations

import os

import gradio as gr

from tev.engine.models import PAIRS, default_pair
from tev.service.adapted import AdaptedDrafters, AskedPrompts
from tev.service.live_runs import LiveRuns
from tev.service.service import TrainingSlot, ModelService

# "auto": CUDA when torch sees it (on ZeroGPU the spaces package makes it visible at start-up
# and moves the weights when a @spaces.GPU call begins), else the CPU
DEVICE = os.environ.get("TEV_DEVICE") or "auto"
# "auto": float32 on a CPU (greedy speculation equals greedy decoding token for token);
# "bfloat16" is faster there and may part from greedy decoding where two tokens nearly tie
DTYPE = os.environ.get("TEV_DTYPE") or "auto"
SERVICE = ModelService(target=os.environ.get("TEV_TARGET") or None, draft=os.environ.get("TEV_DRAFT") or None, device=DEVICE, dtype=DTYPE)
# The live ExitTrain mode runs on the shipped pair (its data and base drafter ship in assets/models;
# a custom TEV_TARGET has none, so the default pair is loaded beside it; ExitTrain was built and
# measured on the float32 target, so another TEV_DTYPE loads that one beside it too); it shares
# the compute thread, where a generation's rounds go ahead of a fine-tune's steps (background work).
SHARES_EXITTRAIN = SERVICE.target_source is None and DTYPE in ("auto", "float32")
EXITTRAIN_SERVICE = SERVICE if SHARES_EXITTRAIN else ModelService(pair=default_pair(), device=DEVICE)
EXITTRAIN_SERVICE.compute = SERVICE.compute
EXITTRAIN_CHAT = PAIRS[default_pair()].has_domains  # its data has domains (dialogue, code, math)
TRAINING_SLOT = TrainingSlot()
ADAPTED = AdaptedDrafters()  # each session's adapted drafters (for the ExitTrain pair's target), least recently used dropped first
ASKED = AskedPrompts()  # each session's chat prompts sent in Live: a workload of its own
RUNS = LiveRuns()  # each session's Live run state: its Stop, the work its next press ends, when it pressed
SERVICE.adapted = ADAPTED if SHARES_EXITTRAIN else None  # Live and the walkthrough serve them where they were made for its target
CHAT_DEFAULT = SERVICE.target_source is None and PAIRS[default_pair()].chat  # a chat target: prompts are user messages


# Every interactive event that runs the models (Live, the walkthrough, the lab): two at a time, in one
# queue shared by those tabs (a third waits).
COMPUTE = {"concurrency_limit": 2, "concurrency_id": "compute"}
# The ExitTrain tab's runs (a fine-tune, a workload adaptation, the shipped drafter's comparison), which
# take minutes: a queue of their own, so a run never holds one of the interactive events' two places;
# their model work is background work in the compute thread (interactive steps go first).
BACKGROUND = {"concurrency_limit": 2, "concurrency_id": "background"}
# $...$ in markdown is a formula (KaTeX in the page)
FORMULAS = [{"left": "$", "right": "$", "display": False}]
# How long a finished run's state (rounds, traces) stays browsable in a session.
RUN_STATE_SECONDS = 3600


def session_of(request) -> str:
    """The browser session a request comes from (its Stop flag, ExitTrain slot, adapted drafters and
    Live prompts are keyed by it); "anonymous" for a call without one."""
    return getattr(request, "session_hash", None) or "anonymous"


def _user_error(error: Exception) -> gr.Error:
    return gr.Error(str(error), print_exception=False)  # the user's mistake, not a server fault


def only(view: type, **values):
    """An instance of ``view`` (a NamedTuple naming an event's outputs) that sets ``values`` and
    leaves every other output as it was."""
    return view(*(values.get(name, gr.skip()) for name in view._fields))


def refuse(message: str, view: type | None = None):
    """A press that cannot act yet (nothing to step or export): one warning saying what to do
    first, and every output of ``view`` (or the event's one output) left as it was."""
    gr.Warning(message)
    return gr.skip() if view is None else only(view)
