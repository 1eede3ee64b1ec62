"""The machine's cost curve: what a round costs here when its target forward holds ``n`` new tokens.

A round's time is the target's tree forward over ``n = k + 1`` new tokens (the root and ``k``
nodes) and the projection of its rows through the output head, which grow with ``n``, plus
the draft, the tree build and the commit, which do not. On a GPU a 33-token forward costs
about one token's; on a small CPU about three, so a tree that pays on one machine loses on
another. :func:`measure_forward_costs` times the forward at every small size and a few larger
ones when a process first needs them (a few seconds); :class:`CostCurve` then follows the rounds'
own stage times.

The curve is not smooth, and it is not forced to be: on a one-thread AVX-512 EPYC a forward of 2
or 3 new tokens costs 1.5-1.7 one-token forwards while 4 tokens cost 1.45 (the matrix kernels'
blocking by row count), so keeping 3 nodes is cheaper than keeping 2. Each size is measured in a
shuffled order over several passes and its fastest pass is kept: another job on the machine only
ever adds time, and the rounds' running ``drift`` then scales the whole curve to how busy the
machine is now.
"""

from __future__ import annotations

import random
import statistics
from collections import deque

import torch

from tev.core.tree import DraftTree
from tev.engine.session import CausalLMSession
from tev.engine.target import Target
from tev.util.machine_cache import model_shape, recall, remember
from tev.util.timing import time_once

__all__ = ["CostCurve", "measure_forward_costs", "machine_cost_curve", "kept_cost_curve", "MEASURED_SIZES"]

MEASURED_SIZES = (1, 2, 3, 4, 5, 6, 7, 8, 9, 12, 17, 25, 33)  # n = k + 1: every small tree, then a few larger
MEASURE_CONTEXT = 128  # cached tokens before the timed forwards (a short chat prompt)
WINDOW = 15  # rounds in the running medians


def _interpolate(points: dict[int, float], n: int) -> float:
    """Piecewise-linear in ``n`` through ``points`` (size -> seconds; a measured size is its own
    value), linear past the ends and never below half the nearest point."""
    sizes = sorted(points)
    if len(sizes) == 1:
        return points[sizes[0]]
    if n <= sizes[0]:
        lo, hi = sizes[0], sizes[1]
    elif n >= sizes[-1]:
        lo, hi = sizes[-2], sizes[-1]
    else:
        hi = next(s for s in sizes if s >= n)
        lo = max(s for s in sizes if s <= n)
        if lo == hi:
            return points[lo]
    value = points[lo] + (points[hi] - points[lo]) * (n - lo) / (hi - lo)
    return max(value, 0.5 * points[min(sizes, key=lambda s: abs(s - n))])


class CostCurve:
    """Seconds a round costs with ``n`` new tokens in the target's forward, ``n >= 1``:
    ``cost(n) = drift * sized(n) + fixed``.

    - ``sized(n)``: the start measurement of the forward at ``n`` (interpolated between the
      measured sizes; not smoothed, see the module's note).
    - ``drift``: the running median, over the last rounds whatever their size, of each
      round's size-dependent stages over ``sized(n)`` at its size (the machine got busier or
      quieter; 1 before any round). One factor for every size, so a size the rounds stopped
      choosing is never judged by stale times.
    - ``fixed``: the running median of the rounds' other stages (draft, build, commit; 0
      before any round).

    Args:
        forward_seconds: start measurement, size ``n`` -> seconds of forward and head.
        frozen: ignore the rounds (``cost = sized``): the choices then depend on no timing,
            so a seeded run repeats token for token.
    """

    def __init__(self, forward_seconds: dict[int, float], frozen: bool = False):
        if not forward_seconds or min(forward_seconds) < 1 or min(forward_seconds.values()) <= 0:
            raise ValueError(f"a cost curve needs positive times at sizes >= 1, got {forward_seconds}")
        self.measured = dict(forward_seconds)
        self.frozen = frozen
        self._drift: deque = deque(maxlen=WINDOW)
        self._fixed: deque = deque(maxlen=WINDOW)

    def sized(self, largest: int) -> list[float]:
        """``sized(n)`` for ``n = 1 .. largest``."""
        return [_interpolate(self.measured, n) for n in range(1, largest + 1)]

    def observe(self, n: int, sized_seconds: float, fixed_seconds: float) -> None:
        """One round's stage times: those that grow with its ``n`` new tokens (forward, head and
        verdict) and the others."""
        if self.frozen:
            return
        self._drift.append(float(sized_seconds) / self.sized(n)[n - 1])
        self._fixed.append(max(0.0, float(fixed_seconds)))

    @property
    def drift(self) -> float:
        return statistics.median(self._drift) if self._drift else 1.0

    @property
    def fixed(self) -> float:
        return statistics.median(self._fixed) if self._fixed else 0.0

    def costs(self, largest: int) -> torch.Tensor:
        """`Tensor[largest]` float64: ``cost(n)`` for ``n = 1 .. largest``."""
        drift, fixed = self.drift, self.fixed
        return torch.tensor([drift * t + fixed for t in self.sized(largest)], dtype=torch.float64)

    def to_dict(self, largest: int) -> dict:
        """Plain JSON values: ``cost(n)`` for ``n = 1 .. largest`` and what it is made of."""
        return {
            "cost_seconds": [round(t, 6) for t in self.costs(largest).tolist()],
            "drift": round(self.drift, 6),
            "fixed_seconds": round(self.fixed, 6),
            "measured_seconds": {str(n): round(t, 6) for n, t in sorted(self.measured.items())},
        }


