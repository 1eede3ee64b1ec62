"""Exact argmax of a large output head from a bfloat16 screen.

Greedy verification needs only ``argmax_j (h @ W.T)_j`` per tree node, but the float32 head of
a 49,152-token model is a 113 MB read per projection, most of a greedy round's decision time.
:class:`HeadScreen` projects through a bfloat16 copy of the head (half the bytes, and the CPU's
bf16 matrix units), bounds the screen's error per token, and recomputes in float32 only the
tokens whose bound reaches the screen's best: the float32 argmax is always among them, so the
result is the float32 argmax (up to float32 summation order, as any two float32 kernels).

The bound: rounding ``h`` and ``W`` to bfloat16 moves each product ``h_i W_ji`` by at most
``(2u + u^2) |h_i W_ji|`` with ``u = 2^-9``, so the dot product by at most
``(2u + u^2) ||h|| ||W_j||``; float32 accumulation over ``H`` terms adds ``gamma_H`` of the
same sum, and the bfloat16 output rounding ``u`` of the result. The kernel is checked to
accumulate in float32 (else the screen is off and every call is plain float32).
"""

from __future__ import annotations

import torch

__all__ = ["HeadScreen"]

_BF16_UNIT = 2.0**-9  # unit roundoff of bfloat16 (8 significant bits)
_F32_UNIT = 2.0**-24


def _accumulates_in_float32() -> bool:
    """True when a bfloat16 matmul on this CPU sums in float32: 1,024 ones sum to 1,024
    (a bfloat16 accumulator sticks at 256, where adding 1 no longer changes it)."""
    ones = torch.ones(1, 1024, dtype=torch.bfloat16)
    return float(torch.nn.functional.linear(ones, ones)) == 1024.0


class HeadScreen:
    """Float32-exact argmax over ``hidden @ head.T`` with a bfloat16 screen.

    Args:
        head: `Tensor[V, H]` float32 output head (kept by reference for the exact recheck).
    """

    def __init__(self, head: torch.Tensor):
        if head.dim() != 2 or head.dtype != torch.float32:
            raise ValueError(f"the head screen takes a float32 [V, H] head, got {head.dtype} {tuple(head.shape)}")
        self.head = head
        self.enabled = head.device.type == "cpu" and _accumulates_in_float32()
        self.version: int | None = None  # the head's version the copy was made from; None: not yet made

    @property
    def screen(self) -> torch.Tensor:
        """`Tensor[V, H]` the bfloat16 copy of the head, made on first use (a model used only for
        sampling, or as an autoregressive drafter, never pays for it) and again after the head
        changed in place (its version counter moved)."""
        if self.version != self.head._version:
            self._build()
        return self._copy

    def _build(self) -> None:
        head = self.head
        self.version = head._version
        with torch.no_grad():
            self._copy = head.to(torch.bfloat16)  # [V, H]
            self.max_row_norm = float(head.norm(dim=1).max())
            size = head.shape[1]
            gamma = size * _F32_UNIT / (1 - size * _F32_UNIT)
            # |screen - exact| <= c_norm * ||h|| * max ||W_j|| + c_out * |screen|
            self.c_norm = (2 * _BF16_UNIT + _BF16_UNIT**2) * (1 + gamma) + gamma
            self.c_out = 2 * _BF16_UNIT  # the output rounding, relative to the rounded value

    def argmax(self, hidden: torch.Tensor) -> torch.Tensor:
        """`LongTensor[k]`: the float32 argmax of each row of ``hidden`` (`Tensor[k, H]` float32)."""
        if not self.enabled or not bool(torch.isfinite(hidden).all()):
            return torch.nn.functional.linear(hidden, self.head).argmax(dim=-1)
        approx = torch.nn.functional.linear(hidden.to(torch.bfloat16), self.screen)  # [k, V], bfloat16
        low, top = (x.float() for x in torch.aminmax(approx, dim=-1))  # [k] each
        peak = torch.maximum(top.abs(), low.abs())  # the largest |screen value| in the row
        slack = self.c_norm * hidden.norm(dim=-1) * self.max_row_norm + self.c_out * peak  # [k]
        margin = 2 * slack * (1 + 1e-3) + 1e-30  # both sides' error, plus this test's own rounding
        rows, tokens = torch.nonzero(approx >= (top - margin).unsqueeze(1), as_tuple=True)  # candidates
        exact = (hidden[rows] * self.head[tokens]).sum(dim=-1)  # float32 logits of the candidates
        best = torch.full_like(top, float("-inf")).scatter_reduce(0, rows, exact, "amax")
        winner = exact == best[rows]
        # the lowest winning token of each row, as a full float32 argmax picks the first maximum
        first = torch.full(top.shape, self.head.shape[0], dtype=torch.long)
        return first.scatter_reduce(0, rows[winner], tokens[winner], "amin")
