"""The drafter's training losses: the token loss and the tree terms (paper Eq. 14-15).

``p`` is the frozen target, ``q`` the drafter. Per step ``L = L_tok + lambda_tree * L_tree``.
``L_tok`` is the cross-entropy of the per-depth marginals ``q_1 .. q_K`` against the target's
written tokens, or against its top-k laws (soft labels). The tree terms (:data:`TREE_TERMS`, one
vocabulary for the CLI, the app, the JSON and the card) read the drafter's trees scored by the
target:

- ``reach`` / ``exit`` / ``exit-depth`` / ``prefix``: ``sum_v weight(v) * -log q_{d(v)}(x_v)``
  over the non-root nodes, divided by their number, with weights floored ``P(v)`` (the official
  code's default), ``w(v)`` (the exit law, the method), ``w(v) d(v)`` (the official code's
  "exit"), or ``P(v)`` rescaled per tree to the total of ``w`` (the ablation's control);
- ``next-depth``: at every node ``v`` above the horizon the target's law ``p_v`` labels depth
  ``d(v) + 1``, weighted by the reach ``P(v)``, the root included (reaches tokens the tree missed);
- ``none``: the token-only control.
"""

from __future__ import annotations

from typing import Literal, get_args

import torch
import torch.nn.functional as F

from tev.core.flow import flow_from_edge_prob
from tev.core.tree import DraftTree
from tev.train.data import IGNORE

__all__ = ["TreeTerm", "TREE_TERMS", "REACH_FLOOR", "token_losses", "node_weights", "exit_loss_terms", "tree_node_loss", "next_depth_loss", "tree_loss"]

TreeTerm = Literal["none", "reach", "exit", "exit-depth", "next-depth", "prefix"]
TREE_TERMS = get_args(TreeTerm)
REACH_FLOOR = 1e-4  # the official code's floor on each edge probability of the reach weight


def token_losses(log_q: torch.Tensor, labels: torch.Tensor, soft: tuple[torch.Tensor, torch.Tensor] | None = None):
    """``L_tok`` of per-depth log-marginals ``log_q`` (`Tensor[B, K, Vd]`) against draft-vocabulary
    ``labels`` (`LongTensor[B, K]`, IGNORE skipped); with ``soft`` (positions `[B, K, k]`,
    probabilities `[B, K, k]`) also the cross-entropy against the target's laws over the labelled
    depths; and the per-depth top-1 accuracy `[K]` (labels outside the draft vocabulary miss).
    Returns (hard loss, soft loss or None, accuracy)."""
    labelled = labels != IGNORE
    hard = F.nll_loss(log_q.reshape(-1, log_q.shape[-1]), labels.reshape(-1), ignore_index=IGNORE)
    soft_loss = None
    if soft is not None:
        positions, probs = soft
        per_label = -(probs * log_q.gather(-1, positions)).sum(-1)  # [B, K]
        soft_loss = (per_label * labelled).sum() / labelled.sum().clamp(min=1)
    hits = (log_q.argmax(-1) == labels) & labelled
    accuracy = hits.sum(0).float() / labelled.sum(0).clamp(min=1)
    return hard, soft_loss, accuracy.detach()


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
        raise ValueError(f"unknown weight mode {mode!r}; choose one of {', '.join(TREE_TERMS)}")
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


def tree_node_loss(draft_logits: torch.Tensor, scored: "tev.train.trees.TreeBatch", indices: list[int], mode: str, draft_positions) -> torch.Tensor:
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


def next_depth_loss(draft_logits: torch.Tensor, scored: "tev.train.trees.TreeBatch", indices: list[int], horizon: int) -> torch.Tensor:
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


def tree_loss(draft_logits: torch.Tensor, scored, indices: list[int], term: str, drafter) -> torch.Tensor:
    """``L_tree`` of the trees ``scored.trees[indices[m]]``, each drafted from ``draft_logits[m]``."""
    if term == "next-depth":
        return next_depth_loss(draft_logits, scored, indices, drafter.config.horizon)
    return tree_node_loss(draft_logits, scored, indices, term, drafter.draft_positions)

