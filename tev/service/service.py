"""Server-side state for the app: models loaded once, input checks, one ExitTrain run at a time.

The app (``app.py``) only wires UI events to these functions; nothing here imports gradio.
Every request gets its own generator, records and seed; the models are shared read-only.
"""

from __future__ import annotations

import json
import math
import os
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from tev.engine.decode import MAX_BUDGET, MIN_TEMPERATURE, GenerationConfig, GenerationSummary, RoundRecord, autoregressive_generate, speculative_generate
from tev.engine.models import ModelBundle, encode_prompt, load_bundle
from tev.core.verify import VERIFIERS

__all__ = ["Limits", "LIMITS", "ModelService", "check_settings", "records_to_json", "ExitTrainSlot", "UserInputError"]


class UserInputError(ValueError):
    """Bad input from a user; the message says what to change."""


@dataclass(frozen=True)
class Limits:
    """Ranges of every control (the UI sliders use the same numbers)."""

    max_prompt_chars: int = 4000
    max_budget: int = 256
    max_new_tokens: int = 256
    max_temperature: float = 2.0
    min_temperature: float = MIN_TEMPERATURE  # a positive T below it overflows logits / T; 0 is greedy
    max_seed: int = 2**31 - 1
    max_lab_draws: int = 20000


LIMITS = Limits()


def _number(name: str, value, low, high, integer: bool):
    if value is None or isinstance(value, bool):
        raise UserInputError(f"{name} is missing; choose a value from {low} to {high}")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise UserInputError(f"{name} must be a number from {low} to {high}, got {value!r}") from None
    if not math.isfinite(number):
        raise UserInputError(f"{name} must be a finite number from {low} to {high}, got {value!r}")
    if integer:
        if number != int(number):
            raise UserInputError(f"{name} must be a whole number from {low} to {high}, got {value!r}")
        number = int(number)
    if not low <= number <= high:
        raise UserInputError(f"{name} must be from {low} to {high}, got {value!r}")
    return number


def check_prompt(prompt) -> str:
    if not isinstance(prompt, str):
        raise UserInputError("the prompt must be text")
    if not prompt.strip():
        raise UserInputError("the prompt is empty; type some code to continue, or pick an example")
    if len(prompt) > LIMITS.max_prompt_chars:
        raise UserInputError(f"the prompt is {len(prompt)} characters; shorten it to at most {LIMITS.max_prompt_chars}")
    if "\x00" in prompt:
        raise UserInputError("the prompt contains a NUL character; remove it")
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError:
        raise UserInputError("the prompt contains invalid Unicode (an unpaired surrogate); retype it") from None
    return prompt


def check_settings(drafter: str, verifier: str, budget, temperature, max_new_tokens, seed, drafters_available) -> GenerationConfig:
    """Validate UI values and build a :class:`GenerationConfig`; raises :class:`UserInputError`."""
    if drafter not in drafters_available:
        raise UserInputError(f"unknown drafter {drafter!r}; choose one of {', '.join(drafters_available)}")
    if verifier not in VERIFIERS:
        raise UserInputError(f"unknown verifier {verifier!r}; choose one of {', '.join(VERIFIERS)}")
    budget = _number("budget", budget, 1, min(LIMITS.max_budget, MAX_BUDGET), integer=True)
    temperature = _number("temperature", temperature, 0.0, LIMITS.max_temperature, integer=False)
    max_new_tokens = _number("max new tokens", max_new_tokens, 1, LIMITS.max_new_tokens, integer=True)
    seed = _number("seed", seed, 0, LIMITS.max_seed, integer=True)
    if 0 < temperature < LIMITS.min_temperature:
        raise UserInputError(f"temperature must be 0 (greedy) or from {LIMITS.min_temperature} to {LIMITS.max_temperature}, got {temperature!r}")
    if verifier == "greedy" and temperature > 0:
        raise UserInputError("the greedy verifier needs temperature 0; set temperature to 0 or pick tev, predraw or sequential")
    return GenerationConfig(budget=budget, temperature=temperature, verifier=verifier, max_new_tokens=max_new_tokens, seed=seed)


