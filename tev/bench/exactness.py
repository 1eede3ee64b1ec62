"""Exactness checks shared by the GPU check and the test suite: the exact law of an output block,
a chi-square test with a stated power, greedy margins and the rounding tie of a precision, and a
counter of CUDA host syncs."""

from __future__ import annotations

import warnings
from collections import Counter
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
from scipy import stats

from tev.core.tree import DraftTree
from tev.util.paths import REPO_ROOT as REPO

__all__ = ["ALPHA", "exact_block_law", "chi_square_against", "power_against_shift", "draws_for_power", "greedy_margins", "rounding_tie",
           "first_difference", "count_host_syncs"]

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


def draws_for_power(law: dict, power: float = 0.9) -> int:
    """The fewest draws (in steps of 10,000) at which a 1-point mass shift fails the test."""
    for n in range(40_000, 200_001, 10_000):
        if power_against_shift(law, n) >= power:
            return n
    raise AssertionError("case needs more than 200,000 draws; make it smaller")


# ------------------------------------------------------------------ greedy decoding in low precision
def greedy_margins(target, prompt: list[int], tokens: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """How far each generated token's logit lies below the largest one, from ONE causal forward
    of ``target`` over ``prompt + tokens`` (a third computation, neither a tree forward nor a
    one-token one).

    Returns (``margin``, ``scale``): `Tensor[n]` float64 on the CPU each, ``n = len(tokens)``;
    ``margin[i] = max_a l_i(a) - l_i(tokens[i]) >= 0`` (0 for the argmax) and ``scale[i]`` the
    largest absolute logit at step ``i``.
    """
    device = next(target.parameters()).device
    ids = torch.tensor([list(prompt) + list(tokens[:-1])], device=device)
    with torch.no_grad():
        logits = target(input_ids=ids).logits[0, len(prompt) - 1 :].double()  # [n, V]
    chosen = logits.gather(1, torch.tensor(tokens, device=device)[:, None])[:, 0]
    return (logits.max(dim=-1).values - chosen).cpu(), logits.abs().max(dim=-1).values.cpu()


def rounding_tie(dtype: torch.dtype, scale: torch.Tensor) -> torch.Tensor:
    """`Tensor[n]`: the logit gap below which ``dtype`` rounding may reorder two tokens.

    Eight units in the last place of the largest logit (at least of 1): a tree forward and a
    one-token forward add the same terms in different orders, so in bfloat16 (8 significant
    bits) their logits differ by a few units in the last place; float32 gets the same rule at
    its own precision (24 bits), which is far below any real gap.
    """
    eps = torch.finfo(dtype).eps  # one unit in the last place at 1: 2**-7 for bfloat16, 2**-23 for float32
    return 8.0 * eps * torch.pow(2.0, torch.floor(torch.log2(scale.clamp(min=1.0))))


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first index where two token lists differ (a length difference counts), or None."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


# ------------------------------------------------------------------ host syncs on CUDA
SYNC_WARNING = "called a synchronizing CUDA operation"


def _site(filename: str, lineno: int) -> str:
    """``tev/core/verify.py:200`` for the repository's files, ``package/file.py:12`` for others."""
    path = Path(filename)
    try:
        return f"{path.resolve().relative_to(REPO)}:{lineno}"
    except ValueError:
        return f"{path.parent.name}/{path.name}:{lineno}"


@contextmanager
def count_host_syncs():
    """Collect the host syncs made inside the block, through torch's CUDA sync debug mode.

    Yields a list that, once the block ends, holds one ``"file:line"`` per synchronizing CUDA
    call (a blocking copy in either direction, ``.item()``, ``.tolist()``, ``int(tensor)``...),
    named after the Python line that made it. Explicit ``torch.cuda.synchronize()`` calls are
    not counted. Needs a CUDA build of torch.
    """
    sites: list[str] = []
    previous = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield sites
        finally:
            torch.cuda.set_sync_debug_mode(previous)
    sites.extend(_site(w.filename, w.lineno) for w in caught if SYNC_WARNING in str(w.message))
