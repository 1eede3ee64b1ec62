"""Claim 2, the coverage bound (Theorem 1): ``E[L] <= 1 + C(T)``, with equality for saturated verifiers.

Measure: each saturated verifier's mean block length over the lab draws on the real trees,
and TEV on each tree's first-child chain (exact but not saturated). Rule: every saturated
verifier within :data:`Z_LIMIT` standard errors of the mean ``1 + C``, the chain below it.
Table: mean ``L``, its standard error and ``z`` per verifier.
"""

from __future__ import annotations

import torch

from tev.bench.report.common import claim, yes
from tev.core.tree import DraftTree
from tev.core.verify import SAMPLING_VERIFIERS
from tev.engine.lab import LabResult, LabTree, run_lab
from tev.util.stats import standard_error_of_mean

__all__ = ["Z_LIMIT", "pooled_length", "first_child_chain", "check_coverage_bound", "coverage_section"]

Z_LIMIT = 4.0  # allowed standard errors (claims 2 and 3)


def pooled_length(results: list[LabResult], verifier: str) -> tuple[float, float]:
    """Mean block length over trees (equal draws each) and its standard error."""
    means = [r.mean_lengths[verifier] for r in results]
    return sum(means) / len(means), standard_error_of_mean([r.length_se[verifier] for r in results])


def first_child_chain(lab: LabTree) -> LabTree:
    """The tree restricted to its first-child chain (root, its first child, that node's first
    child, ...), with the matching target rows: an exact verifier that is not saturated."""
    nodes = [0]
    while lab.tree.children(nodes[-1]):
        nodes.append(lab.tree.children(nodes[-1])[0])
    tree = DraftTree.from_parents([lab.tree.tokens_list[v] for v in nodes], [-1] + list(range(len(nodes) - 1)))
    rows = lab.rows.select(torch.tensor(nodes, device=lab.rows.device))
    return LabTree(tree, rows, rows.flow(tree), "first-child chain")


def check_coverage_bound(trees: list[dict], results: list[LabResult], draws: int, seed: int) -> tuple[dict, dict]:
    """Claim 2: E[L] = 1 + C(T) for the saturated verifiers; a non-saturated exact one stays below.
    Returns (claim row, measurements)."""
    bound = sum(t["lab"].flow.tau_bound for t in trees) / len(trees)
    verifiers = {}
    for name in SAMPLING_VERIFIERS:
        mean, se = pooled_length(results, name)
        verifiers[name] = {"mean_length": mean, "se": se, "diff": mean - bound, "z": (mean - bound) / se if se > 0 else (0.0 if mean == bound else float("inf"))}
    chains = [first_child_chain(t["lab"]) for t in trees]
    chain_results = [run_lab(c, verifiers=("tev",), draws=draws, seed=seed + 10_000 + i) for i, c in enumerate(chains)]
    chain_mean, chain_se = pooled_length(chain_results, "tev")
    chain = {"mean_length": chain_mean, "se": chain_se, "own_bound": sum(c.flow.tau_bound for c in chains) / len(chains), "full_bound": bound, "gap": bound - chain_mean}
    saturated_ok = all(abs(v["z"]) < Z_LIMIT for v in verifiers.values())
    holds = saturated_ok and chain_mean < bound
    worst_z = max(abs(v["z"]) for v in verifiers.values())
    this_run = (
        f"mean 1 + C = {bound:.4f}; mean L: " + ", ".join(f"{n} {v['mean_length']:.4f} ({v['z']:+.1f} s.e.)" for n, v in verifiers.items())
        + f"; first-child-chain TEV {chain_mean:.4f} +- {chain_se:.4f} (below by {chain['gap']:.4f})"
    )
    row = claim(
        2, "Coverage bound (Theorem 1)", "E[L] <= 1 + C(T), with equality for TEV, predraw, sequential", this_run, worst_z, yes(holds),
        f"yes if abs(mean L - mean(1 + C)) < {Z_LIMIT:g} s.e. for each of tev, predraw, sequential (pooled over trees and draws) and TEV on the first-child chain has mean L < the full trees' mean 1 + C",
        {"tau_bound": bound, "max_abs_z": worst_z, **{f"{n}_mean_length": v["mean_length"] for n, v in verifiers.items()}, "chain_mean_length": chain_mean, "chain_gap": chain["gap"]},
    )
    return row, {"trees": len(trees), "draws_per_tree": draws, "tau_bound": bound, "verifiers": verifiers, "first_child_chain": chain}


def coverage_section(report: dict) -> list[str]:
    """Markdown for claim 2: mean L per verifier and the first-child chain."""
    m = report["measurements"]["coverage"]
    c = m["first_child_chain"]
    return [
        f"{m['trees']} trees x {m['draws_per_tree']} draws per verifier; mean 1 + C = {m['tau_bound']:.4f}.",
        "",
        "| verifier | mean L | s.e. | mean L - (1 + C) | z |", "|---|---|---|---|---|",
        *(f"| {n} | {v['mean_length']:.4f} | {v['se']:.4f} | {v['diff']:+.4f} | {v['z']:+.2f} |" for n, v in m["verifiers"].items()),
        "",
        f"Non-saturated exact verifier (TEV on each tree's first-child chain): mean L = {c['mean_length']:.4f} +- {c['se']:.4f}, "
        f"its own mean 1 + C = {c['own_bound']:.4f}, the full trees' mean 1 + C = {c['full_bound']:.4f} (gap {c['gap']:.4f}).",
    ]
