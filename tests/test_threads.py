"""The server's torch threads: every core the container may use for visitors' steps, one fewer for background work
and while another process holds a core (one count where the target's forward rounds a row differently at another,
and a drafter's runs at the reduced count until its rounds are checked the same at both), TEV_THREADS fixing one
count; the count is set in the compute thread, and torch's count belongs to the thread that sets it; the models load
in the compute thread, at the full count. No model is loaded (but a stand-in)."""

from __future__ import annotations

import threading

import pytest
import torch

from tev.util.compute_thread import ComputeThread
from tev.util.cpus import ServerThreads, server_threads


def test_unset_visitors_get_every_core_and_other_work_one_fewer():
    """Visitors' runs get the second core; background work, and every step while another process is busy, leave one."""
    threads = server_threads({}, cpus=2)
    assert threads == ServerThreads(2, 1) and threads.switches
    assert threads.for_step(free=True) == 2 and threads.for_step(free=False) == 1
    assert threads.describe() == "2 torch threads, 1 when cores are busy"
    assert server_threads({"TEV_THREADS": ""}, cpus=4) == ServerThreads(4, 3)  # empty: unset
    one = server_threads({}, cpus=1)
    assert one == ServerThreads(1) and not one.switches and one.describe() == "1 torch thread (TEV_THREADS sets another count)"
    assert threads.single() == ServerThreads(1) and not threads.single().switches
    for bad in ((0, 1), (2, 0)):
        with pytest.raises(ValueError):
            ServerThreads(*bad)


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

    compute.use_threads(ServerThreads(2, fixed=True), set_threads)
    assert compute.threads == ServerThreads(2, fixed=True)
    first, second = compute.steps(logged(3, "first")), compute.steps(logged(2, "second"))
    seen = list(second) + list(first)
    assert {threads for _, _, threads in seen} == {2} and len(seen) == 5
    assert calls == [(2, "tev-compute")]  # set once, in the compute thread


def _counting(compute: ComputeThread, busy: dict | None = None):
    """A policy of 2 threads on free cores and 1 otherwise on ``compute`` (``busy``: whether another process holds a
    core), with a step that says the count it ran with."""
    busy = {"now": False} if busy is None else busy
    current = {"threads": None}
    compute.use_threads(ServerThreads(2, 1), lambda count: current.update(threads=count), lambda: busy["now"])

    def work(steps: int):
        for _ in range(steps):
            yield current["threads"]

    return work


def test_visitors_runs_step_at_the_full_count_and_background_work_at_the_reduced_one():
    compute = ComputeThread(lookahead=1)
    busy = {"now": False}
    work = _counting(compute, busy)
    alone = compute.steps(work(3))
    assert list(alone) == [2, 2, 2]
    # two visitors at once: both at the full count (two API visitors on 2 cores were served 55 answers in 4 minutes so, 38 at one each)
    first, second = compute.steps(work(3)), compute.steps(work(3))
    assert [next(first), next(second)] == [2, 2]
    busy["now"] = True  # a browser or a test worker takes a core: the reduced count from the next step on
    assert [next(first), next(second)] == [1, 1]
    busy["now"] = False
    assert list(first) == [2]
    second.close()
    # background work (a fine-tune, a measurement) never takes the full count: its results do not depend on what else runs
    background = compute.steps(work(2), background=True)
    assert list(background) == [1, 1]


def test_a_request_given_a_count_runs_at_it_whoever_else_is_served():
    """A measurement of what a count costs (the load, budget auto's cost curve) runs at the full count while a core is busy too."""
    compute = ComputeThread(lookahead=1)
    work = _counting(compute, {"now": True})
    assert list(compute.steps(work(2))) == [1, 1]  # an unpinned run: the reduced count
    assert list(compute.steps(work(2), threads=2)) == [2, 2]
    assert compute.call_at(3, compute.count_now) == 3  # read inside the step: the count it runs with
    assert compute.call_at(None, compute.count_now) == 1  # None: the policy's count (a core is busy here)
    with pytest.raises(ValueError):
        compute.steps(work(1), threads=0)


