"""Exact categorical sampling shared by every verifier and the autoregressive baseline."""

from __future__ import annotations

import torch

__all__ = ["sample_rows", "probs_from_logits"]


def sample_rows(weights: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    """One draw per row of non-negative ``weights`` (rows need not be normalised).

    Inverse-CDF sampling: one uniform per row, a cumulative sum and a binary search. On CPU
    it is an order of magnitude faster than ``torch.multinomial`` (which spends its time
    drawing a random number per entry), and it never returns a zero-weight entry.

    Args:
        weights: `Tensor[k, V]` (or `Tensor[V]`), finite, non-negative, each row with mass > 0.
        generator: source of the uniforms (on ``weights``' device).

    Returns:
        `LongTensor[k]` (or a 0-d tensor for a 1-D input), drawn indices.
    """
    single = weights.dim() == 1
    rows = weights.unsqueeze(0) if single else weights
    cdf = torch.cumsum(rows.float(), dim=-1)  # [k, V]
    # A parallel scan (a GPU's) may add in another order, so the sum need not stay flat at a
    # zero weight: hold it flat there and non-decreasing, and a zero-weight entry is never drawn.
    # (A sequential scan already is; there this changes no value.)
    cdf = torch.where(rows > 0, cdf, torch.zeros_like(cdf)).cummax(dim=-1).values
    total = cdf[:, -1:]  # [k, 1]
    uniform = torch.rand(total.shape, generator=generator, device=rows.device, dtype=cdf.dtype)
    # u * total can round up to total; the largest float below it still lands on the last positive entry.
    target = torch.minimum(uniform * total, torch.nextafter(total, torch.zeros_like(total)))
    drawn = torch.searchsorted(cdf, target, right=True).squeeze(-1)  # first index with cdf > target
    return drawn[0] if single else drawn


def probs_from_logits(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """`softmax(logits / T)` in float32; ``temperature`` must be > 0."""
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0 to sample, got {temperature}")
    return torch.softmax(logits.float() / temperature, dim=-1)
