"""The decode loop: one :func:`~tev.engine.round.speculation_round` after another, with the stop rules.

:func:`speculative_generate` is a generator: it yields one :class:`RoundRecord` per round and
returns the :class:`GenerationSummary` (PEP 380: ``summary = yield from ...``);
:func:`run_to_end` takes both. :func:`autoregressive_generate` is the baseline with the same
sampling. ``p`` is the target, ``q`` the drafter.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable, Generator

import torch

from tev.core.sampling import SamplingLaw, sample_rows
from tev.core.verify import SAMPLING_VERIFIERS, VERIFIERS
from tev.engine.auto_budget import AUTO_CAP, AutoBudget
from tev.engine.drafters import Drafter
from tev.engine.prompt_text import check_prompt_ids
from tev.engine.round import STAGES, RoundRecord, prefill, room_left, speculation_round
from tev.engine.session import CausalLMSession, max_positions
from tev.engine.target import Target
from tev.util.compute_thread import result_of
from tev.util.timing import StageTimer

__all__ = ["DecodeConfig", "Request", "GenerationSummary", "speculative_generate", "autoregressive_generate", "run_to_end", "eos_token_id", "MAX_BUDGET", "MIN_TEMPERATURE"]

MAX_BUDGET = 1024


# A policy floor, not a numerical limit: a positive T below 0.01 samples all but greedily, so it
# is refused (T = 0 is greedy). logits / T overflows float32 only far below it (T ~ 1e-38).
MIN_TEMPERATURE = 0.01


@dataclass(frozen=True)
class DecodeConfig:
    """Sampling settings that travel together; making one checks them (a ValueError says what to change).

    ``temperature == 0`` is greedy decoding (the ``greedy`` verifier decides, whatever
    ``verifier`` names); the ``greedy`` verifier at ``temperature > 0`` is refused, never
    switched: it would decode greedily while the settings say sample. ``top_k``, ``top_p`` and ``min_p`` truncate the target's rows as Hugging Face
    ``generate`` does (0, 1 and 0 turn them off; see :class:`SamplingLaw`): every verifier is
    exact for the truncated law. ``budget`` counts non-root draft nodes, or is ``"auto"``:
    each round keeps the best-first prefix of a ``budget_cap``-node tree that this machine pays
    for (:mod:`tev.engine.auto_budget`).
    """

    budget: int | str = 16
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    verifier: str = "tev"
    max_new_tokens: int = 64
    seed: int = 0
    stop_strings: tuple[str, ...] = ()
    stop_at_eos: bool = True
    budget_cap: int = AUTO_CAP

    def __post_init__(self):
        if self.budget != "auto" and (isinstance(self.budget, bool) or not isinstance(self.budget, int) or not 0 <= self.budget <= MAX_BUDGET):
            raise ValueError(f"budget must be an integer from 0 to {MAX_BUDGET} or 'auto', got {self.budget!r}")
        if isinstance(self.budget_cap, bool) or not isinstance(self.budget_cap, int) or not 1 <= self.budget_cap <= MAX_BUDGET:
            raise ValueError(f"budget_cap must be an integer from 1 to {MAX_BUDGET}, got {self.budget_cap!r}")
        if not isinstance(self.temperature, (int, float)) or not math.isfinite(self.temperature) or self.temperature < 0:
            raise ValueError(f"temperature must be a finite number >= 0, got {self.temperature!r}")
        if 0 < self.temperature < MIN_TEMPERATURE:
            raise ValueError(f"temperature must be 0 (greedy) or at least {MIN_TEMPERATURE}, got {self.temperature!r}")
        self.law  # checks top_k, top_p and min_p
        if self.verifier not in VERIFIERS:
            raise ValueError(f"unknown verifier {self.verifier!r}; choose one of {', '.join(VERIFIERS)}")
        if self.verifier == "greedy" and self.temperature > 0:
            raise ValueError(f"the greedy verifier needs temperature 0; set temperature to 0 or pick a sampling verifier ({', '.join(SAMPLING_VERIFIERS)})")
        if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be an integer >= 1, got {self.max_new_tokens!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < 2**63:
            raise ValueError(f"seed must be an integer from 0 to 2**63 - 1, got {self.seed!r}")

    @property
    def law(self) -> SamplingLaw:
        """The target's sampling law (temperature and truncation)."""
        return SamplingLaw(float(self.temperature), self.top_k, float(self.top_p), float(self.min_p))

    @property
    def effective_verifier(self) -> str:
        return "greedy" if self.temperature == 0 else self.verifier


