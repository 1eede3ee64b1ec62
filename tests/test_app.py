"""The app's API through gradio_client against a real server started by the test."""

import json
import re
import threading

import pytest
from gradio_client import Client

from ui.exittrain import ExitTrainView
from ui.lab import LabView
from ui.live import LiveView
from ui.live_rounds import RoundView
from tev.engine.run_speed import MIN_TIMED_TOKENS

SHORT_PROMPT = "def add(a, b):\n    "


@pytest.fixture(scope="module")
def client(app_server):
    return Client(app_server.url, verbose=False)


def named(fields, values) -> dict:
    """An API result by output name (the per-session state and the Continue button are no API outputs)."""
    fields = [name for name in fields if name not in ("state", "more")]
    assert len(values) == len(fields)
    return dict(zip(fields, values))


def traces(plot) -> list:
    """The trace names of a plot output (empty for no figure); a plot sent with its visibility
    comes as an update holding the value."""
    if isinstance(plot, dict) and plot.get("__type__") == "update":
        plot = plot.get("value")
    return [trace.get("name") for trace in json.loads(plot["plot"])["data"]] if plot else []


def generate(client, prompt=SHORT_PROMPT, drafter="block", verifier="tev", budget=8, temperature=1.0, max_new=16, seed=0, compare_ar=False):
    """A Live run at the fixed ``budget`` (budget auto off: it is the page's default)."""
    return named(LiveView._fields, client.predict(prompt, drafter, verifier, budget, temperature, max_new, seed, compare_ar, False, 1.0, 0, False, api_name="/generate"))


def test_api_lists_the_documented_endpoints(client):
    endpoints = set(client.view_api(print_info=False, return_format="dict")["named_endpoints"])
    assert {"/generate", "/browse_round", "/export", "/verifier_lab", "/exittrain", "/exittrain_cancel", "/compare_shipped"} <= endpoints


def test_generate_names_its_parameters_by_the_live_settings(client):
    from tev.service.live_settings import LiveSettings

    parameters = client.view_api(print_info=False, return_format="dict")["named_endpoints"]["/generate"]["parameters"]
    assert [p["parameter_name"] for p in parameters] == list(LiveSettings.names())  # one list of settings, named once
    by_name = client.predict(prompt=SHORT_PROMPT, drafter="block", verifier="tev", budget=4, temperature=0.0, max_new_tokens=4, seed=0,
                             compare_ar=False, chat=False, top_p=1.0, top_k=0, auto=False, api_name="/generate")
    assert named(LiveView._fields, by_name)["summary"]["tokens"] == 4


def test_a_short_continuation_of_a_long_answer_says_why_it_has_no_speed_ratio():
    import types

    from tev.engine.decode import DecodeConfig
    from tev.engine.run_speed import MIN_TIMED_TOKENS, Speed
    from visual.live_words import stats_markdown

    rounds = [types.SimpleNamespace(block_length=1, emitted=[0] * 10, flow=types.SimpleNamespace(tau_bound=1.5), choice=None, drafter="block")] * 5
    summary = types.SimpleNamespace(stop_reason="max_new_tokens", time_to_first_token=0.01, tokens_per_second=9.0)
    config = DecodeConfig(budget=4, max_new_tokens=10)
    stats = stats_markdown(rounds, summary, config, Speed(shown=9.0, added=10))  # 50 tokens in all, this Continue's 10
    assert 50 >= MIN_TIMED_TOKENS > 10 and "No speed comparison: 10 tokens (this Continue added) are too few" in stats
    assert "No speed comparison" not in stats_markdown(rounds, summary, config, Speed(shown=9.0, added=50))


def test_a_continuation_samples_with_a_seed_of_its_own():
    """A Continue must not reuse the numbers that drew the answer so far (prompt + answer would then not be a sample
    of the target): its seed comes from the answer's seed and where it starts, the same for the same press."""
    from tev.service.live_runs import continuation_seed
    from tev.service.service import LIMITS

    seeds = {continuation_seed(seed, position) for seed in (0, 1, 7) for position in (10, 11, 250)}
    assert len(seeds) == 9 and all(0 <= s <= LIMITS.max_seed for s in seeds) and not seeds & {0, 1, 7}
    assert continuation_seed(7, 250) == continuation_seed(7, 250)


