"""How many CPU cores this process may really use, and how many torch threads the server's compute
thread runs with.

``os.cpu_count()`` counts the host's cores; a container (a Hugging Face Space's free tier is
2 vCPUs on a larger host) is limited by its CPU affinity and by its cgroup's CPU quota, and
torch threads beyond that quota wait on each other.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path

__all__ = ["available_cpus", "ServerThreads", "server_threads"]

CGROUP_CPU_MAX = Path("/sys/fs/cgroup/cpu.max")  # cgroup v2: "<quota> <period>" or "max <period>"


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


@dataclass(frozen=True)
class ServerThreads:
    """The torch threads every step of the server's compute thread runs with (:meth:`ComputeThread.use_threads`).

    One count for every run, lone or in a crowd: the drafters' products and transformers' forward round
    differently at another thread count, so a run's tokens under a seed would otherwise depend on who else
    was served. Torch's count belongs to the OS thread that sets it (OpenMP's nthreads-var is per thread),
    so the compute thread setting it changes its own OpenMP team only.

    Attributes:
        count: the threads; fixed: whether ``TEV_THREADS`` set it.
    """

    count: int
    fixed: bool = False

    def __post_init__(self):
        if self.count < 1:
            raise ValueError(f"threads must be >= 1, got {self.count}")

    def describe(self) -> str:
        """The count in words, for the page's header and speed sentence."""
        words = f"{self.count} torch thread{'s' if self.count != 1 else ''}"
        return f"{words} (TEV_THREADS)" if self.fixed else f"{words} (TEV_THREADS sets another count)"


def server_threads(environ=None, cpus: int | None = None) -> ServerThreads:
    """The server's :class:`ServerThreads`: ``TEV_THREADS`` fixes the count (ValueError when it is not a whole
    number >= 1); else one core fewer than the container may use (``cpus``).

    On a 2-core AVX2 EPYC two threads gave a lone run 25% more tokens/s on an otherwise idle machine (once
    the models load in the compute thread, see :mod:`tev.util.compute_thread`), but with other busy
    processes on the same two cores (a browser on the same machine, a second test worker) the server at two
    threads served 5 requests of a 20-second load test where one thread serves 8 or more, and the page's
    main thread went past its long-task limits: OpenMP's threads wait on each other when a core is taken.
    So the default leaves a core free; ``TEV_THREADS=2`` suits a machine that serves only this app."""
    environ = os.environ if environ is None else environ
    text = environ.get("TEV_THREADS", "").strip()
    if text:
        if not text.isdigit() or int(text) < 1:
            raise ValueError(f"TEV_THREADS must be a whole number >= 1, got {text!r}")
        return ServerThreads(int(text), fixed=True)
    cpus = available_cpus() if cpus is None else cpus
    return ServerThreads(max(1, cpus - 1))
