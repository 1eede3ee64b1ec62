"""The ExitTrain loss (paper Eq. 14-15) and the target quantities it weighs nodes by.

``p`` is the frozen target, ``q_theta`` the drafter. The loss is ``L = L_tok + lambda * L_exit``:

    L_exit = - sum_i sum_{v != r} w_i(v) log q_{theta, d(v)}(x_v | c_i) / sum_i (|V_i| - 1)

with ``w`` the exit law of the realized tree ``T_i`` under ``p`` (detached), and ``L_tok`` the
cross-entropy of the draft marginals against the target's own continuation.
Weight modes: ``exit`` (``w(v)``, the method), ``prefix`` (``P(v)`` rescaled per tree to the
same total as ``w``, the ablation control), ``none`` (token-only fine-tune), and the official
code's two: ``reach`` (``P(v)`` with every edge probability floored at ``REACH_FLOOR``, its
default) and ``exit-depth`` (``w(v) * d(v)``, its "exit" option).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers import DynamicCache

from tev.core.flow import flow_from_edge_prob
from tev.core.tree import DraftTree
from tev.core.verify import TargetRows

__all__ = ["IGNORE", "WEIGHT_MODES", "REACH_FLOOR", "top_law", "token_loss", "soft_token_loss", "node_weights", "exit_loss_terms", "tree_node_loss", "next_depth_loss", "TreeBatch", "score_trees"]

IGNORE = -100  # label of a depth past the end of a sequence
WEIGHT_MODES = ("exit", "prefix", "none", "reach", "exit-depth")
REACH_FLOOR = 1e-4  # the official code's floor on each edge probability of the reach weight


def token_loss(draft_logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """``L_tok``: cross-entropy of the per-depth draft marginals (`[M, K, V]`) against the
    target's continuation (`[M, K]`), averaged over labelled depths (``IGNORE`` skipped)."""
    return F.cross_entropy(draft_logits.reshape(-1, draft_logits.shape[-1]), labels.reshape(-1), ignore_index=IGNORE)


def soft_token_loss(draft_logits: torch.Tensor, soft_labels: torch.Tensor) -> torch.Tensor:
    """``L_tok`` against the target's distributions: ``-sum_x p(x) log q_d(x)`` per (example,
    depth), averaged over labelled rows. ``soft_labels`` is `[M, K, V]` like the logits; an
    all-zero row is unlabelled (past the end of its sequence)."""
    labelled = soft_labels.sum(-1) > 0  # [M, K]
    per_row = -(soft_labels * torch.log_softmax(draft_logits, dim=-1)).sum(-1)
    return (per_row * labelled).sum() / labelled.sum().clamp(min=1)


def node_weights(exit_weight: torch.Tensor, reach: torch.Tensor, mode: str, tree: DraftTree | None = None, edge_prob: torch.Tensor | None = None,
                 floor: float = REACH_FLOOR) -> torch.Tensor:
    """Per-node weights of ``L_exit`` for one tree (root entry 0).

    Args:
        exit_weight, reach: `Tensor[N]`, ``w`` and ``P`` of the tree.
        mode: ``exit`` -> ``w(v)``; ``prefix`` -> ``P(v)`` scaled so that its non-root total
            equals the non-root total of ``w``; ``none`` -> zeros; ``reach`` -> the product of
            ``max(p_pa(u)(x_u), floor)`` over the path to ``v`` (needs ``tree`` and
            ``edge_prob``); ``exit-depth`` -> ``w(v) * d(v)`` (needs ``tree``).
    """
    if mode in ("reach", "exit-depth") and tree is None:
        raise ValueError(f"weight mode {mode!r} needs the tree")
    if mode == "exit":
        weights = exit_weight.clone()
    elif mode == "exit-depth":
        weights = exit_weight * tree.depths.to(exit_weight.device, exit_weight.dtype)
    elif mode == "reach":
        if edge_prob is None:
            raise ValueError("weight mode 'reach' needs the edge probabilities")
        weights = flow_from_edge_prob(tree, edge_prob.clamp(min=floor)).reach.to(exit_weight.device, exit_weight.dtype)
    elif mode == "prefix":
        total_exit = exit_weight[1:].sum()
        total_reach = reach[1:].sum()
        weights = reach * (total_exit / total_reach) if total_reach > 0 else torch.zeros_like(reach)
    elif mode == "none":
        weights = torch.zeros_like(exit_weight)
    else:
        raise ValueError(f"unknown weight mode {mode!r}; choose one of {', '.join(WEIGHT_MODES)}")
    weights[0] = 0.0
    return weights.detach()


