"""Load test of the TEV Explorer app through its public API (``gradio_client``).

For each user count N (default 4, 8, 16) it runs N concurrent users, each with its own
``gradio_client.Client`` (its own session), looping ``/generate`` requests with varied
settings for ``--seconds``. It reports per N: requests served, errors (app errors with
their messages, queue-full refusals, transport errors, timeouts), p50/p95 latency, queue
wait and time to the first streamed output, tokens served, and the server's resident memory
(VmRSS from ``/proc/<pid>/status``) at start, after warm-up and at the end.

Then three correctness / overload checks:

* identical seeds: several users send the SAME settings and seed at the same moment
  (together with a group using another seed); every output must be identical to the others
  and to a solo run, and the other seed's outputs must match their own solo run;
* own outputs: a sample of the requests served under load is re-run alone on the idle server;
  each must give exactly the text (with its per-round colouring) and the final tree figure it
  gave under load, and every text served begins with its own prompt (each user's prompts carry
  a ``# user N`` line);
* queue full: more simultaneous submits than the queue holds (``max_size`` 32): the excess
  must be refused with a clear message, the server must stay up and serve again at once.

How times are measured (client side, ``time.perf_counter``):

* latency: ``client.submit(...)`` until the job is done (``job.result()`` returns);
* queue wait: ``submit`` until ``job.status().code`` first shows the server started the
  function (PROCESSING / ITERATING / PROGRESS, or done); polled every ``--poll`` seconds
  (default 0.02 s), so it is an upper bound within one poll interval;
* first output: ``submit`` until ``job.outputs()`` first holds a streamed output (the first
  round's text and tree), same polling.

Usage::

    python -m tev bench loadtest --assets /tmp/rel-assets --out runs/loadtest      # starts its own server
    python -m tev bench loadtest --url http://127.0.0.1:7860/ --pid 12345 --users 4 --seconds 20

Exit code 0 when every check passed (no errors, identical seeds identical, outputs match
their solo runs, queue-full refused clearly, memory growth under the goal), else 1.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import html
import json
import os
import random
import re
import sys
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

try:  # gradio's own client (installed with gradio); the GPU check's machine, which has no gradio, never runs this
    from gradio_client import Client
    from gradio_client.exceptions import AppError
    from gradio_client.utils import QueueError
except ImportError:
    Client = AppError = QueueError = None

from tev.core.verify import SAMPLING_VERIFIERS, VERIFIERS
from tev.data.prompts import load_prompt_set
from tev.drive.appserver import AppServer
from tev.service.live_settings import LiveSettings
from tev.util.paths import assets_dir
from tev.util.stats import quantile
from tev.util.stored import write_result

PROMPTS = [
    "def add(a, b):\n    ",
    "def fib(n):\n    ",
    "import os\n\ndef list_files(path):\n    ",
    "class Stack:\n    def __init__(self):\n        ",
    "def is_prime(n):\n    if n < 2:\n        ",
    "for i in range(10):\n    ",
    "def read_lines(name):\n    with open(name) as f:\n        ",
    "x = [",
]
TEMPERATURES = (0.0, 0.3, 0.7, 1.0, 1.5)
PAGE_NEW_TOKENS = 96  # --page-defaults: the answer length the load goals name (the page opens at more)
STARTED = ("PROCESSING", "ITERATING", "PROGRESS", "FINISHED")
MEMORY_GOAL = 0.10  # RSS growth after warm-up, as a fraction


# ----------------------------------------------------------------------------- server facts
def rss_kib(pid: int | None) -> int | None:
    """Resident memory (VmRSS, KiB) of a process, from /proc/<pid>/status."""
    if not pid:
        return None
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        return None
    return None


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads), from /proc/<pid>/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def text_div(view_html: str) -> str:
    """The ``tev-text`` part of the Live text view (prompt + coloured generated tokens)."""
    match = re.search(r'<div class="tev-text".*', view_html or "", flags=re.S)
    return match.group(0) if match else (view_html or "")


def plain_text(view_html: str) -> str:
    """The prompt plus the generated text, without markup (newline marks removed)."""
    return html.unescape(re.sub(r"<[^>]+>", "", text_div(view_html))).replace("↵", "")


def prompt_shown(view_html: str) -> str:
    match = re.search(r'<div class="tev-prompt"[^>]*>(.*?)</div>', view_html or "", flags=re.S)
    return html.unescape(match.group(1)) if match else ""


# ----------------------------------------------------------------------------- one request
# A load test's request where the page's fields (LiveSettings) have no default of their own; budget auto stays off
# (LiveSettings' default): its sizes follow the machine's timing, so identical seeds could differ.
LOAD_DEFAULTS = {"drafter": "block", "verifier": "tev", "budget": 16, "temperature": 1.0, "max_new_tokens": 32, "seed": 0}


def live_request(prompt: str, *values, **changes) -> LiveSettings:
    """One Live request, as ``/generate`` names its parameters (:class:`LiveSettings`' fields): ``prompt``, then the
    other fields in their order (``values``) or by name (``changes``); the rest :data:`LOAD_DEFAULTS`, else the page's."""
    positional = dict(zip(LiveSettings.names()[1:], values))
    return LiveSettings(prompt=prompt, **{**LOAD_DEFAULTS, **positional, **changes})


def submit(settings: LiveSettings, client):
    """``/generate`` submitted with ``settings``, each by its parameter's name."""
    return client.submit(**asdict(settings), api_name="/generate")


def generate_outputs(client) -> dict[str, int]:
    """Where ``/generate`` returns the outputs the load test reads, from what it declares: the text view (its one
    HTML output), the tree (its first plot) and the run summary (its one JSON output)."""
    kinds = [output["component"].lower() for output in client.view_api(print_info=False, return_format="dict")["named_endpoints"]["/generate"]["returns"]]
    return {"text": kinds.index("html"), "tree": kinds.index("plot"), "summary": kinds.index("json")}


def opening_settings(client) -> LiveSettings:
    """The page's opening settings, as ``/generate`` declares its parameters' defaults (the page's own)."""
    parameters = client.view_api(print_info=False, return_format="dict")["named_endpoints"]["/generate"]["parameters"]
    opening = {p["parameter_name"]: p["parameter_default"] for p in parameters if p.get("parameter_has_default")}
    return live_request(**{name: opening[name] for name in LiveSettings.names() if name in opening})


@dataclass
class Result:
    user: int
    settings: LiveSettings
    outcome: str = "ok"  # ok | app_error | queue_full | transport | timeout
    message: str = ""
    latency: float = float("nan")
    queue_wait: float = float("nan")
    first_output: float = float("nan")
    tokens: int = 0
    view_html: str = field(default="", repr=False)
    tree_digest: str = ""  # sha256 of the final tree figure (the round the page opens at)
    phase: str = "load"
    retimed: bool | None = None  # whether the answer was timed again against plain decoding (None: not asked for)

    def output(self) -> tuple[str, str]:
        """What must not change between runs of the same settings: the text (with its
        per-round colouring) and the last round's tree."""
        return text_div(self.view_html), self.tree_digest


def offered_drafters(client) -> tuple[str, ...]:
    """The drafter kinds the served app offers, as its ``/generate`` endpoint declares them: the kinds
    of the drafter registry (``tev.engine.models.DRAFTERS``) that the served pair ships, in the
    registry's order (``ModelService.drafter_kinds``)."""
    inputs = client.view_api(print_info=False, return_format="dict")["named_endpoints"]["/generate"]["parameters"]
    return tuple(inputs[LiveSettings.names().index("drafter")]["type"]["enum"])


def warm_up_settings(user: int, drafters: tuple[str, ...]) -> LiveSettings:
    """User ``user``'s warm-up request. The first ``len(VERIFIERS)`` take each code path once at
    its largest size (greedy with the autoregressive comparison, which also makes the head
    screen's 56 MB bfloat16 copy; then each sampling verifier), so a path's one-time allocations are in the
    memory read after warm-up and not counted as growth; the others send a short request (16
    heavy warm-ups at once would wait past the client's timeout on two cores)."""
    prompt = f"# user {user}\n" + PROMPTS[user % len(PROMPTS)]
    if user >= len(VERIFIERS):
        return live_request(prompt=prompt, budget=16, max_new_tokens=32, seed=user)
    verifier = ("greedy", *SAMPLING_VERIFIERS)[user]
    return live_request(prompt=prompt, drafter=drafters[user % len(drafters)], verifier=verifier, budget=64,
                    temperature=0.0 if verifier == "greedy" else 1.0, max_new_tokens=96, seed=user, compare_ar=verifier == "greedy")


def random_settings(rng: random.Random, user: int, drafters: tuple[str, ...]) -> LiveSettings:
    verifier = rng.choice(VERIFIERS)
    temperature = 0.0 if verifier == "greedy" else rng.choice(TEMPERATURES)
    return live_request(
        prompt=f"# user {user}\n" + rng.choice(PROMPTS),  # each user's prompts are its own
        drafter=rng.choice(drafters),
        verifier=verifier,
        budget=rng.choice((4, 8, 16, 24, 32, 48, 64)),
        temperature=temperature,
        max_new_tokens=rng.choice((16, 32, 48, 64, 96)),
        seed=rng.randrange(0, 2**31 - 1),
        compare_ar=rng.random() < 0.15,
    )


def page_settings(rng: random.Random, user: int, opening: LiveSettings, max_new_tokens: int = PAGE_NEW_TOKENS) -> LiveSettings:
    """A visitor asking Live at the page's ``opening`` settings (:func:`opening_settings`: its drafter, law, budget,
    the autoregressive re-timing) with ``max_new_tokens`` and a seed of its own; the prompt is one of the held-out
    chat prompts where the page sends chat, else one of the code prompts, marked as this user's."""
    prompt = rng.choice(load_prompt_set("chat"))["text"] if opening.chat else rng.choice(PROMPTS)
    return replace(opening, prompt=f"# user {user}\n" + prompt, max_new_tokens=max_new_tokens, seed=rng.randrange(0, 2**31 - 1))


def classify(error: BaseException) -> tuple[str, str]:
    message = str(error).strip() or type(error).__name__
    if isinstance(error, QueueError):
        return "queue_full", message
    if isinstance(error, AppError):
        return "app_error", message
    if isinstance(error, TimeoutError):
        return "timeout", message
    return "transport", f"{type(error).__name__}: {message}"


def run_one(client, settings: LiveSettings, user: int, timeout: float = 180.0, poll: float = 0.02, phase: str = "load") -> Result:
    """Submit one /generate request and time it (see the module docstring)."""
    result = Result(user=user, settings=settings, phase=phase)
    t0 = time.perf_counter()
    try:
        job = submit(settings, client)
        while not job.done():
            now = time.perf_counter() - t0
            if result.queue_wait != result.queue_wait and job.status().code.value in STARTED:
                result.queue_wait = now
            if result.first_output != result.first_output and job.outputs():
                result.first_output = now
            if now > timeout:
                job.cancel()
                if result.queue_wait != result.queue_wait:  # never left the queue: the server is busy, not stuck
                    raise TimeoutError(f"no answer within {timeout:.0f}s: still waiting in the queue")
                if result.first_output == result.first_output:
                    raise TimeoutError(f"no answer within {timeout:.0f}s: started and streaming, not finished")
                raise TimeoutError(f"no answer within {timeout:.0f}s: started, no output (a hang)")
            time.sleep(poll)
        outputs = job.result(timeout=timeout)
        result.latency = time.perf_counter() - t0
        where = generate_outputs(client)
        summary = outputs[where["summary"]] or {}  # none: no rounds
        result.view_html, result.tokens = outputs[where["text"]] or "", summary.get("tokens", 0)
        result.retimed = summary.get("timing") is not None if settings.compare_ar else None
        result.tree_digest = hashlib.sha256(json.dumps(outputs[where["tree"]], sort_keys=True, default=str).encode()).hexdigest()[:16]
    except BaseException as error:  # noqa: BLE001 - every failure is classified and reported
        result.latency = time.perf_counter() - t0
        result.outcome, result.message = classify(error)
    for name in ("queue_wait", "first_output"):  # finished between two polls
        if getattr(result, name) != getattr(result, name) and result.outcome == "ok":
            setattr(result, name, result.latency)
    return result


def new_client(url: str):
    if Client is None:
        raise RuntimeError("the load test needs gradio_client (pip install -r requirements.txt)")
    return Client(url, verbose=False)


# ----------------------------------------------------------------------------- one load level
def percentile(values: list[float], q: float) -> float:
    """The observed value nearest the ``q`` quantile, NaNs left out."""
    return quantile([v for v in values if v == v], q, method="nearest")


class PeakMemory:
    """Polls a process's VmRSS in a thread (every ``interval`` s) and keeps the largest value."""

    def __init__(self, pid: int | None, interval: float = 0.5):
        self.pid, self.interval, self.peak = pid, interval, rss_kib(pid) or 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self):
        while not self._stop.wait(self.interval):
            self.peak = max(self.peak, rss_kib(self.pid) or 0)

    def stop(self) -> int:
        self._stop.set()
        self._thread.join()
        return max(self.peak, rss_kib(self.pid) or 0)


