"""The app's API through gradio_client against a real server started by the test."""

import json
import re

import pytest
from gradio_client import Client

SHORT_PROMPT = "def add(a, b):\n    "


@pytest.fixture(scope="module")
def client(app_server):
    return Client(app_server.url, verbose=False)


def generate(client, prompt=SHORT_PROMPT, drafter="block", verifier="tev", budget=8, temperature=1.0, max_new=16, seed=0, compare_ar=False):
    return client.predict(prompt, drafter, verifier, budget, temperature, max_new, seed, compare_ar, api_name="/generate")


def test_api_lists_the_documented_endpoints(client):
    endpoints = set(client.view_api(print_info=False, return_format="dict")["named_endpoints"])
    assert {"/generate", "/browse_round", "/export", "/verifier_lab", "/exittrain", "/exittrain_cancel", "/compare_shipped"} <= endpoints


def test_generate_streams_rounds_and_is_reproducible(client):
    job = client.submit(SHORT_PROMPT, "block", "tev", 8, 1.0, 16, 7, True, api_name="/generate")
    final = job.result()
    streamed = job.outputs()
    assert len(streamed) >= 2  # at least the first round and the final update
    text_html, tree, mass, timeline, stats, rounds = final  # the per-session state is not an API output
    assert "rounds" in stats and "timed again with the page idle" in stats and "one-token steps" in stats
    assert re.search(r"→ \*\*\d+\.\d\dx\*\*", stats)  # the speedup of the quiet rerun over plain decoding
    assert "tev-" in text_html and "bonus" in text_html
    assert tree is not None and timeline is not None and mass is not None
    again = client.submit(SHORT_PROMPT, "block", "tev", 8, 1.0, 16, 7, True, api_name="/generate").result()
    assert again[0] == text_html  # same seed, same text and the same round colouring
    other = client.submit(SHORT_PROMPT, "block", "tev", 8, 1.0, 16, 8, True, api_name="/generate").result()
    assert other[0] != text_html  # another seed samples another text: the seed is what fixes it


@pytest.mark.parametrize("drafter,verifier,temperature", [("chain", "predraw", 0.7), ("block", "sequential", 1.3), ("block", "greedy", 0.0)])
def test_every_drafter_and_verifier_runs(client, drafter, verifier, temperature):
    stats = generate(client, drafter=drafter, verifier=verifier, temperature=temperature, max_new=8)[4]
    assert "rounds" in stats


def test_browse_rounds_and_export(client):
    job = client.submit(SHORT_PROMPT, "block", "tev", 8, 1.0, 12, 3, False, api_name="/generate")
    job.result()
    # browse and export act on this session's state: the same client session keeps it
    tree, mass, info = client.predict(1, api_name="/browse_round")
    assert "round 1" in info and "1 + C" in info
    path = client.predict(api_name="/export")
    with open(path) as handle:
        payload = json.load(handle)
    assert payload["rounds"] and payload["rounds"][0]["round"] == 0
    first = payload["rounds"][0]
    assert abs(sum(first["exit_weight"]) - 1.0) < 1e-3 and first["path"][0] == 0


def test_verifier_lab_synthetic_and_prompt(client):
    figure, tree, table = client.predict("synthetic example", SHORT_PROMPT, "block", 16, 1.0, 500, 0, api_name="/verifier_lab")
    assert "| tev |" in table and "| predraw |" in table and "| sequential |" in table
    figure, tree, table = client.predict("prompt", SHORT_PROMPT, "block", 8, 1.0, 300, 1, api_name="/verifier_lab")
    assert "1 + C" in table


def test_budget_zero_drafts_nothing_and_decodes_plainly(client):
    stats = generate(client, budget=0, max_new=6)[4]
    assert "**tau** (mean block length) 1.00" in stats  # one token per target forward, not a silent budget of 1


def test_tiny_exittrain_run(client):
    job = client.submit("math", "exit", 5, 16, api_name="/exittrain")
    curve, status, compare, table, mass, tree_base, tree_trained = job.result()
    assert status.startswith("trained 5 steps")
    assert "Held-out 1 + C" in table and re.search(r"no measurable change|\(a gain\)|\(a loss\)", table)  # the paired change, in words
    assert compare is not None and tree_base is not None and tree_trained is not None


# Out-of-range numbers and unknown choices are stopped by the component itself ("Value 0 is less than minimum
# value 1."), before our own check; both name the bound to respect.
RANGE = r"minimum value|maximum value"
CHOICE = r"not in the list of choices"  # the radio's own check, same idea


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