def exit_loss_terms(
    draft_logits: torch.Tensor,
    example: torch.Tensor,
    depth: torch.Tensor,
    token: torch.Tensor,
    weight: torch.Tensor,
    total_nodes: int,
) -> torch.Tensor:
    """``L_exit`` from draft logits and the flattened non-root nodes of every tree.

    Uses ``log q_d(x) = logits_d[x] - logsumexp(logits_d)``: one log-normaliser per
    (example, depth) row and a gather of the node entries, never an (nodes x V) tensor.

    Args:
        draft_logits: `Tensor[M, K, V]`, the drafter's per-depth logits (with gradient).
        example, depth, token: `LongTensor[n]`, each node's example index, depth (1..K), token.
        weight: `Tensor[n]`, the node weights (detached).
        total_nodes: ``sum_i (|V_i| - 1)``.
    """
    if total_nodes <= 0:
        return draft_logits.sum() * 0.0
    log_norm = torch.logsumexp(draft_logits, dim=-1)  # [M, K]
    log_q = draft_logits[example, depth - 1, token] - log_norm[example, depth - 1]  # [n]
    return -(weight * log_q).sum() / total_nodes


def tree_node_loss(draft_logits: torch.Tensor, scored: "TreeBatch", indices: list[int], mode: str, draft_positions) -> torch.Tensor:
    """The tree term in the official form for the trees ``scored.trees[indices[m]]``, each drafted
    from ``draft_logits[m]`` (`Tensor[M, K, Vd]`): ``sum_v weight(v) * -log q_{d(v)}(x_v)`` over
    their non-root nodes, divided by the number of those nodes; weights by :func:`node_weights`
    (``mode``). ``draft_positions`` maps token ids to draft-vocabulary positions; a node whose
    token the draft vocabulary lacks (``IGNORE``) has no ``q`` to raise and is left out of the sum."""
    device = draft_logits.device
    examples, depths, tokens, weights = [], [], [], []
    for m, i in enumerate(indices):
        tree = scored.trees[i]
        if tree.num_nodes == 1:
            continue
        token = draft_positions(tree.tokens[1:].to(device))
        keep = token != IGNORE
        weight = node_weights(scored.exit_weight[i], scored.reach[i], mode, tree, scored.edge_prob[i])[1:].to(device)
        examples.append(torch.full((int(keep.sum()),), m, dtype=torch.long, device=device))
        depths.append(tree.depths[1:].to(device)[keep])
        tokens.append(token[keep])
        weights.append(weight[keep])
    if not examples:
        return draft_logits.sum() * 0.0
    total_nodes = sum(scored.trees[i].num_nodes - 1 for i in indices)
    return exit_loss_terms(draft_logits, torch.cat(examples), torch.cat(depths), torch.cat(tokens), torch.cat(weights).to(draft_logits.dtype), total_nodes)


def next_depth_loss(draft_logits: torch.Tensor, scored: "TreeBatch", indices: list[int], horizon: int) -> torch.Tensor:
    """The ``next-depth`` tree term: every node ``v`` of ``scored.trees[indices[m]]`` above the
    horizon labels ``q_{d(v)+1}`` (row ``m`` of ``draft_logits``, `Tensor[M, K, Vd]`) with its own
    target law ``p_v`` (``scored.node_soft``, over the draft vocabulary), weighted by its reach
    ``P(v)``, the root included; the cross-entropies averaged over that weight."""
    device = draft_logits.device
    log_q = draft_logits.log_softmax(-1)
    total, weight_sum = draft_logits.sum() * 0.0, 0.0
    for m, i in enumerate(indices):
        tree = scored.trees[i]
        inner = tree.depths < horizon  # nodes whose next token is a depth the drafter predicts
        positions, probs = (x[inner] for x in scored.node_soft[i])
        weight = scored.reach[i].cpu()[inner].float()
        rows = log_q[m, tree.depths[inner]]  # [n, Vd]: q_{d(v) + 1}
        cross = -(probs.to(device) * rows.gather(-1, positions.to(device))).sum(-1)  # [n]
        total = total + (weight.to(device) * cross).sum()
        weight_sum += float(weight.sum())
    return total / max(weight_sum, 1e-9)


# --------------------------------------------------------------------------- target scoring
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
        """One batch holding the trees of ``parts`` in order."""
        def joined(name):
            lists = [getattr(part, name) for part in parts]
            return None if any(x is None for x in lists) else [x for part in lists for x in part]

        return cls(
            trees=[t for part in parts for t in part.trees],
            reach=[r for part in parts for r in part.reach],
            exit_weight=[w for part in parts for w in part.exit_weight],
            coverage=[c for part in parts for c in part.coverage],
            edge_prob=joined("edge_prob"),
            node_soft=joined("node_soft"),
        )

    @property
    def expected_tau(self) -> float:
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


