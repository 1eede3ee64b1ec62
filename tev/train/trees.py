"""The drafter's trees at training anchors, scored by the target through the engine's session.

The one pipeline for every use: the target's causal forward over a sequence
(:class:`tev.engine.session.CausalLMSession`: its features, its logits, its cache), the
drafter's marginals at the anchors, the DDTree each would build at inference
(:meth:`DraftTree.from_marginals`), and every anchor's tree scored in ONE more forward of the
session (:meth:`CausalLMSession.forward_masked`: node ``v`` of the tree rooted at position ``r``
sees the sequence up to ``r`` and its own ancestors), giving ``P``, ``w`` and ``C`` per tree.
Trees are fixed (scored once by the base drafter: distillation, workload adaptation) or
on-policy (redrawn from the current drafter every step: ExitTrain).
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Generator

import torch

from tev.core.flow import flow_from_edge_prob
from tev.core.tree import DraftTree
from tev.core.verify import LogitRows
from tev.core.visibility import tree_visibility
from tev.engine.session import CausalLMSession, max_positions
from tev.engine.target import Target
from tev.train.data import SoftLabels, TrainData
from tev.train.teacher import top_law
from tev.util.precision import low_precision

__all__ = ["TreeBatch", "ScoredTrees", "TargetPass", "target_pass", "draft_logits", "draft_trees", "score_trees", "fixed_trees", "on_policy"]


@dataclass
class TreeBatch:
    """Realized trees and their target quantities (all detached); entry ``m`` of every list
    belongs to ``trees[m]``."""

    trees: list[DraftTree]
    reach: list[torch.Tensor]  # P, `Tensor[N_m]` each
    exit_weight: list[torch.Tensor]  # w, `Tensor[N_m]` each
    coverage: list[float]  # C(T_m)
    edge_prob: list[torch.Tensor] | None = None  # p_pa(v)(x_v), `Tensor[N_m]` each (1 at the root)
    # the target's next-token law at every node, top tokens over a draft vocabulary:
    # (positions `LongTensor[N_m, k]`, probabilities `Tensor[N_m, k]`) per tree, when asked for
    node_soft: list[tuple[torch.Tensor, torch.Tensor]] | None = None

    @classmethod
    def join(cls, parts: list["TreeBatch"]) -> "TreeBatch":
        """One batch holding the trees of ``parts`` in order (an optional list only where every part has it)."""
        def joined(name):
            lists = [getattr(part, name) for part in parts]
            return None if any(x is None for x in lists) else [x for part in lists for x in part]

        return cls(*(joined(f.name) for f in fields(cls)))

    @property
    def tau_bound(self) -> float:
        """Mean ``1 + C(T)`` over the trees (the expected block length)."""
        return 1.0 + sum(self.coverage) / len(self.coverage)

    def exit_mass_by_depth(self, horizon: int) -> dict[str, list[float]]:
        """Mean exit mass per tree by the depth ``0..horizon`` of the node it leaves at:
        ``internal`` where the target's next token was not among the node's children (the
        missing mass a better drafter can win back) and ``leaf`` where the tree ended there.
        The two lists sum to 1 over depths (the exit law is a distribution)."""
        internal = torch.zeros(horizon + 1, dtype=torch.float64)
        leaf = torch.zeros(horizon + 1, dtype=torch.float64)
        for tree, weight in zip(self.trees, self.exit_weight):
            weight = weight.double().cpu()
            is_leaf = tree.is_leaf.cpu()
            internal.index_add_(0, tree.depths[~is_leaf], weight[~is_leaf])
            leaf.index_add_(0, tree.depths[is_leaf], weight[is_leaf])
        count = max(1, len(self.trees))
        return {"internal": (internal / count).tolist(), "leaf": (leaf / count).tolist()}


@dataclass
class ScoredTrees:
    """Trees at anchors of a :class:`TrainData`, scored once by the target (fixed trees).

    Attributes:
        scored: the trees with ``P``, ``w``, edge probabilities and (when asked) every node's
            next-token law over the draft vocabulary (``node_soft``).
        anchors: `LongTensor[R, 2]` (row, anchor) of each tree.
    """

    scored: TreeBatch
    anchors: torch.Tensor

    def __len__(self) -> int:
        return len(self.scored.trees)


@dataclass
class TargetPass:
    """One sequence's causal forward through the engine's session.

    Attributes:
        session: its cache holds the sequence (trees are scored on top, then dropped).
        logits: `Tensor[L, V]` float32, the target's logits at every position.
        features: `Tensor[L, F]` at the drafter's feature layers, or None.
    """

    session: CausalLMSession
    logits: torch.Tensor
    features: torch.Tensor | None


@torch.no_grad()
def target_pass(target, tokens: torch.Tensor, feature_layers=()) -> TargetPass:
    """The causal forward of ``tokens`` (`LongTensor[L]`) through a new session on ``target`` (a model), in
    transformers' forward: its trees see part of the cache, which a row-invariant forward refuses."""
    session = CausalLMSession(Target(target), tuple(feature_layers), row_invariant=False)
    out = session.extend(tokens)
    return TargetPass(session, out.logits, out.features)