def test_the_load_test_sends_the_live_settings_by_their_names():
    import dataclasses

    from tev.drive.loadtest import LOAD_DEFAULTS, live_request
    from tev.service.live_settings import LiveSettings

    sent = live_request("p", "path", "tev", 8, top_p=0.9)  # positional in the page's order, then by name
    assert isinstance(sent, LiveSettings) and list(dataclasses.asdict(sent)) == list(LiveSettings.names())
    assert (sent.drafter, sent.budget, sent.top_p, sent.temperature, sent.auto) == ("path", 8, 0.9, LOAD_DEFAULTS["temperature"], False)
    assert set(LOAD_DEFAULTS) <= set(LiveSettings.names())


def test_a_refusal_goes_under_the_input_its_field_names():
    import gradio as gr

    from tev.service.service import UserInputError
    from ui.components import validator

    inputs = [gr.Textbox(label="prompt"), gr.Number(label="seed"), gr.Number(label="top-k")]

    def check(prompt, seed, top_k):
        raise UserInputError("the seed must not be what the prompt says", "top_k")  # its words name others: the field decides

    verdicts = validator(inputs, check)("x", 1, 2)
    assert [v["is_valid"] for v in verdicts] == [True, True, False] and verdicts[2]["message"].startswith("the seed")


def test_live_tau_counts_the_tokens_the_answer_got_not_the_blocks_past_its_end():
    import types

    from visual.live_words import run_summary, stats_markdown

    def round_of(length, emitted):
        return types.SimpleNamespace(block_length=length, emitted=list(range(emitted)), flow=types.SimpleNamespace(tau_bound=length + 0.5), choice=None, drafter="block")

    # the case: the last round accepted <|im_end|>, a newline and <|im_end|>, and drew a bonus: 4 tokens, none emitted
    records = [round_of(2, 2), round_of(1, 1), round_of(4, 0)]
    summary = run_summary(records, None)
    assert summary["tau"] == pytest.approx(3 / 3) and summary["mean_block_length"] == pytest.approx(7 / 3)
    stats = stats_markdown(records, None)
    assert "**tokens** 3 · **tau** 1.00 · **mean block length** 2.33 · **mean 1 + C** 2.83" in stats


def test_generate_streams_rounds_and_is_reproducible(client):
    fixed = (False, 1.0, 0, False)  # chat, top-p, top-k, budget auto: a fixed budget, whose seeded text repeats
    job = client.submit(SHORT_PROMPT, "block", "tev", 8, 1.0, 64, 7, True, *fixed, api_name="/generate")
    final = named(LiveView._fields, job.result())
    assert len(job.outputs()) >= 2  # at least the first round and the final update
    stats = final["stats"]
    assert "rounds" in stats and "timed again with no other run in this app's line" in stats and "one-token steps" in stats
    assert "the same settings and seed" in stats and "the same text" not in stats  # at T > 0 plain decoding samples its own text
    assert re.search(r"on \d+ torch thread", stats)  # the thread setting it was timed under
    assert re.search(r"→ \*\*\d+\.\d\dx\*\*", stats)  # the speedup of the quiet rerun over plain decoding
    assert "tev-" in final["text"] and "bonus" in final["text"]
    summary = final["summary"]  # the same run in numbers, for tools (they read this, never the sentences)
    assert f"**tau** {summary['tau']:.2f}" in stats and f"**mean block length** {summary['mean_block_length']:.2f}" in stats and f"**rounds** {summary['rounds']}" in stats
    assert summary["tau"] == pytest.approx(summary["tokens"] / summary["rounds"])
    assert f"→ **{summary['timing']['speedup']:.2f}x**" in stats and f"{summary['tokens_per_second']:.1f} tokens/s as this page received the answer" in stats
    assert summary["drafter"] == "block" and summary["stop_reason"] in ("eos", "max_new_tokens")
    assert "nodes" in traces(final["tree"]) and traces(final["mass"]) and traces(final["timeline"])
    again = named(LiveView._fields, client.submit(SHORT_PROMPT, "block", "tev", 8, 1.0, 64, 7, True, *fixed, api_name="/generate").result())
    assert again["text"] == final["text"]  # same seed, same text and the same round colouring
    other = named(LiveView._fields, client.submit(SHORT_PROMPT, "block", "tev", 8, 1.0, 64, 8, True, *fixed, api_name="/generate").result())
    assert other["text"] != final["text"]  # another seed samples another text: the seed is what fixes it


