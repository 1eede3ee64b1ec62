"""Reliability and security, the short versions of docs/reliability.md: load, faults, bad
input (the UI API and the command line), security settings.

Every server here is the real app (``python app.py``) on the quick assets; the ones that are
killed, or that serve a broken or slow model, are this module's own.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import platform
import random
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import torch
from gradio_client import Client

from tev.drive import loadtest
from tev.drive.appserver import REPO, AppServer
from tev.service.live_settings import LiveSettings
from tev.engine.decode import DecodeConfig, run_to_end, Request, speculative_generate
from tev.engine.models import ModelLoadError, load_bundle
from tev.engine.prompt_text import encode_prompt
from tev.util.memory import limit_malloc_arenas
from ui.live_rounds import RoundView

live_request, run_one, new_client = loadtest.live_request, loadtest.run_one, loadtest.new_client

PROMPT = "def add(a, b):\n    "
RANGE = r"minimum value|maximum value|must be from"  # the component's own range check, or the tab's validator naming the input
NOT_A_NUMBER = r"must be a number from"
CHOICES = r"not in the list of choices|must be one of"  # the component's own check, or the validator's
NOTHING = "nothing"  # answered with a warning: no error, the outputs left as they were
OK = "ok"  # a sane result (or clamp), no error


BUSY = 2 / 3  # a thread that computes is runnable ~0.96 of the time; an idle server's threads <= ~0.3


def busiest_thread(pid: int, seconds: float = 2.0) -> float:
    """The largest share, over the next ``seconds``, of moments at which one thread of ``pid``
    is runnable (state ``R`` in ``/proc``: on a core, or ready and waiting for one).

    A computing thread is runnable whether or not the machine gives it a core, so this reads
    near 1 for a server that keeps generating however loaded the machine is (CPU seconds
    would not: they shrink when other processes take the cores); an idle server's threads
    sleep in epoll or futex waits and wake only briefly. Moments are drawn at random, so
    they do not lock onto a thread's polling period.
    """
    draw = random.Random(0)
    runnable: dict[str, int] = {}
    samples = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        samples += 1
        for task in Path(f"/proc/{pid}/task").iterdir():
            try:
                state = (task / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:  # the thread ended meanwhile
                continue
            runnable[task.name] = runnable.get(task.name, 0) + (state == "R")
        time.sleep(draw.uniform(0.01, 0.05))
    return max(runnable.values(), default=0) / samples


def goes_idle(pid: int, within: float = 3.0) -> float:
    """The first :func:`busiest_thread` share under :data:`BUSY` over one-second windows for up to ``within`` seconds
    (else the last one): a stopped run's worker ends within a step, but a step, a collection or the OpenMP threads'
    spinning can fall inside the first window on a loaded machine; a run left computing stays busy throughout."""
    end = time.monotonic() + within
    while True:
        share = busiest_thread(pid, 1.0)
        if share < BUSY or time.monotonic() >= end:
            return share


def sha256_tree(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.rglob("*")) if p.is_file()}


def leave_after(url: str, settings: LiveSettings, until: str = "first", api: str = "/generate") -> subprocess.Popen:
    """A client in its own process that submits, then exits abruptly (a closed tab) once it
    sees its first streamed output, or an output whose stats contain ``until``."""
    code = f"""
import os, sys, time
from gradio_client import Client
job = Client({url!r}, verbose=False).submit(**{dataclasses.asdict(settings)!r}, api_name={api!r})
deadline = time.time() + 120
while time.time() < deadline and not job.done():
    outs = job.outputs()
    if outs and ({until!r} == "first" or {until!r} in str(outs[-1])):
        print("left", flush=True)
        os._exit(0)
    time.sleep(0.01)
