"""A first-come, first-served lock for the server's one compute resource.

``threading.Lock`` gives no order: a thread that releases it and asks again at once (a fine-tune
taking one step after another) usually wins over threads already waiting (users' generation
rounds), which then starve. Measured on the default pair: beside a workload ExitTrain, 16 users
got 1.3 tokens per second between them and 11 of their requests timed out.
"""

from __future__ import annotations

import threading

__all__ = ["FairLock"]


class FairLock:
    """A lock granted in the order it was asked for (a ticket lock). Use it as ``with lock:``.

    A waiter interrupted before its turn (an exception while waiting) gives up its ticket, so
    the threads behind it are not stuck.
    """

    def __init__(self):
        self._condition = threading.Condition(threading.Lock())
        self._next_ticket = 0
        self._serving = 0
        self._abandoned: set[int] = set()

    def acquire(self) -> bool:
        with self._condition:
            ticket = self._next_ticket
            self._next_ticket += 1
            try:
                while self._serving != ticket:
                    self._condition.wait()
            except BaseException:
                if self._serving == ticket:  # its turn came as it was interrupted: pass it on
                    self._advance()
                else:
                    self._abandoned.add(ticket)
                raise
        return True

    def release(self) -> None:
        with self._condition:
            self._advance()

    def _advance(self) -> None:
        self._serving += 1
        while self._serving in self._abandoned:
            self._abandoned.remove(self._serving)
            self._serving += 1
        self._condition.notify_all()

    def locked(self) -> bool:
        with self._condition:
            return self._serving != self._next_ticket

    def __enter__(self) -> "FairLock":
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()
