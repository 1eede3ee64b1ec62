"""What the frozen target writes and computes for its drafter's training.

- corpus continuations (the tiny pair; cached by the target's weights) and answers to a workload's
  prompts, written by :func:`tev.engine.batch_generate.generate_batch` (sampling through
  :mod:`tev.core.sampling`); self-instruct chat conversations (train-drafter), written by the
  continuous-batching :func:`tev.engine.batch_writer.write_answers`;
- the target's features at the drafter's layers along the text, and its next-token laws there,
  cut to their top tokens over the draft vocabulary and renormalised (:func:`top_law`, the one
  soft-label builder; stored as :class:`SoftLabels`).

Chat conversations: the target is given only its chat template's opening of a user turn (after
the template's default system turn) and writes the user's message itself (Magpie-style
self-instruct), sampled at T = 1 so the requests are diverse; a share of the user turns is
started with a few words that steer towards code or mathematics. The target answers each
request, greedily for a share of them (what T = 0 decoding meets) and at T = 1 for the rest,
until its end-of-turn token. Everything is seeded: the same target, counts and seed give the
same conversations.
"""

from __future__ import annotations

import hashlib
import random
from pathlib import Path
from typing import Callable

import torch
from safetensors.torch import load_file, save_file
from tqdm import tqdm

from tev.core.sampling import SamplingLaw
from tev.data.token_stream import encode_corpus
from tev.engine.batch_generate import generate_batch, generate_batch_steps
from tev.engine.batch_writer import WriterPrompt, write_answers
from tev.engine.prompt_text import ChatTemplate, encode_chat
from tev.engine.session import max_positions
from tev.train.data import SoftLabels, TrainData
from tev.util.compute_thread import result_of
from tev.util.files import atomic_file
from tev.util.progress import Phase, Progress, within
from tev.util.precision import low_precision

__all__ = ["regenerate_sequences", "weights_fingerprint", "corpus_sequences", "target_features", "target_features_steps", "top_law",
           "with_features", "with_features_steps", "answer_prompts", "DOMAIN_OPENINGS", "write_requests", "write_responses"]


def regenerate_sequences(target, stream: torch.Tensor, num_sequences: int, context_length: int, new_tokens: int, seed: int,
                         greedy_share: float = 0.5, progress: bool = True, desc: str = "target continuations") -> torch.Tensor:
    """Target-regenerated sequences: contexts at random offsets of ``stream``, continued by the
    target; a ``greedy_share`` of them greedily (what T = 0 decoding meets), the rest sampled at
    T = 1. Returns `LongTensor[num_sequences, context_length + new_tokens]`."""
    generator = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, stream.numel() - context_length, (num_sequences,), generator=generator)
    contexts = [stream[s : s + context_length].tolist() for s in starts.tolist()]
    greedy_count = int(round(num_sequences * greedy_share))
    rows, chunk = [], 64
    bar = tqdm(total=num_sequences, desc=desc, unit="seq", disable=not progress)
    for start in range(0, num_sequences, chunk):
        block = contexts[start : start + chunk]
        temperature = 0.0 if start < greedy_count else 1.0
        written = generate_batch(target, block, new_tokens, temperature, None, seed * 100_003 + start)
        rows += [context + tokens for context, tokens in zip(block, written)]
        bar.update(len(block))
    bar.close()
    return torch.tensor(rows)


