"""Workload adaptation keeps to its minutes: a fake clock advanced by a stubbed pace for each
piece of work (an answer, a scored answer, a step, a held-out prompt) drives a whole run on a
tiny chat pair, so the plan and its cuts are checked without waiting."""

import dataclasses
import re

import pytest

from tev.engine.models import load_bundle
from tev.pipelines import workload as workload_command
from tev.pipelines.workload import MIN_STEPS, Pace, plan_phases, workload_settings
from tev.pipelines.workload_report import summary_lines
from tev.util.compute_thread import result_of
from tev.util.progress import Phase, Progress
from tests.tiny import CHAT_WORDS, save_chat_target, tiny_vocab_drafter

MINUTES = 5


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = tmp_path_factory.mktemp("workload-minutes")
    bundle = load_bundle(str(save_chat_target(folder / "target")), dtype="float32")
    vocab = [bundle.tokenizer.convert_tokens_to_ids(w) for w in CHAT_WORDS[: len(CHAT_WORDS) // 2]] + [bundle.tokenizer.eos_token_id]
    tiny_vocab_drafter(bundle.target, sorted(set(vocab))).save_pretrained(folder / "base")
    prompts = [" ".join(CHAT_WORDS[i % len(CHAT_WORDS)] for i in range(k, k + 5)) for k in range(20)]  # 15 to train on, 5 held out
    return bundle, folder / "base", prompts


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def _run(tiny, monkeypatch, pace: Pace, with_mass: bool = False, probe_heldout: float | None = None, later_answer: float | None = None,
         phases: list | None = None, answer_law: str = "T0") -> dict:
    """A whole adaptation in fake time: each piece of work moves the clock by its stubbed pace
    (the probe's held-out prompt by ``probe_heldout`` when given: a busy minute while it ran; the
    answers after the probe's first ones by ``later_answer``: longer answers in bigger batches).
    ``phases``, when given, collects the run's named phases and their info, as the page reads them.
    Greedy answers only unless ``answer_law`` says otherwise: the plan's cuts are what most tests here check."""
    bundle, base, prompts = tiny
    clock = FakeClock()
    answer, score, train, decode = (workload_command.answer_prompts, workload_command.workload_train_set, workload_command.train,
                                    workload_command._decode_prompt)

    calls = []

    def answering(target, tokenizer, asked, *args, batch=8, **kwargs):
        seconds = later_answer if later_answer is not None and calls else pace.answer
        calls.append(len(asked))
        batches = 0
        events = answer(target, tokenizer, asked, *args, batch=batch, **kwargs)
        while True:
            try:
                event = next(events)
            except StopIteration as done:
                return done.value
            if event.info:  # a batch written (between its forwards the clock stands)
                clock.now += seconds * len(asked[batches * batch : (batches + 1) * batch])
                batches += 1
            yield event

    def scoring(target, drafter, answers, *args, **kwargs):
        built = yield from score(target, drafter, answers, *args, **kwargs)
        clock.now += pace.score * len(answers)
        return built

    def training(*args, **kwargs):
        for record in train(*args, **kwargs):
            clock.now += pace.step
            yield record

    decoded = []

    def decoding(*args, **kwargs):  # a held-out prompt's rounds take about pace.heldout (the run can stop between them)
        seconds = probe_heldout if probe_heldout is not None and not decoded else pace.heldout
        decoded.append(seconds)
        rounds = decode(*args, **kwargs)
        while True:
            try:
                event = next(rounds)
            except StopIteration as done:
                return done.value
            clock.now += seconds / ROUNDS
            yield event

    monkeypatch.setattr(workload_command, "answer_prompts", answering)
    monkeypatch.setattr(workload_command, "workload_train_set", scoring)
    monkeypatch.setattr(workload_command, "train", training)
    monkeypatch.setattr(workload_command, "_decode_prompt", decoding)
    monkeypatch.setattr(workload_command, "EVAL_NEW_TOKENS", 6)
    settings = dataclasses.replace(workload_settings("exit"), batch=8, tree_batch=4)
    events = workload_command.adaptation(bundle, prompts, base, MINUTES, settings, controls=("none",), progress=False, with_mass=with_mass, clock=clock,
                                          answer_law=answer_law)
    result = result_of(_kept(events, phases) if phases is not None else events)["result"]
    assert clock.now == pytest.approx(result["minutes"] * 60)
    assert result["minutes"] <= 1.1 * MINUTES  # the minutes hold, whatever the pace
    return result


def _kept(events, phases: list):
    """``events`` passed on, each that starts a phase also kept in ``phases``."""
    while True:
        try:
            event = next(events)
        except StopIteration as done:
            return done.value
        assert isinstance(event, Progress)
        if event.starts:
            phases.append(event)
        yield event


ROUNDS = 12  # about the rounds of a tiny held-out prompt at the three laws (6 new tokens each)
QUIET = Pace(answer=2.0, score=0.5, step=0.5, heldout=4.0)


def test_a_quiet_run_answers_every_prompt_and_trains_the_steps_that_fit(tiny, monkeypatch):
    result = _run(tiny, monkeypatch, QUIET, with_mass=True)
    assert result["compared"] and result["note"] is None
    assert result["train_prompts_answered"] == 15 and result["eval_prompts"] >= 2
    assert result["steps"] >= MIN_STEPS and result["pace"]["step"] == pytest.approx(QUIET.step)
    assert set(result["T0.7"]) == {"base", "adapted", "token_only"} and set(result["gain"]["T0.7"]) == {"adapted", "token_only"}


def test_a_quiet_run_at_the_default_answer_laws_answers_every_prompt_at_each(tiny, monkeypatch):
    result = _run(tiny, monkeypatch, QUIET, answer_law=workload_command.DEFAULT_ANSWER_LAW)
    laws = workload_command.answer_laws(workload_command.DEFAULT_ANSWER_LAW)
    assert len(laws) == 2 and result["answer_law"] == workload_command.DEFAULT_ANSWER_LAW
    assert result["compared"] and result["answers_asked"] == 2 * 15 and result["train_prompts_answered"] == 15 and result["steps"] >= MIN_STEPS


def test_slow_answers_cut_the_answers_not_the_training(tiny, monkeypatch):
    slow = dataclasses.replace(QUIET, answer=20.0)  # the first 4 answers alone take 80 s of the 300
    result = _run(tiny, monkeypatch, slow)
    assert result["compared"] and result["steps"] >= MIN_STEPS
    assert result["train_prompts_answered"] < 15  # fewer prompts answered...
    assert result["plan"]["steps"] >= MIN_STEPS  # ...so that the steps still fit


def test_slow_held_out_decoding_cuts_the_held_out_prompts_not_the_training(tiny, monkeypatch):
    result = _run(tiny, monkeypatch, dataclasses.replace(QUIET, heldout=20.0))
    assert result["compared"] and result["steps"] >= MIN_STEPS and 1 <= result["eval_prompts"] < 5


def test_answers_slower_than_the_probe_are_still_written_while_the_plan_has_room(tiny, monkeypatch):
    # the probe's 4 answers took 2 s each, the next batch of 8 takes 5 s an answer: 40 s of a 300 s run, still every answer
    result = _run(tiny, monkeypatch, QUIET, later_answer=5.0)
    assert result["compared"] and result["train_prompts_answered"] == 15 and result["steps"] >= MIN_STEPS


def test_held_out_prompts_past_the_plan_fill_the_minutes_a_slow_probe_left(tiny, monkeypatch):
    # the probe's held-out prompt took 40 s (a busy minute), so the plan holds few; the rest decode at 4 s a prompt
    result = _run(tiny, monkeypatch, dataclasses.replace(QUIET, step=0.8), with_mass=True, probe_heldout=40.0)
    assert result["compared"] and result["eval_prompts"] > result["plan"]["heldout"]
    assert result["eval_prompts"] == 5 and result["heldout_mass"] is not None  # every held-out prompt, and the mass figure still fits


def test_the_progress_of_held_out_decoding_counts_the_prompts_it_may_decode(tiny, monkeypatch):
    """It said "up to 1 held-out prompts" and then decoded 2: the plan's count is not a ceiling."""
    from tev.pipelines.workload_report import progress_sentence

    phases = []
    result = _run(tiny, monkeypatch, dataclasses.replace(QUIET, step=0.8), probe_heldout=40.0, phases=phases)
    event = next(event for event in phases if event.phase is Phase.EVALUATE)
    info = event.info
    assert info["prompts"] == result["plan"]["heldout"] < result["eval_prompts"] <= info["most"]
    said = progress_sentence(event, dataclasses.asdict(workload_command.workload_settings()))
    assert f"{info['prompts']} planned, up to {info['most']} while the minutes allow" in said and "up to 1 held-out" not in said
    # the drafters by the result table's names (the page said "exit" and "exittrain" where the table said others)
    assert "with base (the shipped drafter), adapted (token loss only), " in said and not re.search(r"\b(exittrain|exit|token_only)\b(?! term)", said)


def test_a_run_that_cannot_reach_the_minimum_steps_says_so_and_compares_nothing(tiny, monkeypatch):
    result = _run(tiny, monkeypatch, dataclasses.replace(QUIET, step=20.0))  # 30 steps of two drafters: 1200 s
    assert not result["compared"] and result["steps"] < MIN_STEPS
    assert result["gain"] == {} and all(set(result[key]) == {"base"} for key in workload_command.LAWS)
    assert result["note"].startswith(f"Only {result['steps']} fine-tune steps fit in {MINUTES} minutes") and "20.0 s a step" in result["note"]
    lines = summary_lines(result)
    assert lines[-1] == result["note"] and not any("gain" in line for line in lines)


def test_a_held_out_prompt_longer_than_half_the_minutes_is_cut_and_nothing_is_compared(tiny, monkeypatch):
    result = _run(tiny, monkeypatch, dataclasses.replace(QUIET, heldout=400.0))  # one prompt, one drafter: 400 s of the 300
    assert not result["compared"] and result["eval_prompts"] == 0 and all(result[key] == {} for key in workload_command.LAWS)
    assert result["steps"] >= MIN_STEPS  # the time went to training, not to a measurement that cannot finish
    assert "decoding held-out prompts with both drafters does not fit in 5 minutes" in result["note"] and "a held-out prompt took more than half the time left" in result["note"]
    assert summary_lines(result)[-1] == result["note"]


@pytest.mark.parametrize(
    "pace, expected",
    [
        (Pace(1.0, 0.5, 0.5, 5.0), (15, 160, 8, 1)),  # the steps asked for, every answer, the control
        (Pace(1.0, 0.5, 1.0, 5.0), (15, 100, 6, 1)),  # fewer steps than asked, more than the minimum
        (Pace(30.0, 0.5, 1.0, 5.0), (11, 59, 6, 1)),  # slow answers: a third of the time answers, the steps still kept
        (Pace(1.0, 0.5, 8.0, 5.0), (15, 30, 5, 0)),  # slow steps: the minimum without the control
        (Pace(1.0, 0.5, 10.0, 5.0), (8, 29, 0, 0)),  # too slow for 30 steps: no comparison, what fits is trained
    ],
)
def test_the_plan_keeps_the_minimum_training_first(pace, expected):
    plan = plan_phases(pace, 300.0, answered=8, offered=15, steps=160, heldout=10, controls=1)
    assert (plan.answers, plan.steps, plan.heldout, plan.controls) == expected


def test_the_workload_status_is_one_bar_one_clock_and_one_sentence_said_again_as_time_passes(monkeypatch):
    """A held-out decoding once showed one status line for 133 s, under a bar labelled "work" whose timer went back
    to 0 at every line: the status holds the run's one bar, a clock that only goes forward, and the phase's
    sentence, said again about every second with the clock."""
    import itertools
    import re

    import ui.workload
    from tev.util.compute_thread import Steps
    from tev.util.progress import relay
    from ui.workload import STATUS_SECONDS, RunProgress

    clock = itertools.count(0.0, 0.5)  # half a second a piece of work
    monkeypatch.setattr(ui.workload.time, "monotonic", lambda: next(clock))
    events = [Progress.start(Phase.EVALUATE, prompts=2, most=2, drafters=["base", "adapted"], least=5)] + [Progress(Phase.EVALUATE)] * 40

    def pieces():
        yield from events
        return "done"

    shown = RunProgress(0.0, 300.0, dataclasses.asdict(workload_settings()))
    views = []
    run = relay(Steps(pieces()), shown.view)
    while True:
        try:
            views.append(next(run).status)
        except StopIteration as end:
            assert end.value == "done"
            break
    assert 40 * 0.5 / STATUS_SECONDS / 2 <= len(views) <= 40 * 0.5 / STATUS_SECONDS + 1  # said again about every STATUS_SECONDS
    assert all(status.count("<progress") == 1 for status in views)
    assert all("decoding held-out prompts with base (the shipped drafter), adapted (token loss only)" in status for status in views)
    seconds = [60 * int(m) + int(s) for m, s in (re.search(r"(\d+):(\d\d) of about 5:00", status).groups() for status in views)]
    assert seconds == sorted(seconds) and len(set(seconds)) == len(seconds)  # forward, each time its own
    assert not any(re.search(r"\bwork\b", status) for status in views)
