"""The server's one compute thread: requests step in turn, a cancelled request leaves the others
as they would be alone, an exception reaches only its own reader, and a long request (a
fine-tune) cannot starve a short one (a user's generation)."""

from __future__ import annotations

import threading

import pytest

from tev.engine.decode import DecodeConfig, Request, speculative_generate
from tev.util.compute_thread import ComputeThread, result_of
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
        return speculative_generate(Request(target, drafter, prompt, config))

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


def test_an_exception_reaches_its_own_reader_and_the_thread_serves_on():
    compute = ComputeThread()
    failing = compute.steps(_fails_at(2))
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


def test_work_that_submits_work_runs_it_in_place():
    compute = ComputeThread()
    assert compute.call(lambda: compute.call(lambda: threading.current_thread().name)) == compute.name


def test_a_reader_that_leaves_closes_its_request_in_the_compute_thread():
    compute, closed_in = ComputeThread(lookahead=1), []

    def work():
        try:
            while True:
                yield 1
        finally:
            closed_in.append(threading.current_thread().name)

    reader = compute.steps(work())
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
