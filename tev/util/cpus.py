"""How many CPU cores this process may really use, and how many torch threads each step of the
server's compute thread runs with.

``os.cpu_count()`` counts the host's cores; a container (a Hugging Face Space's free tier is
2 vCPUs on a larger host) is limited by its CPU affinity and by its cgroup's CPU quota, and
torch threads beyond that quota wait on each other.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["available_cpus", "ThreadPlan", "ThreadPolicy", "server_thread_policy"]

CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")  # cgroup v2: "<quota> <period>" or "max <period>"
# A server gives every step the same count (TEV_THREADS, else every core) whatever else runs: the drafters' products
# and transformers' forward round differently at another thread count, so a run's tokens under a seed would depend on
# who else was served meanwhile (two visitors with one seed must get one answer).


def available_cpus(cpu_max: Path = CGROUP_CPU_MAX) -> int:
    """The fewest of: the host's cores, this process's CPU affinity, the cgroup quota (rounded up)."""
    counts = [os.cpu_count() or 1]
    if hasattr(os, "sched_getaffinity"):
        counts.append(len(os.sched_getaffinity(0)))
    try:
        quota, period = cpu_max.read_text().split()[:2]
        if quota != "max":
            counts.append(max(1, math.ceil(int(quota) / int(period))))
    except (OSError, ValueError):
        pass  # no cgroup v2 limit readable here
    return max(1, min(counts))


def _threads(count: int) -> str:
    return f"{count} torch thread{'s' if count != 1 else ''}"


@dataclass(frozen=True)
class ThreadPlan:
    """The torch threads a compute step runs with, and why."""

    threads: int
    reason: str


@dataclass(frozen=True)
class ThreadPolicy:
    """Torch threads for each step of the server's compute thread (:meth:`ComputeThread.use_threads`).

    ``fixed`` (``TEV_THREADS``): every step runs with it. Else a step runs with ``lone`` threads while
    exactly one interactive request (a Live run, a walkthrough step, the lab) and no background request is
    active, and with ``shared`` otherwise (several visitors, or a fine-tune or measuring run). Torch's
    thread count belongs to the OS thread that sets it (OpenMP's nthreads-var is per thread), so the
    compute thread setting it changes its own OpenMP team only. The server's default gives both the same
    count (:func:`server_thread_policy`): a ``shared`` count of its own would make a seeded run's tokens
    depend on who else was served.
    """

    lone: int
    shared: int = 1
    fixed: int | None = None

    def __post_init__(self):
        for name in ("lone", "shared", "fixed"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"{name} threads must be >= 1, got {value}")

    def plan(self, interactive: int, background: int = 0) -> ThreadPlan:
        """The threads of a step taken while ``interactive`` and ``background`` requests are active (its own included)."""
        if self.fixed is not None:
            return ThreadPlan(self.fixed, "fixed by TEV_THREADS")
        if interactive == 1 and background == 0:
            return ThreadPlan(self.lone, "a lone run")
        return ThreadPlan(self.shared, f"{interactive + background} requests share the machine")

    def counts(self) -> tuple[int, ...]:
        """Every thread count a step may run with (what a check or measurement that depends on threads must cover)."""
        return (self.fixed,) if self.fixed is not None else tuple(sorted({self.lone, self.shared}))

    def describe(self) -> str:
        """The policy in words, for the page's header."""
        if self.fixed is not None:
            return f"{_threads(self.fixed)} (TEV_THREADS)"
        if self.lone == self.shared:
            return f"{_threads(self.lone)} (TEV_THREADS sets another count)"
        return f"{_threads(self.lone)} for a lone run, {self.shared} each when several share the machine (TEV_THREADS fixes one count)"

    def words(self, others: int = 0) -> str:
        """The threads a run was timed with, ``others`` the most other requests that shared the machine meanwhile."""
        if self.fixed is not None:
            return self.describe()
        if self.lone == self.shared:
            return _threads(self.lone)
        if others == 0:
            return f"{_threads(self.lone)} (a lone run's; {self.shared} each when several share the machine)"
        return f"{_threads(self.shared)} while others shared the machine ({self.lone} for a lone run)"


def server_thread_policy(environ=None, cpus: int | None = None) -> ThreadPolicy:
    """The server's :class:`ThreadPolicy`: ``TEV_THREADS`` fixes the count (ValueError when it is not a whole
    number >= 1); else one core fewer than the container may use (``cpus``), for every step.

    On a 2-core AVX2 EPYC two threads gave a lone run 25% more tokens/s on an otherwise idle machine (once
    the models load in the compute thread, see :mod:`tev.util.compute_thread`), but with other busy
    processes on the same two cores (a browser on the same machine, a second test worker) the server at two
    threads served 5 requests of a 20-second load test where one thread serves 8 or more, and the page's
    main thread went past its long-task limits: OpenMP's threads wait on each other when a core is taken.
    So the default leaves a core free; ``TEV_THREADS=2`` suits a machine that serves only this app. A lone
    run and a crowd's get the same count: a run under a seed must give the same tokens whoever else is
    served (see the note above)."""
    environ = os.environ if environ is None else environ
    text = environ.get("TEV_THREADS", "").strip()
    if text:
        if not text.isdigit() or int(text) < 1:
            raise ValueError(f"TEV_THREADS must be a whole number >= 1, got {text!r}")
        return ThreadPolicy(lone=int(text), shared=int(text), fixed=int(text))
    cpus = available_cpus() if cpus is None else cpus
    fewer = max(1, cpus - 1)
    return ThreadPolicy(lone=fewer, shared=fewer)
