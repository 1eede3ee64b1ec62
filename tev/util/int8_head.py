"""A drafter's read-out through int8 head rows, where that is measured faster.

A drafter reads ``Vd`` rows of the target's head (`[Vd, H]`, 8,192 x 576 for the default
pair): at a few rows per call the product is bound by reading those rows, 19 MB in float32.
The path drafter reads them once per depth, so on a CPU they are most of its draft stage.
Stored as int8 with one scale per row and multiplied by fbgemm's dynamic-quantised kernel
(the activations quantised per call), the same product reads a quarter of the bytes: about
5x faster than float32 on AVX-512 and on AVX2 parts. The logits move by about 1% of their
range, which changes which tokens a tree drafts only at near-ties; verification is exact for
whatever the drafter proposes, so this trades nothing in correctness.

Chosen by measurement, once per process (:func:`int8_head_speedup`), as
:mod:`tev.util.precision` chooses bfloat16; ``TEV_INT8_HEAD=1`` / ``=0`` forces it. Only
inference uses it (no gradient flows through int8 rows).
"""

from __future__ import annotations

import functools
import os
import warnings

import torch

from tev.util.timing import median_seconds

__all__ = ["Int8Head", "int8_head_speedup", "use_int8_head", "INT8_ENV"]

INT8_ENV = "TEV_INT8_HEAD"
_PROBE_SHAPE = (4, 576, 8192)  # rows, hidden, draft vocabulary: one depth of a path drafter's tree
_WORTH_IT = 1.5


class Int8Head:
    """``hidden @ rows.T`` with ``rows`` (`[Vd, H]`) held as int8 per-row scaled.

    Call with `Tensor[..., H]` (any float dtype); returns `Tensor[..., Vd]` float32. ``nbytes``:
    the memory its rows hold.
    """

    def __init__(self, rows: torch.Tensor):
        size, hidden = rows.shape
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch marks its quantised tensor types deprecated; the kernel is the one shipped with the pinned torch
            self._linear = torch.ao.nn.quantized.dynamic.Linear(hidden, size, bias_=False, dtype=torch.qint8)
            rows = rows.detach().float().cpu()
            scales = (rows.abs().amax(dim=1) / 127).clamp(min=1e-12).double()
            quantised = torch.quantize_per_channel(rows, scales, torch.zeros(size, dtype=torch.long), 0, torch.qint8)
            self._linear.set_weight_bias(quantised, None)
        self.nbytes = quantised.numel() * quantised.element_size() + scales.numel() * scales.element_size()  # the int8 rows and their scales
        # the module's own forward calls this op (reduce_range as its version 4 does); called here
        # directly, since at a few rows the module's Python dispatch cost about 40 us a product on
        # an AVX2 EPYC, as much as the product itself (the path drafter makes ~10 a depth)
        self._packed = self._linear._packed_params._packed_params

    def __call__(self, hidden: torch.Tensor) -> torch.Tensor:
        shape = hidden.shape
        return torch.ops.quantized.linear_dynamic(hidden.reshape(-1, shape[-1]).float(), self._packed, True).reshape(*shape[:-1], -1)


@functools.cache
def int8_head_speedup() -> float:
    """float32 time / int8 time of one depth's head product on this CPU (0 where the int8 kernel is missing)."""
    rows, hidden, size = _PROBE_SHAPE
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(rows, hidden, generator=generator)
    weight = torch.randn(size, hidden, generator=generator) * 0.05
    try:
        head = Int8Head(weight)
    except (RuntimeError, AttributeError):  # a torch built without fbgemm/onednn quantised kernels
        return 0.0
    return median_seconds(lambda: torch.nn.functional.linear(x, weight), 15) / median_seconds(lambda: head(x), 15)


def use_int8_head(device: torch.device | str = "cpu") -> bool:
    """Whether a drafter on ``device`` reads its head rows as int8: on a CPU where measured
    at least 1.5x faster than float32, unless ``TEV_INT8_HEAD`` forces it."""
    if torch.device(device).type != "cpu":
        return False
    forced = os.environ.get(INT8_ENV, "").strip()
    if forced in ("0", "1"):
        return forced == "1"
    return int8_head_speedup() >= _WORTH_IT
