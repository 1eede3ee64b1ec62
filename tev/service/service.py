"""Server-side state for the app: models loaded once, input checks, one ExitTrain run at a time.

The app (``app.py``) only wires UI events to these functions; nothing here imports gradio.
Every request gets its own generator, records and seed; the models are shared read-only.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field

import torch

from tev.core.budget import Calibration, RoundRate
from tev.core.sampling import SamplingLaw
from tev.engine.auto_budget import AutoBudget
from tev.engine.cost_curve import CostCurve, kept_cost_curve, machine_cost_curve
from tev.engine.drafter_threads import agree_here
from tev.engine.decode import MAX_BUDGET, MIN_TEMPERATURE, DecodeConfig, GenerationSummary, autoregressive_generate, Request, speculative_generate
from tev.engine.round import RoundRecord
from tev.engine.run_speed import Machine
from tev.engine.models import DRAFTER_KINDS, ModelBundle, Pair, default_kind, default_pair, load_bundle, offered_kinds, pair_record
from tev.pipelines.workload import adapted_kind
from tev.service.adapted import AdaptedDrafters, is_adapted
from tev.service.live_settings import LiveInput, LiveSettings
from tev.util.compute_thread import ComputeThread, result_of as _result
from tev.util.cpus import threads_words
from tev.engine.prompt_text import encode_chat, encode_prompt

__all__ = ["Limits", "LIMITS", "DEFAULT_SAMPLING", "ModelService", "Retiming", "IdleTiming", "IdleTimings", "machine_load", "as_text", "check_number", "finite_number", "check_settings", "records_to_json", "TrainingSlot", "UserInputError"]


class UserInputError(ValueError):
    """Bad input from a user; the message says what to change, and ``field`` (when known) which setting:
    a field of :class:`~tev.service.live_settings.LiveSettings` or a parameter of the event's check, so the page
    puts the message under that input."""

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class Retiming:
    """A finished generation timed again (:meth:`ModelService.retime`): speculation, then plain
    decoding (None when the first was stopped), and ``others``, the most other requests seen
    sharing the compute thread while either ran (0: the machine was this request's alone), and ``threads``, the
    torch thread counts its steps ran with (empty where the server set none)."""

    speculative: GenerationSummary
    autoregressive: GenerationSummary | None
    others: int
    threads: tuple[int, ...] = ()

    @property
    def measured(self) -> bool:
        """Both runs went to their end (neither was stopped)."""
        return self.autoregressive is not None and "cancelled" not in (self.speculative.stop_reason, self.autoregressive.stop_reason)


def machine_load() -> tuple[float, int]:
    """The machine's load average over the last minute (every process on it, this app's included) and its CPU count."""
    return os.getloadavg()[0], os.cpu_count() or 1


@dataclass(frozen=True)
class IdleTiming:
    """A re-timing (:class:`Retiming`) that no other request shared, kept to be shown to a later answer
    that is not re-timed: when it was taken (``time.time()``) and the machine's load average then."""

    timing: Retiming
    at: float
    load: float
    cpus: int


class IdleTimings:
    """The latest idle re-timing on this machine for each kind of run (drafter, budget auto or fixed, greedy or
    sampled): what a later answer is told when a crowd waits and it is not re-timed. Thread-safe."""

    def __init__(self):
        self._latest: dict[tuple, IdleTiming] = {}
        self._lock = threading.Lock()

    @staticmethod
    def kind(drafter: str, config: DecodeConfig) -> tuple:
        """The kind of run a timing stands for: its drafter, budget auto or its fixed budget, and greedy or sampled."""
        return drafter, "auto" if config.budget == "auto" else config.budget, config.temperature == 0

    def remember(self, kind: tuple, timing: Retiming, load: tuple[float, int]) -> None:
        """Keep ``timing`` for ``kind`` when it was measured (both runs ended) with no other request sharing it."""
        if timing.measured and timing.others == 0:
            with self._lock:
                self._latest[kind] = IdleTiming(timing, time.time(), *load)

    def latest(self, kind: tuple) -> IdleTiming | None:
        with self._lock:
            return self._latest.get(kind)


