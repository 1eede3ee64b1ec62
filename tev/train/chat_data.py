"""Training conversations an instruct target writes itself (no data set needed).

Requests: the target is given only its chat template's opening of a user turn (after the
template's default system turn) and writes the user's message itself (Magpie-style
self-instruct), sampled at T = 1 so the requests are diverse. A share of the user turns is
started with a few words that steer towards code or mathematics, the paper's other two
domains. Responses: the target answers each request, greedily for a share of them (what T = 0
decoding meets) and sampled at T = 1 for the rest, until its end-of-turn token.

The result, :class:`ChatSequences`, holds the token ids of each whole conversation (the
template's prompt with the generation prompt, then the response) and where the response
starts. Everything is seeded: the same target, counts and seed give the same conversations.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch
from tqdm import tqdm

from tev.engine.batch_generate import generate_batch
from tev.engine.prompt_text import ChatTemplate

__all__ = ["DOMAIN_OPENINGS", "ChatSequences", "write_requests", "write_responses"]

# Words that start a user turn, by domain ("" leaves the request entirely to the target).
DOMAIN_OPENINGS = {
    "dialogue": ("",),
    "code": ("Write a Python function", "Write a Python program that", "How do I", "Write a function in Python to", "Explain what this Python code does:", "Fix the bug in this Python code:"),
    "math": ("Solve", "What is", "Calculate", "A store sells", "If x", "Find the", "How many"),
}
_FIELDS = ("token_ids", "prompt_lengths", "domains", "requests")


@dataclass
class ChatSequences:
    """Conversations as token ids.

    Attributes:
        token_ids: one list per conversation: prompt (template + request) then the response,
            ending with the end-of-turn token when the response finished.
        prompt_lengths: where each response starts.
        domains: ``dialogue``, ``code`` or ``math`` (the steer of the request).
        requests: the user messages.
    """

    token_ids: list[list[int]]
    prompt_lengths: list[int]
    domains: list[str]
    requests: list[str]

    def __len__(self) -> int:
        return len(self.token_ids)

    def response_tokens(self) -> int:
        return sum(len(ids) - start for ids, start in zip(self.token_ids, self.prompt_lengths))

    def padded(self, pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(`LongTensor[S, T]` right-padded ids, `LongTensor[S]` lengths, `LongTensor[S]` prompt lengths)."""
        width = max(len(ids) for ids in self.token_ids)
        ids = torch.full((len(self), width), pad_id, dtype=torch.long)
        for row, sequence in enumerate(self.token_ids):
            ids[row, : len(sequence)] = torch.tensor(sequence)
        lengths = torch.tensor([len(s) for s in self.token_ids])
        return ids, lengths, torch.tensor(self.prompt_lengths)

    def to_json(self) -> dict:
        return {"token_ids": self.token_ids, "prompt_lengths": self.prompt_lengths, "domains": self.domains, "requests": self.requests}

    @classmethod
    def from_json(cls, data: dict) -> "ChatSequences":
        return cls(data["token_ids"], data["prompt_lengths"], data["domains"], data["requests"])

    def split(self, heldout: int) -> tuple["ChatSequences", "ChatSequences"]:
        """(train, held-out): the last ``heldout`` conversations are held out."""
        cut = len(self) - heldout
        return self.take(range(cut)), self.take(range(cut, len(self)))

    def take(self, indices) -> "ChatSequences":
        """The conversations at ``indices``, in that order."""
        indices = list(indices)
        return ChatSequences(*([getattr(self, name)[i] for i in indices] for name in _FIELDS))

    @classmethod
    def concat(cls, parts: list["ChatSequences"]) -> "ChatSequences":
        """The conversations of ``parts``, one after another."""
        return cls(*(sum((getattr(p, name) for p in parts), []) for name in _FIELDS))


