"""How much of this process's CPUs other processes are using: a browser on the same machine, a second test
worker, another app.

The server gives a visitor's run every core only while no other process holds one (:mod:`tev.util.cpus`): an OpenMP
thread that finds its core taken makes the whole team wait at each of the forward's many barriers. Read from the
kernel's counters of the CPUs this process may run on:

- ``/proc/stat``'s per-CPU lines for this process's CPU affinity, when the affinity is what it may use (a VM or a
  container pinned to its cores); in a container limited by a CPU quota instead, those lines count the whole host's
  work, so they are not read;
- else the cgroup's own ``cpu.stat`` (cgroup v2: every process of this container, this one included);
- else nothing is known, and none is assumed (a Hugging Face Space's browser runs on the visitor's machine).

Others' use = the CPU time those counters grew by, less this process's own, over the wall time between two reads.
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Callable

__all__ = ["OtherLoad", "BUSY_CORES"]

# Others using more than this many cores' worth of time hold a core: half a core, so a browser redrawing a figure or a
# test worker's steady work counts and a shell's odd command does not.
BUSY_CORES = 0.5
_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100  # /proc/stat's unit: USER_HZ
# /proc/stat's fields after the CPU's name: user nice system idle iowait irq softirq steal ...; busy = all but idle,
# iowait (waiting, not running) and steal (the hypervisor's, not this machine's processes)
_BUSY_FIELDS = (0, 1, 2, 5, 6)


class OtherLoad:
    """Cores' worth of CPU time other processes used on this process's CPUs, over about the last ``interval`` seconds.

    Args:
        cpus: the cores this process may use (:func:`~tev.util.cpus.available_cpus`).
        interval: the least seconds between two reads of the counters (a reading in between returns the last figure).
        stat, cgroup_stat: the kernel's files (tests give their own).
        affinity: the CPU numbers this process may run on (None: the OS's answer).
        own: this process's CPU seconds so far (``time.process_time``: every thread of it).
        clock: wall seconds.
    """

    def __init__(self, cpus: int, interval: float = 0.5, stat: Path = Path("/proc/stat"), cgroup_stat: Path = Path("/sys/fs/cgroup/cpu.stat"),
                 affinity: set[int] | None = None, own: Callable[[], float] = time.process_time, clock: Callable[[], float] = time.monotonic):
        self.cpus = cpus
        self.interval = interval
        self._stat, self._cgroup_stat = stat, cgroup_stat
        if affinity is None:
            affinity = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set()
        self._affinity = set(affinity)
        self._own, self._clock = own, clock
        self._lock = threading.Lock()
        self.source = self._source()
        self._last = self._read()  # (wall, machine CPU seconds, own CPU seconds), or None
        self._cores = 0.0

    def _source(self) -> str | None:
        """Which counters tell others' use here: ``"proc"``, ``"cgroup"`` or None."""
        if self._affinity and len(self._affinity) <= self.cpus and self._proc_seconds() is not None:
            return "proc"
        if self._cgroup_seconds() is not None:
            return "cgroup"
        return None

    def _proc_seconds(self) -> float | None:
        try:
            lines = self._stat.read_text().splitlines()
        except OSError:
            return None
        busy, seen = 0, set()
        for line in lines:
            name, *fields = line.split()
            if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in self._affinity:
                busy += sum(int(fields[index]) for index in _BUSY_FIELDS if index < len(fields))
                seen.add(int(name[3:]))
        return busy / _TICKS if seen == self._affinity else None

    def _cgroup_seconds(self) -> float | None:
        try:
            for line in self._cgroup_stat.read_text().splitlines():
                key, _, value = line.partition(" ")
                if key == "usage_usec":
                    return int(value) / 1e6
        except (OSError, ValueError):
            return None
        return None

    def _read(self) -> tuple[float, float, float] | None:
        if self.source is None:
            return None
        machine = self._proc_seconds() if self.source == "proc" else self._cgroup_seconds()
        return None if machine is None else (self._clock(), machine, self._own())

    def cores(self) -> float:
        """Others' use in cores over the latest interval (0.0 where no counter tells it)."""
        with self._lock:
            now = self._clock()
            if self._last is None or now - self._last[0] < self.interval:
                return self._cores
            read = self._read()
            if read is not None:
                wall, machine, own = (after - before for after, before in zip(read, self._last))
                self._cores = max(0.0, (machine - own) / wall) if wall > 0 else self._cores
                self._last = read
            return self._cores

    def holds_a_core(self) -> bool:
        """Whether other processes use more than :data:`BUSY_CORES` of this process's CPUs now."""
        return self.cores() > BUSY_CORES
