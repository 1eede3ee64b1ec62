"""Claim 1, the exit law (Lemma 1), on real trees.

Measure: ``|sum_v w(v) - 1|``, the conservation error ``|w(v) + sum_{u in Ch(v)} P(u) - P(v)|``
and ``w`` against a float64 path walk, per tree; TEV's exit-node counts against ``w`` (a
pooled chi-square). Rule: every error below :data:`ERROR_LIMIT` and the p-value above
:data:`ALPHA`. Table: the chi-square per verifier and the worst errors.
"""

from __future__ import annotations

import math

import torch
from scipy.stats import chi2, chisquare

from tev.bench.lab import LabResult, LabTree
from tev.bench.report.common import claim, image, yes
from tev.core.verify import SAMPLING_VERIFIERS

__all__ = ["ERROR_LIMIT", "ALPHA", "reference_exit_law", "exit_law_errors", "chi_square_cells", "pooled_chi_square", "check_exit_law", "exit_law_section"]

ERROR_LIMIT = 1e-5  # float32 flow arithmetic stays far below this
ALPHA = 1e-3  # chi-square p-value threshold


def reference_exit_law(lab: LabTree) -> torch.Tensor:
    """`Tensor[N]` float64 ``w(v)`` by walking each path from the full rows ``p_v``
    (independent of :mod:`tev.core.flow`; a loop over nodes is fine for a check)."""
    p = lab.rows.all_rows().double().cpu()
    tree = lab.tree
    reach = torch.ones(tree.num_nodes, dtype=torch.float64)
    for v in range(1, tree.num_nodes):
        reach[v] = reach[tree.parents_list[v]] * p[tree.parents_list[v], tree.tokens_list[v]]
    child_mass = torch.zeros(tree.num_nodes, dtype=torch.float64).index_add_(0, tree.parents[1:], p[tree.parents[1:], tree.tokens[1:]])
    return reach * (1.0 - child_mass)


def exit_law_errors(lab: LabTree) -> dict:
    """``|sum w - 1|``, max conservation error ``|w(v) + sum_{u in Ch(v)} P(u) - P(v)|``, and
    max ``|w - w_ref|`` against the float64 reference."""
    flow = lab.flow
    reach, w = flow.reach.double().cpu(), flow.exit_weight.double().cpu()
    parents = lab.tree.parents[1:]
    children_reach = torch.zeros_like(reach).index_add_(0, parents, reach[1:])
    return {
        "sum_error": abs(float(w.sum()) - 1.0),
        "conservation_error": float((w + children_reach - reach).abs().max()),
        "reference_error": float((w - reference_exit_law(lab)).abs().max()),
    }


def chi_square_cells(counts: list[int], weights: list[float], min_expected: float = 5.0) -> tuple[float, int]:
    """Chi-square statistic and dof of ``counts`` against ``weights`` (normalised).

    Cells with an expected count below ``min_expected`` are pooled into one cell first (the
    chi-square approximation needs it); the statistic is scipy's on the pooled cells.
    """
    n = sum(counts)
    total = sum(weights)
    observed, expected, pooled_o, pooled_e = [], [], 0, 0.0
    for count, weight in zip(counts, weights):
        e = n * weight / total
        if e >= min_expected:
            observed.append(count)
            expected.append(e)
        else:
            pooled_o += count
            pooled_e += e
    if pooled_e > 0:
        observed.append(pooled_o)
        expected.append(pooled_e)
    elif pooled_o > 0:
        return float("inf"), max(1, len(observed))  # draws where the law puts no mass
    if len(observed) < 2:
        return 0.0, 0  # one cell: nothing to test
    return float(chisquare(observed, expected).statistic), len(observed) - 1


def pooled_chi_square(trees: list[dict], results: list[LabResult], verifier: str) -> dict:
    """Per-tree chi-square of exit-node counts against ``w``, statistics and dofs summed over
    trees; the p-value is the chi-square tail of the sum."""
    statistic, dof, draws = 0.0, 0, 0
    for tree, result in zip(trees, results):
        counts = [round(f * result.draws) for f in result.frequencies[verifier]]
        s, d = chi_square_cells(counts, tree["lab"].flow.exit_weight.double().cpu().tolist())
        statistic, dof, draws = statistic + s, dof + d, draws + sum(counts)
    p_value = float(chi2.sf(statistic, dof)) if dof > 0 and math.isfinite(statistic) else (1.0 if dof == 0 else 0.0)
    return {"verifier": verifier, "draws": draws, "statistic": statistic, "dof": dof, "p_value": p_value}


def check_exit_law(trees: list[dict], results: list[LabResult]) -> tuple[dict, dict]:
    """Claim 1: the exit law on real trees. Returns (claim row, measurements)."""
    errors = [exit_law_errors(t["lab"]) for t in trees]
    worst = {key: max(e[key] for e in errors) for key in errors[0]}
    tests = {name: pooled_chi_square(trees, results, name) for name in SAMPLING_VERIFIERS}
    tev = tests["tev"]
    holds = all(v < ERROR_LIMIT for v in worst.values()) and tev["p_value"] > ALPHA
    this_run = (
        f"{len(trees)} trees: max abs(sum w - 1) = {worst['sum_error']:.1e}, max conservation error = {worst['conservation_error']:.1e}; "
        f"TEV exits vs w: chi2 = {tev['statistic']:.1f}, dof {tev['dof']}, p = {tev['p_value']:.3g} ({tev['draws']} draws)"
    )
    row = claim(
        1, "Exit law (Lemma 1)", "sum_v w(v) = 1; w(v) + sum_children P(u) = P(v); Pr(exit = v) = w(v)", this_run, tev["p_value"], yes(holds),
        f"yes if max abs(sum w - 1), the max conservation error abs(w(v) + sum_children P(u) - P(v)) and max abs(w - w_ref) against a float64 path walk are all < {ERROR_LIMIT:g} and the pooled chi-square p-value of TEV's exit nodes against w is > {ALPHA:g}",
        {**worst, "chi2_statistic": tev["statistic"], "chi2_dof": tev["dof"], "chi2_p_value": tev["p_value"], "draws": tev["draws"]},
    )
    details = {"trees": [{"prompt": t["prompt"], "length": t["length"], "nodes": t["lab"].tree.num_nodes, **e} for t, e in zip(trees, errors)], "worst": worst, "chi_square": tests}
    return row, details


def exit_law_section(report: dict) -> list[str]:
    """Markdown for claim 1: the chi-square table, the worst errors, the depth plots."""
    m = report["measurements"]["exit_law"]
    return [
        "| verifier | draws | chi2 | dof | p |", "|---|---|---|---|---|",
        *(f"| {t['verifier']} | {t['draws']} | {t['statistic']:.2f} | {t['dof']} | {t['p_value']:.3g} |" for t in m["chi_square"].values()),
        "",
        f"Worst over {len(m['trees'])} trees: |sum w - 1| = {m['worst']['sum_error']:.2e}, conservation error = {m['worst']['conservation_error']:.2e}, "
        f"|w - w_ref| (float64 path walk) = {m['worst']['reference_error']:.2e}.",
        "",
        image(report["plots"], "exit_depth", "exit depth histogram"),
        "",
        image(report["plots"], "mass_by_depth", "mass by depth"),
    ]