def start_workload(url: str, pack: str, minutes: float):
    """Submit one workload ExitTrain run (the ExitTrain tab's workload mode) from its own client."""
    job = new_client(url).submit(pack, "", minutes, api_name="/adapt_workload")  # the recipe: the tab's default (the client fills it in)
    return job, time.perf_counter()


def workload_outcome(job, started: float, timeout: float) -> dict:
    """Wait for a workload run to end; its outcome, time and last status line."""
    try:
        outputs = job.result(timeout=timeout)
        return {"outcome": "ok", "seconds": round(time.perf_counter() - started, 1), "status": str(outputs[0])[:200]}
    except Exception as error:  # noqa: BLE001 - recorded, judged by the caller
        return {"outcome": "error", "seconds": round(time.perf_counter() - started, 1), "status": f"{type(error).__name__}: {str(error)[:200]}"}


def run_level(url: str, pid: int | None, users: int, seconds: float, drafters: tuple[str, ...], seed: int = 0, timeout: float = 180.0, poll: float = 0.02,
              workload: str | None = None, opening: LiveSettings | None = None) -> tuple[dict, list[Result]]:
    """N users, each looping /generate for ``seconds`` after one warm-up request each, with random
    settings over ``drafters``; with ``workload`` (a shipped pack), a workload ExitTrain run starts
    with the loop and the level waits for it to end. With ``opening`` (the page's opening settings) every
    request is a visitor at those settings (:func:`page_settings`). The server's peak memory is sampled throughout."""
    settings_of = (lambda rng, user: page_settings(rng, user, opening)) if opening else (lambda rng, user: random_settings(rng, user, drafters))
    clients = [new_client(url) for _ in range(users)]
    memory = {"start": rss_kib(pid)}
    peak = PeakMemory(pid)
    results: list[Result] = []
    lock = threading.Lock()

    def warm(user: int):
        outcome = run_one(clients[user], warm_up_settings(user, drafters), user, timeout, poll, phase="warm-up")
        with lock:
            results.append(outcome)

    _each_user(warm, users)
    memory["warm"] = rss_kib(pid)
    training = start_workload(url, workload, 5) if workload else None
    deadline = time.perf_counter() + seconds
    started = time.perf_counter()

    def loop(user: int):
        rng = random.Random(seed * 1000 + user)
        while time.perf_counter() < deadline:
            outcome = run_one(clients[user], settings_of(rng, user), user, timeout, poll)
            with lock:
                results.append(outcome)

    hung = _each_user(loop, users, join_timeout=seconds + timeout + 30)
    elapsed = time.perf_counter() - started
    trained = workload_outcome(*training, timeout=900) if training else None
    memory["end"], memory["peak"] = rss_kib(pid), peak.stop()
    for client in clients:
        close = getattr(client, "close", None)
        if close:
            close()
    summary = level_summary(users, elapsed, hung, results, memory)
    if trained is not None:
        summary["workload_run"] = {"pack": workload, **trained}
    return summary, results


