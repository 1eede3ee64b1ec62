"""Draft trees as flat arrays, and their builders.

A tree has a root (node 0: the last committed token) and non-root nodes ``v`` with parent
``pa(v)``, token ``x_v`` and depth ``d(v)``. Parents precede children and sibling tokens are
distinct. The budget ``B`` counts non-root nodes, so a tree has ``N = B + 1`` nodes.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from functools import cached_property
from typing import Sequence

import torch

__all__ = ["DraftTree"]


def _as_long(values, name: str) -> torch.Tensor:
    tensor = torch.as_tensor(values)
    if tensor.dtype.is_floating_point or tensor.dtype == torch.bool:
        raise ValueError(f"{name} must hold integers, got dtype {tensor.dtype}")
    if tensor.dim() != 1:
        raise ValueError(f"{name} must be 1-D, got shape {tuple(tensor.shape)}")
    return tensor.to(device="cpu", dtype=torch.long)


@dataclass(frozen=True, eq=False)
class DraftTree:
    """A draft tree stored as flat CPU arrays, validated on construction.

    Attributes:
        tokens: `LongTensor[N]`, ``x_v``; ``tokens[0]`` is the root token.
        parents: `LongTensor[N]`, ``pa(v)``; ``parents[0] == -1`` and ``parents[v] < v``.
        depths: `LongTensor[N]`, ``d(v)``; ``depths[0] == 0``.
        draft_logprob: `Tensor[N]`, the drafter's log-probability of ``x_v`` at that node
            (per-depth marginal ``log q_d(x_v)`` for a block drafter, conditional
            ``log q(x_v | path)`` for an autoregressive one); 0 at the root.
    """

    tokens: torch.Tensor
    parents: torch.Tensor
    depths: torch.Tensor
    draft_logprob: torch.Tensor

    def __post_init__(self) -> None:
        tokens = _as_long(self.tokens, "tokens")
        parents = _as_long(self.parents, "parents")
        depths = _as_long(self.depths, "depths")
        n = tokens.numel()
        if n == 0:
            raise ValueError("a draft tree needs at least the root node")
        if parents.numel() != n or depths.numel() != n:
            raise ValueError(
                f"tokens, parents and depths must have the same length, got {n}, "
                f"{parents.numel()} and {depths.numel()}"
            )
        if parents[0].item() != -1 or depths[0].item() != 0:
            raise ValueError("node 0 must be the root: parent -1 and depth 0")
        if (tokens < 0).any():
            raise ValueError("token ids must be non-negative")
        if n > 1:
            index = torch.arange(1, n)
            bad = (parents[1:] < 0) | (parents[1:] >= index)
            if bad.any():
                v = int(index[bad][0])
                raise ValueError(
                    f"node {v} has parent {int(parents[v])}: every parent must precede its "
                    "child (parents[v] < v) and only the root may have parent -1"
                )
            wrong_depth = depths[1:] != depths[parents[1:]] + 1
            if wrong_depth.any():
                v = int(index[wrong_depth][0])
                raise ValueError(f"node {v} has depth {int(depths[v])}, expected parent depth + 1")
            sibling_key = parents[1:] * (int(tokens.max()) + 1) + tokens[1:]
            if torch.unique(sibling_key).numel() != n - 1:
                raise ValueError("sibling tokens must be distinct (a parent has two children with the same token)")
        logprob = torch.zeros(n) if self.draft_logprob is None else torch.as_tensor(self.draft_logprob, dtype=torch.float32).cpu()
        if logprob.shape != (n,):
            raise ValueError(f"draft_logprob must have shape ({n},), got {tuple(logprob.shape)}")
        object.__setattr__(self, "tokens", tokens)
        object.__setattr__(self, "parents", parents)
        object.__setattr__(self, "depths", depths)
        object.__setattr__(self, "draft_logprob", logprob)

    # ------------------------------------------------------------------ builders
    @classmethod
    def from_parents(cls, tokens: Sequence[int], parents: Sequence[int], draft_logprob=None) -> "DraftTree":
        """Build a tree from token and parent lists; depths are derived."""
        parents_list = [int(p) for p in parents]
        if not parents_list or parents_list[0] != -1:
            raise ValueError("node 0 must be the root (parent -1)")
        depths = [0] * len(parents_list)
        for v in range(1, len(parents_list)):
            parent = parents_list[v]
            if not 0 <= parent < v:
                raise ValueError(f"node {v} has parent {parent}: every parent must precede its child")
            depths[v] = depths[parent] + 1
        return cls(
            tokens=_as_long(list(tokens), "tokens"),
            parents=torch.tensor(parents_list, dtype=torch.long),
            depths=torch.tensor(depths, dtype=torch.long),
            draft_logprob=draft_logprob,
        )

    @classmethod
    def from_paths(cls, root_token: int, paths: Sequence[Sequence[int]]) -> "DraftTree":
        """A static tree from token paths below the root; shared prefixes are merged.

        Nodes are numbered in order of first appearance, so parents precede children.
        """
        tokens, parents = [int(root_token)], [-1]
        index: dict[tuple[int, ...], int] = {(): 0}
        for path in paths:
            prefix: tuple[int, ...] = ()
            for token in path:
                token = int(token)
                if token < 0:
                    raise ValueError("token ids must be non-negative")
                child = prefix + (token,)
                if child not in index:
                    index[child] = len(tokens)
                    tokens.append(token)
                    parents.append(index[prefix])
                prefix = child
        return cls.from_parents(tokens, parents)

    @classmethod
    def from_marginals(cls, logq: torch.Tensor, budget: int, root_token: int = 0) -> "DraftTree":
        """DDTree: the ``budget`` best prefixes under ``prod_d q_d(x_d)``.

        Best-first over prefixes of per-depth ranks: pop the best prefix, add it as a node,
        push its next sibling (same depth, next rank) and its first child (one deeper, rank
        0). Each push scores at most its popped prefix, so the popped order is the score
        order and parents precede children. Ties break by push order (deterministic).
        Zero-probability prefixes are never added. O(B log B) after a top-B per depth.

        Args:
            logq: `Tensor[K, V]`, per-depth draft log-probabilities ``log q_d``, ``d = 1..K``.
            budget: the number of non-root nodes ``B`` (fewer when fewer prefixes exist).
            root_token: ``x_r``, the last committed token.
        """
        if logq.dim() != 2:
            raise ValueError(f"logq must have shape [K, V], got {tuple(logq.shape)}")
        budget = int(budget)
        if budget < 0:
            raise ValueError(f"budget must be >= 0, got {budget}")
        logq = logq.detach().float().cpu()
        if torch.isnan(logq).any():
            raise ValueError("logq contains NaN")
        horizon, vocab = logq.shape
        width = min(budget, vocab)
        tokens, parents, logprobs = [int(root_token)], [-1], [0.0]
        if budget == 0 or horizon == 0 or width == 0:
            return cls.from_parents(tokens, parents, logprobs)
        top_logq, top_ids = torch.topk(logq, width, dim=1)  # [K, width], sorted descending
        top_logq_list, top_ids_list = top_logq.tolist(), top_ids.tolist()
        # heap entry: (-score, push order, depth index, rank, parent node, parent score)
        counter = 0
        heap = [(-top_logq_list[0][0], counter, 0, 0, 0, 0.0)]
        while heap and len(tokens) <= budget:
            neg_score, _, depth, rank, parent, parent_score = heapq.heappop(heap)
            if neg_score == float("inf"):
                break  # only zero-probability prefixes remain
            node = len(tokens)
            tokens.append(top_ids_list[depth][rank])
            parents.append(parent)
            logprobs.append(top_logq_list[depth][rank])
            score = -neg_score
            if rank + 1 < width:
                counter += 1
                sibling = parent_score + top_logq_list[depth][rank + 1]
                heapq.heappush(heap, (-sibling, counter, depth, rank + 1, parent, parent_score))
            if depth + 1 < horizon:
                counter += 1
                child = score + top_logq_list[depth + 1][0]
                heapq.heappush(heap, (-child, counter, depth + 1, 0, node, score))
        return cls.from_parents(tokens, parents, logprobs)

    @classmethod
    def chain(cls, root_token: int, chain_tokens: Sequence[int], draft_logprob: Sequence[float] | None = None) -> "DraftTree":
        """A linear tree ``root -> t_1 -> ... -> t_K`` (the classic chain draft)."""
        n = len(chain_tokens)
        logprob = None if draft_logprob is None else [0.0] + [float(x) for x in draft_logprob]
        return cls.from_parents([int(root_token)] + [int(t) for t in chain_tokens], [-1] + list(range(n)), logprob)

    # ------------------------------------------------------------------ views
    @property
    def num_nodes(self) -> int:
        """``N``, root included."""
        return self.tokens.numel()

    @property
    def size(self) -> int:
        """``B``: non-root nodes (what a round drafted; ``num_nodes`` counts the root too)."""
        return self.tokens.numel() - 1

    @property
    def root_token(self) -> int:
        return int(self.tokens[0])

    @cached_property
    def max_depth(self) -> int:
        return int(self.depths.max())

    @cached_property
    def parents_list(self) -> list[int]:
        return self.parents.tolist()

    @cached_property
    def tokens_list(self) -> list[int]:
        return self.tokens.tolist()

    @cached_property
    def _children(self) -> list[list[int]]:
        children: list[list[int]] = [[] for _ in range(self.num_nodes)]
        for v, parent in enumerate(self.parents_list[1:], start=1):
            children[parent].append(v)
        return children

    @cached_property
    def child_by_token(self) -> list[dict[int, int]]:
        """Per node, a map from child token to child node."""
        tokens = self.tokens_list
        return [{tokens[u]: u for u in kids} for kids in self._children]

    def children(self, v: int) -> list[int]:
        """Child node indices of ``v``, in node order."""
        return list(self._children[v])

    @cached_property
    def is_leaf(self) -> torch.Tensor:
        """`BoolTensor[N]`: nodes without children."""
        has_child = torch.zeros(self.num_nodes, dtype=torch.bool)
        has_child[self.parents[1:]] = True
        return ~has_child

    @cached_property
    def path_logprob(self) -> torch.Tensor:
        """`Tensor[N]`: the drafter's log path probability ``sum`` of ``draft_logprob`` from the
        root to ``v`` (``log prod_d q_d`` for a block drafter); 0 at the root."""
        total = self.draft_logprob.tolist()
        for v, parent in enumerate(self.parents_list[1:], start=1):  # parents precede children
            total[v] += total[parent]
        return torch.tensor(total, dtype=torch.float32)

    @property
    def draft_coverage(self) -> float:
        """The drafter's own estimate of ``C(T)``: its path probabilities summed over non-root nodes."""
        return float(self.path_logprob[1:].exp().sum())

    def best_first_order(self) -> torch.Tensor:
        """`LongTensor[N - 1]`: the non-root nodes by the drafter's path probability, best first
        (ties in node order). A node never outscores its parent (``log q <= 0``), so every
        prefix of this order holds each kept node's parent before it (see :meth:`keep`); for a
        DDTree it is the node order itself."""
        return torch.sort(-self.path_logprob[1:], stable=True).indices + 1

    def keep(self, nodes: Sequence[int]) -> "DraftTree":
        """The tree of the root and ``nodes`` (non-root node indices), numbered in that order.

        Raises ValueError unless every listed node's parent is the root or listed before it
        (a best-first prefix always is)."""
        nodes = [int(v) for v in nodes]
        index = {0: 0}
        parents = self.parents_list
        for i, v in enumerate(nodes, start=1):
            if not 0 < v < self.num_nodes or v in index:
                raise ValueError(f"node {v} is not a non-root node of this tree, or is listed twice")
            if parents[v] not in index:
                raise ValueError(f"node {v} is kept before (or without) its parent {parents[v]}")
            index[v] = i
        order = torch.tensor([0] + nodes, dtype=torch.long)
        return DraftTree.from_parents(self.tokens[order].tolist(), [-1] + [index[parents[v]] for v in nodes], self.draft_logprob[order])

    def path_to(self, v: int) -> list[int]:
        """Node indices from the root to ``v`` (both included)."""
        path = []
        parents = self.parents_list
        while v != -1:
            path.append(v)
            v = parents[v]
        return path[::-1]

    def path_tokens(self, v: int) -> list[int]:
        """Tokens on the path root -> ``v``, root excluded."""
        tokens = self.tokens_list
        return [tokens[u] for u in self.path_to(v)[1:]]

    @cached_property
    def ancestors(self) -> torch.Tensor:
        """`BoolTensor[N, N]`: ``ancestors[v, u]`` is True when ``u`` is ``v`` or an ancestor of ``v``.

        Computed once and shared (like ``is_leaf``): read it, never write into it.
        """
        n = self.num_nodes
        mask = torch.eye(n, dtype=torch.bool)
        rows = torch.arange(n)
        walk = rows.clone()
        step_parent = self.parents.clamp(min=0)  # the root is its own parent for the walk
        for _ in range(self.max_depth):  # one step up per level, all nodes at once
            walk = step_parent[walk]
            mask[rows, walk] = True
        return mask

    def __repr__(self) -> str:
        return f"DraftTree(size={self.size}, max_depth={self.max_depth}, root_token={self.root_token})"
