"""GPU time on a ZeroGPU Space, and nothing anywhere else.

A ZeroGPU Space attaches a GPU to the process only while a function decorated with
``@spaces.GPU`` runs (each visitor has a daily quota of GPU minutes), so every handler that
runs the models is wrapped by :func:`gpu_task`. Where the ``spaces`` package is absent (a
laptop, a CPU Space, a GPU Space with a dedicated card) the handlers are left as they are.
"""

from __future__ import annotations

import os

try:  # present only on Hugging Face Spaces
    import spaces
except ImportError:
    spaces = None

__all__ = ["GPU_SECONDS", "ZERO_GPU", "gpu_task", "quota_note"]

# The most GPU time one press may hold (ZeroGPU refuses a call when the visitor's quota left is
# below it, so these stay short): a generation of at most 512 tokens, the verifier lab's draws,
# the live ExitTrain fine-tune (at most 3 minutes) and its held-out comparison.
GPU_SECONDS = {"generate": 60, "verifier_lab": 60, "exittrain": 240, "compare_shipped": 90}

ZERO_GPU = spaces is not None and bool(os.environ.get("SPACES_ZERO_GPU"))


def gpu_task(name: str):
    """A decorator: ``spaces.GPU(duration=GPU_SECONDS[name])`` on ZeroGPU, else the identity."""
    duration = GPU_SECONDS[name]
    if not ZERO_GPU:
        return lambda handler: handler
    return spaces.GPU(duration=duration)


def quota_note(name: str) -> str:
    """What one press costs on ZeroGPU (empty elsewhere), for the button's caption."""
    return f"On this ZeroGPU Space one press holds a GPU for at most {GPU_SECONDS[name]} s of your daily GPU quota." if ZERO_GPU else ""
