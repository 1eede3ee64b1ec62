"""The server's one compute thread: every piece of model work runs in it, in turn.

A request is an iterator of steps (a speculation round, a training step, a scoring batch): a
generator yields its progress and returns its result (PEP 380). Handlers hand it to
:meth:`ComputeThread.steps` and read what each step yields, and ``result = yield from
compute.steps(work)`` (or :func:`result_of`) takes the result it returned; the thread
steps the active requests one step each, in turn (interactive ones first: below). Torch work
from many handler threads would also run on as many OpenMP thread teams, each started cold; one
long-lived thread keeps one warm team
(measured: speculation 32 tokens/s in a process's first thread, 23 in a fresh worker thread).

Cancel is "stop stepping it": a reader that stops reading (Stop, a closed page) marks its
request, which is closed in the compute thread before its next step. An exception in a step
reaches the reader of that request only; the thread goes on serving the others.

Priority: a request is interactive (a Live round, a walkthrough step, the lab: someone waits for
each step) or background (``steps(work, background=True)``: a fine-tune, a scoring or measuring
run, which keeps to its own minutes). A background request steps when no interactive request is
ready to step, or when it is owed time: while interactive requests keep the thread busy,
background work still gets ``background_share`` of the thread's time (an interactive step adds
``share / (1 - share)`` of its seconds to what background work is owed, a background step taken
ahead of a ready interactive one pays its seconds back). So with the default 0.1 a background
request waits at most about nine times its last step's seconds (plus one interactive step), an
interactive step waits at most one background step, and nothing is queued beyond each request's
lookahead. Each background reader can say how long interactive work held it back
(:attr:`Steps.held_seconds`), so a run that trained fewer steps under load says why.

Threads: with :meth:`ComputeThread.use_threads` (the server sets it) every step runs with the torch
threads of a :class:`~tev.util.cpus.ServerThreads`, set in this thread before the step: its ``full``
count when the step's request is interactive and no other process holds a core (``others_busy``,
:class:`~tev.util.cpu_load.OtherLoad`), its ``reduced`` count otherwise, or
the count a request was submitted with (``steps(work, threads=n)``: a measurement at a given count);
torch's count is per OS thread (OpenMP's nthreads-var), so no other thread's count changes; a step
reads its own with :meth:`ComputeThread.count_now`. Without it steps run
with whatever count this thread started with (torch's global setting when it first ran torch work).
This thread should be the only one in the process that runs a team of several OpenMP threads: GNU
OpenMP counts the threads of every team, and once they outnumber the cores it stops spinning at its
barriers and sleeps instead, which at the target's many small parallel regions costs more than the
second core gives (plain decoding of the default pair at 2 threads: 17-19 tokens/s with one team,
10-12 with a second, idle team of the main thread's; 15 at 1 thread).
"""

from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Callable, Generic, Iterator, TypeVar

__all__ = ["ComputeThread", "Steps", "result_of", "mapped", "one_step", "BACKGROUND_SHARE"]

# While interactive requests keep the thread busy, the share of its time background work still gets: small, so a
# visitor's answer beside a workload run takes at most about 1 / 0.9 of its time alone (the load goal allows +18%).
BACKGROUND_SHARE = 0.1

T = TypeVar("T")


class _Request:
    """One submitted iterator and what it has yielded but nobody has read yet."""

    def __init__(self, work: Iterator, background: bool = False):
        self.work = work
        self.background = background
        self.held = 0.0  # seconds of interactive steps taken while this (background) request was ready to step
        self.ready: collections.deque = collections.deque()  # results not yet read, in order
        self.error: BaseException | None = None
        self.result = None  # what the work returned (PEP 380), once done
        self.done = False
        self.cancelled = False
        self.threads: int | None = None  # the count its steps run with (None: the server's policy decides each step)


class Steps(Generic[T]):
    """What :meth:`ComputeThread.steps` returns: an iterator over the steps' yields that returns the
    work's result (PEP 380, so ``yield from`` takes it) and cancels the work when closed early."""

    def __init__(self, reader: Iterator[T], request: _Request | None = None):
        self._reader = reader
        self._request = request

    def __iter__(self) -> "Steps[T]":
        return self

    def __next__(self) -> T:
        return next(self._reader)

    def close(self) -> None:
        close = getattr(self._reader, "close", None)
        if close is not None:
            close()

    @property
    def held_seconds(self) -> float:
        """Seconds interactive steps ran while this background request was ready to step (0 for
        interactive work and for work run in place)."""
        return self._request.held if self._request is not None else 0.0


