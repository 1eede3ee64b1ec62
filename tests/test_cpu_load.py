"""Others' use of this process's CPUs, read from the kernel's counters: /proc/stat's lines for the CPUs this process
may run on (not when they are a host's), else the cgroup's own counter, else nothing assumed."""

from __future__ import annotations

from pathlib import Path

from tev.util.compute_thread import ComputeThread
from tev.util.cpu_load import OtherLoad
from tev.util.cpus import ServerThreads


def _stat(folder: Path, busy: dict[int, int], idle: int = 1000) -> Path:
    """A /proc/stat whose CPUs ran ``busy`` ticks (user time) each; USER_HZ ticks, 100 a second on Linux."""
    path = folder / "stat"
    total = sum(busy.values())
    lines = [f"cpu  {total} 0 0 {idle * len(busy)} 0 0 0 0 0 0"] + [f"cpu{cpu} {ticks} 0 0 {idle} 0 0 0 0 0 0" for cpu, ticks in busy.items()]
    path.write_text("\n".join(lines) + "\nintr 1 2 3\n")
    return path


class Clock:
    def __init__(self):
        self.now, self.own = 0.0, 0.0

    def wall(self) -> float:
        return self.now

    def process(self) -> float:
        return self.own


def test_others_use_is_the_cpus_time_less_this_processs_own(tmp_path):
    clock = Clock()
    stat = _stat(tmp_path, {0: 0, 1: 0})
    load = OtherLoad(2, interval=0.5, stat=stat, cgroup_stat=tmp_path / "none", affinity={0, 1}, own=clock.process, clock=clock.wall)
    assert load.source == "proc" and load.cores() == 0.0
    # one second: the two CPUs ran 1.6 s, this process 1.0 s of it -> others 0.6 cores
    _stat(tmp_path, {0: 100, 1: 60})
    clock.now, clock.own = 1.0, 1.0
    assert abs(load.cores() - 0.6) < 1e-9 and load.holds_a_core()
    # within the interval the last figure stands; then a second with only this process running
    clock.now = 1.2
    assert abs(load.cores() - 0.6) < 1e-9
    _stat(tmp_path, {0: 250, 1: 110})
    clock.now, clock.own = 2.2, 3.0  # 2.0 CPU seconds grew, all of them this process's
    assert load.cores() == 0.0 and not load.holds_a_core()


def test_a_hosts_cpus_are_not_read_and_the_cgroup_counter_is(tmp_path):
    """In a container limited by a quota its affinity holds the host's CPUs: their lines count the host's work."""
    clock = Clock()
    stat = _stat(tmp_path, {cpu: 0 for cpu in range(8)})
    cgroup = tmp_path / "cpu.stat"
    cgroup.write_text("usage_usec 0\nuser_usec 0\nsystem_usec 0\n")
    load = OtherLoad(2, stat=stat, cgroup_stat=cgroup, affinity=set(range(8)), own=clock.process, clock=clock.wall)
    assert load.source == "cgroup"
    cgroup.write_text("usage_usec 3000000\nuser_usec 3000000\nsystem_usec 0\n")
    clock.now, clock.own = 2.0, 1.0  # 3 s in two wall seconds, 1 of them this process's: others 1 core
    assert abs(load.cores() - 1.0) < 1e-9
    unknown = OtherLoad(2, stat=stat, cgroup_stat=tmp_path / "none", affinity=set(range(8)), own=clock.process, clock=clock.wall)
    assert unknown.source is None and unknown.cores() == 0.0 and not unknown.holds_a_core()


def test_this_machines_counters_read():
    load = OtherLoad(2)
    assert load.cores() >= 0.0  # whichever counter this machine has (or none), a figure and no error


def test_a_visitors_run_keeps_the_reduced_count_while_another_process_holds_a_core():
    compute = ComputeThread()
    current, busy = {"threads": None}, {"now": True}
    compute.use_threads(ServerThreads(2, 1), lambda count: current.update(threads=count), lambda: busy["now"])

    def work(steps: int):
        for _ in range(steps):
            yield current["threads"]

    assert list(compute.steps(work(2))) == [1, 1]
    busy["now"] = False
    assert list(compute.steps(work(2))) == [2, 2]
