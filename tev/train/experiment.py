"""Before -> train -> after: the one measured fine-tune (the exittrain command, the ablation, the
app's live and workload modes, the diagnosis script).

:class:`Experiment` measures the drafter, trains it, measures it again: :meth:`Experiment.phases` is
the whole of it as one generator of :class:`tev.util.progress.Progress` events (one after every
held-out batch and every training step), so a caller's compute thread takes a piece in turn with
other work (:class:`tev.util.compute_thread.ComputeThread`) and the caller reads one stream of events
(:func:`tev.util.progress.relay`, :func:`tev.util.compute_thread.result_of`); it stops training at its
deadline or on cancel (``stop_training``). The default measurement is the held-out ``1 + C`` of
the drafter's trees on the same held-out anchors before and after, so the change is paired over
anchors and its standard error is :func:`tev.util.stats.standard_error` of the differences.
"""

from __future__ import annotations

from typing import Callable, Generator, Iterator

import time

import torch

from tev.train.data import TrainData
from tev.train.loop import TrainSettings, train
from tev.train.trees import TreeBatch, on_policy
from tev.util.compute_thread import result_of
from tev.util.progress import Phase, Progress, within
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
        measure: ``drafter -> generator`` yielding after each piece of work and returning the measurement.
        compare: ``(before, after) -> dict``, the change (default :func:`paired_change`).

    ``seconds`` says how long each phase took (``before``, ``train``, ``after``), as each ends.
    """

    def __init__(self, drafter, training: Callable, measure: Callable, compare: Callable = paired_change):
        self.drafter, self._training, self._measure, self._compare = drafter, training, measure, compare
        self.before = self.after = None
        self.history: list[dict] = []
        self.seconds: dict[str, float] = {}

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

    def phases(self, stop_training: Callable[[], bool] = lambda: False) -> Generator[Progress, None, dict | None]:
        """Before -> train -> after as one generator: each phase starts with its event
        (:attr:`Phase.BEFORE`, :attr:`Phase.TRAIN`, :attr:`Phase.AFTER` with the steps made), then
        a piece of it after every held-out batch, and every training step's record as the ``info``
        of a :attr:`Phase.TRAIN` piece. Training ends after the last step or
        the first one after which ``stop_training()`` is true. Returns :meth:`change`, or None when no
        step was made (nothing to measure after)."""
        yield from self._timed("before", within(self.measure_before(), Phase.BEFORE), Progress.start(Phase.BEFORE))
        yield from self._timed("train", self._train_until(stop_training), Progress.start(Phase.TRAIN))
        if not self.history:
            return None
        yield from self._timed("after", within(self.measure_after(), Phase.AFTER), Progress.start(Phase.AFTER, steps=self.steps))
        return self.change()

    def _timed(self, name: str, pieces: Iterator[Progress], first: Progress):
        """``first`` and then ``pieces``, with their seconds kept under ``name``."""
        start = time.monotonic()
        yield first
        yield from pieces
        self.seconds[name] = time.monotonic() - start

    def _train_until(self, stop: Callable[[], bool]):
        """The training steps as :attr:`Phase.TRAIN` events, until the last or ``stop()``."""
        records = self.train()
        try:
            for record in records:
                yield Progress(Phase.TRAIN, record)
                if stop():
                    break
        finally:
            records.close()

    def run(self) -> dict:
        """All three phases, nobody reading on the way (the one driver, :func:`result_of`); returns :meth:`change`."""
        return result_of(self.phases())