class ModelService:
    """The shared models, loaded lazily once (thread-safe), plus a compute lock.

    Torch on a 2-core CPU gains nothing from two requests running matrix work at once, so
    generation steps take ``compute`` in turn; Gradio's queue bounds how many wait.
    """

    def __init__(self, target: str | None = None, draft: str | None = None, device: str = "auto"):
        self.target_source = target
        self.draft_source = draft
        self.device = device
        self._bundle: ModelBundle | None = None
        self._load_lock = threading.Lock()
        self.compute = threading.Lock()

    def bundle(self) -> ModelBundle:
        if self._bundle is None:
            with self._load_lock:
                if self._bundle is None:
                    self._bundle = load_bundle(self.target_source, self.draft_source, device=self.device)
        return self._bundle

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
            "threads": torch.get_num_threads(),
            "context": bundle.context_length,
            "vocab": len(bundle.tokenizer),
            "parameters": sizes,
            "drafters": list(bundle.drafters),
            "target_source": bundle.target_source,
        }

    def encode(self, prompt: str, max_new_tokens: int) -> list[int]:
        bundle = self.bundle()
        check_prompt(prompt)
        try:
            ids = encode_prompt(bundle.tokenizer, prompt)
        except ValueError as error:
            raise UserInputError(str(error)) from None
        room = bundle.context_length - len(ids)
        if room < 1:
            raise UserInputError(f"the prompt is {len(ids)} tokens but the model's context is {bundle.context_length}; shorten it")
        return ids

    def generate(self, prompt: str, drafter: str, config: GenerationConfig, should_stop=None):
        """Yields RoundRecords then a GenerationSummary; each round runs under the compute lock."""
        bundle = self.bundle()
        ids = self.encode(prompt, config.max_new_tokens)
        events = speculative_generate(bundle.target, bundle.drafter(drafter), ids, config, bundle.tokenizer, should_stop=should_stop)
        while True:
            with self.compute:
                event = next(events, None)
            if event is None:
                return
            yield event

    def autoregressive(self, prompt: str, config: GenerationConfig, should_stop=None) -> GenerationSummary:
        """The autoregressive baseline; ``should_stop`` is polled after every token."""
        bundle = self.bundle()
        ids = self.encode(prompt, config.max_new_tokens)
        with self.compute:
            return autoregressive_generate(bundle.target, ids, config, bundle.tokenizer, should_stop=should_stop)

    def token_text(self, token: int) -> str:
        return self.bundle().tokenizer.decode([token], clean_up_tokenization_spaces=False)


def records_to_json(records: list[RoundRecord], summary: GenerationSummary | None, settings: dict, folder: str | None = None) -> str:
    """Write a run's rounds to a JSON file (in a fresh temp folder); returns its path."""
    payload = {
        "settings": settings,
        "summary": summary.to_dict() if summary is not None else None,
        "rounds": [
            {
                "round": r.index,
                "position": r.position,
                "drafter": r.drafter,
                "verifier": r.verifier,
                "tree": {"tokens": r.tree.tokens.tolist(), "parents": r.tree.parents.tolist(), "draft_logprob": [round(x, 6) for x in r.tree.draft_logprob.tolist()]},
                "reach": [round(float(x), 6) for x in r.flow.reach.tolist()],
                "rho": [round(float(x), 6) for x in r.flow.rho.tolist()],
                "exit_weight": [round(float(x), 6) for x in r.flow.exit_weight.tolist()],
                "coverage": r.flow.coverage,
                "path": r.verdict.path,
                "exit_node": r.verdict.exit_node,
                "bonus_token": r.verdict.bonus_token,
                "block_length": r.block_length,
                "emitted": r.emitted,
                "text": r.text,
                "timings_ms": {k: 1e3 * v for k, v in r.timings.items()},
            }
            for r in records
        ],
    }
    directory = tempfile.mkdtemp(prefix="tev-run-", dir=folder)
    path = os.path.join(directory, f"tev-run-{time.strftime('%Y%m%d-%H%M%S')}.json")
    with open(path, "w") as handle:
        json.dump(payload, handle, indent=1)
    return path


@dataclass
class ExitTrainSlot:
    """Only one ExitTrain run at a time on the server; others are told to wait."""

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
