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

__all__ = ["available_cpus", "ServerThreads", "server_threads", "threads_words"]

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
    """The torch threads the server's compute thread runs a step with (:meth:`ComputeThread.use_threads`).

    ``full`` for an interactive step (a Live round, a walkthrough step: someone waits on it) while no other process
    holds a core (:class:`~tev.util.cpu_load.OtherLoad`), however many visitors' runs take turns; ``reduced`` for
    background work (a fine-tune, a measurement: its results then do not depend on who else is served) and for every
    step while another process (a browser or a test worker on the same machine) holds a core, where an OpenMP thread
    that finds its core taken makes its whole team wait at each barrier. Torch's count belongs to the OS thread that
    sets it (OpenMP's nthreads-var is per thread), so the compute thread setting it changes its own team only.

    Two counts only where a run's tokens under a seed do not depend on them: the target's forward must give every
    row the same bits at both (the row-invariant forward is checked for it as it is chosen), else the server runs
    one count (:meth:`single`); a drafter is checked the same way before its runs take the full count
    (:meth:`ModelService.run_threads`). Budget auto's cost curve is measured at ``full``.

    Attributes:
        full: threads of an interactive step on free cores; reduced: of every other (None: ``full``);
        fixed: whether ``TEV_THREADS`` set them (one count).
    """

    full: int
    reduced: int | None = None
    fixed: bool = False

    def __post_init__(self):
        if self.reduced is None:
            object.__setattr__(self, "reduced", self.full)
        if min(self.full, self.reduced) < 1:
            raise ValueError(f"threads must be >= 1, got {self.full} and {self.reduced}")

    @property
    def switches(self) -> bool:
        """Whether some steps get another count than others."""
        return self.full != self.reduced

    def for_step(self, free: bool) -> int:
        """The count of a step: ``free`` when it is interactive and no other process holds a core."""
        return self.full if free else self.reduced

    def single(self) -> "ServerThreads":
        """One count for every step (the reduced one): for a target forward whose rows change with the count."""
        return ServerThreads(self.reduced, fixed=self.fixed)

    def describe(self) -> str:
        """The counts in words, for the page's header and speed sentence."""
        if self.switches:
            return f"{threads_words(self.full)}, {self.reduced} when cores are busy"
        return f"{threads_words(self.full)} (TEV_THREADS)" if self.fixed else f"{threads_words(self.full)} (TEV_THREADS sets another count)"


def threads_words(count: int) -> str:
    """``count`` torch threads in words: "1 torch thread", "2 torch threads"."""
    return f"{count} torch thread{'s' if count != 1 else ''}"


def server_threads(environ=None, cpus: int | None = None) -> ServerThreads:
    """The server's :class:`ServerThreads`: ``TEV_THREADS`` fixes one count (ValueError when it is not a whole
    number >= 1); else every core the container may use (``cpus``) for interactive steps, one fewer for background
    work and while another process holds a core.

    Measured on a 2-core AVX2 EPYC with no browser on the machine (docs/benchmarks.md, "Threads by measurement"):
    a lone visitor received the page's answer at a median 22.4 tokens/s at two threads against 17.6 at one, and two
    visitors at once were served 55 answers in four minutes at two threads against 38 with one each; with another
    busy process on the same two cores (a browser, a second test worker) two threads served a short load test 5
    answers where one served 8, hence one fewer while another process holds a core."""
    environ = os.environ if environ is None else environ
    text = environ.get("TEV_THREADS", "").strip()
    if text:
        if not text.isdigit() or int(text) < 1:
            raise ValueError(f"TEV_THREADS must be a whole number >= 1, got {text!r}")
        return ServerThreads(int(text), fixed=True)
    cpus = available_cpus() if cpus is None else cpus
    return ServerThreads(cpus, max(1, cpus - 1))