def test_keeping_one_count_runs_every_step_at_the_reduced_one():
    compute = ComputeThread()
    work = _counting(compute)
    compute.keep_one_count()
    assert compute.threads == ServerThreads(1) and list(compute.steps(work(2))) == [1, 1]


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
    """The target's forward is chosen and timed where its runs will run, at the full count, and no other thread
    starts an OpenMP team of several threads (a second team makes GNU OpenMP sleep at every barrier: see
    tev.util.compute_thread)."""
    from tev.service import service as service_module

    loaded_in = []
    invariant = type("Precision", (), {"invariant": True})()

    def load(*args, **kwargs):
        loaded_in.append((threading.current_thread().name, torch.get_num_threads()))
        return type("Bundle", (), {"precision": invariant})()

    monkeypatch.setattr(service_module, "load_bundle", load)
    models = service_module.ModelService()
    before = torch.get_num_threads()
    models.compute.use_threads(ServerThreads(2, 1), torch.set_num_threads)
    first = models.bundle()
    assert models.bundle() is first and loaded_in == [("tev-compute", 2)]  # once, there, at the full count
    assert models.compute.threads == ServerThreads(2, 1) and models.threads() == 2
    torch.set_num_threads(before)


@pytest.mark.parametrize("precision", [None, type("Precision", (), {"invariant": False})()])
def test_a_forward_whose_rows_change_with_the_count_gets_one_count(monkeypatch, precision):
    """transformers' forward (or none chosen) rounds a row differently at another count: a seed then gives one answer
    only if every step runs at one count, the reduced one."""
    from tev.service import service as service_module

    monkeypatch.setattr(service_module, "load_bundle", lambda *args, **kwargs: type("Bundle", (), {"precision": precision})())
    models = service_module.ModelService()
    models.compute.use_threads(ServerThreads(2, 1), lambda count: None)
    models.bundle()
    assert models.compute.threads == ServerThreads(1) and models.threads() == 1


def test_a_drafters_runs_take_the_full_count_only_once_its_rounds_are_checked_the_same_at_both(monkeypatch):
    """Until a drafter is checked (or where it failed, or for an adapted drafter the check never saw) its runs and the
    re-timing's plain decoding step at the reduced count: a seed gives one answer whatever else runs."""
    from tev.service import service as service_module

    invariant = type("Precision", (), {"invariant": True})()
    steady, shifty, adapted = object(), object(), object()
    bundle = type("Bundle", (), {"precision": invariant, "runner": object(), "drafters": {"path": steady, "block": shifty}})()
    monkeypatch.setattr(service_module, "load_bundle", lambda *args, **kwargs: bundle)
    checked = []

    def agree(target, drafter, counts):
        checked.append((drafter, counts, threading.current_thread().name, models.compute.active_background()))
        return drafter is steady

    monkeypatch.setattr(service_module, "agree_here", agree)
    models = service_module.ModelService()
    models.compute.use_threads(ServerThreads(2, 1), lambda count: None)
    assert models.run_threads(steady) == 1 and models.run_threads(shifty) == 1  # not yet checked
    models.bundle()
    assert "The path, block drafters are still being checked at both thread counts; until then their runs keep 1 torch thread." in models.threads_note()
    models.warm_drafters()
    note = models.threads_note()  # the header says which drafters keep the reduced count, and why
    assert note.startswith("Runs through the block drafter keep 1 torch thread: its trees came out with other bits at 1 and 2 threads") and "path" not in note
    assert [(drafter, counts) for drafter, counts, _, _ in checked] == [(steady, (1, 2)), (shifty, (1, 2))]
    # in the compute thread, as background work: a run ending meanwhile is not told others wait in the app's line
    assert {(name, background) for _, _, name, background in checked} == {("tev-compute", 1)}
    assert models.run_threads(steady) is None and models.run_threads(shifty) == 1 and models.run_threads(adapted) == 1
    seen = []
    assert models.call_with(shifty, lambda: seen.append(models.compute.count_now()) or "tree") == "tree" and seen == [1]
    fixed = service_module.ModelService()  # one count (TEV_THREADS): nothing to check, the policy's count for all
    fixed.compute.use_threads(ServerThreads(2, fixed=True), lambda count: None)
    assert fixed.run_threads(shifty) is None
    assert fixed.threads_note() == ""