def draft_logits(drafter, data: TrainData, index: torch.Tensor, short_history=None, autocast: bool = True) -> torch.Tensor:
    """`Tensor[B, K, Vd]` float32: the drafter's per-depth logits over its draft vocabulary at the
    anchors ``index`` (`LongTensor[B, 2]`), under the low-precision autocast this machine runs
    fast (:func:`low_precision`) when ``autocast``."""
    config = drafter.config
    device = drafter.mask_embed.device
    features, valid, root, labels = data.batch(index, config.context_window, config.horizon, short_history)
    path = (labels[:, : config.horizon - 1].to(device),) if getattr(config, "conditioning", "marginal") == "path" else ()  # teacher-forced: the written tokens above each depth
    dtype = low_precision(device) if autocast else torch.float32
    with torch.autocast(device.type, dtype=dtype, enabled=autocast and dtype != torch.float32):
        return drafter.draft_logits(features.to(device), valid.to(device), root.to(device), *path).float()


def draft_trees(drafter, logits: torch.Tensor, roots: list[int], root_tokens: list[int], budget: int, max_positions: int) -> list[DraftTree]:
    """The tree of ``budget`` nodes inference builds from each row of ``logits`` (`[M, K, Vd]`,
    detached), rooted at position ``roots[m]`` (depth capped by the target's context)."""
    log_q = drafter.full_vocab(logits.detach().float().log_softmax(-1)).cpu()  # [M, K, V]
    trees = []
    for m, (root, token) in enumerate(zip(roots, root_tokens)):
        depth = max(0, min(log_q.shape[1], max_positions - 1 - root))
        trees.append(DraftTree.from_marginals(log_q[m, :depth], budget, root_token=int(token)))
    return trees


@torch.no_grad()
def score_trees(row: TargetPass, trees: list[DraftTree], roots: list[int], temperature: float, soft_vocab: torch.Tensor | None = None,
                soft_top: int = 0) -> TreeBatch:
    """Target rows for every node of ``trees`` (rooted at positions ``roots`` of ``row``'s
    sequence) in one tree-attention forward of ``row.session``; the session's cache is left
    holding the sequence only. With ``soft_top > 0`` also every node's law at ``temperature``
    over ``soft_vocab`` (:func:`top_law`, ``TreeBatch.node_soft``)."""
    session = row.session
    cached = session.length
    sizes = [t.num_nodes - 1 for t in trees]
    n = sum(sizes)
    node_logits = None
    if n:
        tokens = torch.cat([t.tokens[1:] for t in trees])
        positions = torch.cat([root + t.depths[1:] for t, root in zip(trees, roots)])
        # each tree's nodes see the text up to its root and their own path: the trees side by side, blind to each other
        prefix = torch.cat([torch.full((size,), root + 1) for root, size in zip(roots, sizes)])
        visible = tree_visibility(cached, torch.block_diag(*[t.ancestors[1:, 1:] for t in trees]), prefix)
        node_logits = session.forward_masked(tokens, positions, visible).logits
        session.rollback(cached)
    reach, exit_weight, coverage, edges, node_soft = [], [], [], [], []
    offset = 0
    for tree, root, size in zip(trees, roots, sizes):
        logits = row.logits[root : root + 1]
        if size:
            logits = torch.cat([logits, node_logits[offset : offset + size]])
        offset += size
        edge = LogitRows(logits, temperature).edge_prob(tree)
        flow = flow_from_edge_prob(tree, edge)
        reach.append(flow.reach.detach())
        exit_weight.append(flow.exit_weight.detach())
        coverage.append(flow.coverage)
        edges.append(edge.detach().cpu())
        if soft_top > 0:
            node_soft.append(tuple(x.cpu() for x in top_law(logits, soft_top, soft_vocab, temperature)))
    return TreeBatch(trees, reach, exit_weight, coverage, edges, node_soft if soft_top > 0 else None)


