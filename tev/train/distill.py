"""Self-distillation data and training for the block drafter.

The drafter ``q`` learns the target's own behaviour: contexts from the corpus, continuations
sampled from the target ``p`` (target-regenerated data), the target's hidden features at every
position from one teacher-forced forward. Every position of a continuation is an anchor:
features up to ``t``, root ``x_{t+1}``, labels ``x_{t+2} .. x_{t+1+K}``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from tqdm import tqdm
from transformers import DynamicCache

from tev.engine.drafters import BlockDrafter
from tev.core.sampling import probs_from_logits, sample_rows

__all__ = ["DistillData", "sample_continuations", "target_features", "regenerate_sequences", "make_distill_data", "anchor_batch", "train_block_drafter", "IGNORE"]

IGNORE = -100


@torch.no_grad()
def sample_continuations(target, contexts: torch.Tensor, new_tokens: int, temperature: float, generator: torch.Generator, batch: int = 32) -> torch.Tensor:
    """Continue each context with the target.

    Args:
        contexts: `LongTensor[S, Lc]`.
        temperature: 0 for greedy, else sampling at that temperature.

    Returns:
        `LongTensor[S, Lc + new_tokens]`.
    """
    device = next(target.parameters()).device
    outputs = []
    for start in range(0, contexts.shape[0], batch):
        ids = contexts[start : start + batch].to(device)
        cache = DynamicCache(config=target.config)
        logits = target(input_ids=ids, cache=cache, use_cache=True).logits[:, -1]
        pieces = [ids]
        for _ in range(new_tokens):
            if temperature == 0:
                token = logits.argmax(dim=-1)
            else:
                token = sample_rows(probs_from_logits(logits, temperature), generator)
            pieces.append(token[:, None])
            logits = target(input_ids=token[:, None], cache=cache, use_cache=True).logits[:, -1]
        outputs.append(torch.cat(pieces, dim=1).cpu())
    return torch.cat(outputs)


@torch.no_grad()
def target_features(target, sequences: torch.Tensor, layers: list[int], batch: int = 16) -> torch.Tensor:
    """`Tensor[S, T, F]` (bfloat16): the target's hidden states at ``layers``, concatenated."""
    device = next(target.parameters()).device
    chunks = []
    for start in range(0, sequences.shape[0], batch):
        out = target(input_ids=sequences[start : start + batch].to(device), output_hidden_states=True)
        chunks.append(torch.cat([out.hidden_states[i] for i in layers], dim=-1).to(torch.bfloat16).cpu())
    return torch.cat(chunks)


@dataclass
class DistillData:
    """Target-regenerated sequences and their target features.

    Attributes:
        sequences: `LongTensor[S, T]`, context then continuation.
        features: `Tensor[S, T, F]` (bfloat16).
        first_anchor: the first anchor position (the last context position).
    """

    sequences: torch.Tensor
    features: torch.Tensor
    first_anchor: int

    @property
    def num_anchors(self) -> int:
        return self.sequences.shape[0] * (self.sequences.shape[1] - 1 - self.first_anchor)


def regenerate_sequences(
    target,
    stream: torch.Tensor,
    num_sequences: int,
    context_length: int,
    new_tokens: int,
    seed: int,
    greedy_share: float = 0.5,
    progress: bool = True,
    desc: str = "target continuations",
) -> torch.Tensor:
    """Target-regenerated sequences: contexts at random offsets of ``stream``, continued by the
    target; a ``greedy_share`` of them greedily (what T = 0 decoding meets), the rest sampled at
    T = 1. Returns `LongTensor[num_sequences, context_length + new_tokens]`."""
    generator = torch.Generator().manual_seed(seed)
    starts = torch.randint(0, stream.numel() - context_length, (num_sequences,), generator=generator)
    contexts = torch.stack([stream[s : s + context_length] for s in starts.tolist()])
    greedy_count = int(round(num_sequences * greedy_share))
    parts = []
    chunk = 64
    bar = tqdm(total=num_sequences, desc=desc, unit="seq", disable=not progress)
    for start in range(0, num_sequences, chunk):
        block = contexts[start : start + chunk]
        temperature = 0.0 if start < greedy_count else 1.0
        parts.append(sample_continuations(target, block, new_tokens, temperature, generator))
        bar.update(block.shape[0])
    bar.close()
    return torch.cat(parts)


