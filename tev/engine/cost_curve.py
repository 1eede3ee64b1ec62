"""The machine's cost curve: what a round costs here when its target forward holds ``n`` new tokens.

A round's time is the target's tree forward over ``n = k + 1`` new tokens (the root and ``k``
nodes) and the projection of its rows through the output head, which grow with ``n``, plus
the draft, the tree build and the commit, which do not. On a GPU a 33-token forward costs
about one token's; on a small CPU about three, so a tree that pays on one machine loses on
another. :func:`measure_forward_costs` times forward and head at a few sizes when a process
first needs them (a few seconds); :class:`CostCurve` then follows the rounds' own stage times.
"""

from __future__ import annotations

import statistics
import weakref
from collections import deque

import torch

from tev.core.tree import DraftTree
from tev.engine.session import CausalLMSession
from tev.util.timing import time_once

__all__ = ["CostCurve", "measure_forward_costs", "machine_cost_curve", "MEASURED_SIZES"]

MEASURED_SIZES = (1, 2, 3, 5, 9, 17, 33)  # n = k + 1 for k = 0, 1, 2, 4, 8, 16, 32
MEASURE_CONTEXT = 128  # cached tokens before the timed forwards (a short chat prompt)
WINDOW = 15  # rounds in the running medians


def _interpolate(points: dict[int, float], n: int) -> float:
    """Piecewise-linear in ``n`` through ``points`` (size -> seconds), linear past the ends
    and never below half the nearest point."""
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


def _non_decreasing(values: list[float]) -> list[float]:
    """The least-squares non-decreasing fit of ``values`` (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [mean, count]
    for value in values:
        blocks.append([value, 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            mean, count = blocks.pop()
            blocks[-1] = [(blocks[-1][0] * blocks[-1][1] + mean * count) / (blocks[-1][1] + count), blocks[-1][1] + count]
    return [mean for mean, count in blocks for _ in range(int(count))]


class CostCurve:
    """Seconds a round costs with ``n`` new tokens in the target's forward, ``n >= 1``:
    ``cost(n) = drift * sized(n) + fixed``.

    - ``sized(n)``: the start measurement of forward and head at ``n`` (interpolated, made
      non-decreasing: a forward of more tokens never costs less, single times are noisy).
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
        return _non_decreasing([_interpolate(self.measured, n) for n in range(1, largest + 1)])

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


def measure_forward_costs(target, sizes=MEASURED_SIZES, repeats: int = 3, context: int = MEASURE_CONTEXT) -> dict[int, float]:
    """Median seconds of one target forward of ``n`` new tokens (a chain: the tree attention of
    any shape costs the same here) and the projection of its ``n`` rows through the head, for
    each ``n`` in ``sizes``, after ``context`` cached tokens. One warm-up pass first; sizes that
    do not fit the target's context are left out."""
    session = CausalLMSession(target)
    vocab = int(target.get_output_embeddings().weight.shape[0])
    room = session.max_positions - max(sizes) - 1
    cached = max(1, min(context, room))
    session.extend([i % vocab for i in range(cached)])
    sizes = [n for n in sizes if cached + n <= session.max_positions] or [1]
    chains = {n: DraftTree.chain(0, [(i + 1) % vocab for i in range(n - 1)]) for n in sizes}
    times: dict[int, list[float]] = {n: [] for n in sizes}
    for repeat in range(repeats + 1):
        for n in sizes:
            seconds = time_once(lambda: session.forward_tree(chains[n]).logits, session.device)
            session.rollback(cached)
            if repeat:  # the first pass warms the kernels and the allocator
                times[n].append(seconds)
    return {n: statistics.median(t) for n, t in times.items()}


_CURVES: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def machine_cost_curve(target) -> CostCurve:
    """The process's cost curve for ``target`` at torch's current thread count: measured on the
    first call (a few seconds), then the same object, which the rounds keep up to date."""
    by_threads = _CURVES.setdefault(target, {})
    threads = torch.get_num_threads()
    if threads not in by_threads:
        by_threads[threads] = CostCurve(measure_forward_costs(target))
    return by_threads[threads]
