"""A user's workload as drafter training data: its prompts, the target's answers to them, and the
answers' tokens the draft vocabulary lacks.

A workload file is a JSON list of user messages. A seeded split keeps a quarter of them (at
least :data:`MIN_HELDOUT`) as held-out prompts that never reach the trainer. The target answers
the training prompts greedily (the text a T = 0 user gets), in batches.

Anchor convention (one for the whole workload path, as in distillation): anchor ``t`` reads
the target's features up to position ``t``; its root is token ``t + 1`` and its labels are the
tokens after the root. A decoding round whose root sits at position ``r`` is anchor ``r - 1``,
so the first round's tree (root = the last prompt token) is trained too.
"""

from __future__ import annotations

import contextlib
import json
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch
from tqdm import tqdm

from tev.engine.batch_generate import generate_batch
from tev.engine.prompt_text import check_prompt_text, encode_chat

__all__ = ["MIN_PROMPTS", "MIN_HELDOUT", "MAX_PROMPT_CHARS", "load_workload", "check_workload", "split_workload", "WorkloadAnswers", "answer_prompts", "extend_draft_vocab"]

MIN_PROMPTS = 16
MIN_HELDOUT = 4
MAX_PROMPT_CHARS = 4000  # the app's prompt limit; a workload is many short requests


def check_workload(prompts, source: str = "the workload") -> list[str]:
    """``prompts`` if it is a list of at least :data:`MIN_PROMPTS` user messages, each valid
    prompt text of at most :data:`MAX_PROMPT_CHARS` characters; else ``ValueError`` saying
    which entry to fix. Special-token strings are allowed: they are encoded as plain text."""
    if not isinstance(prompts, list):
        raise ValueError(f"{source} must be a JSON list of user messages (strings), got a {type(prompts).__name__}")
    if len(prompts) < MIN_PROMPTS:
        raise ValueError(f"{source} holds {len(prompts)} prompts; give at least {MIN_PROMPTS} (a quarter, at least {MIN_HELDOUT}, is kept for held-out measurement)")
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


@dataclass
class WorkloadAnswers:
    """The target's answers to a workload's training prompts.

    Attributes:
        sequences: per answer, prompt ids + answer ids (`list[int]`).
        prompt_lengths: per answer, how many of its ids are the prompt.
        seconds: wall time of the answering.
    """

    sequences: list[list[int]] = field(default_factory=list)
    prompt_lengths: list[int] = field(default_factory=list)
    seconds: float = 0.0

    def __len__(self) -> int:
        return len(self.sequences)

    @property
    def answer_tokens(self) -> int:
        return sum(len(s) - p for s, p in zip(self.sequences, self.prompt_lengths))


@torch.no_grad()
def answer_prompts(
    target,
    tokenizer,
    prompts: list[str],
    max_new_tokens: int = 96,
    batch: int = 8,
    deadline: float | None = None,
    should_stop: Callable[[], bool] | None = None,
    progress: bool = True,
    compute=contextlib.nullcontext(),
) -> WorkloadAnswers:
    """The target's greedy answers to ``prompts`` (each a user message through the chat
    template), ``batch`` prompts per batch (left-padded, :func:`generate_batch`).

    Batched greedy decoding writes a workload's answers several times faster than answering
    one prompt at a time on a CPU (one weight read serves the whole batch); the text is what
    the target writes (padding may move a near-tie, as any batch size may). Stops between
    batches at ``deadline`` (a ``time.monotonic()`` value) or when ``should_stop()``. Answers
    under two tokens are left out.
    ``compute`` (a lock) is held for each batch, so a server's other users take turns with it.
    """
    start = time.perf_counter()
    answers = WorkloadAnswers()
    context = int(getattr(target.config, "max_position_embeddings", 1 << 30))
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    encoded = [encode_chat(tokenizer, prompt, max_tokens=context - max_new_tokens - 1) for prompt in prompts]
    bar = tqdm(total=len(prompts), desc="target answers", unit="prompt", disable=not progress)
    for first in range(0, len(encoded), batch):
        if (should_stop is not None and should_stop()) or (deadline is not None and time.monotonic() > deadline):
            break
        group = encoded[first : first + batch]
        with compute:
            written = generate_batch(target, group, max_new_tokens, 0.0, eos, seed=0, pad_id=pad)
        for prompt_ids, answer in zip(group, written):
            # the end of turn stays: the drafter should predict it too
            if len(answer) >= 2:
                answers.sequences.append(list(prompt_ids) + answer)
                answers.prompt_lengths.append(len(prompt_ids))
        bar.update(len(group))
    bar.close()
    answers.seconds = time.perf_counter() - start
    return answers


def extend_draft_vocab(drafter, answers: WorkloadAnswers, limit: int = 512) -> list[int]:
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
    for sequence, start in zip(answers.sequences, answers.prompt_lengths):
        for token in sequence[start:]:
            if token not in have:
                counts[token] = counts.get(token, 0) + 1
    added = sorted(counts, key=lambda t: (-counts[t], t))[:limit]
    if added:
        drafter.widen_draft_vocab(added)
    return added