def make_distill_data(
    target,
    stream: torch.Tensor,
    layers: list[int],
    num_sequences: int,
    context_length: int,
    new_tokens: int,
    seed: int,
    greedy_share: float = 0.5,
    progress: bool = True,
) -> DistillData:
    """Target-regenerated sequences (see :func:`regenerate_sequences`) with their features."""
    sequences = regenerate_sequences(target, stream, num_sequences, context_length, new_tokens, seed, greedy_share, progress)
    features = target_features(target, sequences, layers)
    return DistillData(sequences, features, first_anchor=context_length - 1)


def anchor_batch(data: DistillData, index: torch.Tensor, window: int, horizon: int, short_history: torch.Tensor | None = None):
    """Gather one training batch of anchors.

    Args:
        index: `LongTensor[B, 2]` of (sequence, anchor position t).
        short_history: optional `LongTensor[B]`; keep only this many most recent feature
            slots (teaches the drafter the short histories of a prompt's first rounds).

    Returns:
        features `[B, W, F]`, valid `[B, W]`, root ids `[B]`, labels `[B, K]` (IGNORE past the end).
    """
    sequence, anchor = index[:, 0], index[:, 1]
    offsets = torch.arange(-window + 1, 1)
    positions = anchor[:, None] + offsets[None]  # [B, W]
    valid = positions >= 0
    if short_history is not None:
        valid &= offsets[None] > -short_history[:, None]
    features = data.features[sequence[:, None], positions.clamp(min=0)].float() * valid[..., None]
    root = data.sequences[sequence, anchor + 1]
    label_positions = anchor[:, None] + 2 + torch.arange(horizon)[None]  # [B, K]
    in_range = label_positions < data.sequences.shape[1]
    labels = data.sequences[sequence[:, None], label_positions.clamp(max=data.sequences.shape[1] - 1)]
    labels = torch.where(in_range, labels, torch.full_like(labels, IGNORE))
    return features, valid, root, labels


def token_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """``L_tok``: cross-entropy of the per-depth draft marginals (`[B, K, V]`) against the
    target's continuation (`[B, K]`), averaged over labelled depths."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=IGNORE)


def sample_anchor_index(data: DistillData, count: int, generator: torch.Generator) -> torch.Tensor:
    sequence = torch.randint(0, data.sequences.shape[0], (count,), generator=generator)
    anchor = torch.randint(data.first_anchor, data.sequences.shape[1] - 1, (count,), generator=generator)
    return torch.stack([sequence, anchor], dim=1)


def train_block_drafter(
    drafter: BlockDrafter,
    data: DistillData,
    steps: int,
    batch: int,
    lr: float,
    seed: int,
    warmup: int = 100,
    short_history_share: float = 0.1,
    progress: bool = True,
) -> list[dict]:
    """Token-level (``L_tok``) training of a block drafter; returns the loss history."""
    config = drafter.config
    generator = torch.Generator().manual_seed(seed)
    parameters = [p for p in drafter.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(parameters, lr=lr, weight_decay=0.01, betas=(0.9, 0.95))
    drafter.train()
    history = []
    bar = tqdm(range(steps), desc="block drafter", unit="step", disable=not progress)
    running = None
    for step in bar:
        scale = (step + 1) / warmup if step < warmup else 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, steps - warmup)))
        for group in optimizer.param_groups:
            group["lr"] = lr * scale
        index = sample_anchor_index(data, batch, generator)
        short = None
        if short_history_share > 0:
            draw = torch.rand(batch, generator=generator) < short_history_share
            lengths = torch.randint(0, config.context_window, (batch,), generator=generator)
            short = torch.where(draw, lengths, torch.full_like(lengths, config.context_window))
        features, valid, root, labels = anchor_batch(data, index, config.context_window, config.horizon, short)
        device = drafter.mask_embed.device
        logits = drafter(features.to(device), valid.to(device), root.to(device))
        loss = token_loss(logits, labels.to(device))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(parameters, 1.0)
        optimizer.step()
        running = loss.item() if running is None else 0.98 * running + 0.02 * loss.item()
        bar.set_postfix(loss=f"{running:.3f}")
        if (step + 1) % max(1, steps // 20) == 0 or step + 1 == steps:
            history.append({"step": step + 1, "loss": running})
    drafter.eval()
    return history