def _roots(data: TrainData, index: torch.Tensor) -> tuple[list[int], list[int]]:
    roots = (index[:, 1] + 1).tolist()
    return roots, data.token_ids[index[:, 0], index[:, 1] + 1].tolist()


def fixed_trees(target, drafter, data: TrainData, budget: int, per_row: int, seed: int = 0, soft_top: int = 0,
                temperature: float = 1.0) -> Generator[int, None, ScoredTrees]:
    """The fixed trees: at ``per_row`` seeded anchors of each row, the tree of ``budget`` nodes
    ``drafter`` builds there (from ``data``'s features), scored by the target. Yields each row's
    index twice, after the target's pass over the row and after scoring its trees (a caller may
    take turns with other work between them: each took seconds on a busy 2-core CPU), and returns
    the :class:`ScoredTrees`.

    Scoring every anchor's tree costs a forward of ``anchors x budget`` nodes per row (about 9 s
    for a 90-token answer on a 2-core CPU); a few trees per row keep it near one second."""
    was_training = drafter.training
    drafter.eval()
    parts, chosen = [], []
    generator = torch.Generator().manual_seed(seed)
    anchors = data.anchors
    for row in range(len(data)):
        index = anchors[anchors[:, 0] == row]
        index = index[torch.randperm(index.shape[0], generator=generator)[:per_row].sort().values]
        chosen.append(index)
        with torch.no_grad():
            logits = draft_logits(drafter, data, index, autocast=False)
        roots, tokens = _roots(data, index)
        trees = draft_trees(drafter, logits, roots, tokens, budget, max_positions(target))
        sequence = target_pass(target, data.token_ids[row, : int(data.lengths[row])])
        yield row
        parts.append(score_trees(sequence, trees, roots, temperature, drafter.draft_vocab, soft_top))
        yield row
    drafter.train(was_training)
    return ScoredTrees(TreeBatch.join(parts), torch.cat(chosen))


def on_policy(target, drafter, data: TrainData, index: torch.Tensor, budget: int, temperature: float, soft_top: int = 0,
              tree_soft_top: int = 0) -> tuple[TrainData, torch.Tensor, torch.Tensor, TreeBatch]:
    """The on-policy round of the anchors ``index`` (`LongTensor[M, 2]`, grouped by row): one
    causal forward per row through the session (features and, with ``soft_top``, the target's
    top-k laws as soft labels), the current drafter's logits there (with gradient when enabled)
    and the trees they build (detached), scored by the target in one more forward per row.
    With ``tree_soft_top`` every node's law too (the ``next-depth`` term's labels).
    Returns (the drawn rows as :class:`TrainData` with features, ``index`` with its rows renumbered
    into them `LongTensor[M, 2]`, the logits `[M, K, Vd]`, the trees)."""
    rows = list(dict.fromkeys(index[:, 0].tolist()))
    part = data.select(rows)
    layers = list(drafter.config.feature_layers)
    passes = [target_pass(target, part.token_ids[i, : int(part.lengths[i])], layers) for i in range(len(rows))]
    width = part.token_ids.shape[1]
    features = torch.zeros(len(rows), width, passes[0].features.shape[-1])
    for i, p in enumerate(passes):
        features[i, : p.features.shape[0]] = p.features.float().cpu()
    soft = None
    if soft_top > 0:
        laws = [[x.cpu() for x in top_law(p.logits, soft_top, drafter.draft_vocab)] for p in passes]
        k = laws[0][0].shape[-1]
        soft = SoftLabels(torch.zeros(len(rows), width, k, dtype=torch.long), torch.zeros(len(rows), width, k))
        for i, (positions, probs) in enumerate(laws):
            soft.positions[i, : positions.shape[0]], soft.probs[i, : probs.shape[0]] = positions, probs
    part.features, part.soft = features, soft
    local = torch.stack([torch.tensor([rows.index(r) for r in index[:, 0].tolist()]), index[:, 1]], dim=1)
    logits = draft_logits(drafter, part, local)
    roots, tokens = _roots(part, local)
    trees = draft_trees(drafter, logits, roots, tokens, budget, passes[0].session.max_positions)
    scored = []
    for i, p in enumerate(passes):
        mine = [m for m in range(local.shape[0]) if int(local[m, 0]) == i]
        scored.append(score_trees(p, [trees[m] for m in mine], [roots[m] for m in mine], temperature, drafter.draft_vocab, tree_soft_top))
    return part, local, logits, TreeBatch.join(scored)
