"""The server objects every tab shares: the models, the ExitTrain slot, the chat default.

Handlers read them as ``shared.SERVICE`` (never ``from ui.shared import SERVICE``), so a test
that replaces ``ui.shared.SERVICE`` replaces it for every handler.
"""

from __future__ import annotations

import os

import gradio as gr

from tev.engine.models import default_pair
from tev.service.service import ExitTrainSlot, ModelService

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
# the compute lock, so a fine-tune and a generation take turns.
SHARES_EXITTRAIN = SERVICE.target_source is None and DTYPE in ("auto", "float32")
EXITTRAIN_SERVICE = SERVICE if SHARES_EXITTRAIN else ModelService(pair=default_pair(), device=DEVICE)
EXITTRAIN_SERVICE.compute = SERVICE.compute
EXITTRAIN_CHAT = default_pair() == "smollm2"  # its data has domains (dialogue, code, math)
EXITTRAIN_SLOT = ExitTrainSlot()
CHAT_DEFAULT = SERVICE.target_source is None and default_pair() == "smollm2"  # a chat target: prompts are user messages


def _user_error(error: Exception) -> gr.Error:
    return gr.Error(str(error), print_exception=False)  # the user's mistake, not a server fault