print("never saw it", flush=True)
os._exit(1)
"""
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)


# =============================================================================== load
def test_short_load_test(app_server, tmp_path):
    """4 users for 20 s: no errors, identical seeds identical, own outputs, queue full refused."""
    command = [
        sys.executable, "-m", "tev", "bench", "loadtest", "--url", app_server.url, "--pid", str(app_server.pid),
        "--users", "4", "--seconds", "20", "--identical-copies", "3", "--rerun-sample", "6", "--queue-extra", "16", "--out", str(tmp_path),
    ]
    done = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300)
    report = json.loads((tmp_path / "loadtest.json").read_text())
    level = report["levels"][0]
    assert level["errors"] == 0 and level["hung_users"] == 0, level["errors_by_kind"]
    assert level["served"] >= 8
    assert level["latency_p95_s"] < 30 and level["queue_wait_p50_s"] < 10
    assert level["rss_growth_after_warmup"] is not None and level["rss_growth_after_warmup"] < loadtest.MEMORY_GOAL
    assert report["identical_seeds"]["passed"], report["identical_seeds"]
    assert report["own_outputs"]["passed"], report["own_outputs"]
    queue = report["queue_full"]
    assert queue["refused"] > 0 and queue["refusal_messages"] == ["Queue is full! Please try again."], queue
    assert queue["served_right_after"] and not queue["other_errors"]
    assert report["server_alive_at_end"] and report["passed"] and done.returncode == 0, done.stdout[-3000:]
    assert (tmp_path / "loadtest.md").read_text().count("| 4 |") == 1


def test_visitors_at_the_page_defaults_get_chat_answers(app_server):
    """``--page-defaults``: each request is a visitor at the page's opening settings as ``/generate`` declares them
    (its law, budget auto, the autoregressive re-timing, its drafter; chat where the pair has it, and the quick pair
    has none, so code prompts as text), with its own seed and prompt."""
    client = new_client(app_server.url)
    opening = loadtest.opening_settings(client)
    assert opening.auto and opening.compare_ar and opening.verifier == "tev" and not opening.chat and opening.drafter == "block"
    assert (opening.temperature, opening.top_p, opening.budget) == (0.7, 0.9, 16)
    settings = loadtest.page_settings(random.Random(0), 3, opening, max_new_tokens=12)
    assert settings.prompt.startswith("# user 3\n") and settings.prompt[len("# user 3\n"):] in loadtest.PROMPTS and settings.max_new_tokens == 12
    outcome = run_one(client, settings, 3, timeout=120)
    assert outcome.outcome == "ok" and outcome.tokens > 0, outcome.message


# =============================================================================== faults: clients that leave
@pytest.fixture(scope="module")
def slow_server(quick_assets_dir, tmp_path_factory):
    """The app serving a slow target (a random 6-layer, 384-wide model with a 2048 context, made
    here) with the quick target as its AR drafter (TEV_TARGET / TEV_DRAFT), and room for only
    four sessions (TEV_SESSION_CAPACITY): long generations to walk away from."""
    from transformers import LlamaConfig, LlamaForCausalLM

    source = quick_assets_dir / "models" / "target"
    folder = tmp_path_factory.mktemp("slow") / "target"
    config = json.loads((source / "config.json").read_text())
    config.update(hidden_size=384, intermediate_size=1024, num_hidden_layers=6, num_attention_heads=6, num_key_value_heads=6, head_dim=64, max_position_embeddings=2048)
    for key in ("architectures", "transformers_version"):
        config.pop(key, None)
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(**config)).save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(source / name, folder / name)
    env = {"TEV_TARGET": str(folder), "TEV_DRAFT": str(source), "TEV_SESSION_CAPACITY": "4"}
    server = AppServer(quick_assets_dir, folder.parent / "app.log", extra_env=env)
    try:
        server.wait_ready()
        run_one(new_client(server.url), live_request(PROMPT, drafter="chain", verifier="greedy", budget=4, temperature=0.0, max_new_tokens=4), 0)  # models loaded
        yield server
    finally:
        server.stop()


LONG = live_request(PROMPT, drafter="chain", verifier="greedy", budget=4, temperature=0.0, max_new_tokens=256, seed=0)


def test_clients_that_leave_free_their_slots_and_stop_generating(slow_server):
    """Two long generations take both slots (concurrency limit 2); one client cancels, the other
    vanishes, right after its first streamed output: a new request starts at once and the
    server goes idle (a generation left running would keep a thread computing for seconds)."""
    gone = leave_after(slow_server.url, LONG)
    job = loadtest.submit(LONG, new_client(slow_server.url))
    wait_for_output(job)
    job.cancel()
    assert gone.wait(timeout=120) == 0
    fresh = run_one(new_client(slow_server.url), live_request(PROMPT, drafter="chain", verifier="greedy", budget=4, temperature=0.0, max_new_tokens=8, seed=1), 0)
    assert fresh.outcome == "ok" and fresh.queue_wait < 2.0, (fresh.outcome, fresh.message, fresh.queue_wait)
    time.sleep(0.5)
    assert busiest_thread(slow_server.pid) < BUSY


def test_leaving_during_the_autoregressive_comparison_stops_it(slow_server):
    """The speedup's quiet reruns (speculation, then plain decoding) are one long call: they run in a worker that a closed
    generator stops. A client that vanishes there leaves the server idle, and a cancel there
    returns at once (before the fix: ~5 s more of CPU, and a /cancel that timed out)."""
    settings = dataclasses.replace(LONG, max_new_tokens=192, compare_ar=True)
    gone = leave_after(slow_server.url, settings, until="**re-timing**")
    assert gone.wait(timeout=120) == 0, gone.stdout.read()
    time.sleep(0.5)
    assert busiest_thread(slow_server.pid) < BUSY
    job = loadtest.submit(settings, new_client(slow_server.url))
    while not (job.outputs() and "**re-timing**" in str(job.outputs()[-1])):
        assert not job.done(), "the run ended before its autoregressive comparison"
        time.sleep(0.01)
    assert busiest_thread(slow_server.pid, 1.0) > BUSY  # the measure sees the worker computing
    start = time.perf_counter()
    job.cancel()
    assert time.perf_counter() - start < 2.5
    time.sleep(0.5)
    assert goes_idle(slow_server.pid) < BUSY


def test_old_sessions_are_dropped_beyond_the_session_capacity(slow_server):
    """Gradio keeps each session's state in memory; TEV_SESSION_CAPACITY (4 here) bounds it:
    the oldest session's rounds are gone (a clear "generate first"), the newest still browse."""
    clients = [new_client(slow_server.url) for _ in range(6)]
    short = live_request(PROMPT, drafter="chain", verifier="greedy", budget=4, temperature=0.0, max_new_tokens=4)
    for client in clients:
        assert run_one(client, short, 0).outcome == "ok"
    with pytest.raises(Exception, match="generate first"):
        clients[0].predict(1, api_name="/browse_round")
    assert "round 1" in clients[-1].predict(1, api_name="/browse_round")[RoundView._fields.index("info")]  # the round's line


# =============================================================================== faults: ExitTrain
@pytest.fixture(scope="module")
def exittrain_assets(quick_assets_dir, tmp_path_factory):
    """A private copy of the quick assets, with the sha256 of every file before any server ran."""
    folder = tmp_path_factory.mktemp("et") / "assets"
    shutil.copytree(quick_assets_dir, folder)
    return folder, sha256_tree(folder)


@pytest.fixture(scope="module")
def exittrain_server(exittrain_assets):
    folder, _ = exittrain_assets
    server = AppServer(folder, folder.parent / "app.log")
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