def test_a_short_answer_gets_no_speed_ratio_and_says_why(client):
    stats = generate(client, max_new=MIN_TIMED_TOKENS // 4, compare_ar=True)["stats"]
    assert "too few to time" in stats and "timed again" not in stats and not re.search(r"\d\.\d\dx", stats)


def test_budget_zero_says_plain_decoding_without_a_tree_or_a_ratio(client):
    stats = generate(client, budget=0, temperature=0.0, max_new=48, compare_ar=True)["stats"]
    assert "budget 0 drafts nothing" in stats and "the same text" in stats  # greedy: the plain run writes the same text
    assert "tree" not in stats.split("timed again")[1] and not re.search(r"\d\.\d\dx", stats)


def test_a_run_that_stops_at_the_length_says_so(client):
    stats = generate(client, max_new=4)["stats"]
    assert "at the length limit (4 new tokens)" in stats or "the answer ended" in stats


@pytest.mark.parametrize("drafter,verifier,temperature", [("chain", "predraw", 0.7), ("block", "sequential", 1.3), ("block", "greedy", 0.0)])
def test_every_drafter_and_verifier_runs(client, drafter, verifier, temperature):
    stats = generate(client, drafter=drafter, verifier=verifier, temperature=temperature, max_new=8)["stats"]
    assert "rounds" in stats


def test_browse_rounds_and_export(client):
    job = client.submit(SHORT_PROMPT, "block", "tev", 8, 1.0, 12, 3, False, api_name="/generate")
    job.result()
    # browse and export act on this session's state: the same client session keeps it
    browsed = named(RoundView._fields, client.predict(1, api_name="/browse_round"))
    assert "round 1" in browsed["info"] and "1 + C" in browsed["info"] and "nodes" in traces(browsed["tree"])
    path = client.predict(api_name="/export")
    with open(path) as handle:
        payload = json.load(handle)
    assert payload["rounds"] and payload["rounds"][0]["round"] == 0
    first = payload["rounds"][0]
    assert abs(sum(first["exit_weight"]) - 1.0) < 1e-3 and first["path"][0] == 0


def test_verifier_lab_synthetic_and_prompt(client):
    table = named(LabView._fields, client.predict("synthetic example", SHORT_PROMPT, "block", 16, 1.0, 500, 0, api_name="/verifier_lab"))["table"]
    assert "| tev |" in table and "| predraw |" in table and "| sequential |" in table
    table = named(LabView._fields, client.predict("prompt", SHORT_PROMPT, "block", 8, 1.0, 300, 1, api_name="/verifier_lab"))["table"]
    assert "1 + C" in table


def test_budget_zero_drafts_nothing_and_decodes_plainly(client):
    stats = generate(client, budget=0, max_new=6)["stats"]
    assert "**tau** 1.00 · **mean block length** 1.00" in stats  # one token per target forward, not a silent budget of 1


def test_tiny_exittrain_run(client):
    job = client.submit("math", "exit", 5, 16, api_name="/exittrain")
    result = named(ExitTrainView._fields, job.result())
    assert result["status"].startswith("trained 5 steps")
    assert "Held-out 1 + C" in result["table"] and re.search(r"no measurable change|\(a gain\)|\(a loss\)", result["table"])  # the paired change, in words
    assert traces(result["compare"]) and "nodes" in traces(result["tree_base"]) and "nodes" in traces(result["tree_trained"])


# Out-of-range numbers are refused by the event's validator, by the input's name and range, before the handler
# runs, as unknown choices are. Each message names what to change.
RANGE = r"must be from \d"
CHOICE = r"must be one of"  # an unknown choice, likewise


@pytest.mark.parametrize(
    "args,message",
    [
        (dict(prompt=""), "prompt is empty"),
        (dict(prompt="   \n\t "), "prompt is empty"),
        (dict(budget=-1), RANGE),
        (dict(budget=10_000), RANGE),
        (dict(temperature=9.0), RANGE),
        (dict(max_new=0), RANGE),
        (dict(seed=-5), RANGE),
        (dict(drafter="medusa"), CHOICE),
        (dict(verifier="eagle"), CHOICE),
        (dict(verifier="greedy", temperature=1.0), "greedy verifier needs temperature 0"),
        (dict(prompt="x" * 5000), "shorten it"),
        (dict(prompt="def f():\n" * 200), "context"),
    ],
)
def test_bad_inputs_get_clear_errors(client, args, message):
    with pytest.raises(Exception) as caught:
        generate(client, **args)
    assert re.search(message, str(caught.value)), str(caught.value)


def test_browse_before_generating_is_a_clear_error(app_server):
    fresh = Client(app_server.url, verbose=False)
    with pytest.raises(Exception, match="generate first"):
        fresh.predict(1, api_name="/browse_round")


def test_chat_mode_on_a_target_without_a_template_says_what_to_change(client):
    with pytest.raises(Exception, match="no chat template"):
        client.predict(SHORT_PROMPT, "block", "tev", 8, 1.0, 8, 0, False, True, api_name="/generate")


def generate_auto(client, cap=8, seed=0, max_new=16, temperature=1.0):
    """A Live run at budget auto (the slider's value is the cap)."""
    return named(LiveView._fields, client.predict(SHORT_PROMPT, "block", "tev", cap, temperature, max_new, seed, False, False, 1.0, 0, True, api_name="/generate"))


def exported(client) -> dict:
    with open(client.predict(api_name="/export")) as handle:
        return json.load(handle)


def test_budget_auto_shows_each_rounds_choice(client):
    final = generate_auto(client)
    assert "budget auto" in final["stats"] and "cap 8" in final["stats"]
    assert "chosen" in traces(final["choice"]) and "tree size k (auto)" in traces(final["timeline"])
    browsed = named(RoundView._fields, client.predict(1, api_name="/browse_round"))
    assert "budget auto chose" in browsed["info"] and "chosen" in traces(browsed["choice"])
    payload = exported(client)
    assert payload["settings"]["budget"] == "auto" and payload["settings"]["budget_cap"] == 8
    for r in payload["rounds"]:
        assert r["auto_budget"]["size"] == r["budget"] <= 8
    assert payload["summary"]["tree_sizes"] == [r["budget"] for r in payload["rounds"]]
    assert traces(generate(client)["choice"]) == []  # a fixed budget made no choice: no budget figure


def test_budget_auto_learns_within_a_browser_session_only(app_server):
    def first_round(client) -> dict:
        return exported(client)["rounds"][0]["auto_budget"]

    def fresh(choice) -> bool:  # no past round: calibration at its prior, the rate the tree's own best
        return choice["calibration"] == 1.0 and choice["going_rate"] == max(choice["rate_by_size"])

    first, other = Client(app_server.url, verbose=False), Client(app_server.url, verbose=False)
    generate_auto(first, seed=1)
    assert fresh(first_round(first))  # a new session starts from nothing
    generate_auto(first, seed=2)
    assert not fresh(first_round(first))  # its next answer starts from what the first taught
    generate_auto(other, seed=2)
    assert fresh(first_round(other))  # another user's session learned nothing from it


def test_budget_auto_with_a_cap_of_zero_decodes_plainly(client):
    final = generate_auto(client, cap=0, max_new=6)
    assert "**tau** 1.00 · **mean block length** 1.00" in final["stats"] and "budget auto" not in final["stats"] and traces(final["choice"]) == []


def test_a_slower_run_at_budget_auto_says_why_in_the_machines_terms():
    from tev.engine.decode import DecodeConfig, GenerationSummary
    from visual.live_words import speed_verdict

    def summary(tokens, seconds, rounds, stages=None, lengths=None):
        return GenerationSummary([1], list(range(tokens)), "", rounds, lengths or [1] * rounds, [1.0] * rounds, seconds, 0.0, 0.01, "max_new_tokens",
                                 stage_seconds=stages or {})

    spec = summary(64, 4.0, 40, {"draft": 0.4, "build": 0.04, "forward": 3.0, "head": 0.4, "verify": 0.16}, [2] * 24 + [1] * 16)
    plain = summary(64, 3.2, 64)
    verdict = speed_verdict(spec, plain, DecodeConfig(budget="auto", budget_cap=16, temperature=0.7, top_p=0.9))
    assert "**0.80x**" in verdict and "Speculation did not pay on this prompt, on this machine" in verdict
    assert "fixed work (the drafter's pass and the decision, 25 ms here)" in verdict and "tau 1.60" in verdict
    fixed = speed_verdict(spec, plain, DecodeConfig(budget=16, temperature=0.7, top_p=0.9))
    assert "a smaller budget" in fixed and "did not pay on this prompt" not in fixed
    assert "did not pay" not in speed_verdict(plain, spec, DecodeConfig(budget="auto", budget_cap=16))  # faster: no excuse


def test_a_retiming_counts_the_runs_that_shared_the_machine():
    import types

    from tev.engine.decode import GenerationSummary
    from tev.service.service import ModelService

    def summary(reason="max_new_tokens"):
        return GenerationSummary([1], [2, 3], "", 2, [1, 1], [1.0, 1.0], 1.0, 0.0, 0.01, reason)

    def service(active: list[int]):
        """A service whose compute thread reports ``active`` requests at each poll (this request included)."""
        counts = iter(active)
        found = ModelService.__new__(ModelService)
        found.compute = types.SimpleNamespace(active=lambda: next(counts, 1), threads=None, count_now=lambda: None)

        def generate(request, should_stop, sizing=None):
            for _ in range(3):
                if should_stop():
                    return summary("cancelled")
                yield None
            return summary()

        found.generate = generate
        found.autoregressive = lambda ids, config, should_stop, threads=None: summary("cancelled" if should_stop() else "max_new_tokens")
        return found

    request = types.SimpleNamespace(prompt_ids=(1,), config=None, drafter=None)
    alone = service([1, 1, 1, 1]).retime(request, lambda: False)
    assert alone.measured and alone.others == 0
    shared = service([1, 3, 2, 1]).retime(request, lambda: False)  # two other requests took turns during one round
    assert shared.measured and shared.others == 2
    stopped = service([2]).retime(request, lambda: True)  # stopped at its first poll, which saw one other request
    assert not stopped.measured and stopped.autoregressive is None and stopped.others == 1


def test_the_speed_sentence_says_how_it_was_timed_or_why_it_was_not():
    import types

    from tev.engine.decode import DecodeConfig, GenerationSummary
    from tev.service.service import Retiming
    from tev.engine.run_speed import Machine, Speed
    from visual.live_words import run_summary, speed_verdict, stats_markdown

    def summary(tokens, seconds, rounds, reason="max_new_tokens"):
        return GenerationSummary([1], list(range(tokens)), "", rounds, [2] * rounds, [1.0] * rounds, seconds, 0.0, 0.01, reason, stage_seconds={"forward": seconds})

    spec, plain, config = summary(64, 3.0, 32), summary(64, 2.2, 64), DecodeConfig(budget=16, temperature=0.7, top_p=0.9, max_new_tokens=64)
    alone = speed_verdict(spec, plain, config)
    assert "timed again with no other run in this app's line" in alone and "shared" not in alone and "idle" not in alone
    quiet = speed_verdict(spec, plain, config, load=(0.4, 2))  # the machine's load said as measured, never "idle"
    assert "The machine's load average was 0.4 on 2 CPUs as it began" in quiet
    loaded = speed_verdict(spec, plain, config, load=(9.5, 2))  # other processes on the machine: beside the measured reason, not in its place
    verdict, details = loaded.split("\n\n")
    assert "other processes loaded the machine (load average 9.5 on 2 CPUs)" in details and "load" not in verdict
    assert "**0.73x**. Why: a round of the re-timing cost **2.7 one-token steps** and gave **tau 2.00** tokens" in verdict  # the measured reason, where the verdict is
    shared = speed_verdict(spec, plain, config, others=2)  # never called idle when it was not
    assert "timed again while 2 other runs shared the machine" in shared and "idle" not in shared and "lower than it gives one run alone" in shared
    records = [types.SimpleNamespace(block_length=2, emitted=[1, 2], flow=types.SimpleNamespace(tau_bound=2.5), choice=None, drafter="block")] * 32
    stats = stats_markdown(records, summary(64, 3.0, 32, "eos"), config, Speed(shown=7.25, timing=Retiming(spec, plain, 1)))
    assert "timed again while 1 other run shared the machine" in stats and "7.2 tokens/s as this page received the answer" in stats
    # the re-timing names the thread counts its steps ran with: the lone count, and fewer while other work shared the machine
    machine = Machine(2, "2 torch threads, 1 when cores are busy", "row-invariant float32")
    alone_at_2 = stats_markdown(records, summary(64, 3.0, 32, "eos"), config, Speed(timing=Retiming(spec, plain, 0, (2,))), machine)
    assert "on 2 torch threads, the target's row-invariant float32 forward" in alone_at_2
    both = stats_markdown(records, summary(64, 3.0, 32, "eos"), config, Speed(timing=Retiming(spec, plain, 1, (1, 2))), machine)
    assert "on 2 torch threads (1 while another process used a core), the target's row-invariant float32 forward" in both
    assert run_summary(records, summary(64, 3.0, 32, "eos"), Speed(timing=Retiming(spec, plain, 1, (1, 2))), machine)["timing"]["thread_counts"] == [1, 2]
    stopped = stats_markdown(records, summary(64, 3.0, 32, "cancelled"), config, Speed(shown=7.0))  # after Stop, a word on the speed too
    # two pages at once: the first text reached the browser 10.7 s after the press where the page said 787 ms
    waited = stats_markdown(records, summary(64, 3.0, 32, "eos"), config, Speed(shown=3.1, waited=9.9, crowd=1))
    assert "time to first token 9910 ms (9.9 s of it in this app's line behind other runs)" in waited
    assert "3.1 tokens/s as this page received the answer, from the press (1 other run shared the machine while it streamed" in waited
    assert "No speed comparison: you pressed Stop" in stopped
    for reason, words in (("stop", "you pressed Stop during the re-timing"), ("ended", "you pressed Stop as the answer ended"),
                          ("generate", "you pressed Generate during the re-timing")):
        stats = stats_markdown(records, summary(64, 3.0, 32, "eos"), config, Speed(timing=Retiming(summary(10, 1.0, 5, "cancelled"), None, 0), unmeasured=reason))
        assert f"**speed not measured**: {words}" in stats and "**speed, timed" not in stats


def test_an_answer_is_not_re_timed_while_others_wait_and_says_whose_figure_it_gives(monkeypatch):
    """Twelve visitors at the opening settings each waited for every answer's re-timing (median 200 s): while other
    runs wait in the app's line the answer is not re-timed; it says so, and gives the machine's latest re-timing
    that ran alone, named as such and never as this answer's "timed"."""
    import types

    from tev.engine.decode import DecodeConfig, GenerationSummary
    from tev.engine.run_speed import Speed
    from tev.service.live_runs import Asked, LiveRuns
    from tev.service.service import IdleTimings, Retiming
    from visual import live_words

    def summary(tokens, seconds, rounds, reason="max_new_tokens"):
        return GenerationSummary([1], list(range(tokens)), "", rounds, [2] * rounds, [1.0] * rounds, seconds, 0.0, 0.01, reason, stage_seconds={"forward": seconds})

    config = DecodeConfig(budget="auto", budget_cap=16, temperature=0.7, top_p=0.9, max_new_tokens=64)
    kind, timings = IdleTimings.kind("path", config), IdleTimings()
    timings.remember(kind, Retiming(summary(64, 4.0, 32), summary(64, 8.0, 64), 2), (1.0, 2))  # shared: never kept as an idle figure
    assert timings.latest(kind) is None
    timings.remember(kind, Retiming(summary(64, 4.0, 32), summary(64, 8.0, 64), 0), (1.2, 2))
    retimed = []
    service = types.SimpleNamespace(others_waiting=lambda: 3, idle_timings=timings, retime=lambda *args: retimed.append(args))
    asked = Asked((1,), "", "path", config, True, session="frank")
    steps = LiveRuns()._timed_again(service, None, None, [types.SimpleNamespace(drafter="path")], None, asked, Speed(shown=5.0))
    with pytest.raises(StopIteration) as end:
        next(steps)  # nothing shown, nothing timed: the answer ends at once
    speed = end.value.value
    assert not retimed and speed.unmeasured == "busy" and speed.waiting == 3 and speed.recalled is timings.latest(kind)
    said = live_words.speed_line(speed, config)
    assert said.startswith("**speed not re-timed**: 3 other runs were in this app's line") and "timed again" not in said
    assert "latest re-timing of the same kind of run that had the app to itself" in said and "load average 1.2 on 2 CPUs then" in said and "**2.00x**" in said
    assert "No re-timing of this kind of run has yet run alone here" in live_words.not_retimed(1, None, config)


def test_live_says_when_it_serves_the_adapted_drafter():
    from ui.live import _adapted_note

    note = _adapted_note("adapted: my prompts #k3y")  # an API name: its key is never shown
    assert note.startswith("**served: your adapted drafter my prompts**") and "k3y" not in note
    assert _adapted_note("block") is None


def test_a_finished_run_opens_at_a_round_that_teaches_not_its_last():
    """The last round was often a stub as the answer ran out (B = 1-2, C = 0), and the fullest tree often a degenerate
    one (all its mass on one path: C(T) a whole number, nothing to see in the colours): the figures open at the most
    target mass among the rounds whose mass leaves the tree at more than one node, and the sentence says which and why."""
    import types

    import torch

    from visual.live_words import opened_at, teaching_round

    def round_of(budget, coverage, exits=(0.5, 0.5)):
        flow = types.SimpleNamespace(coverage=coverage, exit_weight=torch.tensor(exits))
        return types.SimpleNamespace(tree=types.SimpleNamespace(size=budget), flow=flow)

    records = [round_of(8, 0.9), round_of(16, 0.4), round_of(16, 4.0, (0.0, 1.0)), round_of(11, 1.2), round_of(16, 1.2), round_of(2, 0.0, (1.0,))]
    assert teaching_round(records) == 4  # C = 1.2 spread over two nodes, the fuller of two; not the degenerate C = 4.000
    said = opened_at(records, 4)
    assert "round 5 of 6 (B = 16, C(T) = 1.200), chosen to teach" in said and "among the 4 rounds whose mass leaves the tree at more than one node" in said
    greedy = [round_of(16, 3.0, (0.0, 1.0)), round_of(16, 5.0, (1.0, 0.0))]  # at T = 0 every round's mass leaves at one node
    assert teaching_round(greedy) == 1 and "in every round the target was sure along one path" in opened_at(greedy, 1, greedy=True)
    assert "(as always at T = 0)" in opened_at(greedy, 1, greedy=True)
    assert opened_at([round_of(0, 0.0, (1.0,))], 0) == ""  # budget 0: every round is the root alone


def test_a_run_drawing_its_figures_still_counts_as_waiting_for_the_machine():
    """Another Live run between its compute turns (checking, drawing its figures) is in the app's line too: on the quick
    pair 16 of 163 answers were re-timed beside 11 other visitors when only the compute thread's line was counted."""
    from tev.service.service import ModelService

    service = ModelService()
    with service.serving():  # this run, its compute work done
        assert service.others_waiting() == 0
        with service.serving():  # another visitor's run, drawing its figures
            assert service.others_waiting() == 1
        assert service.others_waiting() == 0


def test_continue_goes_on_from_an_answer_cut_at_the_length_limit_as_one_longer_greedy_answer(chat_server):
    """Continue after a cut answer: its rounds join the answer, numbered after it, and at T = 0 the whole equals one
    answer asked for the sum of the lengths (greedy speculation is greedy decoding); nothing to continue is refused."""
    import types

    import gradio as gr

    from tests.tiny import CHAT_WORDS
    from ui.live import LiveView, check_continue, continue_live, run_live

    visitor = types.SimpleNamespace(session_hash="carol")
    prompt = " ".join(CHAT_WORDS[:5])

    def answer(views) -> tuple[list[int], dict]:
        final = LiveView(*views[-1])
        return [t for record in final.state["records"] for t in record.emitted], final

    whole, _ = answer(list(run_live(prompt, "block", "tev", 4, 0.0, 12, 0, False, False, 1.0, 0, request=visitor)))
    first, cut = answer(list(run_live(prompt, "block", "tev", 4, 0.0, 6, 0, False, False, 1.0, 0, request=visitor)))
    assert cut.state["summary"].stop_reason == "max_new_tokens" and cut.more["visible"] is True
    more, went_on = answer(list(continue_live(cut.state, None, visitor)))
    assert more[: len(first)] == first and more == whole[: len(more)] and len(more) > len(first)
    rounds = went_on.state["records"]
    assert [r.index for r in rounds] == list(range(len(rounds)))  # the new rounds numbered after the first ones
    assert went_on.summary["tokens"] == len(more)
    presses = went_on.state["settings"]["presses"]  # the export says each press's seed and first round
    assert [p["first_round"] for p in presses] == [0, len(cut.state["records"])] and presses[0]["seed"] == 0 != presses[1]["seed"]
    with pytest.raises(ValueError, match="press Generate first"):
        check_continue({"records": [], "summary": None})
    ended = {**went_on.state, "summary": types.SimpleNamespace(stop_reason="eos")}  # an answer that ended on its own
    with pytest.raises(ValueError, match=r"not cut at the length limit \(the answer ended\)"):
        check_continue(ended)
    with pytest.raises(gr.Error, match="nothing to continue"):
        list(continue_live(ended, None, visitor))


def test_generate_pressed_during_a_continue_ends_it_without_drawing_over_the_new_run(chat_server):
    """Continue and Generate are two events: a Generate pressed while a Continue streams would run beside it into the
    same outputs. The press ends the Continue after its round, and the Continue draws nothing more."""
    import types

    from tests.tiny import CHAT_WORDS
    from ui.live import LiveView, arm_stop, continue_live, run_live

    visitor = types.SimpleNamespace(session_hash="dave")
    cut = LiveView(*list(run_live(" ".join(CHAT_WORDS[:5]), "block", "tev", 4, 0.0, 6, 0, False, False, 1.0, 0, request=visitor))[-1])
    going = continue_live(cut.state, None, visitor)
    first = LiveView(*next(going))
    assert first.state["summary"] is None  # streaming
    arm_stop(visitor)  # Generate pressed in the same session
    rest = list(going)
    assert all(LiveView(*view).state is None or LiveView(*view).state.get("summary") is None for view in rest)  # no finished view
    again = LiveView(*list(continue_live(cut.state, None, types.SimpleNamespace(session_hash="erin")))[-1])  # another session's is its own
    assert again.state["summary"].stop_reason in ("max_new_tokens", "eos")


def test_every_tab_opens_on_the_pairs_default_drafter(monkeypatch):
    """Live, the Walkthrough and the Verifier lab open on one drafter: the pair's default (here a pair
    whose default is the path drafter), not each tab a kind of its own."""
    import gradio as gr

    import app
    from ui import shared

    monkeypatch.setattr(shared.SERVICE, "drafter_kinds", lambda: ["block", "exittrain", "path", "chain", "ar"])
    monkeypatch.setattr(shared.SERVICE, "default_drafter_kind", lambda: "path")
    demo = app.build_app()
    radios = {block.elem_id or block.label: block.value for block in demo.blocks.values()
              if isinstance(block, gr.Radio) and (block.label or "").startswith("drafter")}
    assert len(radios) >= 3, radios  # Live, Walkthrough, Verifier lab
    assert set(radios.values()) == {"path"}, radios


def test_the_speed_verdict_names_the_re_timings_tau_beside_the_answers():
    """The headline's tau is the answer's; the verdict's is the re-timing's (budget auto sizes its trees by the clock of
    its own moment, so they differ): each is named as whose it is."""
    from tev.engine.decode import DecodeConfig, GenerationSummary
    from visual.live_words import speed_verdict

    def summary(tokens, seconds, rounds):
        return GenerationSummary([1], list(range(tokens)), "", rounds, [2] * rounds, [1.0] * rounds, seconds, 0.0, 0.01, "eos", stage_seconds={"forward": seconds})

    spec, plain, at_auto = summary(58, 3.0, 40), summary(64, 4.0, 64), DecodeConfig(budget="auto", budget_cap=16, temperature=0.7, top_p=0.9)
    differs = speed_verdict(spec, plain, at_auto, own=(1.68, False)).split("\n\n")[0]
    assert "gave **tau 1.45** tokens (the answer's rounds above gave tau 1.68: budget auto sized the re-timing's trees" in differs
    assert "(as this Continue's rounds)" in speed_verdict(spec, plain, at_auto, own=(1.45, True))


def test_the_round_browser_names_a_round_that_teaches_little(client):
    """A finished run fills the round browser's sentence at once (it was empty until a round was browsed), and a
    round whose mass lies on one path, or a one-deep fan, is named as such where it is drawn."""
    import types

    import torch

    from visual.live_words import round_info

    result = generate(client)
    opened = re.search(r"round (\d+) of", result["stats"])
    assert opened and result["info"].startswith(f"round {opened.group(1)}:")

    def record(parents, exits):
        tree = types.SimpleNamespace(size=len(parents) - 1, depths=torch.tensor([0] + [1 + (p > 0) for p in parents[1:]]))
        flow = types.SimpleNamespace(coverage=1.0, tau_bound=2.0, exit_weight=torch.tensor(exits))
        verdict = types.SimpleNamespace(exit_node=1, block_length=2, accepted_tokens=lambda tree: [5])
        return types.SimpleNamespace(index=0, tree=tree, flow=flow, verdict=verdict, block_length=2, accepted_tokens=[5], choice=None)

    assert "its mass on one path" in round_info(record([-1, 0, 1], [0.0, 0.0, 1.0]))
    assert "a one-deep fan: all 3 nodes" in round_info(record([-1, 0, 0, 0], [0.1, 0.5, 0.3, 0.1])).replace("**", "")
    assert "**" not in round_info(record([-1, 0, 1], [0.2, 0.3, 0.5]))  # a round that spreads its mass, two deep: nothing to flag
