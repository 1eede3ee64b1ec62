"""How many CPU cores this process may really use.

``os.cpu_count()`` counts the host's cores; a container (a Hugging Face Space's free tier is
2 vCPUs on a larger host) is limited by its CPU affinity and by its cgroup's CPU quota, and
torch threads beyond that quota wait on each other.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

__all__ = ["available_cpus"]

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