def wait_for_output(job, timeout: float = 60.0):
    deadline = time.time() + timeout
    while not job.outputs():
        assert not job.done() and time.time() < deadline, "no streamed output"
        time.sleep(0.05)


def test_exittrain_one_run_at_a_time_only_the_owner_cancels(exittrain_server):
    owner, other = new_client(exittrain_server.url), new_client(exittrain_server.url)
    job = owner.submit("math", "exit", 400, 16, api_name="/exittrain")
    wait_for_output(job)
    assert other.predict(api_name="/exittrain_cancel") == "no ExitTrain run of yours is in progress"
    with pytest.raises(Exception, match="another ExitTrain run is in progress"):
        other.predict("math", "exit", 5, 16, api_name="/exittrain")
    assert owner.predict(api_name="/exittrain_cancel") == "cancelling after this step…"
    outputs = job.result(timeout=120)
    steps = int(re.fullmatch(r"cancelled after (\d+) steps", outputs[1]).group(1))
    assert 0 <= steps < 400  # cancelled wherever it was: scoring or training
    assert outputs[3] == "Cancelled: nothing was measured."  # no comparison of the unfinished copy


def test_exittrain_owner_leaving_frees_the_slot(exittrain_server):
    code = f"""
import os, time
from gradio_client import Client
job = Client({exittrain_server.url!r}, verbose=False).submit("math", "exit", 400, 16, api_name="/exittrain")
while not job.outputs():
    time.sleep(0.05)
os._exit(0)
"""
    assert subprocess.run([sys.executable, "-c", code], timeout=120).returncode == 0
    client, deadline = new_client(exittrain_server.url), time.time() + 30
    while True:  # the abandoned run stops at its next yield (every 5 steps) and frees the slot
        try:
            status = client.predict("math", "exit", 5, 16, api_name="/exittrain")[1]
            break
        except Exception as error:  # noqa: BLE001
            assert "in progress" in str(error) and time.time() < deadline, str(error)
            time.sleep(0.5)
    assert status.startswith("trained 5 steps")


def test_killing_the_server_mid_exittrain_leaves_the_assets_intact(exittrain_server, exittrain_assets):
    folder, before = exittrain_assets
    job = new_client(exittrain_server.url).submit("math", "exit", 400, 16, api_name="/exittrain")
    wait_for_output(job)
    exittrain_server.kill()
    assert exittrain_server.process.returncode == -9
    assert sha256_tree(folder) == before  # same files, same bytes: no checkpoint, no stray file
    restarted = AppServer(folder, folder.parent / "app-restarted.log")
    try:
        restarted.wait_ready()
        served = run_one(new_client(restarted.url), live_request(PROMPT, budget=8, max_new_tokens=16), 0)
        assert served.outcome == "ok", served.message
    finally:
        restarted.stop()
    assert sha256_tree(folder) == before


# =============================================================================== faults: broken model folders
def _truncate(path: Path):
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def _wrong_shape(path: Path, key: str, value):
    config = json.loads(path.read_text())
    config[key] = value
    path.write_text(json.dumps(config))


BROKEN = {  # name: (which folder is broken, how)
    "target folder missing": ("target", None),
    "target folder empty": ("target", lambda d: [p.unlink() for p in d.iterdir()]),
    "target weights truncated": ("target", lambda d: _truncate(d / "model.safetensors")),
    "target weights random bytes": ("target", lambda d: (d / "model.safetensors").write_bytes(os.urandom(200_000))),
    "target config.json random bytes": ("target", lambda d: (d / "config.json").write_bytes(os.urandom(300))),
    "target config.json without model_type": ("target", lambda d: (d / "config.json").write_text("{}")),
    "target config.json wrong shapes": ("target", lambda d: _wrong_shape(d / "config.json", "hidden_size", 128)),
    "target pickle weights only": ("target", lambda d: (torch.save({}, d / "pytorch_model.bin"), (d / "model.safetensors").unlink())),
    "target tokenizer.json corrupt": ("target", lambda d: (d / "tokenizer.json").write_text("{not json")),
    "drafter weights truncated": ("draft", lambda d: _truncate(d / "drafter.safetensors")),
    "drafter config corrupt": ("draft", lambda d: (d / "drafter_config.json").write_text("garbage")),
    "drafter config wrong shapes": ("draft", lambda d: _wrong_shape(d / "drafter_config.json", "hidden_size", 48)),
}


@pytest.fixture(scope="module")
def broken_models(quick_assets_dir, tmp_path_factory):
    """name -> (target folder, draft folder or None), one broken copy of the quick models each."""
    root, models = tmp_path_factory.mktemp("broken"), quick_assets_dir / "models"
    made = {}
    for index, (name, (which, breaks)) in enumerate(BROKEN.items()):
        source = models / ("target" if which == "target" else "drafter-base")
        folder = root / f"{index}-{which}"
        if breaks is not None:
            shutil.copytree(source, folder)
            breaks(folder)
        made[name] = (folder, None) if which == "target" else (models / "target", folder)
    return made


@pytest.mark.parametrize("name", list(BROKEN))
def test_a_broken_model_folder_is_a_clear_load_error(broken_models, name):
    target, draft = broken_models[name]
    with pytest.raises(ModelLoadError) as caught:
        load_bundle(target=str(target), draft=str(draft) if draft else None)
    message = str(caught.value)
    assert str(draft or target) in message and "\n" not in message, message


@pytest.fixture(scope="module")
def broken_server(quick_assets_dir, broken_models, tmp_path_factory):
    target, _ = broken_models["target weights truncated"]
    server = AppServer(quick_assets_dir, tmp_path_factory.mktemp("broken-app") / "app.log", extra_env={"TEV_TARGET": str(target)})
    try:
        server.wait_ready()
        yield server, target
    finally:
        server.stop()


