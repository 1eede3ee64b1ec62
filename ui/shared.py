"""The server objects every tab shares: the models, the ExitTrain slot, the chat default.

Handlers read them as ``shared.SERVICE`` (never ``from ui.shared import SERVICE``), so a test
that replaces ``ui.shared.SERVICE`` replaces it for every handler.
"""

from __future__ import annotations

import os

import gradio as gr

from tev.engine.models import default_pair
from tev.service.service import ExitTrainSlot, ModelService

SERVICE = ModelService(target=os.environ.get("TEV_TARGET") or None, draft=os.environ.get("TEV_DRAFT") or None)
# The live ExitTrain mode is built on the tiny code pair (its data and base drafter ship in
# assets/models); it shares the compute lock, so a fine-tune and a generation take turns.
EXITTRAIN_SERVICE = SERVICE if SERVICE.target_source is None and default_pair() == "tiny" else ModelService(pair="tiny")
EXITTRAIN_SERVICE.compute = SERVICE.compute
EXITTRAIN_SLOT = ExitTrainSlot()
CHAT_DEFAULT = SERVICE.target_source is None and default_pair() == "smollm2"  # a chat target: prompts are user messages


def _user_error(error: Exception) -> gr.Error:
    return gr.Error(str(error), print_exception=False)  # the user's mistake, not a server fault