def _each_user(work, users: int, join_timeout: float | None = None) -> int:
    """``work(user)`` for every user at once, each in its own thread; how many were still running
    after ``join_timeout`` seconds (hung)."""
    threads = [threading.Thread(target=work, args=(u,)) for u in range(users)]
    [t.start() for t in threads]
    [t.join(timeout=join_timeout) for t in threads]
    return sum(t.is_alive() for t in threads)


def level_summary(users: int, elapsed: float, hung: int, results: list[Result], memory: dict) -> dict:
    """One level in numbers: requests, errors by kind and message, latency quantiles, tokens, and the
    server's memory (``memory``: VmRSS in KiB at ``start``, after warm-up ``warm``, at the ``end``, and the ``peak``)."""
    load = [r for r in results if r.phase == "load"]
    ok = [r for r in load if r.outcome == "ok"]
    errors: dict[str, dict[str, int]] = {}
    for r in results:
        if r.outcome != "ok":
            errors.setdefault(r.outcome, {}).setdefault(r.message[:200], 0)
            errors[r.outcome][r.message[:200]] += 1
    rss_warm, rss_end = memory["warm"], memory["end"]
    growth = (rss_end - rss_warm) / rss_warm if rss_end and rss_warm else None

    def mib(kib):
        return round(kib / 1024, 1) if kib else None

    return {
        "users": users,
        "seconds": round(elapsed, 1),
        "requests": len(load),
        "served": len(ok),
        "warm_up_requests": len(results) - len(load),
        "errors": sum(r.outcome != "ok" for r in results),
        "errors_by_kind": errors,
        "hung_users": hung,
        "requests_per_second": round(len(ok) / elapsed, 3) if elapsed else None,
        "tokens_served": sum(r.tokens for r in ok),
        "retimed": sum(bool(r.retimed) for r in ok),  # answers timed again against plain decoding (the rest asked for it while others waited)
        "tokens_per_second": round(sum(r.tokens for r in ok) / elapsed, 1) if elapsed else None,
        "latency_p50_s": round(percentile([r.latency for r in ok], 0.5), 3),
        "latency_p95_s": round(percentile([r.latency for r in ok], 0.95), 3),
        "latency_max_s": round(max((r.latency for r in ok), default=float("nan")), 3),
        "queue_wait_p50_s": round(percentile([r.queue_wait for r in ok], 0.5), 3),
        "queue_wait_p95_s": round(percentile([r.queue_wait for r in ok], 0.95), 3),
        "first_output_p50_s": round(percentile([r.first_output for r in ok], 0.5), 3),
        "first_output_p95_s": round(percentile([r.first_output for r in ok], 0.95), 3),
        "rss_start_mib": mib(memory["start"]),
        "rss_after_warmup_mib": mib(rss_warm),
        "rss_end_mib": mib(rss_end),
        "rss_growth_after_warmup": round(growth, 4) if growth is not None else None,
        "rss_peak_mib": mib(memory["peak"]),
    }


