"""Process memory settings for the server.

glibc gives a thread that allocates while another holds the main arena an arena of its own (up to
8 per core), and an arena rarely returns its freed pages: a server whose request threads each
allocate large tensors grows with every new thread that computes. Measured on the default pair
(docs/reliability.md, three 60 s levels of 4 users): resident memory grew +14.2% / +8.0% / +4.2%
per level with glibc's default, +12.2% / +3.3% / +2.8% with two arenas (1627 MB and 1472 MB at
the end), at the same latency.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

__all__ = ["limit_malloc_arenas"]

_M_ARENA_MAX = -8  # mallopt parameter (malloc.h)


def limit_malloc_arenas(count: int = 2) -> bool:
    """Cap glibc's malloc arenas at ``count`` for arenas created from now on, unless the
    operator set ``MALLOC_ARENA_MAX``. Returns whether the cap was set (False off glibc)."""
    if os.environ.get("MALLOC_ARENA_MAX"):
        return False  # the operator's own setting, read by glibc at start-up, stands
    name = ctypes.util.find_library("c")
    if not name:
        return False
    try:
        mallopt = ctypes.CDLL(name).mallopt
    except (OSError, AttributeError):  # not glibc (musl, macOS)
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    return mallopt(_M_ARENA_MAX, count) == 1
