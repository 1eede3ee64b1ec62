"""The one streaming convention: a generator yields progress events and ``return``s its result
(PEP 380). A generator caller takes the result with ``result = yield from work``; a plain caller
runs the work to its end with :func:`finish`."""

from __future__ import annotations

from typing import Generator, TypeVar

__all__ = ["finish"]

R = TypeVar("R")


def finish(work: Generator[object, None, R]) -> R:
    """Run ``work`` to its end, dropping its progress events; its result (``StopIteration.value``)."""
    while True:
        try:
            next(work)
        except StopIteration as done:
            return done.value