def test_the_app_with_a_broken_target_says_so_and_keeps_serving(broken_server):
    server, target = broken_server
    client = new_client(server.url)
    expected = f"could not load the model from folder {target}: SafetensorError"
    # the ExitTrain tab runs on the tiny pair whatever TEV_TARGET says, so only these two meet the broken target
    for api, args, named in (("/generate", (), dataclasses.asdict(live_request(PROMPT))), ("/verifier_lab", ("prompt", PROMPT, "block", 8, 1.0, 300, 0), {})):
        with pytest.raises(Exception, match=re.escape(expected)):
            client.predict(*args, **named, api_name=api)
    figure, tree, table = client.predict("synthetic example", PROMPT, "block", 8, 1.0, 300, 0, api_name="/verifier_lab")  # needs no model
    assert "| tev |" in table
    assert server.process.poll() is None
    log = Path(server.log.name).read_text()
    assert f"models could not be loaded: {expected}" in log and "Traceback" not in log


@pytest.mark.browser
def test_the_page_shows_why_the_models_did_not_load(broken_server):
    if os.environ.get("TEV_SKIP_BROWSER") == "1":
        pytest.skip("TEV_SKIP_BROWSER=1 was set explicitly")
    from playwright.sync_api import sync_playwright

    server, target = broken_server
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=shutil.which("chromium") or "/usr/bin/chromium", headless=True, args=["--no-sandbox", "--disable-gpu"])
        try:
            page = browser.new_page()
            page.goto(server.url)
            line = page.locator("p", has_text="Models could not be loaded")
            line.wait_for(timeout=60_000)
            assert str(target) in line.inner_text()
        finally:
            browser.close()


# =============================================================================== bad input: the UI API
def gen(**changes) -> tuple:
    values = dict(prompt=PROMPT, drafter="block", verifier="tev", budget=8, temperature=1.0, max_new=16, seed=0, compare_ar=False, chat=False, top_p=1.0, top_k=0)
    values.update(changes)
    return ("/generate", tuple(values.values()))


def lab(**changes) -> tuple:
    values = dict(source="prompt", prompt=PROMPT, drafter="block", budget=8, temperature=1.0, draws=300, seed=0)
    values.update(changes)
    return ("/verifier_lab", tuple(values.values()))


def exittrain(**changes) -> tuple:
    values = dict(domain="math", tree_term="exit", steps=5, lambda_tree=16)
    values.update(changes)
    return ("/exittrain", tuple(values.values()))


def walk(**changes) -> tuple:
    values = dict(prompt=PROMPT, drafter="block", verifier="tev", budget=8, temperature=0.7, top_p=0.9, seed=0)
    values.update(changes)
    return ("/walkthrough", tuple(values.values()))


