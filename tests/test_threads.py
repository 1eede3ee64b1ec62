"""The server's torch threads: one core fewer than the container for every run, TEV_THREADS fixing another
count; the count is set in the compute thread, and torch's count belongs to the thread that sets it; the
models load in the compute thread. No model is loaded (but a stand-in)."""

from __future__ import annotations

import threading

import pytest
import torch

from tev.util.compute_thread import ComputeThread
from tev.util.cpus import ServerThreads, server_threads


def test_unset_the_server_runs_one_core_fewer_than_the_container_for_every_run():
    """One count whoever else is served, so a seed gives one answer; a core is left to the browser and other work."""
    assert server_threads({}, cpus=3) == ServerThreads(2) and ServerThreads(2).describe() == "2 torch threads (TEV_THREADS sets another count)"
    assert server_threads({"TEV_THREADS": ""}, cpus=4) == ServerThreads(3)  # empty: unset
    for cpus in (1, 2):
        assert server_threads({}, cpus=cpus) == ServerThreads(1) and ServerThreads(1).describe().startswith("1 torch thread ")
    with pytest.raises(ValueError):
        ServerThreads(0)


def test_tev_threads_fixes_the_count():
    threads = server_threads({"TEV_THREADS": " 3 "}, cpus=2)
    assert threads == ServerThreads(3, fixed=True) and threads.describe() == "3 torch threads (TEV_THREADS)"
    for bad in ("0", "-1", "two", "1.5"):
        with pytest.raises(ValueError, match="TEV_THREADS"):
            server_threads({"TEV_THREADS": bad}, cpus=2)


def test_the_count_is_set_in_the_compute_thread_once_before_its_steps():
    compute, calls = ComputeThread(lookahead=100), []
    current = {"threads": None}

    def set_threads(count: int):
        calls.append((count, threading.current_thread().name))
        current["threads"] = count

    def logged(count, name):  # each step notes the count it ran with
        for index in range(count):
            yield (name, index, current["threads"])

    compute.use_threads(ServerThreads(2), set_threads)
    assert compute.threads == ServerThreads(2)
    first, second = compute.steps(logged(3, "first")), compute.steps(logged(2, "second"))
    seen = list(second) + list(first)
    assert {threads for _, _, threads in seen} == {2} and len(seen) == 5
    assert calls == [(2, "tev-compute")]  # set once, in the compute thread


def test_without_a_policy_steps_keep_the_threads_count():
    compute = ComputeThread()
    assert compute.threads is None
    assert list(compute.steps(iter([1, 2]))) == [1, 2]


def test_torch_threads_set_in_one_thread_leave_another_threads_count_alone():
    """What the policy relies on: torch.set_num_threads sets OpenMP's count of the calling thread (a thread
    that has not run torch work yet starts from the latest count set anywhere)."""
    before = torch.get_num_threads()
    seen = {}

    def worker():
        torch.set_num_threads(before + 1)
        seen["worker"] = torch.get_num_threads()
        torch.set_num_threads(before)  # the count new threads start from, as it was

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join(10)
    assert seen["worker"] == before + 1 and torch.get_num_threads() == before


def test_the_models_load_in_the_compute_thread(monkeypatch):
    """The target's forward is chosen and timed where its runs will run, and no other thread starts an OpenMP team of
    several threads (a second team makes GNU OpenMP sleep at every barrier: see tev.util.compute_thread)."""
    from tev.service import service as service_module

    loaded_in = []
    monkeypatch.setattr(service_module, "load_bundle", lambda *args, **kwargs: loaded_in.append(threading.current_thread().name) or object())
    models = service_module.ModelService()
    first = models.bundle()
    assert models.bundle() is first and loaded_in == ["tev-compute"]  # once, and there