def _generate(target, tokenizer, prompts: list[list[int]], max_new_tokens: int, temperature: float, stop_id: int, seed: int) -> list[list[int]]:
    """Continue each prompt until ``stop_id`` (kept) or ``max_new_tokens``."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stop_id
    return generate_batch(target, prompts, max_new_tokens, temperature, stop_id, seed, pad_id=pad)


def write_requests(target, tokenizer, count: int, seed: int, max_tokens: int = 64, domain_shares=(0.5, 0.25, 0.25), exclude=(), batch: int = 48, progress: bool = True) -> list[tuple[str, str]]:
    """``count`` distinct user requests written by the target, as ``(domain, text)``.

    Only requests the target finished (end-of-turn within ``max_tokens``) are kept; texts in
    ``exclude`` (the held-out evaluation prompts) never are.
    """
    template = ChatTemplate.of(tokenizer)
    rng = random.Random(seed)
    names = list(DOMAIN_OPENINGS)
    excluded = {text.strip() for text in exclude}
    seen: set[str] = set()
    requests: list[tuple[str, str]] = []
    bar = tqdm(total=count, desc="requests (self-instruct)", unit="req", disable=not progress)
    round_index = 0
    while len(requests) < count:
        if round_index > 50 + 4 * count // batch:
            raise RuntimeError(f"the target wrote only {len(requests)} usable requests of {count}; lower --requests")
        steers = [rng.choices(names, weights=domain_shares)[0] for _ in range(batch)]
        openings = [rng.choice(DOMAIN_OPENINGS[d]) for d in steers]
        prompts = [tokenizer.encode(template.user_opening + opening, add_special_tokens=False) for opening in openings]
        written = _generate(target, tokenizer, prompts, max_tokens, 1.0, template.end_of_turn, seed * 100_003 + round_index)
        round_index += 1
        for domain, opening, ids in zip(steers, openings, written):
            if not ids or ids[-1] != template.end_of_turn:
                continue  # unfinished
            text = (opening + tokenizer.decode(ids[:-1], skip_special_tokens=True)).strip()
            if len(text) < 8 or text in seen or text in excluded:
                continue
            seen.add(text)
            requests.append((domain, text))
            bar.update()
            if len(requests) == count:
                break
    bar.close()
    return requests


def write_responses(
    target, tokenizer, requests: list[tuple[str, str]], max_new_tokens: int, seed: int, greedy_share: float = 0.5, batch: int = 48,
    progress: bool = True, done: list[list[int]] | None = None, on_batch=None,
) -> ChatSequences:
    """The target's answer to each request: the first ``greedy_share`` greedily, the rest at T = 1.

    Resumable: ``done`` holds the conversations of the batches already written (as passed to
    ``on_batch(token_ids)`` after each batch); every batch is seeded by where it starts, so a
    resumed run writes what an uninterrupted one would.
    """
    template = ChatTemplate.of(tokenizer)
    prompts = [template.prompt_ids(tokenizer, text) for _, text in requests]
    greedy_count = int(round(len(requests) * greedy_share))
    token_ids: list[list[int]] = list(done or [])
    bar = tqdm(total=len(requests), initial=len(token_ids), desc="responses", unit="resp", disable=not progress)
    start = len(token_ids)
    while start < len(requests):
        # a batch never mixes greedy and sampled answers
        stop = min(start + batch, greedy_count) if start < greedy_count else min(start + batch, len(requests))
        chunk = prompts[start:stop]
        temperature = 0.0 if start < greedy_count else 1.0
        answers = _generate(target, tokenizer, chunk, max_new_tokens, temperature, template.end_of_turn, seed * 100_003 + start)
        token_ids += [p + a for p, a in zip(chunk, answers)]
        if on_batch is not None:
            on_batch(token_ids)
        bar.update(len(chunk))
        start = stop
    bar.close()
    return ChatSequences(token_ids, [len(p) for p in prompts], [d for d, _ in requests], [t for _, t in requests])
