"""The server's torch threads per compute step: every core for a lone run, one each while several share the
machine, TEV_THREADS fixing one count; the count is set in the compute thread, only when it changes, and
torch's count belongs to the thread that sets it. No model is loaded."""

from __future__ import annotations

import threading

import pytest
import torch

from tev.util.compute_thread import ComputeThread, result_of
from tev.util.cpus import ThreadPolicy, server_thread_policy


def test_a_lone_interactive_run_gets_every_core_and_anything_else_the_shared_count():
    policy = ThreadPolicy(lone=2, shared=1)
    assert policy.plan(1, 0).threads == 2 and policy.plan(1, 0).reason == "a lone run"
    assert policy.plan(2, 0).threads == 1 and "2 requests share" in policy.plan(2, 0).reason
    assert policy.plan(1, 1).threads == 1  # a fine-tune beside a visitor
    assert policy.plan(0, 1).threads == 1  # a background run alone
    assert policy.counts() == (1, 2)
    assert policy.describe() == "2 torch threads for a lone run, 1 each when several share the machine (TEV_THREADS fixes one count)"
    assert policy.words(0).startswith("2 torch threads (a lone run's") and policy.words(1).startswith("1 torch thread while others shared")


def test_tev_threads_fixes_the_count_for_every_step():
    policy = server_thread_policy({"TEV_THREADS": " 3 "}, cpus=2)
    assert [policy.plan(i, b).threads for i, b in ((1, 0), (2, 0), (0, 1))] == [3, 3, 3]
    assert policy.counts() == (3,) and policy.describe() == "3 torch threads (TEV_THREADS)" and policy.words(2) == policy.describe()
    for bad in ("0", "-1", "two", "1.5"):
        with pytest.raises(ValueError, match="TEV_THREADS"):
            server_thread_policy({"TEV_THREADS": bad}, cpus=2)


def test_unset_every_step_gets_one_core_fewer_than_the_container_so_a_seed_gives_one_answer_whoever_else_is_served():
    policy = server_thread_policy({}, cpus=3)
    assert policy == ThreadPolicy(lone=2, shared=2) and [policy.plan(i, b).threads for i, b in ((1, 0), (3, 0), (1, 1))] == [2, 2, 2]
    assert policy.describe() == "2 torch threads (TEV_THREADS sets another count)" and policy.words(3) == "2 torch threads"
    assert server_thread_policy({"TEV_THREADS": ""}, cpus=4) == ThreadPolicy(lone=3, shared=3)  # empty: unset
    for cpus in (1, 2):
        single = server_thread_policy({}, cpus=cpus)
        assert single == ThreadPolicy(lone=1, shared=1) and single.counts() == (1,) and single.words(0) == "1 torch thread"
    with pytest.raises(ValueError):
        ThreadPolicy(lone=0)


def _steps(count: int, seen: list, name: str, gate: threading.Event | None = None, held: threading.Event | None = None):
    for index in range(count):
        if gate is not None and index == 1:
            assert gate.wait(5)
        seen.append((name, index))
        if held is not None and index == 0:
            held.set()
        yield index


def test_each_step_runs_with_the_policys_count_set_in_the_compute_thread_only_when_it_changes():
    compute, calls, seen = ComputeThread(lookahead=100), [], []
    current = {"threads": None}

    def set_threads(count: int):
        calls.append((count, threading.current_thread().name))
        current["threads"] = count

    def logged(count, name, **events):  # each step notes the count it ran with
        for index in _steps(count, [], name, **events):
            seen.append((name, index, current["threads"]))
            yield index

    compute.use_threads(ThreadPolicy(lone=2, shared=1), set_threads)
    assert compute.thread_policy == ThreadPolicy(lone=2, shared=1) and compute.thread_plan().threads == 1  # nothing active
    assert result_of(compute.steps(logged(3, "alone"))) is None
    assert [s[2] for s in seen] == [2, 2, 2] and calls == [(2, "tev-compute")]  # set once, in the compute thread
    seen.clear()
    gate, started = threading.Event(), threading.Event()
    first = compute.steps(logged(3, "first", gate=gate, held=started))
    assert started.wait(5)
    second = compute.steps(logged(2, "second"))
    gate.set()
    list(second)
    list(first)
    assert [threads for name, index, threads in seen if name == "first"][0] == 2  # alone as it started
    assert all(threads == 1 for name, index, threads in seen if name == "second")  # two shared the machine
    seen.clear()
    list(compute.steps(logged(1, "again")))
    assert seen == [("again", 0, 2)]
    assert [count for count, _ in calls] == [2, 1, 2] and {thread for _, thread in calls} == {"tev-compute"}


def test_without_a_policy_steps_keep_the_threads_count():
    compute = ComputeThread()
    assert compute.thread_policy is None and compute.thread_plan() is None
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
