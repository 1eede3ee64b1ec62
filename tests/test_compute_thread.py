"""The server's one compute thread: requests step in turn, a cancelled request leaves the others
as they would be alone, an exception reaches only its own reader, a long request cannot starve a
short one, and interactive work (a user's rounds) steps ahead of background work (a fine-tune),
which still gets its share of the time."""

from __future__ import annotations

import threading

import pytest

from tev.engine.decode import DecodeConfig, Request, speculative_generate
from tev.util.compute_thread import BACKGROUND_SHARE, ComputeThread, mapped, result_of
from tev.engine.target import Target
from tests.tiny import tiny_block_drafter, tiny_target


def _logged(name: str, steps: int, log: list, gate: threading.Event | None = None):
    for index in range(steps):
        if gate is not None and index == 0:
            assert gate.wait(5)
        log.append((name, index, threading.current_thread().name))
        yield index


def test_two_requests_step_in_turn_in_the_compute_thread():
    compute, log, both_in = ComputeThread(lookahead=100), [], threading.Event()
    first = compute.steps(_logged("a", 4, log, gate=both_in))
    second = compute.steps(_logged("b", 4, log))
    both_in.set()
    assert list(first) == [0, 1, 2, 3] and list(second) == [0, 1, 2, 3]
    assert [(name, index) for name, index, _ in log] == [("a", 0), ("b", 0), ("a", 1), ("b", 1), ("a", 2), ("b", 2), ("a", 3), ("b", 3)]
    assert {thread for _, _, thread in log} == {compute.name}


def _tokens(events) -> list[int]:
    return [token for record in events for token in record.emitted]


def test_cancelling_one_request_leaves_the_other_as_it_runs_alone():
    target = tiny_target(64, seed=3)
    drafter = tiny_block_drafter(target)
    config = DecodeConfig(budget=6, temperature=1.0, max_new_tokens=24, seed=11)

    def request(prompt):
        return speculative_generate(Request(Target(target), drafter, prompt, config))

    alone = _tokens(request([3, 9, 27]))
    compute = ComputeThread(lookahead=1)
    kept = compute.steps(request([3, 9, 27]))
    cancelled = compute.steps(request([5, 7]))
    first = next(kept)
    next(cancelled), next(cancelled)
    cancelled.close()  # the reader leaves after two rounds: the request is closed, never stepped again
    assert _tokens([first, *kept]) == alone
    assert len(alone) >= 4  # several rounds ran, so the two requests did interleave
    assert compute.active() == 0


def _fails_at(step: int):
    for index in range(step):
        yield index
    raise ValueError("a bad step")


@pytest.mark.parametrize("background", [False, True])
def test_an_exception_reaches_its_own_reader_and_the_thread_serves_on(background):
    compute = ComputeThread()
    failing = compute.steps(_fails_at(2), background=background)
    healthy = compute.steps(iter(range(5)))
    assert next(failing) == 0 and next(failing) == 1
    with pytest.raises(ValueError, match="a bad step"):
        next(failing)
    assert list(healthy) == [0, 1, 2, 3, 4]
    assert compute.call(lambda a, b: a * b, 6, b=7) == 42  # later work runs as before


def test_a_long_request_does_not_starve_a_short_one():
    """A fine-tune that always has another step and a user's generation of 5 rounds: the user's
    rounds finish while the fine-tune has taken about one step per round, not all of its steps."""
    compute, log, stop = ComputeThread(lookahead=1000), [], threading.Event()  # no reader holds either back

    def fine_tune():
        index = 0
        while not stop.is_set():
            log.append("step")
            index += 1
            yield index

    def generation():
        for index in range(5):
            log.append("round")
            yield index

    training = compute.steps(fine_tune())
    reader = threading.Thread(target=lambda: [None for _ in training])
    reader.start()
    assert list(compute.steps(generation())) == [0, 1, 2, 3, 4]
    stop.set()
    reader.join(5)
    assert not reader.is_alive()
    between = log[log.index("round"): len(log) - log[::-1].index("round")]
    assert between.count("round") == 5 and between.count("step") <= 4 and "step step" not in " ".join(between)


class _StepClock:
    """A clock the steps themselves move: a step of ``seconds`` adds them (read in the compute thread)."""

    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now

    def steps(self, name: str, count: int, seconds: float, log: list):
        for index in range(count):
            self.now += seconds
            log.append(f"{name}{index}")
            yield index