def tree_section_mask(trees: list[DraftTree], roots: list[int], cached: int, dtype: torch.dtype, device) -> torch.Tensor:
    """`Tensor[1, 1, n, cached + n]` additive mask for all trees' non-root nodes appended after a
    ``cached``-long sequence: tree ``a``'s nodes see the sequence up to its root position
    ``roots[a]`` and their own ancestors (0 visible, ``finfo.min`` hidden)."""
    sizes = [t.num_nodes - 1 for t in trees]
    n = sum(sizes)
    visible = torch.zeros(n, cached + n, dtype=torch.bool)
    offset = 0
    for tree, root, size in zip(trees, roots, sizes):
        if size == 0:
            continue
        rows = slice(offset, offset + size)
        visible[rows, : root + 1] = True
        visible[rows, cached + offset : cached + offset + size] = tree.ancestors[1:, 1:]  # non-root part, [size, size]
        offset += size
    mask = torch.zeros(n, cached + n, dtype=dtype).masked_fill(~visible, torch.finfo(dtype).min)
    return mask.to(device)[None, None]


@torch.no_grad()
def score_trees(target, sequence: torch.Tensor, cache: DynamicCache, root_logits: torch.Tensor, trees: list[DraftTree], roots: list[int], temperature: float,
                soft_vocab: torch.Tensor | None = None, soft_top: int = 0) -> TreeBatch:
    """Target rows for every node of the trees of ONE sequence, in one tree-attention forward.

    Args:
        sequence: `LongTensor[S]` whose causal forward filled ``cache`` (batch row 0).
        root_logits: `Tensor[A, V]`, target logits at each root position (row ``a`` is
            ``p_root`` of ``trees[a]``, from the causal forward).
        roots: root positions in ``sequence`` (tree ``a``'s root token is ``sequence[roots[a]]``).
        soft_vocab, soft_top: with ``soft_top > 0``, also keep every node's next-token law at
            ``temperature`` over ``soft_vocab`` (a draft vocabulary; all tokens when None), its
            ``soft_top`` most likely tokens renormalised (``TreeBatch.node_soft``).
    """
    device = root_logits.device
    cached = sequence.numel()
    tokens = torch.cat([t.tokens[1:] for t in trees]) if trees else torch.zeros(0, dtype=torch.long)
    node_logits = None
    if tokens.numel():
        positions = torch.cat([root + t.depths[1:] for t, root in zip(trees, roots)])
        mask = tree_section_mask(trees, roots, cached, next(target.parameters()).dtype, device)
        out = target(input_ids=tokens[None].to(device), position_ids=positions[None].to(device), attention_mask=mask, cache=cache, use_cache=True)
        node_logits = out.logits[0].float()  # [n, V]
        cache.crop(-tokens.numel())  # leave the sequence cache as it was
    reach, exit_weight, coverage, edges, node_soft = [], [], [], [], []
    offset = 0
    for a, tree in enumerate(trees):
        size = tree.num_nodes - 1
        logits = root_logits[a : a + 1] if size == 0 else torch.cat([root_logits[a : a + 1], node_logits[offset : offset + size]])
        offset += size
        rows = TargetRows(logits=logits, temperature=temperature)
        edge = rows.edge_prob(tree)
        flow = flow_from_edge_prob(tree, edge)
        reach.append(flow.reach.detach())
        exit_weight.append(flow.exit_weight.detach())
        coverage.append(flow.coverage)
        edges.append(edge.detach().cpu())
        if soft_top > 0:
            node_soft.append(top_law(logits, temperature, soft_vocab, soft_top))
    return TreeBatch(trees, reach, exit_weight, coverage, edges, node_soft if soft_top > 0 else None)


def top_law(logits: torch.Tensor, temperature: float, vocab: torch.Tensor | None, top: int) -> tuple[torch.Tensor, torch.Tensor]:
    """`Tensor[N, V]` logits -> the law ``softmax(logits / T)`` over ``vocab`` (all tokens when
    None) cut to its ``top`` most likely entries and renormalised: (positions in ``vocab``
    `LongTensor[N, top]`, probabilities `Tensor[N, top]`), on the CPU."""
    if vocab is not None:
        logits = logits[:, vocab.to(logits.device)]
    probs = torch.softmax(logits.float() / temperature, dim=-1)
    best = probs.topk(min(top, probs.shape[-1]), dim=-1)
    return best.indices.cpu(), (best.values / best.values.sum(-1, keepdim=True)).cpu()
