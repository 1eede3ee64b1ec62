"""Best-first growth of a draft tree, depth by depth (EAGLE-2's dynamic tree): the one grower of every
drafter whose ``q`` at a node is conditional on the path to it. ``q`` is the draft model.

A drafter supplies one step: forward some nodes of the growing tree together (each sees the
context and its own ancestors) and return each one's next-token log ``q``. :func:`grow_tree`
chooses which nodes each depth forwards; :meth:`GrowingTree.best` keeps the best ``budget``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import torch

from tev.core.tree import DraftTree

__all__ = ["GrowingTree", "Step", "grow_tree", "frontier_width"]


@dataclass
class GrowingTree:
    """The nodes created so far in one round, flat lists indexed by node (0 is the root).

    Attributes:
        tokens, parents, depths: each node's token, parent (-1 at the root) and depth.
        scores: path score ``sum log q`` from the root (0 at the root).
        logprobs: log ``q`` of the node's token given the path to its parent.
        slots: node -> the order it was forwarded in this round (the root first, slot 0): where a
            drafter's cache holds its keys.
    """

    tokens: list[int]
    parents: list[int] = field(default_factory=lambda: [-1])
    depths: list[int] = field(default_factory=lambda: [0])
    scores: list[float] = field(default_factory=lambda: [0.0])
    logprobs: list[float] = field(default_factory=lambda: [0.0])
    slots: dict[int, int] = field(default_factory=dict)

    def ancestor_slots(self, v: int) -> list[int]:
        """The slots of ``v``'s ancestors, parent first (every ancestor was forwarded before it)."""
        seen, u = [], self.parents[v]
        while u != -1:
            seen.append(self.slots[u])
            u = self.parents[u]
        return seen

    def add_children(self, v: int, values: list[float], tokens: list[int]) -> list[int]:
        """Create children of ``v`` with tokens ``tokens`` and log q ``values`` (a -inf one is not a
        proposal); returns the new nodes."""
        created = []
        for value, token in zip(values, tokens):
            if value == float("-inf"):
                continue
            created.append(len(self.tokens))
            self.tokens.append(token)
            self.parents.append(v)
            self.depths.append(self.depths[v] + 1)
            self.scores.append(self.scores[v] + value)
            self.logprobs.append(value)
        return created

    def kth_best(self, budget: int) -> float:
        """The ``budget``-th best non-root score so far (a node scoring below it, and so every
        descendant of it, cannot enter the kept tree); -inf while fewer nodes exist."""
        if len(self.scores) - 1 < budget:
            return float("-inf")
        return sorted(self.scores[1:], reverse=True)[budget - 1]

    def best(self, budget: int) -> DraftTree:
        """The ``budget`` best nodes by path score (ties: the earlier created), as a tree: a child
        never outscores its parent, so every kept node's parent is kept too."""
        ranked = sorted(range(1, len(self.tokens)), key=lambda v: (-self.scores[v], v))[:budget]
        keep = sorted(ranked)  # creation order: parents first
        new_index = {0: 0, **{v: i + 1 for i, v in enumerate(keep)}}
        return DraftTree.from_parents([self.tokens[0]] + [self.tokens[v] for v in keep], [-1] + [new_index[self.parents[v]] for v in keep],
                                      [0.0] + [self.logprobs[v] for v in keep])


# step(nodes, tree) -> `Tensor[n, Vq]` log q of the next token under each of the n ``nodes`` (their
# slots already numbered in ``tree``); the first call forwards the root alone.
Step = Callable[[list[int], GrowingTree], torch.Tensor]


def frontier_width(budget: int, cap: int) -> int:
    """Nodes forwarded per depth, and children proposed per forwarded node, for ``budget`` nodes:
    about ``sqrt(budget)``, at least 2 and at most ``cap``."""
    return min(cap, max(2, math.ceil(math.sqrt(budget))))


def grow_tree(root: int, budget: int, horizon: int, width: int, step: Step, min_path_prob: float = 0.0,
              token_ids: torch.Tensor | None = None) -> GrowingTree:
    """Grow a tree under ``root`` best first by conditional path score, one ``step`` per depth.

    Each depth forwards the ``width`` best frontier nodes together and each proposes its ``width``
    most likely children. Depths stop early once no frontier node could still enter the best
    ``budget`` (it saves a step and changes no kept node), or none has a path probability of at
    least ``min_path_prob`` (such a node adds less than that to the expected block).

    Args:
        root: the root token (the last committed); budget: ``B``, the non-root nodes to be kept.
        horizon: the deepest depth grown; width: see above (1: the top-1 chain).
        step: forwards nodes, returning their next-token log q (:data:`Step`).
        token_ids: `LongTensor[Vq]`, the token each column of a step's rows stands for (a draft
            vocabulary); None: the column is the token.

    Returns:
        the grown tree (only the root when ``budget`` or ``horizon`` is 0); ``.best(budget)`` keeps it.
    """
    tree = GrowingTree([root])
    if budget <= 0 or horizon <= 0:
        return tree
    least = math.log(min_path_prob) if min_path_prob > 0 else float("-inf")
    chosen = [0]
    for depth in range(horizon):
        tree.slots.update({v: len(tree.slots) + row for row, v in enumerate(chosen)})
        logq = step(chosen, tree)  # [n, Vq]
        top = torch.topk(logq, min(width, logq.shape[-1]), dim=-1)  # one call for the depth's rows
        tokens = top.indices if token_ids is None else token_ids[top.indices.to(token_ids.device)]
        frontier = []
        for row, v in enumerate(chosen):
            frontier += tree.add_children(v, top.values[row].tolist(), tokens[row].tolist())
        if depth + 1 == horizon:
            break
        floor = max(tree.kth_best(budget), least)
        ranked = sorted(frontier, key=lambda u: (-tree.scores[u], u))[:width]
        chosen = [u for u in ranked if tree.scores[u] > float("-inf") and tree.scores[u] >= floor]
        if not chosen:
            break
    return tree