# (what is tried, (endpoint, inputs), what must happen: a regex of the error, or OK)
API_CASES = [
    ("empty prompt", gen(prompt=""), "prompt is empty"),
    ("whitespace-only prompt", gen(prompt="  \n\t "), "prompt is empty"),
    ("prompt of 4,001 characters", gen(prompt="x" * 4001), "shorten it to at most 4000"),
    ("prompt of 1,000,000 characters", gen(prompt="x" * 1_000_000), "shorten it to at most 4000"),
    ("prompt longer than the model's context", gen(prompt="def f():\n" * 200), "context"),
    ("NUL character in the prompt", gen(prompt="a\x00b"), "NUL character"),
    ("prompt that tokenizes to nothing (only the BOS token text)", gen(prompt="<|endoftext|>"), "produced no tokens"),
    ("control characters and an ANSI escape", gen(prompt="\x01\x02\x1b[31mdef f():\n"), OK),
    ("zero-width space and right-to-left override", gen(prompt="\u200b\u202edef f():"), OK),
    ("emoji", gen(prompt="def 😀():\n"), OK),
    ("HTML/script prompt (shown escaped)", gen(prompt="<script>alert(1)</script>\n"), OK),
    ("prompt is not text (null)", gen(prompt=None), "prompt must be text"),
    ("budget -1", gen(budget=-1), RANGE),
    ("budget 0 (drafts nothing: plain decoding)", gen(budget=0), OK),
    ("top-p 0", gen(top_p=0.0), RANGE),
    ("top-p 1.5", gen(top_p=1.5), RANGE),
    ("top-p 'most'", gen(top_p="most"), NOT_A_NUMBER),
    ("top-k -1", gen(top_k=-1), RANGE),
    ("top-k 2.5", gen(top_k=2.5), "whole number"),
    ("top-k 1 (only the argmax survives: greedy text, sampled)", gen(top_k=1), OK),
    ("top-p 0.05 with top-k 3", gen(top_p=0.05, top_k=3), OK),
    ("budget 10,000", gen(budget=10_000), RANGE),
    ("budget 3.5", gen(budget=3.5), "whole number"),
    ("budget 'abc'", gen(budget="abc"), NOT_A_NUMBER),
    ("budget null", gen(budget=None), "budget B is missing"),
    ("temperature -1", gen(temperature=-1), RANGE),
    ("temperature 9", gen(temperature=9.0), RANGE),
    ("temperature 1e-300 (would overflow logits / T)", gen(temperature=1e-300), r"0 \(greedy\) or (from|at least) 0.01"),
    ("temperature 'hot'", gen(temperature="hot"), NOT_A_NUMBER),
    ("max new tokens 0", gen(max_new=0), RANGE),
    ("max new tokens 10^9", gen(max_new=10**9), RANGE),
    ("max new tokens 2.5", gen(max_new=2.5), "whole number"),
    ("max new tokens 1 (one round)", gen(max_new=1), OK),
    ("seed -5", gen(seed=-5), RANGE),
    ("seed 2^31", gen(seed=2**31), RANGE),
    ("seed 2^64", gen(seed=2**64), RANGE),
    ("seed 1e30", gen(seed=1e30), RANGE),
    ("seed 'x'", gen(seed="x"), NOT_A_NUMBER),
    ("seed null", gen(seed=None), "seed is missing"),
    ("seed 1.5", gen(seed=1.5), "whole number"),
    ("drafter 'medusa'", gen(drafter="medusa"), CHOICES),
    ("drafter '../../etc/passwd'", gen(drafter="../../etc/passwd"), CHOICES),
    ("drafter not shipped in these assets ('exittrain')", gen(drafter="exittrain"), CHOICES),  # not offered, so refused as any other unknown choice
    ("verifier 'eagle'", gen(verifier="eagle"), CHOICES),
    ("verifier null", gen(verifier=None), CHOICES),
    ("greedy verifier at T = 1", gen(verifier="greedy", temperature=1.0), "greedy verifier needs temperature 0"),
    ("lab draws 0", lab(draws=0), RANGE),
    ("lab draws 10^9", lab(draws=10**9), RANGE),
    ("lab draws 'many'", lab(draws="many"), NOT_A_NUMBER),
    ("lab seed -1", lab(seed=-1), RANGE),
    ("lab budget 0", lab(budget=0), RANGE),
    ("lab temperature 0", lab(temperature=0), RANGE),
    ("lab tree source 'bogus'", lab(source="bogus"), CHOICES),
    ("lab empty prompt", lab(prompt=""), "prompt is empty"),
    ("ExitTrain steps 0", exittrain(steps=0), RANGE),
    ("ExitTrain steps 10^6", exittrain(steps=10**6), RANGE),
    ("ExitTrain steps 'many'", exittrain(steps="many"), NOT_A_NUMBER),
    ("ExitTrain lambda_tree -1", exittrain(lambda_tree=-1), RANGE),
    ("ExitTrain lambda_tree 1000", exittrain(lambda_tree=1000), RANGE),
    ("ExitTrain tree term 'bogus'", exittrain(tree_term="bogus"), CHOICES),
    ("ExitTrain domain 'poetry'", exittrain(domain="poetry"), CHOICES),
    ("browse round 'abc'", ("/browse_round", ("abc",)), NOT_A_NUMBER),
    ("walkthrough empty prompt", walk(prompt=""), "prompt is empty"),
    ("walkthrough prompt longer than the context", walk(prompt="def f():\n" * 200), "context"),
    ("walkthrough budget 1000", walk(budget=1000), RANGE),
    ("walkthrough temperature 9", walk(temperature=9.0), RANGE),
    ("walkthrough top-p 0", walk(top_p=0.0), RANGE),
    ("walkthrough greedy verifier at T = 0.7", walk(verifier="greedy"), "greedy verifier needs temperature 0"),
    ("walkthrough drafter 'bogus'", walk(drafter="bogus"), CHOICES),
    ("walkthrough Next before any round", ("/walkthrough_next", ()), NOTHING),
]


@pytest.fixture(scope="module")
def api(app_server):
    return Client(app_server.url, verbose=False)


@pytest.mark.parametrize("what,call,expected", API_CASES, ids=[c[0] for c in API_CASES])
def test_bad_input_through_the_api(api, what, call, expected):
    endpoint, args = call
    if expected == NOTHING:
        api.predict(*args, api_name=endpoint)  # a warning in the page; the call itself succeeds
        return
    if expected == OK:
        outputs = api.predict(*args, api_name=endpoint)
        assert "rounds" in outputs[4]
        assert "<script>" not in outputs[0]  # the prompt is shown escaped
        return
    with pytest.raises(Exception) as caught:
        api.predict(*args, api_name=endpoint)
    assert re.search(expected, str(caught.value)), str(caught.value)


# JSON a client library would refuse to send, posted raw: (what, body, expected error)
RAW_CASES = [
    ("lone surrogate in the prompt (JSON \\ud800)", '["def f():\\ud800", "block", "tev", 8, 1.0, 16, 0, false, false, 1.0, 0, false]', "invalid Unicode"),
    ("budget NaN", f'[{json.dumps(PROMPT)}, "block", "tev", NaN, 1.0, 16, 0, false, false, 1.0, 0, false]', NOT_A_NUMBER + ".*got nan"),
    ("temperature Infinity", f'[{json.dumps(PROMPT)}, "block", "tev", 8, Infinity, 16, 0, false, false, 1.0, 0, false]', NOT_A_NUMBER + ".*got inf"),
    ("max new tokens -Infinity", f'[{json.dumps(PROMPT)}, "block", "tev", 8, 1.0, -Infinity, 0, false, false, 1.0, 0, false]', NOT_A_NUMBER),
    ("seed NaN", f'[{json.dumps(PROMPT)}, "block", "tev", 8, 1.0, 16, NaN, false, false, 1.0, 0, false]', NOT_A_NUMBER + ".*got nan"),
    ("top-p NaN", f'[{json.dumps(PROMPT)}, "block", "tev", 8, 1.0, 16, 0, false, false, NaN, 0, false]', NOT_A_NUMBER + ".*got nan"),
    ("seed as a string", f'[{json.dumps(PROMPT)}, "block", "tev", 8, 1.0, 16, "7", false, false, 1.0, 0, false]', NOT_A_NUMBER),
]