# ----------------------------------------------------------------------------- checks
def check_identical_seeds(url: str, copies: int = 4, timeout: float = 180.0) -> dict:
    """``copies`` users with the same settings+seed and ``copies`` with another seed, all at once."""
    base = live_request(prompt=PROMPTS[1], drafter="block", verifier="tev", budget=16, temperature=1.0, max_new_tokens=48, seed=1234)
    other = replace(base, seed=4321)
    solo_client = new_client(url)
    solo = {s.seed: run_one(solo_client, s, -1, timeout, phase="solo") for s in (base, other)}
    clients = [new_client(url) for _ in range(2 * copies)]
    outcomes: list[Result | None] = [None] * (2 * copies)

    def go(i: int):
        outcomes[i] = run_one(clients[i], base if i % 2 == 0 else other, i, timeout, phase="identical-seed")

    threads = [threading.Thread(target=go, args=(i,)) for i in range(2 * copies)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    same = [o for i, o in enumerate(outcomes) if i % 2 == 0]
    diff = [o for i, o in enumerate(outcomes) if i % 2 == 1]
    errors = [o.message for o in outcomes + list(solo.values()) if o is None or o.outcome != "ok"]
    identical = not errors and all(o.output() == solo[base.seed].output() for o in same)
    other_identical = not errors and all(o.output() == solo[other.seed].output() for o in diff)
    seeds_differ = solo[base.seed].output() != solo[other.seed].output()
    return {
        "settings": asdict(base),
        "other_seed": other.seed,
        "copies_per_seed": copies,
        "errors": errors,
        "same_seed_identical_to_each_other_and_solo": identical,
        "other_seed_identical_to_its_solo": other_identical,
        "the_two_seeds_give_different_text": seeds_differ,
        "text_seed_%d" % base.seed: plain_text(solo[base.seed].view_html)[:300],
        "text_seed_%d" % other.seed: plain_text(solo[other.seed].view_html)[:300],
        "passed": identical and other_identical and seeds_differ,
    }


def check_own_outputs(url: str, results: list[Result], sample: int = 24, seed: int = 0, timeout: float = 180.0) -> dict:
    """Re-run a sample of load requests alone; each must reproduce the text it got under load."""
    served = [r for r in results if r.outcome == "ok" and r.phase == "load"]
    rng = random.Random(seed)
    chosen = rng.sample(served, min(sample, len(served)))
    client = new_client(url)
    mismatches, wrong_prompt = [], []
    for r in chosen:
        if prompt_shown(r.view_html) != r.settings.prompt or not plain_text(r.view_html).startswith(r.settings.prompt):
            wrong_prompt.append(asdict(r.settings))
        again = run_one(client, r.settings, r.user, timeout, phase="solo")
        if again.outcome != "ok" or again.output() != r.output():
            mismatches.append({"settings": asdict(r.settings), "under_load": plain_text(r.view_html)[:200], "solo": plain_text(again.view_html)[:200] or again.message})
    all_prompts_own = all(prompt_shown(r.view_html) == r.settings.prompt for r in served)
    return {
        "served_under_load": len(served),
        "rerun_alone": len(chosen),
        "mismatches": mismatches,
        "texts_not_starting_with_own_prompt": wrong_prompt,
        "every_served_text_shows_its_own_prompt": all_prompts_own,
        "passed": not mismatches and not wrong_prompt and all_prompts_own,
    }


def check_queue_full(url: str, max_size: int = 32, extra: int = 8, timeout: float = 120.0) -> dict:
    """Submit ``max_size + extra`` long requests at once; the excess must be refused clearly."""
    long = live_request(prompt=PROMPTS[0], budget=64, temperature=1.0, max_new_tokens=256, seed=0)
    client = new_client(url)
    t0 = time.perf_counter()
    jobs = [submit(replace(long, seed=i), client) for i in range(max_size + extra)]
    submitted = time.perf_counter() - t0
    deadline = time.perf_counter() + 30
    while time.perf_counter() < deadline and not all(j.done() or j.status().code.value in ("IN_QUEUE", *STARTED) for j in jobs):
        time.sleep(0.1)
    time.sleep(1.0)
    refused, messages, other, states = 0, set(), [], {}
    for job in jobs:
        state = job.status().code.value
        if job.done():
            try:
                job.result(timeout=1)
            except QueueError as error:
                refused += 1
                messages.add(str(error))
                state = "refused"
            except Exception as error:  # noqa: BLE001
                other.append(f"{type(error).__name__}: {error}")
        states[state] = states.get(state, 0) + 1
    for job in jobs:  # free the server: cancel what is still queued or running
        if not job.done():
            job.cancel()
    time.sleep(2.0)
    after = run_one(new_client(url), live_request(prompt=PROMPTS[0], budget=8, max_new_tokens=16, seed=1), 0, timeout, phase="after-queue-full")
    clear = refused > 0 and all("queue is full" in m.lower() for m in messages)
    return {
        "submitted": len(jobs),
        "submit_seconds": round(submitted, 2),
        "states_after_submit": states,
        "refused": refused,
        "refusal_messages": sorted(messages),
        "other_errors": other,
        "served_right_after": after.outcome == "ok",
        "latency_right_after_s": round(after.latency, 3),
        "passed": clear and not other and after.outcome == "ok",
    }


# ----------------------------------------------------------------------------- report
def markdown(report: dict) -> str:
    lines = [
        "# Load test",
        "",
        f"Server: {report['url']} (pid {report.get('pid')}), assets {report.get('assets') or ('as the attached server has them' if report.get('attached') else 'the app default')}; "
        f"{report['seconds_per_level']} s per level; drafters {', '.join(report['drafters'])}; machine: {os.cpu_count()} CPUs. Command: `{report['command']}`",
        "",
        "| users N | requests served (re-timed) | errors | p50 latency | p95 latency | longest | queue wait p50 / p95 | first output p50 / p95 | tokens/s | RSS start | RSS after warm-up | RSS end | growth after warm-up | RSS peak |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for level in report["levels"]:
        def mib(key):
            return f"{level[key]:.0f} MiB" if level.get(key) else "n/a"

        growth = f"{100 * level['rss_growth_after_warmup']:+.1f}%" if level.get("rss_growth_after_warmup") is not None else "n/a"
        lines.append(
            f"| {level['users']} | {level['served']} ({level.get('retimed', 0)}; +{level['warm_up_requests']} warm-up) | {level['errors']} | {level['latency_p50_s']:.2f} s | {level['latency_p95_s']:.2f} s | {level.get('latency_max_s', float('nan')):.2f} s | "
            f"{level['queue_wait_p50_s']:.2f} / {level['queue_wait_p95_s']:.2f} s | {level['first_output_p50_s']:.2f} / {level['first_output_p95_s']:.2f} s | {level['tokens_per_second']} | "
            f"{mib('rss_start_mib')} | {mib('rss_after_warmup_mib')} | {mib('rss_end_mib')} | {growth} | {mib('rss_peak_mib')} |"
        )
    for level in report["levels"]:
        if "workload_run" in level:
            w = level["workload_run"]
            lines.append(f"\nN={level['users']}: a workload ExitTrain run ({w['pack']}) beside the users: {w['outcome']} in {w['seconds']} s ({w['status']})")
    errors = {k: v for level in report["levels"] for k, v in level["errors_by_kind"].items()}
    lines += ["", "Errors by kind: " + (json.dumps(errors) if errors else "none."), ""]
    if "identical_seeds" in report:
        s = report["identical_seeds"]
        lines.append(
            f"- Identical seeds ({s['copies_per_seed']} users with seed {s['settings']['seed']} and {s['copies_per_seed']} with seed {s['other_seed']}, all at once): "
            f"same seed identical to each other and to a solo run: **{s['same_seed_identical_to_each_other_and_solo']}**; other seed identical to its solo run: "
            f"**{s['other_seed_identical_to_its_solo']}**; the two seeds differ: **{s['the_two_seeds_give_different_text']}**."
        )
    if "own_outputs" in report:
        o = report["own_outputs"]
        lines.append(
            f"- Own outputs: {o['rerun_alone']} of {o['served_under_load']} requests served under load re-run alone: {len(o['mismatches'])} mismatches; "
            f"every served text shows its own prompt: **{o['every_served_text_shows_its_own_prompt']}**."
        )
    if "queue_full" in report:
        q = report["queue_full"]
        lines.append(
            f"- Queue full: {q['submitted']} long requests submitted at once (queue max_size 32, 2 running): {q['refused']} refused with "
            f"{q['refusal_messages']}; other errors {len(q['other_errors'])}; a request right after was served: **{q['served_right_after']}** ({q['latency_right_after_s']} s)."
        )
    lines += ["", f"Overall: **{'PASS' if report['passed'] else 'FAIL'}** ({'; '.join(report['failures']) or 'no failures'})", ""]
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", help="attach to a running app (default: start `python app.py` on a free port)")
    parser.add_argument("--pid", type=int, help="the attached server's process id (for its memory)")
    parser.add_argument("--assets", default=os.environ.get("TEV_ASSETS_DIR"), help="assets folder for the started server (TEV_ASSETS_DIR; default: the app's own)")
    parser.add_argument("--users", type=int, nargs="+", default=[4, 8, 16], help="concurrent user counts, one level each")
    parser.add_argument("--seconds", type=float, default=60.0, help="duration of each level")
    parser.add_argument("--seed", type=int, default=0, help="seed of the users' random settings")
    parser.add_argument("--poll", type=float, default=0.02, help="status polling interval of each user (s)")
    parser.add_argument("--timeout", type=float, default=180.0, help="a request with no answer by then counts as an error (its message says whether it was still queued, streaming, or stuck)")
    parser.add_argument("--identical-copies", type=int, default=4, help="users per seed in the identical-seed check (0: skip)")
    parser.add_argument("--rerun-sample", type=int, default=24, help="load requests re-run alone to compare (0: skip)")
    parser.add_argument("--no-queue-check", action="store_true", help="skip the queue-full check")
    parser.add_argument("--queue-extra", type=int, default=8, help="submits beyond the queue's max_size (32) in the queue-full check")
    parser.add_argument("--out", help="folder for loadtest.json and loadtest.md")
    parser.add_argument("--page-defaults", nargs="?", const="", default=None, metavar="DRAFTER",
                        help=f"every request asks Live at the page's opening settings as /generate declares them (its drafter, law, budget auto, "
                             f"the autoregressive re-timing; a chat prompt where the page sends chat) with {PAGE_NEW_TOKENS} new tokens, "
                             "instead of random settings; DRAFTER: another drafter than the page's opening one")
    parser.add_argument("--workload", default=None, help="a shipped workload pack: each level also runs one workload ExitTrain (5 minutes) beside the users")


def run(args: argparse.Namespace) -> int:
    """The levels and checks ``args`` ask for; 0 when every check passed."""
    server = None
    url, pid = args.url, args.pid
    if url is None:
        out_dir = Path(args.out or "/tmp")
        out_dir.mkdir(parents=True, exist_ok=True)
        extra = {} if args.assets else {"TEV_ASSETS_DIR": os.environ.get("TEV_ASSETS_DIR", "")}
        server = AppServer(Path(args.assets) if args.assets else assets_dir(), out_dir / "loadtest-server.log", extra_env=extra)
        url, pid = server.url, server.process.pid
        print(f"started the app at {url} (pid {pid}) in {server.wait_ready():.1f}s", flush=True)
    report: dict = {"url": url, "pid": pid, "assets": args.assets if server else None, "attached": server is None, "seconds_per_level": args.seconds, "command": " ".join(["python -m tev bench loadtest", *sys.argv[3:]]), "levels": []}
    all_results: list[Result] = []
    try:
        report["drafters"] = drafters = offered_drafters(new_client(url))
        opening = None
        if args.page_defaults is not None:
            opening = opening_settings(new_client(url))
            opening = dataclasses.replace(opening, drafter=args.page_defaults or opening.drafter)
            report["page_defaults"] = {**asdict(opening), "prompt": "held-out chat prompts" if opening.chat else "the code prompts", "max_new_tokens": PAGE_NEW_TOKENS}
        for users in args.users:
            summary, results = run_level(url, pid, users, args.seconds, drafters, seed=args.seed + users, timeout=args.timeout, poll=args.poll, workload=args.workload,
                                         opening=opening)
            report["levels"].append(summary)
            all_results += results
            print(json.dumps(summary), flush=True)
        if args.identical_copies:
            report["identical_seeds"] = check_identical_seeds(url, args.identical_copies, args.timeout)
            print("identical seeds:", report["identical_seeds"]["passed"], flush=True)
        if args.rerun_sample:
            report["own_outputs"] = check_own_outputs(url, all_results, args.rerun_sample, args.seed, args.timeout)
            print("own outputs:", report["own_outputs"]["passed"], flush=True)
        if not args.no_queue_check:
            report["queue_full"] = check_queue_full(url, extra=args.queue_extra, timeout=args.timeout)
            print("queue full:", json.dumps(report["queue_full"]), flush=True)
        if pid:
            report["server_alive_at_end"] = Path(f"/proc/{pid}").exists()
    finally:
        if server is not None:
            server.stop()
    failures = []
    for level in report["levels"]:
        if level["errors"]:
            failures.append(f"N={level['users']}: {level['errors']} errors")
        if level["hung_users"]:
            failures.append(f"N={level['users']}: {level['hung_users']} users hung")
        if level["served"] == 0:
            failures.append(f"N={level['users']}: nothing served")
        if level.get("workload_run", {}).get("outcome", "ok") != "ok":
            failures.append(f"N={level['users']}: the workload run failed ({level['workload_run']['status']})")
        if level.get("rss_growth_after_warmup") is not None and level["rss_growth_after_warmup"] > MEMORY_GOAL:
            failures.append(f"N={level['users']}: memory grew {100 * level['rss_growth_after_warmup']:.1f}% after warm-up")
    for check in ("identical_seeds", "own_outputs", "queue_full"):
        if check in report and not report[check]["passed"]:
            failures.append(f"{check} failed")
    if report.get("server_alive_at_end") is False:
        failures.append("the server died")
    report["failures"] = failures
    report["passed"] = not failures
    text = markdown(report)
    print(text)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        write_result(out / "loadtest.json", "loadtest", report, default=str)
        (out / "loadtest.md").write_text(text)
        print(f"wrote {out / 'loadtest.json'} and {out / 'loadtest.md'}")
    return 0 if report["passed"] else 1