@dataclass(frozen=True)
class Limits:
    """Ranges of every control (the UI sliders use the same numbers)."""

    max_prompt_chars: int = 4000
    max_budget: int = 256
    max_new_tokens: int = 256
    max_temperature: float = 2.0
    min_top_p: float = 0.05
    max_top_k: int = 1000
    min_temperature: float = MIN_TEMPERATURE  # a policy floor for a positive T (0 is greedy), the library's own
    max_seed: int = 2**31 - 1
    max_lab_budget: int = 64
    min_lab_temperature: float = 0.05  # the lab samples: no greedy there
    max_lab_draws: int = 20000
    min_exittrain_steps: int = 5
    max_exittrain_steps: int = 400
    max_lambda_tree: float = 100


LIMITS = Limits()

# The app's opening sampling law, chosen by measurement (docs/sampling-defaults.json, from
# scripts/sampling_defaults.py, removed after commit b697f37): coherent answers on the held-out prompts and graded reach.
DEFAULT_SAMPLING = SamplingLaw(0.7, top_p=0.9)


def finite_number(name: str, value, low, high, field: str | None = None) -> int | float:
    """``value`` itself when it is a finite int or float (not a bool); else a
    :class:`UserInputError` naming the range ``[low, high]`` (the range is not checked here)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise UserInputError(f"{name} must be a number from {low} to {high}, got {value!r}", field)
    return value


def as_text(value) -> str | None:
    """A text input's value as Gradio's Textbox would have passed it (its preprocessing is off on a
    checked event): None stays None, anything else becomes its ``str``."""
    return None if value is None else str(value)


def check_number(name: str, value, low, high, integer: bool = False, field: str | None = None) -> int | float:
    """A finite number in ``[low, high]`` (a whole one, returned as ``int``, when ``integer``);
    raises :class:`UserInputError` saying what to change (``name``: the setting as the page words it;
    ``field``: its field, see :class:`UserInputError`)."""
    if value is None:
        raise UserInputError(f"{name} is missing; choose a value from {low} to {high}", field)
    number = finite_number(name, value, low, high, field)
    if integer and number != int(number):
        raise UserInputError(f"{name} must be a whole number from {low} to {high}, got {value!r}", field)
    number = int(number) if integer else float(number)
    if not low <= number <= high:
        raise UserInputError(f"{name} must be from {low} to {high}, got {value!r}", field)
    return number


def check_settings(verifier: str, budget, temperature, max_new_tokens, seed, top_p=1.0, top_k=0, budget_is_auto: bool = False) -> DecodeConfig:
    """The page's settings within its ranges (:data:`LIMITS`), as a :class:`DecodeConfig` (whose
    making checks the verifier, the temperature floor and greedy at T > 0); raises
    :class:`UserInputError` saying what to change. ``top_p`` 1 and ``top_k`` 0 leave the
    target's rows untruncated. With ``budget_is_auto`` the budget is "auto" and ``budget`` its cap; a
    budget of 0 drafts nothing either way (plain decoding)."""
    budget = check_number("budget", budget, 0, min(LIMITS.max_budget, MAX_BUDGET), integer=True, field="budget")
    temperature = check_number("temperature", temperature, 0.0, LIMITS.max_temperature, field="temperature")
    max_new_tokens = check_number("max new tokens", max_new_tokens, 1, LIMITS.max_new_tokens, integer=True, field="max_new_tokens")
    seed = check_number("seed", seed, 0, LIMITS.max_seed, integer=True, field="seed")
    top_p = check_number("top-p", top_p, LIMITS.min_top_p, 1.0, field="top_p")
    top_k = check_number("top-k", top_k, 0, LIMITS.max_top_k, integer=True, field="top_k")
    try:
        budget_fields = {"budget": "auto", "budget_cap": budget} if budget_is_auto and budget > 0 else {"budget": budget}
        return DecodeConfig(**budget_fields, temperature=temperature, top_k=top_k, top_p=top_p, verifier=verifier, max_new_tokens=max_new_tokens, seed=seed)
    except ValueError as error:
        raise UserInputError(str(error)) from None


class ModelService:
    """The shared models, loaded lazily once (thread-safe), plus the one thread that runs them.

    Torch on a 2-core CPU gains nothing from two requests running matrix work at once, so every
    piece of model work is a step that ``compute`` (a :class:`ComputeThread`) runs in turn with
    the others, interactive work (a user's rounds) ahead of background work (a fine-tune);
    Gradio's queue bounds how many wait.
    """

    def __init__(self, target: str | None = None, draft: str | None = None, device: str = "auto", pair: str | None = None, dtype: str = "auto"):
        self.target_source = target
        self.draft_source = draft
        self.device = device
        self.dtype = dtype  # the target's precision ("auto": float32 on a CPU, the exact default)
        self.pair = pair  # a shipped pair when no target is given (None: $TEV_PAIR or the default)
        self._bundle: ModelBundle | None = None
        self.compute = ComputeThread()  # users' rounds first; a fine-tune's steps (background) still get their share of the time
        self.idle_timings = IdleTimings()  # the latest re-timing that ran alone, per kind of run
        self._runs = 0  # interactive runs being served (see serving), with the lock below
        self._runs_lock = threading.Lock()
        self._curve_lock = threading.Lock()  # one cost curve measurement at a time (the start's and a first request's)
        self._thread_free: dict[int, bool] = {}  # per drafter (its id): whether its rounds are the same at both thread counts
        # each browser session's adapted drafters for this target (set by the app where its workload runs adapt this
        # target's drafter); None: this service serves no adapted drafter
        self.adapted: AdaptedDrafters | None = None

    def bundle(self) -> ModelBundle:
        """The models, loaded on first use in the compute thread: the target's forward is checked and
        timed there, at the threads a visitor's run will have, and no other thread starts an OpenMP team of
        several threads (see :mod:`tev.util.compute_thread`, "Threads")."""
        if self._bundle is None:
            threads = self.compute.threads  # one step at a time: two first requests load once
            self.compute.call_at(threads.full if threads is not None else None, self._load)
        return self._bundle

    def _load(self) -> None:
        if self._bundle is None:
            bundle = load_bundle(self.target_source, self.draft_source, device=self.device, dtype=self.dtype, pair=self.pair)
            threads = self.compute.threads
            if threads is not None and threads.switches and not (bundle.precision is not None and bundle.precision.invariant):
                # transformers' forward rounds a row differently at another count: one count, so a seed gives one answer
                self.compute.keep_one_count()
            self._bundle = bundle

    def _shipped_pair(self) -> Pair | None:
        """The shipped pair this service serves (None for a target or drafter given by path)."""
        if self.target_source is None and self.draft_source is None:
            return pair_record(self.pair or default_pair())
        return None

    def drafter_kinds(self) -> list[str]:
        """The drafter kinds the page offers, known before any model loads: a shipped pair's own
        (a kind it does not ship would only be refused); every kind for a target or drafter given by path."""
        shipped = self._shipped_pair()
        return offered_kinds(shipped) if shipped else list(DRAFTER_KINDS)

    def default_drafter_kind(self) -> str:
        """The drafter kind the page starts with: the shipped pair's default where it ships it, else ``block``."""
        shipped = self._shipped_pair()
        return default_kind(shipped) if shipped else "block"

    def target_precision(self):
        """The target's forward and precision (:class:`~tev.engine.target_precision.TargetPrecision`)
        once the models are loaded; None before."""
        return self._bundle.precision if self._bundle is not None else None

    def info(self) -> dict:
        bundle = self.bundle()
        target = bundle.target
        device = next(target.parameters()).device
        sizes = {"target": sum(p.numel() for p in target.parameters())}
        for name, drafter in bundle.drafters.items():
            if name in ("chain",):
                continue
            sizes[name] = sum(p.numel() for p in drafter.model.parameters())
        return {
            "device": str(device) + (f" ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else ""),
            "dtype": str(next(target.parameters()).dtype).replace("torch.", ""),
            "target_forward": bundle.precision.to_dict() if bundle.precision is not None else None,
            "threads": self.threads(),
            "context": bundle.context_length,
            "vocab": len(bundle.tokenizer),
            "parameters": sizes,
            "drafters": list(bundle.drafters),
            "target_source": bundle.target_source,
            "pair": bundle.pair,
            "chat": bundle.is_chat,
        }

    def encode(self, prompt, chat: bool = False) -> list[int]:
        """The checked token ids of a user's prompt: a user message through the chat template
        when ``chat`` (and the target has one), else the raw text (raises :class:`UserInputError`)."""
        bundle = self.bundle()
        encode = encode_chat if chat and bundle.is_chat else encode_prompt
        try:
            return encode(bundle.tokenizer, prompt, bundle.context_length, LIMITS.max_prompt_chars)
        except ValueError as error:
            raise UserInputError(str(error)) from None

    def drafter(self, kind: str):
        """The target's drafter of kind ``kind``; raises :class:`UserInputError` (of the drafter input) when it has none."""
        try:
            return self.bundle().drafter(kind)
        except ValueError as error:
            raise UserInputError(str(error), "drafter") from None

    def check_drafter_choice(self, name) -> None:
        """Refuses (:class:`UserInputError`) a drafter choice this service cannot serve: a kind its target lacks, or
        an adapted drafter where it keeps none. Which session's adapted drafter it is, and its kind, is settled when
        it is served (:meth:`chosen_drafter`), since a check does not know the session."""
        if is_adapted(name):
            self._adapted_store()
        else:
            self.drafter(name)

    def chosen_drafter(self, name, session: str):
        """The drafter a choice names: a drafter kind of the target, or ``session``'s adapted drafter (or any
        session's, by its API name); :class:`UserInputError` saying why not."""
        if not is_adapted(name):
            return self.drafter(name)
        return self._adapted(lambda store: store.drafter(session, name))

    def served_drafter(self, name, session: str, law: SamplingLaw) -> tuple[object, str | None]:
        """The drafter Live runs for a choice at ``law``, and a sentence when it is not the one chosen: an adapted
        drafter only where it measured no worse than the shipped one it was adapted from
        (:meth:`~tev.service.adapted.AdaptedDrafters.serving`); :class:`UserInputError` as :meth:`chosen_drafter`."""
        if not is_adapted(name):
            return self.drafter(name), None
        bundle = self.bundle()
        return self._adapted(lambda store: store.serving(session, name, law, bundle.drafter(adapted_kind(bundle))))

    def _adapted_store(self) -> AdaptedDrafters:
        if self.adapted is None:
            raise UserInputError("adapted drafters are made for the default pair's target; this server's Live tab runs another target", "drafter")
        return self.adapted

    def _adapted(self, look_up):
        """``look_up(store)`` on the adapted drafters, its ``ValueError`` (none kept for the session) refused as a bad
        choice of the drafter input."""
        store = self._adapted_store()
        try:
            return look_up(store)
        except ValueError as error:
            raise UserInputError(str(error), "drafter") from None

    def check_live(self, settings: LiveSettings) -> LiveInput:
        """A Live press's settings checked (:class:`LiveInput`): the prompt tokenized (through the chat template
        with ``chat``) and the generation's settings; raises :class:`UserInputError` naming the field to change."""
        bundle = self.bundle()
        if settings.chat and not bundle.is_chat:
            raise UserInputError("this target has no chat template; untick 'chat' to continue the text as it is", "chat")
        try:
            prompt_ids = tuple(self.encode(as_text(settings.prompt), chat=bool(settings.chat)))
        except UserInputError as error:
            raise UserInputError(str(error), "prompt") from None
        config = check_settings(settings.verifier, settings.budget, settings.temperature, settings.max_new_tokens, settings.seed,
                                top_p=settings.top_p, top_k=settings.top_k, budget_is_auto=bool(settings.auto))
        self.check_drafter_choice(settings.drafter)
        return LiveInput(prompt_ids, config)

    def request(self, prompt_ids, drafter, config: DecodeConfig) -> Request:
        """The checked :class:`Request` for ``drafter`` (a drafter of :meth:`drafter`, or a
        session's adapted one); raises :class:`UserInputError` saying what to change."""
        try:
            return Request(self.bundle().runner, drafter, prompt_ids, config)
        except ValueError as error:
            raise UserInputError(str(error)) from None

    def generate(self, request: Request, should_stop=None, sizing: AutoBudget | None = None, first_round: int = 0):
        """Yields a RoundRecord per round (each a step of the compute thread) and returns the
        GenerationSummary (PEP 380: ``summary = yield from ...``). ``sizing``: budget auto's rule and
        what it learned (one user's; see :meth:`auto_budget`); ``first_round``: the first round's number. Its steps
        run at the threads :meth:`run_threads` gives its drafter."""
        work = speculative_generate(request, self.bundle().tokenizer, should_stop=should_stop, sizing=sizing, first_round=first_round)
        return (yield from self.compute.steps(work, threads=self.run_threads(request.drafter)))

    def run_threads(self, drafter) -> int | None:
        """The torch threads a run through ``drafter`` steps with: None (the server's policy: the full count while no
        other process holds a core) where the drafter's rounds were checked the same at both counts, else the reduced
        count for its every step, so a seed gives one answer whatever else runs (a drafter not yet checked, an adapted one)."""
        threads = self.compute.threads
        if threads is None or not threads.switches or self._thread_free.get(id(drafter), False):
            return None
        return threads.reduced

    def threads_note(self) -> str:
        """For the header: which drafters' runs keep the reduced count, and why ("" where the count never switches)."""
        threads = self.compute.threads
        if threads is None or not threads.switches or self._bundle is None:
            return ""
        drafters = self._bundle.drafters
        moved = [kind for kind, drafter in drafters.items() if self._thread_free.get(id(drafter)) is False]
        waiting = [kind for kind, drafter in drafters.items() if id(drafter) not in self._thread_free]
        said = []
        if moved:
            said.append(f"Runs through the {', '.join(moved)} drafter{'s' if len(moved) > 1 else ''} keep {threads_words(threads.reduced)}: "
                        f"{'their' if len(moved) > 1 else 'its'} trees came out with other bits at {threads.reduced} and {threads.full} "
                        "threads when checked at start, and a seed must give one answer whatever else runs.")
        if waiting:
            said.append(f"The {', '.join(waiting)} drafter{'s are' if len(waiting) > 1 else ' is'} still being checked at both thread counts; "
                        f"until then {'their' if len(waiting) > 1 else 'its'} runs keep {threads_words(threads.reduced)}.")
        return " ".join(said)

    def call_with(self, drafter, function, *args, **kwargs):
        """``function(*args, **kwargs)`` as one step of the compute thread at the threads of a run through ``drafter``
        (:meth:`run_threads`): a walkthrough's or the lab's tree."""
        return self.compute.call_at(self.run_threads(drafter), function, *args, **kwargs)

    def auto_budget(self, config: DecodeConfig, calibration: Calibration, rate: RoundRate) -> AutoBudget:
        """Budget auto for one request: the machine's cost curve (measured in the compute thread
        the first time, see :meth:`cost_curve`), ``config.budget_cap`` and the caller's own
        ``calibration`` and ``rate``, which the request's rounds then update."""
        return AutoBudget(self.cost_curve(), config.budget_cap, calibration, rate)

    def warm_drafters(self) -> None:
        """Prepare every drafter's inference weights now, in the compute thread (a drafter with a ``warm``
        method builds them on first use otherwise, in a visitor's first round); where the server's thread count
        switches, check each drafter's rounds at both counts (:meth:`run_threads`), one drafter
        a step (a second or so each). All of it is background work: a visitor's rounds go first, and a run ending
        meanwhile is not told that other runs wait in the app's line (its re-timing would be skipped for them)."""
        def warm() -> None:
            for drafter in self.bundle().drafters.values():
                if hasattr(drafter, "warm"):
                    drafter.warm()

        self.compute.call_at(None, warm, background=True)
        threads = self.compute.threads
        if threads is None or not threads.switches:
            return
        target = self.bundle().runner
        for drafter in self.bundle().drafters.values():
            if id(drafter) not in self._thread_free:
                counts = (threads.reduced, threads.full)
                self._thread_free[id(drafter)] = self.compute.call_at(threads.full, agree_here, target, drafter, counts, background=True)

    def warm_in_background(self) -> None:
        """Measure the machine's cost curve for budget auto and prepare the drafters' inference weights from a
        background thread (a few seconds, as steps of the compute thread), so the first request waits on neither
        (the path drafter's fused weights took 0.7 s in its first round); a failure is reported in one line and
        the first request does the work again."""

        def measure():
            try:
                self.cost_curve(background=True)
                self.warm_drafters()
            except Exception as error:  # noqa: BLE001 - reported, not raised: the page serves on
                print(f"TEV Explorer: the cost curve for budget auto could not be measured: {error}", file=sys.stderr, flush=True)

        threading.Thread(target=measure, name="tev-cost-curve", daemon=True).start()

    def threads(self) -> int:
        """The torch threads a visitor's run steps with on free cores: the server's full count, else torch's."""
        threads = self.compute.threads
        return threads.full if threads is not None else torch.get_num_threads()

    def machine(self) -> Machine:
        """What runs run on here, as the speed sentences name it: the threads (the server's count in words, or
        torch's) and the target's forward (None before the models load)."""
        threads, precision = self.compute.threads, self.target_precision()
        count = self.threads()
        words = threads.describe() if threads is not None else f"{threads_words(count)} (TEV_THREADS)"
        return Machine(count, words, precision.label if precision else None)

    def cost_curve(self, background: bool = False) -> CostCurve:
        """The process's cost curve for the target at the full count (a few seconds' measurement on first use,
        one step of the compute thread at that count whoever else is served; ``background``: the start's, which a
        run ending meanwhile does not count as a run in the app's line); once measured it is read here, without a
        turn of the compute thread. Runs at the reduced count are priced with it too. A first request that comes
        while the start measures waits for that measurement rather than taking another."""
        runner, threads = self.bundle().runner, self.threads()
        with self._curve_lock:
            curve = kept_cost_curve(runner, threads)  # the target keeps what it measured (its curves)
            if curve is None:
                curve = self.compute.call_at(threads, machine_cost_curve, runner, background=background)
        return curve

    @contextlib.contextmanager
    def serving(self):
        """Counts an interactive run (a Live answer) from its start to its end, its own work outside the compute
        thread included (checks, drawing its figures), for :meth:`others_waiting`."""
        with self._runs_lock:
            self._runs += 1
        try:
            yield
        finally:
            with self._runs_lock:
                self._runs -= 1

    def others_waiting(self) -> int:
        """How many other interactive runs are in the app's line now, as the caller's own (inside :meth:`serving`)
        has ended its compute work: the other runs being served, or more requests in the compute thread's line
        (a walkthrough's or the lab's); background work (a fine-tune) is not counted: it steps after them."""
        with self._runs_lock:
            runs = self._runs - 1
        return max(runs, self.compute.active() - self.compute.active_background())

    def autoregressive(self, prompt_ids: list[int], config: DecodeConfig, should_stop=None, threads: int | None = None) -> GenerationSummary:
        """The autoregressive baseline; ``should_stop`` is polled after every token; ``threads``: run it at this count
        (a re-timing's, as its speculative run had; None: the server's policy)."""
        bundle = self.bundle()  # the whole run is one step: nothing else runs while it is timed
        return self.compute.call_at(threads, autoregressive_generate, bundle.runner, prompt_ids, config, bundle.tokenizer, should_stop=should_stop)

    def retime(self, request: Request, should_stop, sizing: AutoBudget | None = None) -> Retiming:
        """``request`` decoded again by speculation, then by plain decoding of the same prompt, both
        timed (:class:`Retiming`); ``should_stop`` is polled between rounds and after every plain
        token. Counts the other requests that shared the compute thread meanwhile, sampled at each poll."""
        seen, counts = {"others": 0}, set()

        def halted() -> bool:  # called inside the runs' steps, in the compute thread
            seen["others"] = max(seen["others"], self.compute.active() - 1)  # this request is one of the active
            if self.compute.count_now() is not None:  # None: no policy sets the threads here
                counts.add(self.compute.count_now())
            return should_stop()

        speculative = _result(self.generate(request, should_stop=halted, sizing=sizing))
        plain = (None if speculative.stop_reason == "cancelled" else  # plain decoding at the speculative run's threads: a fair ratio
                 self.autoregressive(list(request.prompt_ids), request.config, should_stop=halted, threads=self.run_threads(request.drafter)))
        return Retiming(speculative, plain, seen["others"], tuple(sorted(counts)))

    def token_text(self, token: int) -> str:
        return self.bundle().tokenizer.decode([token], clean_up_tokenization_spaces=False)


def records_to_json(records: list[RoundRecord], summary: GenerationSummary | None, settings: dict, folder: str | None = None, token_text=None) -> str:
    """Write a run's rounds to a JSON file (in a fresh temp folder); returns its path. With
    ``token_text`` (token id -> text) every token also comes as text."""
    payload = {
        "settings": settings,
        "summary": summary.to_dict() if summary is not None else None,
        "rounds": [record.to_dict(token_text) for record in records],
    }
    directory = tempfile.mkdtemp(prefix="tev-run-", dir=folder)
    path = os.path.join(directory, f"tev-run-{time.strftime('%Y%m%d-%H%M%S')}.json")
    with open(path, "w") as handle:
        json.dump(payload, handle, indent=1)
    return path


@dataclass
class TrainingSlot:
    """Only one fine-tune at a time on the server (an ExitTrain run or a workload adaptation); others are told to wait."""

    lock: threading.Lock = field(default_factory=threading.Lock)
    owner: str | None = None
    trainer: object | None = None

    def acquire(self, owner: str) -> bool:
        if not self.lock.acquire(blocking=False):
            return False
        self.owner = owner
        return True

    def release(self) -> None:
        self.owner = None
        self.trainer = None
        self.lock.release()

    def cancel(self, owner: str) -> bool:
        """Cancel the running job if ``owner`` started it."""
        trainer = self.trainer
        if trainer is not None and self.owner == owner:
            trainer.cancel()
            return True
        return False
