"""What the frozen target writes and computes for its drafter's training.

- corpus continuations (the tiny pair), chat answers to a workload's prompts: all written by
  :func:`tev.engine.batch_generate.generate_batch` (sampling through :mod:`tev.core.sampling`);
- the target's features at the drafter's layers along the text, and its next-token laws there,
  cut to their top tokens over the draft vocabulary (:class:`SoftLabels`, the one soft form).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch
from tqdm import tqdm

from tev.engine.batch_generate import generate_batch
from tev.engine.prompt_text import encode_chat
from tev.train.data import SoftLabels, TrainData
from tev.util.precision import low_precision

__all__ = ["regenerate_sequences", "target_features", "with_features", "WorkloadAnswers", "answer_prompts"]


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


@torch.no_grad()
def target_features(
    target, token_ids: torch.Tensor, lengths: torch.Tensor, layers: list[int], batch: int = 8, progress: bool = True,
    soft_vocab: torch.Tensor | None = None, soft_top: int = 0,
) -> torch.Tensor | tuple[torch.Tensor, SoftLabels]:
    """`Tensor[S, T, F]` (in :func:`low_precision`): hidden states at ``layers``, concatenated, of each
    right-padded sequence.

    With ``soft_top > 0`` also the target's next-token distributions as :class:`SoftLabels`:
    at every position, the ``soft_top`` most likely tokens of the target's distribution over
    ``soft_vocab`` (the drafter's draft vocabulary; renormalised over it, T = 1).
    """
    device = next(target.parameters()).device
    body = target.get_decoder() if hasattr(target, "get_decoder") else target.base_model
    store = low_precision(device)  # the features' storage: half the memory where this machine computes in bfloat16
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
            probs = torch.softmax((result.last_hidden_state @ head_rows.T).float(), dim=-1)
            top = probs.topk(soft_top, dim=-1)
            soft.positions[rows, :width] = top.indices.to(soft.positions.dtype).cpu()
            soft.probs[rows, :width] = top.values.to(torch.float16).cpu()
    return out if soft is None else (out, soft)


def with_features(target, data: TrainData, layers: list[int], soft_vocab: torch.Tensor | None = None, soft_top: int = 0,
                  progress: bool = True) -> TrainData:
    """``data`` with the target's features at ``layers`` (and with ``soft_top`` its top-k laws) at every position."""
    out = target_features(target, data.token_ids, data.lengths, layers, progress=progress, soft_vocab=soft_vocab, soft_top=soft_top)
    features, soft = out if soft_top > 0 else (out, None)
    return TrainData(data.token_ids, data.lengths, data.prompt_lengths, features, soft, data.domains)


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

    def data(self, pad_id: int = 0) -> TrainData:
        return TrainData.from_lists(self.sequences, self.prompt_lengths, pad_id)

    @property
    def answer_tokens(self) -> int:
        return sum(len(s) - p for s, p in zip(self.sequences, self.prompt_lengths))


@torch.no_grad()
def answer_prompts(target, tokenizer, prompts: list[str], max_new_tokens: int = 96, batch: int = 8, progress: bool = True):
    """The target's greedy answers to ``prompts`` (each a user message through the chat
    template), ``batch`` prompts at a time (left-padded, :func:`generate_batch`): yields the
    :class:`WorkloadAnswers` so far after every batch (a caller stops between batches at its
    deadline, or takes turns with other work). Answers under two tokens are left out.

    Batched greedy decoding writes a workload's answers several times faster than answering one
    prompt at a time on a CPU (one weight read serves the whole batch)."""
    start = time.perf_counter()
    answers = WorkloadAnswers()
    context = int(getattr(target.config, "max_position_embeddings", 1 << 30))
    eos = tokenizer.eos_token_id
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    encoded = [encode_chat(tokenizer, prompt, max_tokens=context - max_new_tokens - 1) for prompt in prompts]
    bar = tqdm(total=len(prompts), desc="target answers", unit="prompt", disable=not progress)
    for first in range(0, len(encoded), batch):
        group = encoded[first : first + batch]
        written = generate_batch(target, group, max_new_tokens, 0.0, eos, seed=0, pad_id=pad)
        for prompt_ids, answer in zip(group, written):
            if len(answer) >= 2:  # the end of turn stays: the drafter should predict it too
                answers.sequences.append(list(prompt_ids) + answer)
                answers.prompt_lengths.append(len(prompt_ids))
        bar.update(len(group))
        answers.seconds = time.perf_counter() - start
        yield answers
    bar.close()