def measure_forward_costs(target: Target, sizes=MEASURED_SIZES, passes: int = 3, context: int = MEASURE_CONTEXT, seed: int = 0) -> dict[int, float]:
    """The fastest of ``passes`` timings of one target forward of ``n`` new tokens (a chain: the
    tree attention of any shape costs the same here), for each ``n`` in ``sizes``, after
    ``context`` cached tokens. Each pass takes the sizes in a fresh shuffled order, so a busy
    spell of the machine lands on different sizes in different passes; one warm-up pass first.
    The head's projection is not timed here: what a round does with its rows depends on the
    sampling law, and the rounds' own times scale it in (``drift``). Sizes that do not fit the
    target's context are left out."""
    session = CausalLMSession(target)
    vocab = int(target.model.get_output_embeddings().weight.shape[0])
    room = session.max_positions - max(sizes) - 1
    cached = max(1, min(context, room))
    session.extend([i % vocab for i in range(cached)])
    sizes = [n for n in sizes if cached + n <= session.max_positions] or [1]
    chains = {n: DraftTree.chain(0, [(i + 1) % vocab for i in range(n - 1)]) for n in sizes}
    times: dict[int, list[float]] = {n: [] for n in sizes}
    order = random.Random(seed)
    for repeat in range(passes + 1):
        for n in order.sample(sizes, len(sizes)):
            seconds = time_once(lambda: session.forward_tree(chains[n]), session.device)
            session.rollback(cached)
            if repeat:  # the first pass warms the kernels and the allocator
                times[n].append(seconds)
    return {n: min(t) for n, t in times.items()}


def machine_cost_curve(target: Target) -> CostCurve:
    """``target``'s cost curve at torch's current thread count and in the forward its sessions run
    (``target.label``: a bfloat16 row costs another price than a float32 one): measured on the first
    call (a few seconds) and kept in ``target.curves``, then the same object, which the rounds keep up to date."""
    key = _curve_key(target, torch.get_num_threads())
    if key not in target.curves:
        target.curves[key] = CostCurve(_forward_costs_here(target, target.label))
    return target.curves[key]


def kept_cost_curve(target: Target, threads: int) -> CostCurve | None:
    """The curve :func:`machine_cost_curve` measured on ``target`` at ``threads`` torch threads in the forward it
    runs now, or None before (read without running anything)."""
    return target.curves.get(_curve_key(target, threads))


def _curve_key(target: Target, threads: int) -> tuple[int, str]:
    return threads, target.label


def _forward_costs_here(target: Target, forward: str) -> dict[int, float]:
    """:func:`measure_forward_costs` on this machine, from an earlier start's measurement where one
    was kept (:mod:`tev.util.machine_cache`; about 6 s of a start at one thread on a 2-core AVX2
    EPYC): the rounds' own times then scale it to the moment (``drift``)."""
    parts = {"model": model_shape(target.model), "forward": forward, "sizes": MEASURED_SIZES, "context": MEASURE_CONTEXT}
    kept = recall("cost-curve", parts)
    if kept is not None and isinstance(kept.get("seconds"), dict):
        try:
            seconds = {int(n): float(t) for n, t in kept["seconds"].items()}
        except (TypeError, ValueError):
            seconds = {}
        if seconds and min(seconds) >= 1 and min(seconds.values()) > 0:
            return seconds
    seconds = measure_forward_costs(target)
    remember("cost-curve", parts, {"seconds": {str(n): t for n, t in seconds.items()}})
    return seconds
