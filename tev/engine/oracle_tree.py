"""The oracle tree: B nodes grown best first from the target's own conditional probabilities.

``p`` is the target. Under a sampling law, node ``v``'s reach is ``P(v) = P(pa(v)) * p_pa(v)(x_v)``, and a
child's reach never exceeds its parent's, so the ``B`` nodes of largest reach below a context form a tree;
as coverage is the sum of reaches, ``C(T) = sum_{v != r} P(v)``, no tree of ``B`` nodes covers more. With a
saturated verifier (TEV) the expected block length is ``1 + C(T)``, so ``1 + C`` of this tree bounds the
``tau`` of any drafter's tree of ``B`` nodes (and depth at most ``horizon``) at that context and law. At
``T = 0`` the law puts all its mass on the argmax, and the tree is the greedy path.

Grown as the best-first builder grows a drafter's tree (pop the best candidate, add it, offer its next
sibling and its first child), except that each added node's children come from the target's row at it: one
target forward per node, so this is a measurement (``python -m tev bench oracle-reach``), not a drafter.
"""

from __future__ import annotations

import heapq
import math

import torch

from tev.core.sampling import SamplingLaw
from tev.core.tree import DraftTree
from tev.engine.session import CausalLMSession

__all__ = ["oracle_tree", "target_row"]


def target_row(session: CausalLMSession, base: int, tokens: list[int], law: SamplingLaw) -> torch.Tensor:
    """`Tensor[V]` the law's probabilities after the session's first ``base`` cached tokens and ``tokens``
    (the root and a path below it); the cache is cut back to ``base`` first. At ``T = 0``: one-hot at the argmax."""
    session.rollback(base)
    logits = session.extend(tokens).last_logits()
    if law.greedy:
        return torch.nn.functional.one_hot(logits.argmax(), logits.shape[-1]).float()
    return law.probs(logits[None])[0]


def oracle_tree(session: CausalLMSession, context: list[int], law: SamplingLaw, budget: int, horizon: int) -> DraftTree:
    """The best-first tree of at most ``budget`` nodes and depth ``horizon`` under ``context[-1]``, nodes in
    the order they were added (each prefix of ``k`` nodes is the oracle tree of budget ``k``); a node's
    ``draft_logprob`` is ``log p`` of its token at its parent, so ``path_logprob`` is ``log P(v)``.

    Args:
        session: a session on the target whose cache holds ``context[:-1]`` exactly; left so.
        context: the committed tokens, the root last.
        law: the target's sampling law (``temperature == 0``: greedy).
    Fewer than ``budget`` nodes where fewer have positive reach (at ``T = 0``, past the greedy path's ``horizon``).
    """
    base = len(context) - 1
    if session.length != base:
        raise ValueError(f"the session holds {session.length} tokens; the oracle needs the context but its root ({base})")
    tokens, parents, logprob, depths, reach = [context[-1]], [-1], [0.0], [0], [1.0]
    offers: dict[int, tuple[list[float], list[int]]] = {}  # node -> its row's most likely tokens, descending
    candidates: list[tuple[float, int, int, int]] = []  # (-reach, tie, node, rank): the rank-th child of node

    def expand(node: int, path: list[int]) -> None:
        row = target_row(session, base, [context[-1], *path], law)
        top = row.topk(min(budget, int((row > 0).sum()))) if budget else None
        if top is not None and top.values.numel():
            offers[node] = (top.values.tolist(), top.indices.tolist())
            heapq.heappush(candidates, (-reach[node] * offers[node][0][0], len(tokens), node, 0))

    paths = {0: []}
    if horizon > 0:
        expand(0, [])
    while candidates and len(tokens) - 1 < budget:
        negative, _, parent, rank = heapq.heappop(candidates)
        values, ids = offers[parent]
        node = len(tokens)
        tokens.append(ids[rank])
        parents.append(parent)
        depths.append(depths[parent] + 1)
        reach.append(-negative)
        logprob.append(math.log(values[rank]))
        paths[node] = paths[parent] + [ids[rank]]
        if rank + 1 < len(values):  # the next sibling
            heapq.heappush(candidates, (-reach[parent] * values[rank + 1], node, parent, rank + 1))
        if depths[node] < horizon and len(tokens) - 1 < budget:  # the first child
            expand(node, paths[node])
    session.rollback(base)
    return DraftTree.from_parents(tokens, parents, logprob)
