"""Before -> train -> after: the one measured fine-tune (the exittrain command, the ablation, the
app's live and workload modes, the diagnosis script).

:class:`Experiment` measures the drafter, trains it, measures it again. Each phase is a
generator that yields (never None) after every piece of work (a held-out batch, a training step), so the
caller's compute thread takes a piece in turn with other work, and the caller stops at its deadline
or on cancel (:class:`tev.util.compute_thread.ComputeThread`). The default measurement is the held-out ``1 + C`` of
the drafter's trees on the same held-out anchors before and after, so the change is paired over
anchors and its standard error is :func:`tev.util.stats.standard_error` of the differences.
"""

from __future__ import annotations

from typing import Callable, Generator, Iterator

import torch

from tev.train.data import TrainData
from tev.train.loop import TrainSettings, train
from tev.train.trees import TreeBatch, on_policy
from tev.util.stats import standard_error

__all__ = ["HELDOUT_BATCHES", "HELDOUT_SEED", "heldout_trees", "paired_change", "Experiment"]

HELDOUT_BATCHES = 4  # held-out draws (each sequences_per_step x anchors_per_sequence rounds) before and after
HELDOUT_SEED = 12345  # the same held-out anchors for every drafter


def heldout_trees(target, drafter, data: TrainData, settings: TrainSettings, batches: int = HELDOUT_BATCHES) -> Generator[int, None, TreeBatch]:
    """The drafter's trees on held-out data at fixed anchors (the same rounds every call), scored
    by the target: yields each batch's number after it and returns the joined :class:`TreeBatch`."""
    was_training = drafter.training
    drafter.eval()
    generator = torch.Generator().manual_seed(HELDOUT_SEED)
    parts = []
    for batch in range(batches):
        index = data.draw(settings.sequences_per_step, settings.anchors_per_sequence, generator)
        with torch.no_grad():
            parts.append(on_policy(target, drafter, data, index, settings.budget, settings.temperature)[3])
        yield batch
    drafter.train(was_training)
    return TreeBatch.join(parts)


def paired_change(before: TreeBatch, after: TreeBatch) -> dict:
    """Mean ``1 + C`` of two drafters' trees on the same held-out anchors, the relative change
    and its standard error (paired over anchors: both drafters met the same contexts)."""
    if len(before.coverage) != len(after.coverage) or not before.coverage:
        raise ValueError("compare trees of the same held-out anchors")
    differences = [a - b for a, b in zip(after.coverage, before.coverage)]
    return {"before": before.tau_bound, "after": after.tau_bound, "change": after.tau_bound / before.tau_bound - 1,
            "change_se": standard_error(differences) / before.tau_bound, "anchors": len(differences)}


class Experiment:
    """One drafter measured, trained and measured again.

    Args:
        drafter: the drafter to train (in place, float32).
        training: ``drafter -> generator of step records`` (:func:`tev.train.loop.train`).
        measure: ``drafter -> generator`` yielding an int per piece of work and returning the measurement.
        compare: ``(before, after) -> dict``, the change (default :func:`paired_change`).
    """

    def __init__(self, drafter, training: Callable, measure: Callable, compare: Callable = paired_change):
        self.drafter, self._training, self._measure, self._compare = drafter, training, measure, compare
        self.before = self.after = None
        self.history: list[dict] = []

    @classmethod
    def exittrain(cls, target, drafter, data: TrainData, heldout: TrainData, settings: TrainSettings) -> "Experiment":
        """Held-out ``1 + C`` before and after :func:`train` with ``settings`` on ``data``."""
        return cls(drafter, lambda d: train(d, data, settings, target=target),
                   lambda d: heldout_trees(target, d, heldout, settings))

    def _measured(self, name: str) -> Iterator[int]:
        setattr(self, name, (yield from self._measure(self.drafter)))

    def measure_before(self) -> Iterator[int]:
        return self._measured("before")

    def measure_after(self) -> Iterator[int]:
        return self._measured("after")

    def train(self) -> Iterator[dict]:
        """The training steps (a caller may stop between them); records kept in ``history``."""
        for record in self._training(self.drafter):
            self.history.append(record)
            yield record

    @property
    def steps(self) -> int:
        return len(self.history)

    def change(self) -> dict:
        return self._compare(self.before, self.after)

    def run(self) -> dict:
        """All three phases at once; returns :meth:`change`."""
        for phase in (self.measure_before(), self.train(), self.measure_after()):
            for _ in phase:
                pass
        return self.change()
