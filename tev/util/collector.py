"""The server's garbage collections, kept short.

A full collection (generation 2) walks every object the collector tracks, and it stops every thread while it runs:
the compute thread's rounds too. Once the app has loaded its models and built its page the process holds hundreds
of thousands of them (torch, transformers, Gradio, plotly), nearly all of which live as long as the process. On the
default pair (2-core AVX-512 EPYC) a full collection took 53-274 ms, longer as the server lived, and one falling into
a 0.8 s re-timing took its speculation from about 80 to 60 tokens/s: the page's figure for that prompt read 0.93x
where it read 1.25x without it (docs/benchmarks.md). Frozen once after start-up, those objects are never walked
again, and a full collection walks only what requests made since.
"""

from __future__ import annotations

import gc

__all__ = ["freeze_long_lived"]


def freeze_long_lived() -> int:
    """Collect once, then move every object alive now out of the collector's reach (:func:`gc.freeze`): they are
    never collected, and no later collection walks them. Call it when the long-lived objects exist (the models, the
    page) and the requests' have not begun. Returns how many objects were frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
