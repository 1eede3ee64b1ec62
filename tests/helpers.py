"""Shared test helpers: exact target laws and a chi-square check with a stated power."""

from __future__ import annotations

from collections import Counter

import numpy as np
import torch
from scipy import stats

from tev.core.tree import DraftTree

ALPHA = 1e-3  # seeded tests are deterministic; this keeps a correct sampler far from the edge


def exact_block_law(tree: DraftTree, probs: torch.Tensor) -> dict[tuple[int, ...], float]:
    """The law of the output block under plain sampling from ``p``, enumerated by brute force.

    A block is the path tokens to the exit node ``V`` then a bonus ``y`` that is not a child
    token of ``V``: probability ``prod(path edges) * p_V(y)``. Computed in float64 by walking
    each path, independently of ``tev.core.flow``.
    """
    p = probs.double()
    tokens = tree.tokens.tolist()
    law: dict[tuple[int, ...], float] = {}
    for v in range(tree.num_nodes):
        path = tree.path_to(v)
        reach = 1.0
        for parent, child in zip(path[:-1], path[1:]):
            reach *= float(p[parent, tokens[child]])
        child_tokens = {tokens[u] for u in tree.children(v)}
        prefix = tuple(tokens[u] for u in path[1:])
        for y in range(p.shape[1]):
            if y not in child_tokens:
                law[prefix + (y,)] = reach * float(p[v, y])
    return law


def chi_square_against(law: dict, samples: list, min_expected: float = 5.0) -> tuple[float, float, int]:
    """Chi-square of ``samples`` against ``law``; returns (statistic, p-value, dof).

    Cells with expected count below ``min_expected`` are pooled into one cell. A sample
    outside the law's support (or in a zero-probability cell) fails at once.
    """
    n = len(samples)
    counts = Counter(samples)
    for cell, count in counts.items():
        assert law.get(cell, 0.0) > 0, f"sampled {cell!r} ({count} times) but its target probability is 0"
    observed, expected = [], []
    pooled_obs, pooled_exp = 0, 0.0
    for cell, prob in law.items():
        if prob * n >= min_expected:
            observed.append(counts.get(cell, 0))
            expected.append(prob * n)
        else:
            pooled_obs += counts.get(cell, 0)
            pooled_exp += prob * n
    if pooled_exp > 0:
        observed.append(pooled_obs)
        expected.append(pooled_exp)
    expected_arr = np.array(expected)
    expected_arr *= n / expected_arr.sum()  # float64 rounding only
    statistic, p_value = stats.chisquare(np.array(observed), expected_arr)
    return float(statistic), float(p_value), len(observed) - 1


def power_against_shift(law: dict, n: int, shift: float = 0.01, alpha: float = ALPHA, min_expected: float = 5.0) -> float:
    """Power of the chi-square test to detect ``shift`` of mass between the two largest cells."""
    probs = sorted((p for p in law.values() if p * n >= min_expected), reverse=True)
    dof = len(probs)  # the pooled cell adds one cell, so cells - 1 == len(probs)
    noncentrality = n * shift**2 * (1 / probs[0] + 1 / probs[1])
    critical = stats.chi2.ppf(1 - alpha, dof)
    return float(stats.ncx2.sf(critical, dof, noncentrality))


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
