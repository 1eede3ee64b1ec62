"""The server's one compute thread: every piece of model work runs in it, in turn.

A request is an iterator of steps (a speculation round, a training step, a scoring batch): a
generator yields its progress and returns its result (PEP 380). Handlers hand it to
:meth:`ComputeThread.steps` and read what each step yields, and ``result = yield from
compute.steps(work)`` (or :func:`result_of`) takes the result it returned; the thread
steps the active requests one step each, first come first served, so a fine-tune taking step
after step cannot starve a user's rounds. Torch work from many handler threads would also run
on as many OpenMP thread teams, each started cold; one long-lived thread keeps one warm team
(measured: speculation 32 tokens/s in a process's first thread, 23 in a fresh worker thread).

Cancel is "stop stepping it": a reader that stops reading (Stop, a closed page) marks its
request, which is closed in the compute thread before its next step. An exception in a step
reaches the reader of that request only; the thread goes on serving the others.
"""

from __future__ import annotations

import collections
import logging
import threading
from typing import Callable, Iterator, TypeVar

__all__ = ["ComputeThread", "result_of"]

T = TypeVar("T")


class _Request:
    """One submitted iterator and what it has yielded but nobody has read yet."""

    def __init__(self, work: Iterator):
        self.work = work
        self.ready: collections.deque = collections.deque()  # results not yet read, in order
        self.error: BaseException | None = None
        self.result = None  # what the work returned (PEP 380), once done
        self.done = False
        self.cancelled = False


class ComputeThread:
    """Steps submitted iterators in one daemon thread, one step each in turn.

    Args:
        lookahead: the most results a request may have waiting for its reader; a request that
            far ahead is skipped until its reader catches up (a slow page does not hold the others).
        name: the thread's name.
    """

    def __init__(self, lookahead: int = 2, name: str = "tev-compute"):
        if lookahead < 1:
            raise ValueError(f"lookahead must be >= 1, got {lookahead}")
        self.lookahead = lookahead
        self.name = name
        self._condition = threading.Condition()
        self._turns: collections.deque[_Request] = collections.deque()  # requests waiting for a turn, next first
        self._open = 0  # requests whose reader has not finished (one may be stepping, outside the line)
        self._thread: threading.Thread | None = None

    def steps(self, work: Iterator[T]) -> Iterator[T]:
        """Submit ``work`` now; the returned iterator yields what each of its steps yields (each
        step computed in the compute thread), returns what ``work`` returned (``yield from`` takes
        it) and re-raises a step's exception. Closing it before the end cancels ``work``."""
        if self.in_compute_thread():  # work that submits work: run it here, in turn with nothing
            return iter(work)
        request = _Request(work)
        with self._condition:
            self._turns.append(request)
            self._open += 1
            self._start()
            self._condition.notify_all()
        return self._read(request)

    def call(self, function: Callable[..., T], *args, **kwargs) -> T:
        """``function(*args, **kwargs)`` computed in the compute thread as one step."""
        return result_of(self.steps(_once(function, args, kwargs)))

    def in_compute_thread(self) -> bool:
        return threading.current_thread() is self._thread

    def active(self) -> int:
        """How many requests share the thread now: submitted, and their readers not yet done."""
        with self._condition:
            return self._open

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
                if not request.done:
                    request.cancelled = True
                    self._condition.notify_all()

    def _start(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._serve, name=self.name, daemon=True)
            self._thread.start()

    def _next_turn(self) -> _Request:
        """The first request that may step (cancelled ones first go to be closed); waits for one."""
        with self._condition:
            while True:
                for request in self._turns:
                    if request.cancelled or len(request.ready) < self.lookahead:
                        self._turns.remove(request)
                        return request
                self._condition.wait()

    def _serve(self) -> None:
        while True:
            request = self._next_turn()
            if request.cancelled:
                _close(request.work)
                with self._condition:
                    request.done = True
                    self._condition.notify_all()
                continue
            try:
                result, ended, error = next(request.work), False, None
            except StopIteration as end:
                result, ended, error = end.value, True, None
            except BaseException as caught:  # noqa: BLE001 - it belongs to the request's reader
                result, ended, error = None, True, caught
            with self._condition:
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


def _once(function, args, kwargs) -> Iterator:
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
