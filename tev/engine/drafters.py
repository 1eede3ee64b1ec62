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
  best-first by conditional path score, depth by depth, one tree-attention forward per depth
  (the grower of :mod:`tev.engine.tree_growth`, which the path drafter grows its tree with too).
- ``shape="chain"`` on either gives the classic linear draft (top-1 per depth).

Which drafters a pair offers, and how each is loaded, is the registry in :mod:`tev.engine.models`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from tev.core.tree import DraftTree
from tev.core.visibility import slot_visibility
from tev.engine.block_drafter import BlockDrafter
from tev.engine.session import CausalLMSession
from tev.engine.target import Target
from tev.engine.tree_growth import GrowingTree, Step, frontier_width, grow_tree
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
        features: `Tensor[k, F]` the target's features at the last ``k`` committed positions
            before the root (``k``: all of them, or at most ``window``; None while there are none,
            or for a drafter that reads none); the round appends the accepted path's rows
            (:meth:`add_features`).
        cache: the drafter's own model session (an AR drafter's KV cache), else None.
        window: the most recent rows the drafter reads (None: every row is kept); older rows
            are dropped, so a round copies ``window`` rows, not the whole history.
    """

    features: torch.Tensor | None = None
    cache: CausalLMSession | None = None
    window: int | None = None

    def add_features(self, rows: torch.Tensor | None) -> None:
        """Append `Tensor[n, F]` rows (the newly committed positions' features)."""
        if rows is not None:
            kept = rows if self.features is None else torch.cat([self.features, rows])
            self.features = kept if self.window is None else kept[-self.window:]


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
        return DraftState(window=self.model.config.context_window)

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
    """A small causal LM drafter that grows an EAGLE-2-style dynamic tree
    (:func:`~tev.engine.tree_growth.grow_tree`).

    Per round: one forward for the root, then for each depth one tree-attention forward of
    the ``width`` best frontier nodes (by path score ``sum log q``), each expanding its
    ``width`` most likely children; finally the ``budget`` best nodes overall are kept.
    ``width`` grows with the budget (at most 16). Depths stop once no frontier node has a path
    probability of at least ``min_path_prob`` or the context's floor (budget auto's).
    ``model``: the drafter's causal LM, or a :class:`~tev.engine.target.Target` of it (shared with its sessions).
    """

    def __init__(self, model, horizon: int = 8, shape: str = "tree", name: str | None = None, min_path_prob: float = 0.0):
        _check_shape(shape)
        # its sessions run transformers' forward, with one head screen for all of them (a Target given is shared:
        # the chain derived from the AR drafter reads the same screen)
        self.runner = model if isinstance(model, Target) else Target(model)
        self.model = self.runner.model
        self.horizon = horizon
        self.shape = shape
        self.name = name or ("ar" if shape == "tree" else "ar-chain")
        self.feature_layers: tuple[int, ...] = ()
        self.min_path_prob = min_path_prob

    def new_state(self) -> DraftState:
        return DraftState(cache=CausalLMSession(self.runner))

    def marginals(self, context: DraftContext, state: DraftState) -> None:
        return None  # the tree grows depth by depth: each node's q is conditional on its path

    def width_for(self, budget: int) -> int:
        return 1 if self.shape == "chain" else frontier_width(budget, cap=16)

    def propose(self, context: DraftContext, budget: int, state: DraftState, timer: StageTimer | None = None) -> DraftTree:
        timer = timer or StageTimer()
        cache = state.cache  # this drafter's KV cache
        horizon = min(self.horizon, context.max_depth, cache.max_positions - len(context.token_ids))
        if self.shape == "chain":
            horizon = min(horizon, budget)
        with timer.stage("draft"):
            grown = grow_tree(context.token_ids[-1], budget, horizon, self.width_for(budget), self._step(context, cache),
                              max(self.min_path_prob, context.min_path_prob))
            cache.rollback(len(context.token_ids) - 1)  # the round's speculative entries leave the cache
        with timer.stage("build"):
            return grown.best(budget)

    @staticmethod
    def _step(context: DraftContext, cache: CausalLMSession) -> Step:
        """The grower's step over this drafter's KV cache: the committed tokens sit at positions
        ``0 .. committed - 1``, a node of slot ``s`` at ``committed + s`` (the root first)."""
        committed = len(context.token_ids) - 1

        def step(nodes: list[int], tree: GrowingTree) -> torch.Tensor:
            if nodes == [0]:  # the root: catch up on tokens committed since the last round, then the root
                if cache.length > committed:
                    cache.rollback(committed)
                out = cache.extend(context.token_ids[cache.length :])
                return torch.log_softmax(out.last_logits(), dim=-1)[None]  # [1, V]
            visible = slot_visibility(committed, cache.length - committed, [tree.ancestor_slots(v) for v in nodes])  # [n, held + n]
            out = cache.forward_masked([tree.tokens[v] for v in nodes], [committed + tree.depths[v] for v in nodes], visible)
            return torch.log_softmax(out.logits, dim=-1)  # [n, V]

        return step
