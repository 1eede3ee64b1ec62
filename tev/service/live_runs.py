"""A Live run's protocol on the server: each browser session's Stop, its next press, and one run as typed events.

A press of Generate or Continue (:meth:`LiveRuns.press`) ends the session's work that the press
replaces (a finished answer's re-timing, a Continue's rounds) and clears its Stop; Stop
(:meth:`LiveRuns.stop`) ends the session's run after its current round. :meth:`LiveRuns.serve`
runs one answer and yields what happened, for the page to draw: a :class:`Round` per round, a
:class:`TimingAgain` as the finished answer is timed again against plain decoding (then a
:data:`WAITING` tick every quarter second while that runs), and the :class:`Finished` run with its
:class:`~tev.engine.run_speed.Speed`. The sentences are :mod:`visual.live_words`'; the page's
outputs are ``ui.live``'s.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import threading
import time
from dataclasses import dataclass
from typing import Iterator, NamedTuple

from tev.core.budget import Calibration, RoundRate
from tev.engine.decode import DecodeConfig, GenerationSummary
from tev.engine.run_speed import MIN_TIMED_TOKENS, Speed
from tev.service.service import LIMITS, IdleTimings, machine_load
from tev.util.lru import LRU

__all__ = ["Asked", "continuation_seed", "continuation", "Round", "TimingAgain", "WAITING", "Finished", "LiveRuns", "in_worker"]

SESSIONS = 1024  # the most recently used browser sessions whose run state is kept


class Asked(NamedTuple):
    """What a Live answer was asked with (a Continue goes on with it): the prompt's token ids and text, the
    drafter chosen, the checked settings, whether the answer is timed against plain decoding, and the browser
    session that asked (whose adapted drafter a Continue serves)."""

    prompt_ids: tuple[int, ...]
    prompt: str
    drafter: str
    config: DecodeConfig
    compare_ar: bool
    presses: tuple[dict, ...] = ()  # each press's seed and first round (Generate, then each Continue), for the export
    session: str = "anonymous"


def continuation_seed(seed: int, position: int) -> int:
    """The seed a Continue samples with: drawn from the answer's seed and where the continuation starts, so no
    press reuses another's random numbers (with the same seed, the continuation would draw the numbers that chose
    the answer's first tokens, and prompt + answer would no longer be a sample of the target)."""
    digest = hashlib.sha256(f"tev-continue:{seed}:{position}".encode()).digest()
    return int.from_bytes(digest[:8], "little") % (LIMITS.max_seed + 1)


def continuation(service, records: list, asked: Asked, session: str) -> tuple[object, Asked, str | None]:
    """What a Continue of the answer ``records`` (asked with ``asked``) runs: the checked request over the prompt and
    the answer so far with its own seed (:func:`continuation_seed`), what it is asked with, and why another drafter
    than the one chosen serves it (None: the one chosen); raises ``ValueError`` (:class:`~tev.service.service.UserInputError`)."""
    so_far = asked.prompt_ids + tuple(token for record in records for token in record.emitted)
    config = dataclasses.replace(asked.config, seed=continuation_seed(asked.config.seed, len(so_far)))
    served, serving_note = service.served_drafter(asked.drafter, session, config.law)
    return service.request(so_far, served, config), asked._replace(config=config), serving_note


@dataclass(frozen=True)
class Round:
    """A round ran: ``records`` holds the run's rounds so far (those a Continue goes on from first), this one
    last; ``active`` and ``background``: the compute thread's requests as it ended (this run's included)."""

    records: list
    active: int
    background: int


@dataclass(frozen=True)
class TimingAgain:
    """The finished answer (``records``, ``summary``) is being timed again; ``speed`` is what is known so far."""

    records: list
    summary: GenerationSummary
    speed: Speed


WAITING = object()  # a tick while the answer is timed again (the page may redraw nothing)


@dataclass(frozen=True)
class Finished:
    """The run ended: its rounds, summary and speed, and what the page keeps of it (``state``: the rounds, the
    summary, what it was asked with, and the settings the export gives)."""

    records: list
    summary: GenerationSummary
    speed: Speed
    state: dict