def post_raw(url: str, api_name: str, data: str) -> tuple[int, str]:
    """POST inputs as raw JSON to the HTTP API; returns (HTTP status, text): a refusal before the
    queue (422: the tab's validator; 400: inputs Gradio cannot take) with its detail, or 200 with
    the final event of the answer."""
    base = url.rstrip("/")
    answer = httpx.post(f"{base}/gradio_api/call/{api_name}", content=('{"data": ' + data + "}").encode(), headers={"content-type": "application/json"}, timeout=30)
    if answer.status_code != 200:
        return answer.status_code, answer.text
    return 200, httpx.get(f"{base}/gradio_api/call/{api_name}/{answer.json()['event_id']}", timeout=60).text


@pytest.mark.parametrize("what,data,expected", RAW_CASES, ids=[c[0] for c in RAW_CASES])
def test_bad_input_as_raw_json(app_server, what, data, expected):
    status, text = post_raw(app_server.url, "generate", data)
    assert status == 422 and re.search(expected, text), (status, text[-400:])  # refused by the validator, before the queue


def test_malformed_requests_are_refused_and_the_server_carries_on(app_server):
    """Protocol-level garbage gets Gradio's own refusal (not our message), and no harm."""
    base = app_server.url.rstrip("/")
    assert httpx.post(f"{base}/gradio_api/call/generate", content=b"hello", headers={"content-type": "application/json"}).status_code == 422
    assert httpx.post(f"{base}/gradio_api/call/generate", json={"data": 5}).status_code == 422
    assert post_raw(app_server.url, "generate", json.dumps([PROMPT]))[0] == 400  # too few inputs
    assert run_one(new_client(app_server.url), live_request(PROMPT, max_new_tokens=4), 0).outcome == "ok"


EXPECTED_IN_LOG = (  # what Gradio itself logs, with a traceback, for input it refuses
    r"gradio\.exceptions\.Error: ",  # its own range / choice checks
    r"ValueError: An event handler \(run_live\) didn't receive enough input values",  # the malformed request above
    # Gradio's /cancel route and its queue's reset_iterators each test an event's iterator
    # outside their lock and delete it inside: a client leaving while its run ends races them
    r"KeyError: '[0-9a-f]{32}'$",
)


def test_user_errors_leave_no_server_traceback(app_server, api):
    """After the bad inputs above, the server log holds no exception but Gradio's own input
    checks; ours (user errors) are logged as nothing at all, and nothing crashed in our code."""
    with pytest.raises(Exception):
        api.predict(*gen(budget="abc")[1], api_name="/generate")
    log = Path(app_server.log.name).read_text()
    raised = [line for line in re.findall(r"^[A-Za-z_][\w.]*(?:Error|Exception)(?:: .*)?$", log, flags=re.M) if not any(re.match(p, line) for p in EXPECTED_IN_LOG)]
    assert not raised, raised[:5]
    assert "must be a number from" not in log and "prompt is empty" not in log


# =============================================================================== bad input: the command line
CLI_CASES = [  # (argv, what must happen: a regex of the one error line, or OK)
    (["generate"], "the following arguments are required: --prompt"),
    (["generate", "--prompt", ""], "the prompt is empty"),
    (["generate", "--prompt", "   "], "the prompt is empty"),
    (["generate", "--prompt", "<|endoftext|>"], "produced no tokens"),
    (["generate", "--prompt", "x" * 20_000], "context is 128; shorten it"),
    (["generate", "--prompt", "a\udcff\udcfeb"], "not valid UTF-8"),  # what Python makes of undecodable argv bytes
    (["generate", "--prompt", "a\x00b"], "NUL character"),
    (["generate", "--prompt", "\x01\x1b[31mdef f():", "--max-new-tokens", "4"], OK),
    (["generate", "--prompt", PROMPT, "--budget", "abc"], "argument --budget: a budget is a whole number of nodes or 'auto'"),
    (["generate", "--prompt", PROMPT, "--budget", "-1"], "budget must be an integer from 0 to 1024"),
    (["generate", "--prompt", PROMPT, "--budget", "100000"], "budget must be an integer from 0 to 1024"),
    (["generate", "--prompt", PROMPT, "--temperature", "nan"], "temperature must be a finite number"),
    (["generate", "--prompt", PROMPT, "--temperature", "inf"], "temperature must be a finite number"),
    (["generate", "--prompt", PROMPT, "--temperature", "-1"], "temperature must be a finite number >= 0"),
    (["generate", "--prompt", PROMPT, "--temperature", "1e-300"], r"temperature must be 0 \(greedy\) or at least 0.01"),
    (["generate", "--prompt", PROMPT, "--temperature", "hot"], "argument --temperature: invalid float value"),
    (["generate", "--prompt", PROMPT, "--max-new-tokens", "0"], "max_new_tokens must be an integer >= 1"),
    (["generate", "--prompt", PROMPT, "--max-new-tokens", "1000000000"], OK),  # stops at the context limit
    (["generate", "--prompt", PROMPT, "--seed", "-1"], "seed must be an integer from 0"),
    (["generate", "--prompt", PROMPT, "--seed", "99999999999999999999999"], "seed must be an integer from 0"),
    (["generate", "--prompt", PROMPT, "--seed", "1.5"], "argument --seed: invalid int value"),
    (["generate", "--prompt", PROMPT, "--drafter", "medusa"], "argument --drafter: invalid choice"),
    (["generate", "--prompt", PROMPT, "--drafter", "exittrain"], "drafter 'exittrain' is not available here"),
    (["generate", "--prompt", PROMPT, "--verifier", "eagle"], "argument --verifier: invalid choice"),
    (["generate", "--prompt", PROMPT, "--stop", ""], "--stop needs a non-empty string"),
    (["generate", "--prompt", PROMPT, "--target", "../"], "could not load the tokenizer from folder ..: it holds no tokenizer files"),
    (["generate", "--prompt", PROMPT, "--target", "/etc"], "could not load the tokenizer from folder /etc: it holds no tokenizer files"),
    (["generate", "--prompt", PROMPT, "--target", "/etc/passwd"], "/etc/passwd is a file; give the model's folder"),
    (["generate", "--prompt", PROMPT, "--target", "{symlink}"], "could not load the tokenizer from folder .*link-to-etc: it holds no tokenizer files"),
    (["generate", "--prompt", PROMPT, "--draft", "/etc"], "could not load the tokenizer from folder /etc"),
    (["generate", "--prompt", PROMPT, "--target", "org/na me"], "not a Hugging Face id"),
    (["generate", "--prompt", PROMPT, "--target", "org/name;rm -rf /"], "not a Hugging Face id"),
    (["generate", "--prompt", PROMPT, "--target", "a/b/c"], "not a Hugging Face id"),
    (["generate", "--prompt", PROMPT, "--target", "no-such-org/no-such-model"], "not in the local Hugging Face cache"),
    (["generate", "--prompt", PROMPT, "--device", "foo"], "unknown device 'foo'"),
    (["generate", "--prompt", PROMPT, "--dtype", "foo"], "unknown dtype 'foo'"),
    (["exittrain", "--steps", "0"], "steps must be an integer >= 1, got 0"),
    (["exittrain", "--steps", "-5"], "steps must be an integer >= 1, got -5"),
    (["exittrain", "--steps", "abc"], "argument --steps: invalid int value"),
    (["exittrain", "--lambda-tree", "nan"], "lambda_tree must be a finite number"),
    (["exittrain", "--lambda-tree", "inf"], "lambda_tree must be a finite number"),
    (["exittrain", "--lambda-tree", "-1"], "lambda_tree must be a finite number >= 0"),
    (["exittrain", "--tree-term", "bogus"], "argument --tree_term/--tree-term: invalid choice"),
    (["exittrain", "--budget", "0"], "budget must be an integer >= 1"),
    (["exittrain", "--lr", "0"], "lr must be a finite number > 0"),
    (["exittrain", "--temperature", "0"], "temperature must be a finite number > 0"),
    (["exittrain", "--out", "{repo}/assets/models/x", "--resume"], "is inside assets/"),
    (["exittrain", "--out", "{tmp}/none", "--resume"], "--resume: no checkpoint in"),
    (["exittrain", "--target", "/etc", "--out", "{tmp}/out"], "could not load the tokenizer from folder /etc"),
    (["exittrain", "--data-sequences", "0"], "--data-sequences must be at least 1, got 0"),
    (["exittrain", "--context-length", "-3"], "--context-length must be at least 1, got -3"),
    (["exittrain", "--eval-prompts", "-1"], "--eval-prompts must be 0"),
]