def _blocked_thread(**settings):
    """A thread busy with a one-step request until the returned event is set, so the requests
    submitted meanwhile all wait in line when it is free."""
    compute, free, started = ComputeThread(lookahead=1000, **settings), threading.Event(), threading.Event()
    blocker = compute.steps(_waits_for(free, started))
    assert started.wait(5)  # out of the line and stepping: whatever is submitted now waits behind it
    return compute, free, blocker


def _waits_for(event: threading.Event, started: threading.Event | None = None):
    if started is not None:
        started.set()
    assert event.wait(5)
    yield None


def test_an_interactive_request_steps_ahead_of_a_background_one():
    """A training run in line first and a user's rounds after it: the rounds go first, and the run
    still takes a step each time it is owed its share (0.2 of the time: one 1 s step per 4 s of rounds)."""
    clock, log = _StepClock(), []
    compute, free, blocker = _blocked_thread(background_share=0.2, clock=clock)
    training = compute.steps(clock.steps("b", 3, 1.0, log), background=True)
    rounds = compute.steps(clock.steps("a", 9, 1.0, log))
    free.set()
    assert list(rounds) == list(range(9)) and list(training) == [0, 1, 2] and list(blocker) == [None]
    # a0 leaves the run owed 0.25 s: it steps, paying 1 s, and is owed time again 4 rounds later
    assert log == ["a0", "b0", "a1", "a2", "a3", "a4", "b1", "a5", "a6", "a7", "a8", "b2"]
    assert training.held_seconds == 9.0 and rounds.held_seconds == 0.0  # every round ran while the run was ready to step


@pytest.mark.parametrize("background", [False, True])
def test_call_at_computes_a_function_as_background_work_when_asked(background):
    """One call (the start's warm-up, a drafter's check, the cost curve) submitted before a user's rounds: as
    interactive work it goes first; as background work the rounds go first and it takes its turn when owed."""
    clock, log = _StepClock(), []
    compute, free, blocker = _blocked_thread(background_share=0.2, clock=clock)

    def warm() -> int:
        clock.now += 1.0
        log.append("warm")
        return 3

    answer = {}
    caller = threading.Thread(target=lambda: answer.setdefault("value", compute.call_at(1, warm, background=background)))
    caller.start()
    for _ in range(500):  # until the call waits in line behind the blocker
        if len(compute._turns) == 1:
            break
        threading.Event().wait(0.01)
    rounds = compute.steps(clock.steps("a", 3, 1.0, log))
    free.set()
    assert list(rounds) == [0, 1, 2] and list(blocker) == [None]
    caller.join(5)
    assert answer == {"value": 3}
    assert log == (["a0", "warm", "a1", "a2"] if background else ["warm", "a0", "a1", "a2"])


def test_a_background_request_still_gets_its_share_under_endless_interactive_work():
    """Rounds that never stop (0.5 s each) beside a run of 3 s steps: the run finishes, having had
    about the default share of the thread's time, and knows how long the rounds held it back."""
    clock, log, stop = _StepClock(), [], threading.Event()
    compute, free, blocker = _blocked_thread(clock=clock)

    def endless():
        while not stop.is_set():
            clock.now += 0.5
            log.append("round")
            yield None

    def run():
        yield from clock.steps("step", 10, 3.0, log)
        log.append("done")  # the run's last step (it returns): the held time counts up to it

    training = compute.steps(run(), background=True)
    rounds = compute.steps(endless())
    reader = threading.Thread(target=lambda: [None for _ in rounds])
    reader.start()
    free.set()
    try:
        assert list(training) == list(range(10))
    finally:
        stop.set()
        reader.join(5)
    assert not reader.is_alive()
    log = log[: log.index("done")]  # the rounds after the run are not part of its time
    interactive, background = 0.5 * log.count("round"), 3.0 * (len(log) - log.count("round"))
    assert abs(background / (background + interactive) - BACKGROUND_SHARE) <= 0.02, (interactive, background)
    assert training.held_seconds == interactive
    between = " ".join(log[log.index("step0"):])
    paid_back = round(3.0 * (1 - BACKGROUND_SHARE) / BACKGROUND_SHARE / 0.5)  # rounds that pay back one 3 s step (54 at a tenth)
    assert " ".join(["round"] * (paid_back - 2)) in between  # each step is paid back by rounds
    assert "round " * (paid_back + 3) not in between  # and the run never waits much longer