class LiveRuns:
    """Each browser session's run state (the :data:`SESSIONS` most recently used): its Stop flag, the work its
    next press ends, and when it last pressed. Thread-safe (each registry is an :class:`~tev.util.lru.LRU`)."""

    def __init__(self):
        self._stops: LRU[str, threading.Event] = LRU(SESSIONS)
        # the work that the session's next press ends: a finished answer's re-timing, or a Continue's rounds (the new
        # run's event is another one, so it would stream beside them into the same outputs; a Generate during a
        # Generate's rounds waits for them instead: always_last); a finished one's event stays until replaced
        self._superseded: LRU[str, threading.Event] = LRU(SESSIONS)
        # when the session last pressed a button that runs: the wait in the app's line counts in the page's times
        self._pressed: LRU[str, float] = LRU(SESSIONS)

    def stop_flag(self, session: str) -> threading.Event:
        return self._stops.get_or_put(session, threading.Event)

    def stop(self, session: str) -> None:
        """Stop pressed: the session's run ends after its current round (or before it starts), its re-timing at its next step."""
        self.stop_flag(session).set()

    def press(self, session: str) -> None:
        """Generate (or Continue) pressed, and it runs: the session's re-timing or streaming Continue, if one runs, ends;
        a Stop from before this press does not stop the new run."""
        running = self._superseded.peek(session)
        if running is not None:
            running.set()
        self.stop_flag(session).clear()
        self._pressed.put(session, time.perf_counter())

    def ended_by_next_press(self, session: str) -> threading.Event:
        """A fresh event, set when ``session`` next presses Generate or Continue."""
        superseded = threading.Event()
        self._superseded.put(session, superseded)
        return superseded

    def waited(self, session: str, started: float) -> float:
        """Seconds from the session's press to ``started`` (its run's start); 0 without a press before it (an API call)."""
        pressed = self._pressed.peek(session)
        return started - pressed if pressed is not None and 0 <= started - pressed < 3600 else 0.0

    def serve(self, service, speculation, asked: Asked, memory: dict | None, earlier: list = (), superseded: threading.Event | None = None) -> Iterator:
        """Run ``speculation`` (a checked request of ``service``) for ``asked`` and yield what happens (see the module's
        note); ``earlier``: the rounds a Continue goes on from (the new rounds are numbered after them). Once
        ``superseded`` is set (a new press took the page) it ends after its round and yields nothing more."""
        config = asked.config
        asked = asked._replace(presses=(*asked.presses, {"seed": config.seed, "max_new_tokens": config.max_new_tokens, "first_round": len(earlier)}))
        sizing, quiet_sizing = _sizing(service, config, asked.drafter, memory)
        stop = self.stop_flag(asked.session)
        records, crowd = list(earlier), 0
        started = time.perf_counter()
        waited = self.waited(asked.session, started)
        replaced = superseded.is_set if superseded is not None else lambda: False
        events = service.generate(speculation, should_stop=lambda: stop.is_set() or replaced(), sizing=sizing, first_round=len(earlier))
        try:  # the page closes this generator when the client leaves: stop generating then
            while True:
                try:
                    record = next(events)
                except StopIteration as end:
                    summary = end.value
                    break
                records.append(record)
                active, background = service.compute.active(), service.compute.active_background()
                crowd = max(crowd, active - 1 - background)
                yield Round(records, active, background)
        finally:
            events.close()
        if replaced():
            return
        new = sum(len(r.emitted) for r in records[len(earlier):])
        speed = Speed(shown=new / max(time.perf_counter() - started + waited, 1e-9), added=new, rounds=len(records) - len(earlier),
                      continued=bool(earlier), waited=waited, crowd=crowd)
        if asked.compare_ar and summary.stop_reason != "cancelled" and new >= MIN_TIMED_TOKENS:
            speed = yield from self._timed_again(service, speculation, quiet_sizing, records, summary, asked, speed)
        # the export: the settings of the first press, then each press's seed and first round; the summary is the last press's
        state = {"records": records, "summary": summary, "asked": asked,
                 "settings": {"prompt": asked.prompt, "drafter": asked.drafter, **dataclasses.asdict(config), "seed": asked.presses[0]["seed"],
                              "presses": list(asked.presses)}}
        yield Finished(records, summary, speed, state)

    def _timed_again(self, service, speculation, quiet_sizing, records, summary, asked: Asked, speed: Speed):
        """The finished answer timed again against plain decoding, unless a Stop landed as it ended, or other runs
        wait in the app's line (then the machine's latest lone re-timing of this kind of run is given, named as
        such); returns the :class:`Speed` to show (PEP 380)."""
        stop = self.stop_flag(asked.session)
        if stop.is_set():  # a Stop that landed as the answer ended: nothing is timed
            return dataclasses.replace(speed, unmeasured="ended")
        kind = IdleTimings.kind(records[-1].drafter, asked.config)
        waiting = service.others_waiting()
        if waiting > 0:  # a crowd: re-timing (a minute on the default pair) would hold every one of them up
            return dataclasses.replace(speed, unmeasured="busy", waiting=waiting, recalled=service.idle_timings.latest(kind))
        superseded = self.ended_by_next_press(asked.session)
        yield TimingAgain(records, summary, speed)
        load = machine_load()

        def again(should_stop):
            return service.retime(speculation, lambda: should_stop() or stop.is_set() or superseded.is_set(), quiet_sizing)

        timing = yield from in_worker(again, tick=WAITING)
        if not timing.measured:
            return dataclasses.replace(speed, unmeasured="generate" if superseded.is_set() else "stop")
        service.idle_timings.remember(kind, timing, load)
        return dataclasses.replace(speed, timing=timing, load=load)


def _sizing(service, config: DecodeConfig, drafter: str, memory: dict | None):
    """Budget auto for this browser session's request: its own calibration and rate per drafter
    (``memory``, the session's state, updated in place by the rounds), so each answer starts from
    what the session's earlier answers taught and no user's rounds steer another's trees.
    Returns (the rule for the live run, a copy for the quiet re-timing, which starts where the
    live run started); (None, None) at a fixed budget."""
    if config.budget != "auto":
        return None, None
    memory = memory if memory is not None else {}
    calibration, rate = memory.setdefault(drafter, (Calibration(), RoundRate()))
    quiet = copy.deepcopy((calibration, rate))
    return service.auto_budget(config, calibration, rate), service.auto_budget(config, *quiet)


def in_worker(work, tick, poll: float = 0.25):
    """Run ``work(should_stop)`` in a worker thread, yielding ``tick`` every ``poll`` seconds
    while it runs; returns its result (use with ``yield from``).

    A long call inside a generator handler would hold the request's slot, and keep computing,
    after its client cancelled or left: the page can only close the generator between yields.
    Here closing it sets the stop flag that ``work`` polls, so the work ends within a step.
    """
    stop = threading.Event()
    box = {}

    def target():
        try:
            box["value"] = work(stop.is_set)
        except BaseException as error:  # re-raised in the request's own thread below
            box["error"] = error

    worker = threading.Thread(target=target, name="tev-worker", daemon=True)
    worker.start()
    try:
        while worker.is_alive():
            worker.join(poll)
            if worker.is_alive():
                yield tick
    finally:
        stop.set()
    if "error" in box:
        raise box["error"]
    return box["value"]