@dataclass(frozen=True, eq=False)
class Request:
    """One speculative generation; making it checks every input, so the loop checks none again.

    Attributes:
        target: the :class:`~tev.engine.target.Target` (``p``): its model and the forward chosen for it.
        drafter: the :class:`~tev.engine.drafters.Drafter` that proposes the trees (``q``).
        prompt_ids: the prompt's token ids (BOS included where the model expects it): at least
            one, and no more than the target's context (checked; kept as a tuple).
        config: the settings (checked as a :class:`DecodeConfig` is made).
    """

    target: Target
    drafter: Drafter
    prompt_ids: tuple[int, ...]
    config: DecodeConfig = DecodeConfig()

    def __post_init__(self):
        if not isinstance(self.config, DecodeConfig):
            raise TypeError(f"config must be a DecodeConfig, got {type(self.config).__name__}")
        if not isinstance(self.target, Target):  # a bare model would silently drop the forward chosen for it
            raise TypeError(f"the target must be a Target (tev.engine.target), got {type(self.target).__name__}; wrap a model never chosen as Target(model)")
        context = max_positions(self.target.model)
        object.__setattr__(self, "prompt_ids", tuple(check_prompt_ids(self.prompt_ids, context)))


@dataclass(eq=False)
class GenerationSummary:
    """The whole generation: tokens, text, and the statistics the UI and benchmarks read.

    ``tau`` is what the user gets per target forward (the emitted ``token_ids`` over ``rounds``);
    ``block_lengths`` are the verifier's raw blocks (accepted + bonus), which also count tokens
    past a stop (EOS, a stop string, the length limit): their mean is what ``1 + C`` bounds.
    """

    prompt_ids: list[int]
    token_ids: list[int]
    text: str
    rounds: int
    block_lengths: list[int]
    tau_bounds: list[float]
    seconds: float
    prefill_seconds: float
    time_to_first_token: float
    stop_reason: str
    stage_seconds: dict[str, float] = field(default_factory=dict)
    method: str = ""
    tree_sizes: list[int] = field(default_factory=list)
    draft_coverages: list[float] = field(default_factory=list)

    @property
    def tau(self) -> float:
        """Tokens emitted per target forward: ``len(token_ids) / rounds`` (nan without a round)."""
        return len(self.token_ids) / self.rounds if self.rounds else float("nan")

    @property
    def mean_block_length(self) -> float:
        """Mean output-block length (accepted + bonus) over rounds, stops ignored: the quantity
        ``tau_bound`` bounds (nan without a round)."""
        return sum(self.block_lengths) / len(self.block_lengths) if self.block_lengths else float("nan")

    @property
    def tau_bound(self) -> float:
        """Mean ``1 + C(T)`` over the same rounds (what a saturated verifier attains on average)."""
        return sum(self.tau_bounds) / len(self.tau_bounds) if self.tau_bounds else float("nan")

    @property
    def q_calibration(self) -> float:
        """Realised coverage over the drafter's estimate, summed over the rounds that kept a node
        (``sum C / sum q``; 1 for a calibrated drafter, nan without such a round)."""
        estimated = sum(c for c, n in zip(self.draft_coverages, self.tree_sizes) if n)
        realised = sum(b - 1.0 for b, n in zip(self.tau_bounds, self.tree_sizes) if n)
        return realised / estimated if estimated > 0 else float("nan")

    @property
    def tokens_per_second(self) -> float:
        return len(self.token_ids) / self.seconds if self.seconds > 0 else float("nan")

    def to_dict(self) -> dict:
        return {
            "method": self.method,
            "prompt_ids": self.prompt_ids,
            "token_ids": self.token_ids,
            "text": self.text,
            "rounds": self.rounds,
            "block_lengths": self.block_lengths,
            "tau": self.tau,
            "mean_block_length": self.mean_block_length,
            "tau_bounds": self.tau_bounds,
            "tau_bound": self.tau_bound,
            "seconds": self.seconds,
            "prefill_seconds": self.prefill_seconds,
            "time_to_first_token": self.time_to_first_token,
            "tokens_per_second": self.tokens_per_second,
            "stop_reason": self.stop_reason,
            "stage_seconds": self.stage_seconds,
            "tree_sizes": self.tree_sizes,
            "draft_coverages": self.draft_coverages,
            "q_calibration": self.q_calibration,
        }


