"""Shared test helpers: random draft trees and a plain-Python reference of the truncated sampling
law (the exactness checks the GPU check also runs live in ``tev.bench.exactness``)."""

from __future__ import annotations

import numpy as np
import torch

from tev.core.tree import DraftTree

def random_tree(generator: torch.Generator, vocab: int, budget: int, horizon: int, root_token: int = 0) -> DraftTree:
    """A random tree with distinct sibling tokens, depths up to ``horizon``."""
    tokens, parents, depths = [root_token], [-1], [0]
    children_tokens: list[set[int]] = [set()]
    attempts = 0
    while len(tokens) <= budget and attempts < 100 * budget:
        attempts += 1
        parent = int(torch.randint(len(tokens), (1,), generator=generator))
        if depths[parent] >= horizon:
            continue
        free = [t for t in range(vocab) if t not in children_tokens[parent]]
        if not free:
            continue
        token = free[int(torch.randint(len(free), (1,), generator=generator))]
        children_tokens[parent].add(token)
        tokens.append(token)
        parents.append(parent)
        depths.append(depths[parent] + 1)
        children_tokens.append(set())
    return DraftTree.from_parents(tokens, parents)


def truncated_law(logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0) -> torch.Tensor:
    """Reference rows of the truncated sampling law, in float64, one row at a time in plain
    Python (independent of ``tev.core.sampling``): ``/ T``, then top-k, top-p and min-p as
    Hugging Face ``generate`` applies them, ties at a cut all kept.

    Args:
        logits: `Tensor[k, V]`. Returns `Tensor[k, V]` float64 probabilities.
    """
    out = []
    for row in logits.double().tolist():
        scaled = [x / temperature for x in row]
        keep = [True] * len(scaled)
        def probs():
            top = max(s for s, k in zip(scaled, keep) if k)
            e = [np.exp(s - top) if k else 0.0 for s, k in zip(scaled, keep)]
            total = sum(e)
            return [x / total for x in e]
        if 0 < top_k < len(scaled):
            kth = sorted(scaled, reverse=True)[top_k - 1]
            keep = [k and s >= kth for s, k in zip(scaled, keep)]
        if top_p < 1:
            p = probs()
            ordered = sorted(p, reverse=True)
            before, floor = 0.0, ordered[0]
            for value in ordered:
                if before >= top_p:
                    break
                floor, before = value, before + value
            keep = [k and x >= floor for x, k in zip(p, keep)]
        if min_p > 0:
            p = probs()
            keep = [k and x >= min_p * max(p) for x, k in zip(p, keep)]
        out.append(probs())
    return torch.tensor(out, dtype=torch.float64)