class ComputeThread:
    """Steps submitted iterators in one daemon thread, one step each in turn, interactive work first.

    Args:
        lookahead: the most results a request may have waiting for its reader; a request that
            far ahead is skipped until its reader catches up (a slow page does not hold the others).
        name: the thread's name.
        background_share: while interactive requests keep the thread busy, the share of its time
            background requests still get (0 < share < 1).
        clock: seconds, for the background share (tests pass their own).
    """

    def __init__(self, lookahead: int = 2, name: str = "tev-compute", background_share: float = BACKGROUND_SHARE,
                 clock: Callable[[], float] = time.monotonic):
        if lookahead < 1:
            raise ValueError(f"lookahead must be >= 1, got {lookahead}")
        if not 0.0 < background_share < 1.0:
            raise ValueError(f"background_share must be between 0 and 1, got {background_share}")
        self.lookahead = lookahead
        self.name = name
        self.background_share = background_share
        self._clock = clock
        self._owed = 0.0  # seconds of thread time background work is owed (negative: it has taken more than its share)
        self._condition = threading.Condition()
        self._turns: collections.deque[_Request] = collections.deque()  # requests waiting for a turn, next first
        self._open = 0  # requests whose reader has not finished (one may be stepping, outside the line)
        self._open_background = 0  # those of them that are background work
        self._thread: threading.Thread | None = None
        self._threads = None  # a ServerThreads (tev.util.cpus), see use_threads; None: steps keep the thread's count
        self._set_threads: Callable[[int], None] | None = None
        self._others_busy: Callable[[], bool] | None = None  # whether other processes hold one of this process's cores
        self._threads_now: int | None = None  # the count last set in the compute thread (None: never set here)

    def steps(self, work: Iterator[T], background: bool = False, threads: int | None = None) -> Steps[T]:
        """Submit ``work`` now; the returned iterator yields what each of its steps yields (each
        step computed in the compute thread), returns what ``work`` returned (``yield from`` takes
        it) and re-raises a step's exception. Closing it before the end cancels ``work``.
        ``background``: work nobody waits on step by step (training, scoring, measuring), which
        steps when no interactive request is ready, or when it is owed its share of the time.
        ``threads``: run every step with this many torch threads whatever else runs (a measurement of
        what a count costs), where :meth:`use_threads` set a policy; None: the count it gives each step."""
        if threads is not None and threads < 1:
            raise ValueError(f"threads must be >= 1, got {threads}")
        if self.in_compute_thread():  # work that submits work: run it here, in turn with nothing
            return Steps(iter(work))
        request = _Request(work, background)
        request.threads = threads
        with self._condition:
            self._turns.append(request)
            self._open += 1
            self._open_background += background
            self._start()
            self._condition.notify_all()
        return Steps(self._read(request), request)

    def call(self, function: Callable[..., T], *args, **kwargs) -> T:
        """``function(*args, **kwargs)`` computed in the compute thread as one step."""
        return result_of(self.steps(one_step(function, *args, **kwargs)))

    def call_at(self, threads: int | None, function: Callable[..., T], *args, background: bool = False, **kwargs) -> T:
        """:meth:`call` with ``threads`` torch threads whatever else runs (None: the count the policy gives it);
        ``background``: as :meth:`steps` takes it (work nobody waits on step by step goes after a visitor's)."""
        return result_of(self.steps(one_step(function, *args, **kwargs), background=background, threads=threads))

    def use_threads(self, threads, set_threads: Callable[[int], None], others_busy: Callable[[], bool] | None = None) -> None:
        """Run each step with the count ``threads`` (a :class:`~tev.util.cpus.ServerThreads`) gives it, set with
        ``set_threads`` (``torch.set_num_threads``) in the compute thread before the step; ``others_busy``: whether
        other processes hold a core now (then no step takes the full count; None: never asked)."""
        with self._condition:
            self._threads, self._set_threads, self._others_busy = threads, set_threads, others_busy

    def keep_one_count(self) -> None:
        """From now on every step runs with the policy's reduced count (:meth:`ServerThreads.single`)."""
        with self._condition:
            if self._threads is not None:
                self._threads = self._threads.single()

    def count_now(self) -> int | None:
        """The torch threads of the step in progress (read from inside it), else of the last one (None: never set here)."""
        return self._threads_now

    @property
    def threads(self):
        """The :class:`~tev.util.cpus.ServerThreads` steps run with (None: none set; steps keep the thread's count)."""
        return self._threads

    def _apply_threads(self, request: _Request) -> None:
        """Before a step of ``request``: its count (its own, else the policy's: full when it is interactive and no
        other process holds a core), set in this thread when it is not yet."""
        with self._condition:
            threads, set_threads, others_busy = self._threads, self._set_threads, self._others_busy
        if set_threads is None:  # no policy: steps keep the thread's count
            return
        free = not request.background
        if free and request.threads is None and threads.switches and others_busy is not None:
            free = not others_busy()
        count = request.threads if request.threads is not None else threads.for_step(free)
        if count != self._threads_now:
            try:
                set_threads(count)
                self._threads_now = count
            except Exception:  # noqa: BLE001 - a step runs with the count it has rather than stop the thread
                logging.getLogger(__name__).exception("setting %d torch threads failed", count)

    def in_compute_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def active(self) -> int:
        """How many requests share the thread now: submitted, and their readers not yet done."""
        with self._condition:
            return self._open

    def active_background(self) -> int:
        """How many of :meth:`active` are background work."""
        with self._condition:
            return self._open_background

    def _read(self, request: _Request) -> Iterator:
        try:
            while True:
                with self._condition:
                    while not request.ready and not request.done:
                        self._condition.wait()
                    if request.ready:
                        result = request.ready.popleft()
                        self._condition.notify_all()  # a request held back by its lookahead may go on
                    elif request.error is not None:
                        raise request.error
                    else:
                        return request.result
                yield result
        finally:
            with self._condition:
                self._open -= 1
                self._open_background -= request.background
                if not request.done:
                    request.cancelled = True
                    self._condition.notify_all()

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name=self.name, daemon=True)
            self._thread.start()

    def _next_turn(self) -> tuple[_Request, list[_Request], bool]:
        """The request to step next, the background requests ready to step that wait on it, and
        whether an interactive request was ready. A cancelled request goes first (to be closed);
        then the first interactive request that may step, unless a background one may and is owed
        time (or no interactive one may). Waits for one."""
        with self._condition:
            while True:
                ready = [r for r in self._turns if r.cancelled or len(r.ready) < self.lookahead]
                cancelled = next((r for r in ready if r.cancelled), None)
                interactive = next((r for r in ready if not r.background), None)
                background = next((r for r in ready if r.background), None)
                chosen = cancelled or (background if background is not None and (interactive is None or self._owed > 0) else interactive)
                if chosen is not None:
                    self._turns.remove(chosen)
                    waiting = [r for r in ready if r.background and r is not chosen and not r.cancelled]
                    return chosen, waiting, interactive is not None
                self._condition.wait()

    def _account(self, request: _Request, waiting: list[_Request], contended: bool, seconds: float) -> None:
        """After a step of ``seconds``: an interactive step taken while background requests were
        ready adds their share to what they are owed (and to each one's held time); a background
        step taken while an interactive request was ready pays its seconds back."""
        if not request.background:
            if waiting:
                self._owed += seconds * self.background_share / (1.0 - self.background_share)
                for held in waiting:
                    held.held += seconds
        elif contended:
            self._owed -= seconds

    def _serve(self) -> None:
        while True:
            request, waiting, contended = self._next_turn()
            if request.cancelled:
                _close(request.work)
                with self._condition:
                    request.done = True
                    self._condition.notify_all()
                continue
            self._apply_threads(request)
            started = self._clock()
            try:
                result, ended, error = next(request.work), False, None
            except StopIteration as end:
                result, ended, error = end.value, True, None
            except BaseException as caught:  # noqa: BLE001 - it belongs to the request's reader
                result, ended, error = None, True, caught
            seconds = self._clock() - started
            with self._condition:
                self._account(request, waiting, contended, seconds)
                if ended:
                    request.done, request.error, request.result = True, error, result
                else:
                    request.ready.append(result)
                    self._turns.append(request)  # the back of the line: the others step first
                self._condition.notify_all()