def _cli_id(case) -> str:
    argv, _ = case
    return " ".join(a if len(a) < 30 else a[:12] + "…" for a in argv).encode("ascii", "backslashreplace").decode()


@pytest.mark.parametrize("argv,expected", CLI_CASES, ids=[_cli_id(c) for c in CLI_CASES])
def test_bad_command_line_flags(argv, expected, quick_assets_dir, tmp_path, monkeypatch, capsys):
    """Exit code 2 and one ``error: ...`` line (argparse's usage line may precede it), never a
    traceback; an exception escaping ``main`` fails this test as it would crash the command."""
    from tev.cli import main

    monkeypatch.setenv("TEV_ASSETS_DIR", str(quick_assets_dir))
    (tmp_path / "link-to-etc").symlink_to("/etc")
    argv = [a.replace("{symlink}", str(tmp_path / "link-to-etc")).replace("{repo}", str(REPO)).replace("{tmp}", str(tmp_path)) for a in argv]
    try:
        code = main(argv)
    except SystemExit as exit_:  # argparse
        code = exit_.code
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip() and "Loading weights" not in line]
    if expected == OK:
        assert code == 0, err[-2000:]
        return
    assert code == 2 and "Traceback" not in err, err[-2000:]
    assert re.match(r"^(python -m tev \w+: )?error: ", lines[-1]) and re.search(expected, lines[-1]), lines[-1]
    assert sum("error:" in line for line in lines) == 1


@pytest.mark.parametrize(
    "argv,expected",
    [
        ([b"generate", b"--prompt", b"a\xff\xfeb"], "not valid UTF-8"),
        ([b"generate", b"--prompt", b"x", b"--budget", b"many"], "a budget is a whole number of nodes or .auto."),
        ([b"generate", b"--prompt", b"x", b"--target", b"{broken}"], "could not load the model from folder .*SafetensorError"),
    ],
    ids=["undecodable bytes", "argparse", "truncated weights"],
)
def test_the_real_command_exits_2_with_one_line(argv, expected, quick_assets_dir, broken_models):
    broken = str(broken_models["target weights truncated"][0]).encode()
    argv = [a.replace(b"{broken}", broken) for a in argv]
    done = subprocess.run([sys.executable.encode(), b"-m", b"tev", *argv], cwd=REPO, capture_output=True, env={**os.environ, "TEV_ASSETS_DIR": str(quick_assets_dir)}, timeout=120)
    err = done.stderr.decode("utf-8", "replace")
    last = [line for line in err.splitlines() if line.strip()][-1]
    assert done.returncode == 2 and "Traceback" not in err, err[-2000:]
    assert "error: " in last and re.search(expected, last), last


# =============================================================================== security
def _copy_target(quick_assets_dir: Path, tmp_path: Path) -> Path:
    folder = tmp_path / "target"
    shutil.copytree(quick_assets_dir / "models" / "target", folder)
    return folder


def _edit_json(path: Path, **changes) -> None:
    path.write_text(json.dumps({**json.loads(path.read_text()), **changes}))