def weights_fingerprint(model) -> str:
    """A cache key for a model's weights: SHA-256 over every state-dict entry (name, shape and
    values as float32, so one checkpoint loaded in bf16 or fp32 keys the same), 12 hex digits."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(f"{name}{tuple(tensor.shape)}".encode())
        digest.update(tensor.detach().float().cpu().contiguous().numpy())
    return digest.hexdigest()[:12]


def corpus_sequences(target, tokenizer, split: str, count: int, context_length: int, new_tokens: int, seed: int, cache_dir: Path | None = None,
                     progress: bool = True, limit_files: int | None = None) -> torch.Tensor:
    """`LongTensor[count, context_length + new_tokens]`: :func:`regenerate_sequences` from a corpus
    split (its first ``limit_files`` files; None: all), cached in ``cache_dir`` (None: no cache) by
    their settings and the target."""
    path = None
    if cache_dir is not None:
        key = f"{split}-{count}-{context_length}-{new_tokens}-{seed}-{weights_fingerprint(target)}" + (f"-{limit_files}" if limit_files else "")
        path = Path(cache_dir) / f"sequences-{key}.safetensors"
        if path.is_file():
            return load_file(path)["sequences"].long()
    stream, _ = encode_corpus(tokenizer, split, limit_files)
    sequences = regenerate_sequences(target, stream, count, context_length, new_tokens, seed, progress=progress, desc=f"{split} sequences")
    if path is not None:
        with atomic_file(path) as temporary:
            save_file({"sequences": sequences.to(torch.int32)}, temporary)
    return sequences


def target_features(
    target, token_ids: torch.Tensor, lengths: torch.Tensor, layers: list[int], batch: int = 8, progress: bool = True,
    soft_vocab: torch.Tensor | None = None, soft_top: int = 0, store: torch.dtype | None = None,
) -> torch.Tensor | tuple[torch.Tensor, SoftLabels]:
    """`Tensor[S, T, F]` (in ``store``, else :func:`low_precision`): hidden states at ``layers``,
    concatenated, of each right-padded sequence.

    With ``soft_top > 0`` also the target's next-token laws as :class:`SoftLabels`: at every
    position, :func:`top_law` over ``soft_vocab`` (the drafter's draft vocabulary) at T = 1.
    (:func:`target_features_steps` run to its end.)
    """
    return result_of(target_features_steps(target, token_ids, lengths, layers, batch, progress, soft_vocab, soft_top, store))


@torch.no_grad()  # on a generator: grad mode is off only while it runs, not between its steps
def target_features_steps(
    target, token_ids: torch.Tensor, lengths: torch.Tensor, layers: list[int], batch: int = 8, progress: bool = True,
    soft_vocab: torch.Tensor | None = None, soft_top: int = 0, store: torch.dtype | None = None,
):
    """:func:`target_features` as a generator that yields after each batch's forward (a batch of 8
    answers took seconds on a busy 2-core CPU: a server's compute thread steps users' rounds
    between batches) and returns the features (PEP 380)."""
    device = next(target.parameters()).device
    body = target.get_decoder() if hasattr(target, "get_decoder") else target.base_model
    store = store or low_precision(device)  # the features' storage: half the memory where this machine computes in bfloat16
    out = torch.zeros(*token_ids.shape, len(layers) * target.config.hidden_size, dtype=store)
    soft, head_rows = None, None
    if soft_top > 0:
        head = target.get_output_embeddings().weight
        head_rows = head if soft_vocab is None else head[soft_vocab.to(head.device)]  # [Vd, H]
        soft_top = min(soft_top, head_rows.shape[0])  # a draft vocabulary smaller than k keeps all of it
        soft = SoftLabels(torch.zeros(*token_ids.shape, soft_top, dtype=torch.int16 if head_rows.shape[0] < 2**15 else torch.int32),
                          torch.zeros(*token_ids.shape, soft_top, dtype=torch.float16))
    order = torch.argsort(lengths, descending=True)  # similar lengths share a batch: less padding
    for start in tqdm(range(0, len(order), batch), desc="target features", unit="batch", disable=not progress):
        rows = order[start : start + batch]
        width = int(lengths[rows].max())
        ids = token_ids[rows, :width].to(device)
        mask = (torch.arange(width)[None] < lengths[rows, None]).long().to(device)
        result = body(input_ids=ids, attention_mask=mask, output_hidden_states=True)
        hidden = result.hidden_states
        out[rows, :width] = torch.cat([hidden[i] for i in layers], dim=-1).to(store).cpu()
        if soft is not None:
            # the final (normed) hidden state through the draft-vocabulary rows of the head
            positions, probs = top_law(result.last_hidden_state @ head_rows.T, soft_top)
            soft.positions[rows, :width] = positions.to(soft.positions.dtype).cpu()
            soft.probs[rows, :width] = probs.to(torch.float16).cpu()
        yield start
    return out if soft is None else (out, soft)


def top_law(logits: torch.Tensor, top: int, vocab: torch.Tensor | None = None, temperature: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """The one soft label: the target's law ``softmax(logits / T)`` over ``vocab`` (`LongTensor[Vd]`,
    a draft vocabulary; every token when None), restricted to its ``top`` most likely tokens and
    renormalised over them, so it is a law. `Tensor[..., V]` logits -> (positions in ``vocab``
    `LongTensor[..., k]`, probabilities `Tensor[..., k]` float32 summing to 1), k = ``min(top, Vd)``."""
    if vocab is not None:
        logits = logits[..., vocab.to(logits.device)]
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    best = probs.topk(min(top, probs.shape[-1]), dim=-1)
    return best.indices, best.values / best.values.sum(-1, keepdim=True)


def with_features(target, data: TrainData, layers: list[int], soft_vocab: torch.Tensor | None = None, soft_top: int = 0,
                  progress: bool = True) -> TrainData:
    """``data`` with the target's features at ``layers`` (and with ``soft_top`` its top-k laws) at every position."""
    return result_of(with_features_steps(target, data, layers, soft_vocab, soft_top, progress))