def result_of(steps: Iterator, each: Callable[[object], None] | None = None):
    """Run ``steps`` to its end; what it returned (PEP 380). ``each`` sees what every step yields
    (a progress line, a kept record); without it the yields are dropped."""
    while True:
        try:
            step = next(steps)
        except StopIteration as end:
            return end.value
        if each is not None:
            each(step)


def mapped(steps: Iterator, function: Callable[[object], object]) -> Iterator:
    """``steps`` with ``function`` applied to what each step yields (a progress line for another
    reader, a marker between pieces of work); returns what ``steps`` returned (PEP 380) and closes
    it when closed early, as ``yield from`` would."""
    try:
        while True:
            try:
                step = next(steps)
            except StopIteration as end:
                return end.value
            yield function(step)
    finally:
        close = getattr(steps, "close", None)
        if close is not None:
            close()


def one_step(function, *args, **kwargs) -> Iterator:
    """One step: ``function(*args, **kwargs)``, returned (PEP 380)."""
    return function(*args, **kwargs)
    yield  # noqa: unreachable - makes this a generator, so the call runs at its first step, in the compute thread


def _close(work) -> None:
    close = getattr(work, "close", None)
    if close is not None:
        try:
            close()
        except Exception:  # noqa: BLE001 - a request's cleanup must not stop the others
            logging.getLogger(__name__).exception("closing a cancelled request failed")
