"""The ExitTrain tab's runs are background work in the server's compute thread: a workload
adaptation and a live fine-tune submit every piece of their work with ``background=True`` (so
Live's rounds step first), run in a queue group of their own (so they never hold one of the
interactive events' places), and say how long interactive work went first."""

import dataclasses
import threading
import types

from tests.tiny import CHAT_WORDS



def _submissions(compute, monkeypatch) -> list:
    """``(name of the submitted generator, background)`` for every ``compute.steps`` call from now on."""
    seen, steps = [], compute.steps

    def recorded(work, background=False, threads=None):
        seen.append((getattr(work, "__name__", type(work).__name__), background))
        return steps(work, background=background, threads=threads)

    monkeypatch.setattr(compute, "steps", recorded)
    return seen


def _prompt(k: int) -> str:
    return " ".join(CHAT_WORDS[i % len(CHAT_WORDS)] for i in range(k, k + 4))


def test_a_workload_run_is_background_work_and_live_goes_first(chat_server, monkeypatch):
    import ui.workload
    from ui.live import run_live

    compute = chat_server.service.compute
    seen = _submissions(compute, monkeypatch)
    prompts = "\n".join(_prompt(k) for k in range(16))
    outputs, live_stats = [], []

    def adapt():
        outputs.extend(ui.workload.run_workload(ui.workload.OWN, prompts, 2, ui.workload.DEFAULT_RECIPE, types.SimpleNamespace(session_hash="alice")))

    run = threading.Thread(target=adapt)
    run.start()
    try:
        while compute.active_background() == 0 and run.is_alive():
            threading.Event().wait(0.01)
        for k in range(3):  # a visitor's Live runs while the adaptation steps
            streamed = list(run_live(_prompt(k), "block", "tev", 8, 0.0, 6, 0, False, True, 1.0, 0, request=types.SimpleNamespace(session_hash="bob")))
            live_stats += [output.stats for output in streamed[:-1]]
    finally:
        run.join(120)
    assert not run.is_alive()
    assert ("adaptation", True) in seen  # the whole run: answers, scoring, training steps, held-out decoding
    assert all(background for name, background in seen if name == "adaptation")
    assert any(name == "speculative_generate" and not background for name, background in seen)  # Live stays interactive
    assert any("background run (fine-tuning, measuring) shares the machine now: your rounds go first" in stats for stats in live_stats), live_stats
    assert outputs[-1][0].startswith("finished in") and "trained" in outputs[-1][0]
    assert compute.active() == compute.active_background() == 0


def test_a_live_exittrain_run_scores_and_trains_as_background_work(chat_server, monkeypatch):
    import ui.exittrain
    from tev.pipelines.exittrain import EXITTRAIN_SETTINGS
    from tev.train.experiment import Experiment

    compute = chat_server.service.compute
    chat_server.service.bundle()  # loaded first: the models load as a step of the compute thread too
    seen = _submissions(compute, monkeypatch)
    settings = dataclasses.replace(EXITTRAIN_SETTINGS, steps=5)

    def measure(drafter):
        yield 0
        return types.SimpleNamespace(tau_bound=1.5)

    def training(drafter):
        for step in range(1, 6):
            yield {"step": step, "loss": 1.0, "loss_tok": 1.0, "loss_tree": 0.0, "tau_bound": 1.5}

    monkeypatch.setattr(ui.exittrain, "_checked", lambda *a: (chat_server.service.bundle(), settings, None, None))
    monkeypatch.setattr(ui.exittrain, "live_experiment", lambda *a: Experiment(None, training, measure))

    def cancel_at_step_2(fraction, desc=""):
        if desc.startswith("step 2/"):
            chat_server.shared.TRAINING_SLOT.cancel("carol")

    outputs = list(ui.exittrain.run_exittrain("math", "exit", 5, 0.1, types.SimpleNamespace(session_hash="carol"), progress=cancel_at_step_2))
    assert outputs[-1].status == "cancelled after 2 steps"
    assert seen == [("phases", True)]  # before, training and after: one run of background work


def test_the_exittrain_tab_runs_in_its_own_queue_group():
    """A run of minutes holds a place of the ExitTrain tab's group, never one of the two that Live,
    the walkthrough and the lab share."""
    import app

    groups = {fn.api_name: fn.concurrency_id for fn in app.build_app().fns.values()}
    assert {groups[name] for name in ("exittrain", "adapt_workload", "compare_shipped")} == {"background"}
    assert {groups[name] for name in ("generate", "walkthrough", "walkthrough_next", "verifier_lab")} == {"compute"}


def test_a_run_says_for_what_share_of_its_minutes_interactive_runs_had_priority():
    from ui.exittrain import priority_note

    assert priority_note(120.0, 300.0) == "; interactive runs (Live, walkthrough, lab) had priority for 40% of the minutes"
    assert priority_note(0.0, 300.0) == priority_note(1.0, 300.0) == priority_note(5.0, 0.0) == ""  # alone (under 1%), or no time yet
