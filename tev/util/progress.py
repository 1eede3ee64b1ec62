"""What a long run says as it goes: one event type for every run and every reader.

A long run (a workload adaptation, a measured fine-tune, the target writing answers) is a
generator that yields a :class:`Progress` after every piece of work and returns its result
(PEP 380), so a server's compute thread can take a piece at a time and a reader can stop between
pieces. Every reader (the page's tabs, the command line) reads the same events: ``phase`` says what
runs (a :class:`Phase`, named once here), ``starts`` whether it starts with this event, and ``info``
what the phase has to say (the plan, a training step's record, the answers written so far).

A piece of work that has nothing new to say is ``Progress(phase)``. A lower-level generator
that yields something else after each piece (a decoding round, a batch number) joins a run
through :func:`within`, which names the phase of each of its pieces.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Callable, Iterator, Mapping

from tev.util.compute_thread import mapped

__all__ = ["Phase", "Progress", "within", "relay"]


class Phase(str, enum.Enum):
    """Every phase of every long run, with what it does in a few plain words."""

    ANSWERS = "the target writes answers"
    PACE = "timing this machine"
    PLAN = "planning the minutes"
    SCORE = "scoring the answers"
    TRAIN = "fine-tuning"
    CONTROL = "training the control"
    BEFORE = "measuring the drafter before"
    AFTER = "measuring the drafter after"
    EVALUATE = "decoding held-out prompts"
    EVALUATED = "held-out prompts decoded"
    MASS = "measuring where the target's mass leaves the trees"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Progress:
    """One event of a long run: the ``phase`` it belongs to, whether the phase ``starts`` here (else
    it is a piece of work inside it), and what it says (``info``: empty when nothing new)."""

    phase: Phase
    info: Mapping = field(default_factory=dict)
    starts: bool = False

    @classmethod
    def start(cls, phase: Phase, **info) -> "Progress":
        """The event that starts ``phase``, saying ``info``."""
        return cls(phase, info, True)


def within(steps: Iterator, phase: Phase) -> Iterator[Progress]:
    """``steps`` (a generator yielding anything after each piece of work: a round, a batch, an event
    of another run) as pieces of ``phase`` that say nothing new; returns what ``steps`` returned (PEP 380)."""
    return mapped(steps, lambda _: Progress(phase))


def relay(steps: Iterator, view: Callable[[Progress], object], stop: Callable[[], bool] = lambda: False):
    """The one driver of a run for a reader that streams: yields ``view(event)`` for every event of
    ``steps`` (nothing where it is None) and returns what ``steps`` returned (PEP 380), or None as
    soon as ``stop()`` says so (checked after each event)."""
    while True:
        try:
            event = next(steps)
        except StopIteration as end:
            return end.value
        if stop():
            return None
        shown = view(event)
        if shown is not None:
            yield shown