def eos_token_id(target, tokenizer=None) -> int | None:
    """The token that ends a generation: the tokenizer's EOS, else the model config's (the first
    of a list)."""
    eos = getattr(tokenizer, "eos_token_id", None) if tokenizer is not None else getattr(target.config, "eos_token_id", None)
    if isinstance(eos, (list, tuple)):
        return eos[0] if eos else None
    return eos


class _Output:
    """Accumulates generated tokens and applies the stop rules (EOS, stop strings, length)."""

    def __init__(self, tokenizer, config: DecodeConfig, eos_id: int | None):
        self.tokenizer = tokenizer
        self.config = config
        self.eos_id = eos_id if config.stop_at_eos else None
        self.tokens: list[int] = []
        self.text = ""
        self.stop_reason = ""

    def _decode(self) -> str:
        if self.tokenizer is None:
            return ""
        return self.tokenizer.decode(self.tokens, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def add(self, block: list[int]) -> tuple[list[int], str]:
        """Append a block; returns (tokens kept, text added). Sets ``stop_reason`` on a stop."""
        kept = []
        before = self.text
        for token in block:
            if self.eos_id is not None and token == self.eos_id:
                self.stop_reason = "eos"
                break
            kept.append(token)
            self.tokens.append(token)
            if self.config.stop_strings:
                text = self._decode()
                hits = [text.find(s, max(0, len(before) - len(s))) for s in self.config.stop_strings]
                hits = [h for h in hits if h >= 0]
                if hits:
                    self.text = text[: min(hits)]
                    self.stop_reason = "stop_string"
                    return kept, self.text[len(before) :]
            if len(self.tokens) >= self.config.max_new_tokens:
                self.stop_reason = "max_new_tokens"
                break
        self.text = self._decode()
        added = self.text[len(before) :] if self.text.startswith(before) else self.text
        return kept, added


def speculative_generate(
    request: Request, tokenizer=None, should_stop: Callable[[], bool] | None = None, sizing: AutoBudget | None = None, first_round: int = 0
) -> Generator[RoundRecord, None, GenerationSummary]:
    """Generate with tree speculation; yields a RoundRecord per round and returns the summary.

    Args:
        request: the target, the drafter, the prompt and the settings (checked as it was made).
        tokenizer: for text and EOS (optional; without it only token ids are produced).
        should_stop: polled between rounds; returning True ends the generation ("cancelled").
        sizing: with ``config.budget == "auto"``, the rule's state (default: the target's cost
            curve, measured before the clock starts on first use, and a fresh
            calibration); a caller may pass one to share it across generations.
        first_round: the first round's ``index`` (a continuation's rounds follow the answer's).
    """
    target, drafter, config = request.target, request.drafter, request.config
    if config.budget != "auto":
        if sizing is not None:
            raise ValueError("an AutoBudget needs config.budget == 'auto'")
    elif sizing is None:
        sizing = AutoBudget.for_target(target, config.budget_cap)
    start = time.perf_counter()
    session = CausalLMSession(target, feature_layers=drafter.feature_layers)
    prompt = list(request.prompt_ids)
    verifier = config.effective_verifier
    device = session.device
    generator = torch.Generator(device=device).manual_seed(config.seed)
    eos_id = eos_token_id(target.model, tokenizer)
    output = _Output(tokenizer, config, eos_id)
    state = drafter.new_state()
    committed = list(prompt)  # the root is committed[-1]
    prefill(session, prompt, state)
    prefill_seconds = time.perf_counter() - start
    totals = {stage: 0.0 for stage in STAGES}
    block_lengths, tau_bounds, tree_sizes, draft_coverages = [], [], [], []
    first_token_at = None
    paused = 0.0
    index = 0
    while not output.stop_reason:
        if should_stop is not None and should_stop():
            output.stop_reason = "cancelled"
            break
        if room_left(session) < 0:
            output.stop_reason = "context_limit"
            break
        timer = StageTimer(device)
        record = speculation_round(session, drafter, committed, config.budget, verifier, config.law, generator, state, timer, sizing)
        block = record.verdict.block_tokens(record.tree)
        record.index = first_round + index
        record.emitted, record.text = output.add(block)
        committed.extend(block)
        if first_token_at is None:
            first_token_at = time.perf_counter() - start
        block_lengths.append(record.block_length)
        tau_bounds.append(record.flow.tau_bound)
        tree_sizes.append(record.tree.size)
        draft_coverages.append(record.tree.draft_coverage)
        for stage, seconds in record.timings.items():
            totals[stage] = totals.get(stage, 0.0) + seconds
        suspended_at = time.perf_counter()
        yield record
        paused += time.perf_counter() - suspended_at  # the consumer's time is not generation time
        index += 1
    seconds = time.perf_counter() - start - paused
    return GenerationSummary(
        prompt_ids=prompt,
        token_ids=list(output.tokens),
        text=output.text,
        rounds=index,
        block_lengths=block_lengths,
        tau_bounds=tau_bounds,
        seconds=seconds,
        prefill_seconds=prefill_seconds,
        time_to_first_token=first_token_at if first_token_at is not None else seconds,
        stop_reason=output.stop_reason,
        stage_seconds=totals,
        method=f"{drafter.name}+{verifier}",
        tree_sizes=tree_sizes,
        draft_coverages=draft_coverages,
    )


def autoregressive_generate(
    target: Target,
    prompt_ids,
    config: DecodeConfig = DecodeConfig(),
    tokenizer=None,
    should_stop: Callable[[], bool] | None = None,
) -> GenerationSummary:
    """Plain one-token-per-forward decoding of ``target`` (in the forward chosen for it) with the
    same sampling and stop rules."""
    start = time.perf_counter()
    session = CausalLMSession(target)
    prompt = check_prompt_ids(prompt_ids, session.max_positions)
    generator = torch.Generator(device=session.device).manual_seed(config.seed)
    eos_id = eos_token_id(target.model, tokenizer)
    output = _Output(tokenizer, config, eos_id)
    law = config.law
    logits = session.extend(prompt).last_logits()
    prefill_seconds = time.perf_counter() - start
    first_token_at = None
    steps = 0
    while True:
        if config.temperature == 0:
            token = int(logits.argmax())
        else:
            token = int(sample_rows(law.probs(logits), generator))
        output.add([token])
        steps += 1
        if first_token_at is None:
            first_token_at = time.perf_counter() - start
        if output.stop_reason:
            break
        if should_stop is not None and should_stop():
            output.stop_reason = "cancelled"
            break
        if session.length >= session.max_positions:
            output.stop_reason = "context_limit"
            break
        logits = session.extend([token]).last_logits()
    seconds = time.perf_counter() - start
    return GenerationSummary(
        prompt_ids=prompt,
        token_ids=list(output.tokens),
        text=output.text,
        rounds=steps,
        block_lengths=[1] * steps,
        tau_bounds=[1.0] * steps,
        seconds=seconds,
        prefill_seconds=prefill_seconds,
        time_to_first_token=first_token_at if first_token_at is not None else seconds,
        stop_reason=output.stop_reason,
        method="autoregressive",
    )


def run_to_end(rounds, each: Callable[[RoundRecord], None] | None = None) -> tuple[list[RoundRecord], GenerationSummary]:
    """Drain a :func:`speculative_generate` generator: (round records, the summary it returned).
    ``each`` sees every record as it arrives (a progress bar, the text so far)."""
    records = []

    def kept(record: RoundRecord) -> None:
        records.append(record)
        if each is not None:
            each(record)

    return records, result_of(rounds, kept)