def with_features_steps(target, data: TrainData, layers: list[int], soft_vocab: torch.Tensor | None = None, soft_top: int = 0,
                        progress: bool = True):
    """:func:`with_features` as a generator that yields after each batch's forward and returns the data (PEP 380)."""
    out = yield from target_features_steps(target, data.token_ids, data.lengths, layers, progress=progress, soft_vocab=soft_vocab, soft_top=soft_top)
    features, soft = out if soft_top > 0 else (out, None)
    return TrainData(data.token_ids, data.lengths, data.prompt_lengths, features, soft, data.domains, data.requests)


@torch.no_grad()
def answer_prompts(target, tokenizer, prompts: list[str], max_new_tokens: int = 96, batch: int = 8, progress: bool = True,
                   law: "SamplingLaw | float" = 0.0, seed: int = 0, enough: Callable[[int], bool] | None = None):
    """The target's answers to ``prompts`` (each a user message through the chat template),
    greedy, or sampled from ``law`` (seeded per batch), ``batch`` prompts at a time (left-padded,
    :func:`generate_batch_steps`): a generator that yields a :attr:`Phase.ANSWERS` piece after each
    forward (a batch of 8 answers is about a hundred forwards: a minute on a busy 2-core CPU, so a
    server's compute thread can step a user's round between two) and, after each batch, one saying
    ``{"answered", "prompts"}``; it returns the answers (:class:`TrainData`, each a prompt then its
    answer; None when there is none). Answers under two tokens are left out. ``enough(answered)``,
    asked after each batch, may end the run there (a caller's deadline): the answers so far are returned.

    Batched greedy decoding writes a workload's answers several times faster than answering one
    prompt at a time on a CPU (one weight read serves the whole batch)."""
    sequences, prompt_lengths = [], []
    context = max_positions(target)
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    encoded = [encode_chat(tokenizer, prompt, max_tokens=context - max_new_tokens - 1) for prompt in prompts]
    bar = tqdm(total=len(prompts), desc="target answers", unit="prompt", disable=not progress)
    for first in range(0, len(encoded), batch):
        group = encoded[first : first + batch]
        written = yield from within(generate_batch_steps(target, group, max_new_tokens, law, eos, seed * 100_003 + first, pad), Phase.ANSWERS)
        for prompt_ids, answer in zip(group, written):
            if len(answer) >= 2:  # the end of turn stays: the drafter should predict it too
                sequences.append(list(prompt_ids) + answer)
                prompt_lengths.append(len(prompt_ids))
        bar.update(len(group))
        answered = first + len(group)
        yield Progress(Phase.ANSWERS, {"answered": answered, "prompts": len(prompts)})
        if enough is not None and enough(answered):
            break
    bar.close()
    return TrainData.from_lists(sequences, prompt_lengths) if sequences else None


