"""Matrix products whose every row comes out the same however many rows are computed with it.

A CPU matrix library picks its kernel and its blocking by the shape of the product: a product of
one row is often a matrix-vector kernel that sums a row's terms in another order than the
matrix-matrix kernel does, and a large reduction dimension may be split differently for few rows
than for many. Then a row computed alone (plain decoding) and the same row inside a tree differ in
their last bits, and greedy speculation can part from greedy decoding where two logits nearly tie.

:class:`RowProducts` holds one weight prepacked for oneDNN (the library's blocked layout, read the
same way whatever the row count) and always hands the kernel between ``min_rows`` and ``max_rows``
rows: fewer are padded with zero rows, more are cut into pieces of ``max_rows``. Inside that range
the kernel's treatment of a row must not depend on the row count or on the row's place in the
batch; :func:`invariance_failures` checks exactly that, row by row and bit for bit, on this
machine's kernels (:mod:`tev.engine.target_precision` runs it at load and refuses the path where
it fails).

Measured on a 2-core AVX512_BF16 Xeon without AMX (torch 2.13, oneDNN prepacked): every row count
from 2 to 64 gives every row the same bits, in float32 and in bfloat16; a single row does not (its
own kernel where the reduction is longer than 1,024, as in the MLP's down projection; in bfloat16
the difference shows only where the output rounds near a boundary, a few elements in ten thousand),
hence ``min_rows = 2``. torch's default float32 ``linear`` (MKL) has three classes (1, 2-15, 16
and more rows) and is not used here.
"""

from __future__ import annotations

import torch

__all__ = ["RowProducts", "invariance_failures", "packed_products_available", "MIN_ROWS", "MAX_ROWS"]

MIN_ROWS = 2  # one row gets a matrix-vector kernel of its own in most libraries: never hand the kernel one row
MAX_ROWS = 64  # larger row counts (a long prompt's prefill) are cut into pieces of this many


def _pack(weight: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach().to(dtype).contiguous(), MAX_ROWS)


def packed_products_available(dtype: torch.dtype) -> bool:
    """Whether this torch build and CPU run oneDNN's prepacked product in ``dtype``."""
    try:
        products = RowProducts(torch.zeros(8, 64), dtype)
        return products(torch.zeros(3, 64)).shape == (3, 8)
    except (RuntimeError, AttributeError):
        return False


class RowProducts:
    """``x @ weight.T (+ bias)`` in ``dtype``, one fixed kernel for every row count.

    Args:
        weight: `Tensor[out, in]` (any float dtype; a copy is packed in ``dtype``).
        dtype: the products' precision (``torch.float32`` or ``torch.bfloat16``).
        bias: `Tensor[out]` or None, added in float32 after the product.
        min_rows, max_rows: the row counts handed to the kernel.
    """

    def __init__(self, weight: torch.Tensor, dtype: torch.dtype, bias: torch.Tensor | None = None,
                 min_rows: int = MIN_ROWS, max_rows: int = MAX_ROWS):
        if weight.dim() != 2:
            raise ValueError(f"a product's weight is [out, in], got {tuple(weight.shape)}")
        self.out_features, self.in_features = weight.shape
        self.dtype = dtype
        self.packed = _pack(weight, dtype)
        self.bias = None if bias is None else bias.detach().float()
        self.min_rows, self.max_rows = min_rows, max_rows
        self._zeros = torch.zeros(max(min_rows - 1, 0), self.in_features, dtype=dtype)

    def _kernel(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, None, "none", [], "")

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """`Tensor[M, in]` -> `Tensor[M, out]` float32 (the kernel's output in ``dtype``, widened)."""
        if x.dtype != self.dtype:
            x = x.to(self.dtype)
        rows = x.shape[0]
        if self.min_rows <= rows <= self.max_rows:
            out = self._kernel(x.contiguous()).float()
        elif 0 < rows < self.min_rows:  # a one-token step: zero rows below (one small copy, cheaper than a pad)
            out = self._kernel(torch.cat([x, self._zeros[: self.min_rows - rows]]))[:rows].float()
        else:
            pieces = []
            for start in range(0, max(rows, 1), self.max_rows):
                piece = x[start:start + self.max_rows]
                real = piece.shape[0]
                if real < self.min_rows:  # zero rows below: the kernel sees min_rows rows
                    piece = torch.nn.functional.pad(piece, (0, 0, 0, self.min_rows - real))
                pieces.append(self._kernel(piece.contiguous())[:real])
            out = (pieces[0] if len(pieces) == 1 else torch.cat(pieces)).float()
        return out if self.bias is None else out + self.bias


def invariance_failures(products: RowProducts, row_counts, seed: int = 0) -> list[int]:
    """The row counts ``M`` (of ``row_counts``) where some row of a product over ``M`` rows is
    not bit for bit the same row computed alone; empty when every row is invariant.

    Random rows of the weight's input width; every row of every batch is compared, so a row's
    place in the batch is checked too."""
    generator = torch.Generator().manual_seed(seed)
    largest = max(row_counts)
    x = torch.randn(largest, products.in_features, generator=generator)
    alone = torch.cat([products(x[i:i + 1]) for i in range(largest)])
    return [m for m in row_counts if not torch.equal(products(x[:m]), alone[:m])]