def test_a_background_request_alone_steps_without_waiting():
    clock, log = _StepClock(), []
    compute = ComputeThread(clock=clock)
    training = compute.steps(clock.steps("b", 5, 2.0, log), background=True)
    assert list(training) == [0, 1, 2, 3, 4] and training.held_seconds == 0.0


def test_work_that_submits_work_runs_it_in_place():
    compute = ComputeThread()
    assert compute.call(lambda: compute.call(lambda: threading.current_thread().name)) == compute.name


@pytest.mark.parametrize("background", [False, True])
def test_a_reader_that_leaves_closes_its_request_in_the_compute_thread(background):
    compute, closed_in = ComputeThread(lookahead=1), []

    def work():
        try:
            while True:
                yield 1
        finally:
            closed_in.append(threading.current_thread().name)

    reader = compute.steps(work(), background=background)
    assert next(reader) == 1
    reader.close()
    assert compute.call(lambda: "served") == "served"  # the close came before this turn
    assert closed_in == [compute.name]


def test_a_live_run_says_when_it_shares_the_machine(tmp_path, monkeypatch):
    """While another request is being stepped (a fine-tune, another user), the Live stats say the
    run takes turns with it; alone, they say nothing of it."""
    import types

    from tev.engine.models import load_bundle
    from tev.service.service import ModelService
    from tests.tiny import CHAT_WORDS, save_chat_target, tiny_vocab_drafter
    from ui import shared
    from ui.live import run_live

    folder = save_chat_target(tmp_path / "target")
    bundle = load_bundle(str(folder), dtype="float32")
    vocab = sorted({bundle.tokenizer.convert_tokens_to_ids(w) for w in CHAT_WORDS} | {bundle.tokenizer.eos_token_id})
    tiny_vocab_drafter(bundle.target, vocab).save_pretrained(tmp_path / "base")
    service = ModelService(target=str(folder), draft=str(tmp_path / "base"), dtype="float32")
    monkeypatch.setattr(shared, "SERVICE", service)
    prompt = " ".join(CHAT_WORDS[:4])

    def streamed_stats():
        outputs = run_live(prompt, "block", "tev", 8, 0.0, 6, 0, False, True, 1.0, 0, request=types.SimpleNamespace(session_hash="visitor"))
        return [output.stats for output in outputs][:-1]  # the last is the finished run's summary

    assert not any("share" in stats for stats in streamed_stats())
    stop = threading.Event()

    def fine_tune():
        while not stop.is_set():
            yield None

    training = service.compute.steps(fine_tune())
    reader = threading.Thread(target=lambda: [None for _ in training])
    reader.start()
    try:
        shared_stats = streamed_stats()
        assert any("1 other run shares the machine now" in stats for stats in shared_stats), shared_stats
    finally:
        stop.set()
        reader.join(5)


def _progress_then(result, steps: int):
    for index in range(steps):
        yield index
    return result


def test_the_work_returns_its_result_through_the_thread():
    """One convention: a request yields progress and returns its result (PEP 380); ``steps``
    passes the result through to ``yield from``, in the compute thread and in place."""
    compute = ComputeThread()

    def reader(work):
        result = yield from compute.steps(work)
        return result

    seen = []
    outer = reader(_progress_then("done", 3))
    while True:
        try:
            seen.append(next(outer))
        except StopIteration as end:
            assert end.value == "done"
            break
    assert seen == [0, 1, 2]
    assert result_of(compute.steps(_progress_then({"rows": 1}, 2))) == {"rows": 1}
    assert compute.call(lambda: 5) == 5
    nested = compute.call(lambda: result_of(compute.steps(_progress_then(7, 2))))  # work that submits work: in place
    assert nested == 7


def test_mapped_maps_each_yield_returns_the_result_and_closes_an_unfinished_generator():
    closed = []

    def work():
        try:
            yield 1
            yield 2
            return "done"
        finally:
            closed.append(True)

    seen = []
    assert result_of(mapped(work(), lambda step: step * 10), seen.append) == "done"
    assert seen == [10, 20] and closed == [True]
    early = mapped(work(), lambda step: step)
    assert next(early) == 1
    closed.clear()
    early.close()  # a reader that stops early closes the work, as yield from would
    assert closed == [True]