# Words that start a user turn, by domain ("" leaves the request entirely to the target).
DOMAIN_OPENINGS = {
    "dialogue": ("",),
    "code": ("Write a Python function", "Write a Python program that", "How do I", "Write a function in Python to", "Explain what this Python code does:", "Fix the bug in this Python code:"),
    "math": ("Solve", "What is", "Calculate", "A store sells", "If x", "Find the", "How many"),
}


def write_requests(target, tokenizer, count: int, seed: int, max_tokens: int = 64, domain_shares=(0.5, 0.25, 0.25), exclude=(), slots: int = 192,
                   progress: bool = True) -> list[tuple[str, str]]:
    """``count`` distinct user requests written by the target, as ``(domain, text)``.

    Written in rounds of ``2 * slots`` openings (:func:`~tev.engine.batch_writer.write_answers`),
    each sampled at T = 1 with a seed of its own and kept in the order of the openings. Only
    requests the target finished (end-of-turn within ``max_tokens``) are kept; texts in
    ``exclude`` (the held-out evaluation prompts) never are.
    """
    template = ChatTemplate.of(tokenizer)
    rng = random.Random(seed)
    names = list(DOMAIN_OPENINGS)
    excluded = {text.strip() for text in exclude}
    seen: set[str] = set()
    requests: list[tuple[str, str]] = []
    bar = tqdm(total=count, desc="requests (self-instruct)", unit="req", disable=not progress)
    size, written_so_far = 2 * slots, 0
    while len(requests) < count:
        if written_so_far > 4 * count + 50 * size:
            raise RuntimeError(f"the target wrote only {len(requests)} usable requests of {count}; lower --requests")
        steers = [rng.choices(names, weights=domain_shares)[0] for _ in range(size)]
        openings = [rng.choice(DOMAIN_OPENINGS[d]) for d in steers]
        prompts = [WriterPrompt(tuple(tokenizer.encode(template.user_opening + opening, add_special_tokens=False)), 1.0,
                                seed * 100_003 + written_so_far + i) for i, opening in enumerate(openings)]
        written = dict(item for item in write_answers(target, prompts, max_tokens, template.end_of_turn, slots) if item is not None)
        written_so_far += size
        for index, (domain, opening) in enumerate(zip(steers, openings)):
            ids = written[index]
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
    target, tokenizer, requests: list[tuple[str, str]], max_new_tokens: int, seed: int, greedy_share: float = 0.5, slots: int = 192,
    progress: bool = True, done: dict[int, list[int]] | None = None, on_answers=None,
) -> TrainData:
    """The target's answer to each request: the first ``greedy_share`` greedily, the rest at T = 1;
    the conversations with their domains and requests.

    Written by :func:`~tev.engine.batch_writer.write_answers`, ``slots`` at once, each answer
    sampled with a seed of its own (the request's index). Resumable: ``done`` maps request indices
    to the conversations already written (as passed to ``on_answers(done)`` after every ``slots``
    answers); the others are written as an uninterrupted run writes them.
    """
    template = ChatTemplate.of(tokenizer)
    prompts = [template.prompt_ids(tokenizer, text) for _, text in requests]
    greedy_count = int(round(len(requests) * greedy_share))
    token_ids: dict[int, list[int]] = dict(done or {})
    missing = [i for i in range(len(requests)) if i not in token_ids]
    bar = tqdm(total=len(requests), initial=len(token_ids), desc="responses", unit="resp", disable=not progress)
    work = [WriterPrompt(tuple(prompts[i]), 0.0 if i < greedy_count else 1.0, seed * 100_003 + i) for i in missing]
    unsaved = 0
    for item in write_answers(target, work, max_new_tokens, template.end_of_turn, slots):
        if item is None:
            continue
        index = missing[item[0]]
        token_ids[index] = prompts[index] + list(item[1])
        bar.update()
        unsaved += 1
        if on_answers is not None and (unsaved >= slots or len(token_ids) == len(requests)):
            on_answers(token_ids)
            unsaved = 0
    bar.close()
    ordered = [token_ids[i] for i in range(len(requests))]
    return TrainData.from_lists(ordered, [len(p) for p in prompts], domains=[d for d, _ in requests], requests=[t for _, t in requests])

