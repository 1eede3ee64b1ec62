"""Tree drafters: who proposes the draft tree. ``q`` is the draft model, ``p`` the target.

Every drafter is a :class:`Drafter`::

    state = drafter.new_state()                      # per generation: features, caches
    tree = drafter.propose(context, budget, state, timer)
    logq = drafter.marginals(context, state)         # `[K, V]` log q_d, or None

- :class:`BlockTreeDrafter` (the default, the paper's setting): a
  :class:`~tev.engine.block_drafter.BlockDrafter` reads the target's hidden features at the last
  committed positions plus the root token and emits K per-depth marginals ``q_d`` in ONE
  forward; the DDTree builder turns them into the tree.
- :class:`ARTreeDrafter`: any small causal LM sharing the tokenizer grows a dynamic tree
  best-first by conditional path score, depth by depth, one tree-attention forward per depth.
- ``shape="chain"`` on either gives the classic linear draft (top-1 per depth).

Which drafters a pair offers, and how each is loaded, is the registry in :mod:`tev.engine.models`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol

import torch

from tev.core.tree import DraftTree
from tev.engine.block_drafter import BlockDrafter
from tev.engine.session import CausalLMSession
from tev.util.timing import StageTimer

__all__ = ["DraftContext", "DraftState", "Drafter", "BlockTreeDrafter", "ARTreeDrafter", "SHAPES"]

SHAPES = ("tree", "chain")


@dataclass(frozen=True)
class DraftContext:
    """What a drafter may read at the start of a round besides its own state.

    Attributes:
        token_ids: committed tokens (prompt and output so far); the last one is the root.
        max_depth: the deepest a node may go (room left in the target's context).
        min_path_prob: nodes whose path probability under ``q`` falls below it will not be kept
            (budget auto's floor): a drafter that pays per depth need not grow them.
    """

    token_ids: list[int]
    max_depth: int
    min_path_prob: float = 0.0


@dataclass(eq=False)
class DraftState:
    """What a drafter keeps from round to round of one generation.

    Attributes:
        features: `Tensor[committed - 1, F]` the target's features at every committed position
            before the root (None while there are none, or for a drafter that reads none); the
            round appends the accepted path's rows (:meth:`add_features`).
        cache: the drafter's own model session (an AR drafter's KV cache), else None.
    """

    features: torch.Tensor | None = None
    cache: CausalLMSession | None = None

    def add_features(self, rows: torch.Tensor | None) -> None:
        """Append `Tensor[n, F]` rows (the newly committed positions' features)."""
        if rows is not None:
            self.features = rows if self.features is None else torch.cat([self.features, rows])


class Drafter(Protocol):
    """What a tree drafter provides; the decode loop, the walkthrough, the lab and the benches
    read nothing else.

    Attributes:
        name: the drafter's kind as the page and the JSON name it (``block``, ``chain``, ...).
        shape: ``tree`` or ``chain`` (top-1 per depth).
        feature_layers: the target's hidden-state indices it reads (empty: none).
    """

    name: str
    shape: str
    feature_layers: tuple[int, ...]

    def new_state(self) -> DraftState:
        """A fresh state for one generation."""

    def propose(self, context: DraftContext, budget: int, state: DraftState, timer: StageTimer | None = None) -> DraftTree:
        """A draft tree of at most ``budget`` non-root nodes under ``context.token_ids[-1]``;
        times its stages ``draft`` and ``build`` on ``timer``."""

    def marginals(self, context: DraftContext, state: DraftState) -> torch.Tensor | None:
        """`Tensor[K, V]` log ``q_d`` per depth for this context, or None for a drafter that
        has none (one that grows its tree depth by depth)."""


def _check_shape(shape: str) -> None:
    if shape not in SHAPES:
        raise ValueError(f"shape must be one of {', '.join(SHAPES)}, got {shape!r}")


class BlockTreeDrafter:
    """Block drafter + DDTree builder (``shape="tree"``), or its top-1 chain (``"chain"``)."""

    def __init__(self, model: BlockDrafter, shape: str = "tree", name: str | None = None, horizon: int | None = None):
        _check_shape(shape)
        self.model = model
        self.shape = shape
        self.name = name or ("block" if shape == "tree" else "chain")
        self.feature_layers = tuple(model.config.feature_layers)
        self.horizon = min(horizon or model.config.horizon, model.config.horizon)  # deepest depth used

    def new_state(self) -> DraftState:
        return DraftState()

    def marginals(self, context: DraftContext, state: DraftState) -> torch.Tensor:
        """`Tensor[K', V]` log ``q_d`` on the host, ``K' = min(horizon, context.max_depth)``."""
        depth = min(self.horizon, context.max_depth)
        return self.model.marginals(state.features, context.token_ids[-1])[:depth].float().cpu()

    def propose(self, context: DraftContext, budget: int, state: DraftState, timer: StageTimer | None = None) -> DraftTree:
        timer = timer or StageTimer()
        with timer.stage("draft"):
            logq = self.marginals(context, state)  # [K', V]
        with timer.stage("build"):
            if self.shape == "chain":
                length = min(budget, logq.shape[0])
                best = logq[:length].max(dim=-1)
                return DraftTree.chain(context.token_ids[-1], best.indices.tolist(), best.values.tolist())
            return DraftTree.from_marginals(logq, budget, root_token=context.token_ids[-1])


class ARTreeDrafter:
    """A small causal LM drafter that grows an EAGLE-2-style dynamic tree.

    Per round: one forward for the root, then for each depth one tree-attention forward of
    the ``width`` best frontier nodes (by path score ``sum log q``), each expanding its
    ``width`` most likely children; finally the ``budget`` best nodes overall are kept (a
    child never outscores its parent, so they form a tree). ``width`` grows with the budget.
    """

    def __init__(self, model, horizon: int = 8, shape: str = "tree", name: str | None = None):
        _check_shape(shape)
        self.model = model
        self.horizon = horizon
        self.shape = shape
        self.name = name or ("ar" if shape == "tree" else "ar-chain")
        self.feature_layers: tuple[int, ...] = ()

    def new_state(self) -> DraftState:
        return DraftState(cache=CausalLMSession(self.model))

    def marginals(self, context: DraftContext, state: DraftState) -> None:
        return None  # the tree grows depth by depth: each node's q is conditional on its path

    def width_for(self, budget: int) -> int:
        return 1 if self.shape == "chain" else min(16, max(2, math.ceil(math.sqrt(budget))))

    def propose(self, context: DraftContext, budget: int, state: DraftState, timer: StageTimer | None = None) -> DraftTree:
        timer = timer or StageTimer()
        cache = state.cache  # this drafter's KV cache
        root = context.token_ids[-1]
        horizon = min(self.horizon, context.max_depth, cache.max_positions - len(context.token_ids))
        if self.shape == "chain":
            horizon = min(horizon, budget)
        if budget == 0 or horizon <= 0:
            return DraftTree.from_parents([root], [-1])
        width = self.width_for(budget)
        with timer.stage("draft"):
            # catch up on tokens committed since the last round, then the root
            committed = len(context.token_ids) - 1
            if cache.length > committed:
                cache.rollback(committed)
            pending = context.token_ids[cache.length :]
            base = committed
            out = cache.extend(pending)
            node_logq = {0: torch.log_softmax(out.last_logits(), dim=-1)}
            tokens, parents, scores, logprobs, depths = [root], [-1], [0.0], [0.0], [0]
            slot = {0: base}  # cache slot of each forwarded node
            frontier = self._expand(0, node_logq[0], width, tokens, parents, scores, logprobs, depths)
            for depth in range(1, horizon):
                chosen = sorted(frontier, key=lambda v: (-scores[v], v))[:width]
                chosen = [v for v in chosen if scores[v] > float("-inf")]
                if not chosen:
                    break
                visible = torch.zeros(len(chosen), cache.length + len(chosen), dtype=torch.bool)
                visible[:, :base] = True
                for row, v in enumerate(chosen):
                    u = parents[v]
                    while u != -1:
                        visible[row, slot[u]] = True
                        u = parents[u]
                    visible[row, cache.length + row] = True
                start = cache.length
                out = cache.forward_masked([tokens[v] for v in chosen], [base + depth] * len(chosen), visible)
                frontier = []
                for row, v in enumerate(chosen):
                    slot[v] = start + row
                    frontier += self._expand(v, torch.log_softmax(out.logits[row], dim=-1), width, tokens, parents, scores, logprobs, depths)
            cache.rollback(committed)  # the round's speculative entries leave the cache
        with timer.stage("build"):
            ranked = sorted(range(1, len(tokens)), key=lambda v: (-scores[v], v))[:budget]
            keep = sorted(ranked)  # creation order: parents first
            new_index = {0: 0, **{v: i + 1 for i, v in enumerate(keep)}}
            return DraftTree.from_parents(
                [root] + [tokens[v] for v in keep],
                [-1] + [new_index[parents[v]] for v in keep],
                [0.0] + [logprobs[v] for v in keep],
            )

    @staticmethod
    def _expand(v, logq, width, tokens, parents, scores, logprobs, depths) -> list[int]:
        top = torch.topk(logq, min(width, logq.numel()))
        created = []
        for value, token in zip(top.values.tolist(), top.indices.tolist()):
            if value == float("-inf"):
                continue
            created.append(len(tokens))
            tokens.append(token)
            parents.append(v)
            scores.append(scores[v] + value)
            logprobs.append(value)
            depths.append(depths[v] + 1)
        return created
