"""A user's workload as drafter training data: its prompts, and the answers' tokens the draft
vocabulary lacks (the target's answers: :func:`tev.train.teacher.answer_prompts`).

A workload file is a JSON list of user messages. A seeded split keeps a quarter of them (at
least :data:`MIN_HELDOUT`) as held-out prompts that never reach the trainer.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

from tev.engine.prompt_text import check_prompt_text
from tev.train.data import TrainData

__all__ = ["MIN_PROMPTS", "MIN_HELDOUT", "MAX_PROMPT_CHARS", "load_workload", "check_workload", "split_workload", "extend_draft_vocab"]

MIN_PROMPTS = 16
MIN_HELDOUT = 4
MAX_PROMPT_CHARS = 4000  # the app's prompt limit; a workload is many short requests


def check_workload(prompts, source: str = "the workload", minimum: int = MIN_PROMPTS) -> list[str]:
    """``prompts`` if it is a list of at least ``minimum`` user messages, each valid
    prompt text of at most :data:`MAX_PROMPT_CHARS` characters; else ``ValueError`` saying
    which entry to fix. Special-token strings are allowed: they are encoded as plain text."""
    if not isinstance(prompts, list):
        raise ValueError(f"{source} must be a JSON list of user messages (strings), got a {type(prompts).__name__}")
    if len(prompts) < minimum:
        raise ValueError(f"{source} holds {len(prompts)} prompts; give at least {minimum} (a quarter, at least {MIN_HELDOUT}, is kept for held-out measurement)")
    for i, prompt in enumerate(prompts):
        if not isinstance(prompt, str):
            raise ValueError(f"{source}: entry {i} is a {type(prompt).__name__}, not a string; every entry must be one user message")
        try:
            check_prompt_text(prompt, MAX_PROMPT_CHARS)
        except ValueError as error:
            raise ValueError(f"{source}: entry {i}: {error}") from None
    return list(prompts)


def load_workload(path: str | Path) -> list[str]:
    """The checked prompts of a workload file (a JSON list of strings)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"no workload file at {path}; give a JSON file holding a list of user messages")
    try:
        prompts = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path} is not a UTF-8 JSON file ({error}); it must hold a JSON list of user messages") from None
    return check_workload(prompts, str(path))


def split_workload(prompts: list[str], seed: int = 0) -> tuple[list[str], list[str]]:
    """(train, held-out): a seeded shuffle keeps a quarter (at least :data:`MIN_HELDOUT`) of the
    prompts held out; the same prompts and seed give the same split."""
    order = list(range(len(prompts)))
    random.Random(seed).shuffle(order)
    count = max(MIN_HELDOUT, len(prompts) // 4)
    heldout = [prompts[i] for i in sorted(order[:count])]
    train = [prompts[i] for i in sorted(order[count:])]
    return train, heldout


def extend_draft_vocab(drafter, answers: TrainData, limit: int = 512) -> list[int]:
    """Add the answers' tokens the drafter's draft vocabulary lacks (the most frequent first, at
    most ``limit``), in place; returns the added token ids.

    A block drafter reads the target's own head rows for its draft vocabulary and learns nothing
    per token, so a workload's new tokens (another language, a format's symbols) can join it
    without retraining; the drafter's config records the new size.
    """
    if drafter.draft_vocab is None:
        return []
    have = set(drafter.draft_vocab.tolist())
    counts: dict[int, int] = {}
    for sequence, start in zip(answers.sequences, answers.prompt_lengths.tolist()):
        for token in sequence[start:]:
            if token not in have:
                counts[token] = counts.get(token, 0) + 1
    added = sorted(counts, key=lambda t: (-counts[t], t))[:limit]
    if added:
        drafter.widen_draft_vocab(added)
    return added