def test_a_model_folder_that_needs_its_own_code_is_refused_unrun(quick_assets_dir, tmp_path):
    """A folder whose model or tokenizer type only its own Python file defines (``auto_map``,
    the Hub's remote-code hook) is refused, and that file is never imported."""
    folder = _copy_target(quick_assets_dir, tmp_path)
    marker = tmp_path / "custom code ran"
    (folder / "custom.py").write_text(f"from pathlib import Path\nPath({str(marker)!r}).touch()\n")
    _edit_json(folder / "config.json", model_type="custom-llama", auto_map={"AutoConfig": "custom.Config", "AutoModelForCausalLM": "custom.Model"})
    with pytest.raises(ModelLoadError, match=f"could not load the model from folder {re.escape(str(folder))}: .*custom code"):
        load_bundle(target=str(folder))
    _edit_json(folder / "tokenizer_config.json", tokenizer_class="CustomTokenizer", auto_map={"AutoTokenizer": ["custom.Tokenizer", None]})
    with pytest.raises(ModelLoadError, match=f"could not load the tokenizer from folder {re.escape(str(folder))}: .*custom code"):
        load_bundle(target=str(folder))
    assert not marker.exists()


class _Unpickled:
    """Unpickling this writes ``marker``: evidence that a loader ran pickle."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (Path.write_text, (self.marker, "unpickled"))


def test_pickle_weights_are_never_unpickled(quick_assets_dir, tmp_path):
    """A ``pytorch_model.bin`` whose unpickling writes a file: beside safetensors it is ignored,
    alone it is refused; either way it is never unpickled (and the trap does work)."""
    folder = _copy_target(quick_assets_dir, tmp_path)
    marker = tmp_path / "unpickled"
    torch.save({"trap": _Unpickled(marker)}, folder / "pytorch_model.bin")
    load_bundle(target=str(folder))
    (folder / "model.safetensors").unlink()
    with pytest.raises(ModelLoadError, match="safetensors"):
        load_bundle(target=str(folder))
    assert not marker.exists()
    torch.load(folder / "pytorch_model.bin", weights_only=False)  # what a pickle loader would do
    assert marker.read_text() == "unpickled"


def test_the_app_listens_on_loopback_only_with_uploads_capped(app_server):
    """Started without GRADIO_SERVER_NAME (AppServer drops it), the app listens on 127.0.0.1
    only, opens no share tunnel, and refuses an upload over 1 MB."""
    port = f"{app_server.port:04X}"
    listening = [line.split()[1] for line in Path("/proc/net/tcp").read_text().splitlines()[1:] if line.split()[1].endswith(":" + port) and line.split()[3] == "0A"]
    assert listening == [f"0100007F:{port}"]  # 127.0.0.1 only, not 0.0.0.0
    log = Path(app_server.log.name).read_text()
    assert "To create a public link, set `share=True`" in log and "public URL" not in log and "share link" not in log  # Gradio's lines for share=False
    answer = httpx.post(app_server.url.rstrip("/") + "/gradio_api/upload", files={"files": ("big.bin", b"\0" * 2_000_000)}, timeout=30)
    assert answer.status_code == 413, (answer.status_code, answer.text[:200])


def test_the_app_writes_nothing_beside_itself(app_server):
    """Gradio writes a ``.pyi`` stub beside a module that defines a component subclass; the app
    defines none (its inputs are Gradio's own components, checked by the events' validators)."""
    assert not (REPO / "app.pyi").exists() and not (REPO / "ui" / "components.pyi").exists()
    assert not list(REPO.glob("ui/*.pyi"))


def test_the_ui_takes_no_paths_model_ids_or_uploads(app_server):
    config = httpx.get(app_server.url.rstrip("/") + "/config", timeout=30).json()
    inputs = [c for c in config["components"] if c.get("props", {}).get("interactive") is not False]
    kinds = {c["type"] for c in inputs}
    assert not kinds & {"file", "uploadbutton", "image", "audio", "video", "model3d", "dataframe", "fileexplorer"}, kinds
    textboxes = [c["props"].get("label") for c in config["components"] if c["type"] == "textbox"]
    # Live, Walkthrough and lab prompts, then the ExitTrain tab's workload box: prompts (text, one per line), never a path
    assert textboxes[:3] == ["prompt (Python code to continue) · at most 4,000 characters"] + ["prompt · at most 4,000 characters"] * 2
    assert [label.split(",")[0] for label in textboxes[3:]] == ["your prompts"]


def test_served_models_keep_no_autograd_graph(quick_assets_dir, monkeypatch):
    """Inference-only models: a round's tensors hold no autograd graph (before, every record a
    session kept in its state also kept the target's activations alive: ~4 MB per session)."""
    monkeypatch.setenv("TEV_ASSETS_DIR", str(quick_assets_dir))
    bundle = load_bundle()
    assert not any(p.requires_grad for p in bundle.target.parameters())
    assert not any(p.requires_grad for p in bundle.drafter("block").model.parameters())
    records, _ = run_to_end(speculative_generate(Request(bundle.runner, bundle.drafter("block"), encode_prompt(bundle.tokenizer, PROMPT), DecodeConfig(budget=8, max_new_tokens=8)), bundle.tokenizer))
    assert not records[0].flow.reach.requires_grad and not records[0].tree.draft_logprob.requires_grad


def test_the_server_caps_malloc_arenas_unless_the_operator_did(monkeypatch):
    monkeypatch.setenv("MALLOC_ARENA_MAX", "4")
    assert limit_malloc_arenas() is False  # the operator's setting stands
    monkeypatch.delenv("MALLOC_ARENA_MAX")
    assert limit_malloc_arenas() is (platform.libc_ver()[0] == "glibc")
