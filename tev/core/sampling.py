"""Exact categorical sampling shared by every verifier and the autoregressive baseline, and the
sampling law (temperature, top-k, top-p, min-p) that turns target logits into the rows ``p_v``."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

__all__ = ["sample_rows", "probs_from_logits", "SamplingLaw", "LawCut", "as_law"]

# Top-p looks for its cut among the largest entries first (a top-k, far cheaper than sorting a
# 49k-token row); only a row whose largest entries hold less than top_p is sorted whole.
_TOP_P_PREFIX = 256


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
    return SamplingLaw(float(temperature)).probs(logits)


@dataclass(frozen=True)
class SamplingLaw:
    """How target logits become the law ``p_v`` every verifier reproduces exactly.

    Applied in the order Hugging Face ``generate`` applies its warpers: ``logits / T``, then
    top-k, then top-p, then min-p. Each removes tokens (their logit becomes ``-inf``); at
    least the most likely token always stays. Ties at a cut are all kept, so the law does not
    depend on how a sort orders equal entries. ``temperature == 0`` is greedy decoding (the
    argmax; the other settings then change nothing).

    Attributes:
        temperature: ``T >= 0``.
        top_k: keep the ``k`` largest logits (and ties with the k-th); 0 keeps all.
        top_p: keep the smallest set of most likely tokens whose mass reaches ``top_p``
            (nucleus sampling); 1 keeps all.
        min_p: keep tokens with probability at least ``min_p`` times the largest; 0 keeps all.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0

    def __post_init__(self):
        t, k, p, m = self.temperature, self.top_k, self.top_p, self.min_p
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t < 0:
            raise ValueError(f"temperature must be a finite number >= 0, got {t!r}")
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise ValueError(f"top_k must be a whole number >= 0 (0 keeps every token), got {k!r}")
        if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0 < p <= 1:
            raise ValueError(f"top_p must be a number in (0, 1] (1 keeps every token), got {p!r}")
        if isinstance(m, bool) or not isinstance(m, (int, float)) or not 0 <= m < 1:
            raise ValueError(f"min_p must be a number in [0, 1) (0 keeps every token), got {m!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def truncates(self) -> bool:
        """Whether any token can be removed (top-k, top-p or min-p is on)."""
        return self.top_k > 0 or self.top_p < 1 or self.min_p > 0

    def describe(self) -> str:
        """A short label, e.g. ``T = 0.7, top-p 0.9``."""
        if self.greedy:
            return "T = 0 (greedy)"
        parts = [f"T = {self.temperature:g}"]
        parts += [f"top-k {self.top_k}"] if self.top_k else []
        parts += [f"top-p {self.top_p:g}"] if self.top_p < 1 else []
        parts += [f"min-p {self.min_p:g}"] if self.min_p > 0 else []
        return ", ".join(parts)

    def warp(self, logits: torch.Tensor) -> torch.Tensor:
        """`Tensor[k, V]` float32 ``logits / T`` with the removed tokens at ``-inf``; each row
        is warped on its own (the result for a row never depends on the other rows).

        Args:
            logits: `Tensor[k, V]` (or `Tensor[V]`) target logits; ``T`` must be > 0.
        """
        return self._cut(logits)[0]

    def log_probs(self, logits: torch.Tensor) -> torch.Tensor:
        """`Tensor[k, V]` float32 log-probabilities of the law (``-inf`` where a token was
        removed): :meth:`warp` minus each row's one normaliser."""
        scaled, log_norm = self._cut(logits)
        return scaled - log_norm

    def cut(self, logits: torch.Tensor) -> "LawCut":
        """The law's rows of ``logits`` `[k, V]` as a :class:`LawCut`: top-p's mask over the whole
        vocabulary is left undone where a reader needs only a few entries of each row."""
        return LawCut(*self._cut(logits, defer_top_p=True))

    def probs(self, logits: torch.Tensor) -> torch.Tensor:
        """`Tensor[k, V]` float32 rows of the law (zeros where a token was removed)."""
        return torch.exp(self.log_probs(logits))

    def _cut(self, logits: torch.Tensor, defer_top_p: bool = False):
        """(``logits / T`` with removed tokens at ``-inf``, `Tensor[..., 1]` the log normaliser
        of what is kept). Each cut is a floor on the scaled logit (ties at it all kept), found
        among the row's largest entries: top-k from a top-k, top-p from the top 256 with the
        row's one logsumexp (a row whose top 256 hold less than ``top_p`` is sorted whole),
        min-p from the row's largest probability. The normaliser is summed over the kept entries alone
        when they all lie in that prefix. ``defer_top_p``: a third item, top-p's floor `Tensor[..., 1]`,
        with that floor's mask not yet applied where every row's kept entries lie in the prefix (else None)."""
        if self.greedy:
            raise ValueError("temperature 0 is greedy: there is no law to sample from, only the argmax")
        scaled = logits.float() / self.temperature
        vocab = scaled.shape[-1]
        prefix = None  # the row's largest entries, descending, once a cut has looked for them
        if 0 < self.top_k < vocab:
            prefix = scaled.topk(max(self.top_k, min(_TOP_P_PREFIX, vocab)), dim=-1).values
            kth = prefix[..., self.top_k - 1 : self.top_k]
            scaled = scaled.masked_fill(scaled < kth, float("-inf"))
            prefix = prefix.masked_fill(prefix < kth, float("-inf"))
        log_norm = torch.logsumexp(scaled, dim=-1, keepdim=True)  # of what top-k kept
        if self.top_p < 1:
            if prefix is None:
                prefix = scaled.topk(min(_TOP_P_PREFIX, vocab), dim=-1).values
            floor = _top_p_floor(scaled, prefix, log_norm, self.top_p)
            prefix = prefix.masked_fill(prefix < floor, float("-inf"))
            inside = prefix[..., -1:] == float("-inf")  # every kept entry is in the prefix unless the cut reached its end
            in_prefix = self.min_p == 0 and prefix.shape[-1] < vocab  # then a row's normaliser may be summed over its prefix
            all_inside = in_prefix and bool(inside.all())
            if all_inside:
                log_norm = torch.logsumexp(prefix, dim=-1, keepdim=True)
                if defer_top_p:
                    return scaled, log_norm, floor
            scaled = scaled.masked_fill(scaled < floor, float("-inf"))
            if not all_inside:
                whole = torch.logsumexp(scaled, dim=-1, keepdim=True)
                log_norm = torch.where(inside, torch.logsumexp(prefix, dim=-1, keepdim=True), whole) if in_prefix else whole
        if self.min_p > 0:  # keep p >= min_p * max p (a whole softmax: min-p is rarely on)
            probs = torch.softmax(scaled, dim=-1)
            scaled = scaled.masked_fill(probs < self.min_p * probs.max(dim=-1, keepdim=True).values, float("-inf"))
            log_norm = torch.logsumexp(scaled, dim=-1, keepdim=True)
        return (scaled, log_norm, None) if defer_top_p else (scaled, log_norm)


@dataclass(frozen=True)
class LawCut:
    """Rows of a :class:`SamplingLaw` whose last mask may not be applied yet: a tree's parent rows are
    read at their children's tokens only, so masking and normalising every entry of every row (most of
    the head stage's law work at a few rows of a 49k vocabulary) is left to the rows read whole.

    Attributes:
        scaled: `Tensor[k, V]` float32 ``logits / T``, removed tokens at ``-inf`` except those below ``floor``.
        log_norm: `Tensor[k, 1]` each row's log normaliser over the kept entries.
        floor: `Tensor[k, 1]` the least kept scaled logit (entries below it are removed), or None (nothing deferred).
    """

    scaled: torch.Tensor
    log_norm: torch.Tensor
    floor: torch.Tensor | None

    def log_probs_at(self, rows: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """`Tensor[m]` log p of ``tokens[i]`` in row ``rows[i]`` (both `LongTensor[m]`): the same numbers
        :meth:`log_probs` holds there."""
        picked = self.scaled[rows, tokens]
        if self.floor is not None:
            picked = picked.masked_fill(picked < self.floor[rows, 0], float("-inf"))
        return picked - self.log_norm[rows, 0]

    def log_probs(self, rows: torch.Tensor | None = None) -> torch.Tensor:
        """`Tensor[m, V]` whole rows ``rows`` (`LongTensor[m]`; None: all) of log-probabilities, as
        :meth:`SamplingLaw.log_probs` gives them."""
        scaled, log_norm = self.scaled, self.log_norm
        floor = self.floor
        if rows is not None:
            scaled, log_norm = scaled.index_select(0, rows), log_norm.index_select(0, rows)
            floor = None if floor is None else floor.index_select(0, rows)
        if floor is not None:
            scaled = scaled.masked_fill(scaled < floor, float("-inf"))
        return scaled - log_norm


def _top_p_floor(scaled: torch.Tensor, prefix: torch.Tensor, log_norm: torch.Tensor, top_p: float) -> torch.Tensor:
    """`Tensor[..., 1]`: the smallest scaled logit top-p keeps in each row of ``scaled`` `[..., V]`,
    from its descending ``prefix`` `[..., P]` and ``log_norm`` `[..., 1]`.

    In descending order entry ``j`` is kept while the mass before it is below ``top_p``; the
    floor is the last kept entry's value (every entry equal to it is kept too). The mass is
    summed in float64 over the same leading values whether a row is cut in its prefix or sorted
    whole, so both give the same floor.
    """
    floor, mass = _floor_in(prefix, log_norm, top_p)
    short = mass < top_p  # the cut may lie beyond the prefix: sort those rows whole
    if prefix.shape[-1] < scaled.shape[-1] and bool(short.any()):
        floor[short] = _floor_in(scaled[short].sort(dim=-1, descending=True).values, log_norm[short], top_p)[0]
    return floor


def _floor_in(descending: torch.Tensor, log_norm: torch.Tensor, top_p: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(`Tensor[..., 1]` the floor, `Tensor[...]` float64 mass of all of ``descending``)."""
    through = torch.exp(descending - log_norm).double().cumsum(dim=-1)
    before = torch.cat([torch.zeros_like(through[..., :1]), through[..., :-1]], dim=-1)  # mass strictly before each entry
    kept = (before < top_p).sum(dim=-1, keepdim=True).clamp(min=1)
    return descending.gather(-1, kept - 1), through[..., -1]


def as_law(sampling: "SamplingLaw | float") -> SamplingLaw:
    """A :class:`SamplingLaw` from a law or a bare temperature."""
    return sampling if isinstance(sampling, SamplingLaw) else SamplingLaw(float(sampling))
