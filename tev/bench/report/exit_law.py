"""Claim 1, the exit law (Lemma 1), on real trees.

Measure: ``|sum_v w(v) - 1|``, the conservation error ``|w(v) + sum_{u in Ch(v)} P(u) - P(v)|``
and ``w`` against a float64 path walk, per tree; TEV's exit-node counts against ``w`` (a
pooled chi-square). Rule: each error below its limit (:func:`error_limits`) and the p-value
above :data:`ALPHA`. Table: the chi-square per verifier and the worst errors.

The limits are derived from float32 rounding, not tuned on a machine, so the rule is the same
on every CPU. ``u = 2^-24`` is float32's unit roundoff; per tree, ``D`` is its depth, ``K`` the
most children of a node, ``V`` the row length and ``Lambda`` the largest ``|log sum exp|`` of a
parent row (the logits' scale). First order in ``u``:

- An edge probability is ``exp(s_t - L)`` with ``L = m + log sum_i exp(s_i - m)`` (the flow's
  logsumexp, ``m`` the row's max) in float32. Its relative error is at most ``(E + |log e|) u``
  with ``E = Lambda + 3 ln V + 4 ceil(log2 V) + 4``: rounding ``m + log(.)`` costs
  ``Lambda u``; the sum of the ``V`` terms (torch's cascade sum: chains of at most
  ``4 ceil(log2 V)`` additions) ``4 ceil(log2 V) u``; the rounded ``s_i - m`` an average
  ``E_p[m - s] u <= ln V u``; the log's 1-ulp error ``2 ln V u``; two exps of 1 ulp ``4 u``;
  and ``s_t - L`` itself ``|log e| u``. Given probabilities are read, not computed: ``E = 0``.
- ``P(v)`` is a product of ``d <= D`` edges (``d - 1`` roundings), the child mass a sum of
  ``k <= K`` (``k - 1``), ``rho = 1 - mass`` and ``w = P rho`` one each. With ``rho + mass = 1``,
  ``e |ln e| <= 1/e`` per edge and ``sum_children e |ln e| <= ln K + 1/e``:
  ``|w - w_ref| <= u [max(D, 1) (E + 1) + (D + 1)/e + K + ln K + 1]`` (``w_ref``: the same walk
  in float64 from the same float32 logits).
- ``sum_v w(v) = 1`` telescopes exactly for any edge values, so only the product and sum
  roundings count: ``|sum w - 1| <= u sum_v P(v) (d + k + 1) <= (1 + D)(D + K + 1) u``
  (``sum_v P(v) = 1 + C <= 1 + D``).
- Conservation compares ``P(u)``, a product rounded ``d`` times, with ``P(v) e_u`` and
  ``rho``'s roundings: ``|w(v) + sum_children P(u) - P(v)| <= (2 D + K + 1) u``.

Where the children's float32 mass rounds above 1, ``rho`` is clamped at 0; what the clamp
removes (``P(v) (mass - 1)``, measured) is added to each limit. The float64 side adds the same
terms with ``2^-53``, which the limits include.
"""

from __future__ import annotations

import math

import torch
from scipy.stats import chi2, chisquare

from tev.bench.report.common import claim, image, yes
from tev.core.verify import SAMPLING_VERIFIERS
from tev.engine.lab import LabResult, LabTree

__all__ = [
    "ALPHA", "U32", "edge_error_units", "reference_limit", "sum_limit", "conservation_limit", "reference_edge_prob", "reference_exit_law",
    "error_limits", "exit_law_errors", "chi_square_cells", "pooled_chi_square", "check_exit_law", "exit_law_section",
]

ALPHA = 1e-3  # chi-square p-value threshold
U32 = 2.0**-24  # float32 unit roundoff
U64 = 2.0**-53  # float64's, for the reference's own arithmetic
ERRORS = ("sum_error", "conservation_error", "reference_error")


def edge_error_units(vocab: int, max_abs_lse: float) -> float:
    """``E``: an edge probability's relative error, in units of ``u`` and less its ``|log e|``
    part, for rows of ``vocab`` entries whose ``|log sum exp|`` is at most ``max_abs_lse``."""
    return max_abs_lse + 3 * math.log(vocab) + 4 * math.ceil(math.log2(vocab)) + 4


def reference_limit(depth: int, max_children: int, edge_units: float) -> float:
    """Bound on ``max |w - w_ref|`` (module docstring); ``edge_units`` is ``E`` (0 for given probabilities)."""
    k = max(max_children, 1)
    units = max(depth, 1) * (edge_units + 1) + (depth + 1) / math.e + k + math.log(k) + 1
    return (U32 + U64) * units


def sum_limit(depth: int, max_children: int) -> float:
    """Bound on ``|sum_v w(v) - 1|`` (module docstring)."""
    return (U32 + U64) * (1 + depth) * (depth + max_children + 1)


def conservation_limit(depth: int, max_children: int) -> float:
    """Bound on ``max_v |w(v) + sum_{u in Ch(v)} P(u) - P(v)|`` (module docstring)."""
    return (U32 + U64) * (2 * depth + max_children + 1)


def reference_edge_prob(lab: LabTree) -> tuple[torch.Tensor, float]:
    """(`Tensor[N]` float64 ``p_pa(v)(x_v)`` from the same float32 (warped) parent logits the
    flow used, the rows' largest ``|log sum exp|``; 0 where rows are given as probabilities or
    are greedy's 0/1 edges, which are read, not computed)."""
    rows, tree = lab.rows, lab.tree
    edge = torch.ones(tree.num_nodes, dtype=torch.float64)
    if tree.num_nodes == 1:
        return edge, 0.0
    if rows.greedy_only:
        return lab.flow.edge_prob.double().cpu(), 0.0
    parents = rows.parent_rows(tree)  # the flow's own (cached) internal rows
    slot, tokens = parents.slot.cpu(), tree.tokens[1:]
    if rows.probs is not None:
        edge[1:] = parents.values.double().cpu()[slot, tokens]
        return edge, 0.0
    scaled = rows.law.warp(rows.logits_at(parents.internal)).double().cpu()  # [k, V] the same float32 logits, warped
    log_norm = torch.logsumexp(scaled, dim=-1)  # [k]
    edge[1:] = torch.exp(scaled[slot, tokens] - log_norm[slot])
    return edge, float(log_norm.abs().max())


def reference_exit_law(lab: LabTree) -> torch.Tensor:
    """`Tensor[N]` float64 ``w(v)`` by walking each path from :func:`reference_edge_prob`
    (independent of :mod:`tev.core.flow`; a loop over nodes is fine for a check)."""
    edge, _ = reference_edge_prob(lab)
    tree = lab.tree
    reach = torch.ones(tree.num_nodes, dtype=torch.float64)
    for v in range(1, tree.num_nodes):
        reach[v] = reach[tree.parents_list[v]] * edge[v]
    child_mass = torch.zeros(tree.num_nodes, dtype=torch.float64).index_add_(0, tree.parents[1:], edge[1:])
    return reach * (1.0 - child_mass)


def error_limits(lab: LabTree) -> dict:
    """This tree's limit for each error of :func:`exit_law_errors`, and what they are made of
    (``depth`` D, ``max_children`` K, ``vocab`` V, ``max_abs_lse`` Lambda, ``edge_units`` E,
    ``clamped``: the most mass ``rho``'s clamp at 0 removed at one node, and in all)."""
    tree, flow = lab.tree, lab.flow
    depth = int(tree.depths.max())
    max_children = int(torch.bincount(tree.parents[1:], minlength=1).max()) if tree.num_nodes > 1 else 0
    _, max_abs_lse = reference_edge_prob(lab)
    computed = not lab.rows.greedy_only and lab.rows.probs is None
    edge_units = edge_error_units(lab.rows.vocab_size, max_abs_lse) if computed else 0.0
    excess = (flow.reach.double() * (flow.child_mass.double() - 1).clamp(min=0)).cpu()  # P(v) (mass - 1)_+
    most, total = float(excess.max()), float(excess.sum())
    return {
        "sum_error": sum_limit(depth, max_children) + total,
        "conservation_error": conservation_limit(depth, max_children) + most,
        "reference_error": reference_limit(depth, max_children, edge_units) + most,
        "depth": depth, "max_children": max_children, "vocab": lab.rows.vocab_size, "max_abs_lse": max_abs_lse, "edge_units": edge_units,
        "clamped": total,
    }


def exit_law_errors(lab: LabTree) -> dict:
    """``|sum w - 1|``, max conservation error ``|w(v) + sum_{u in Ch(v)} P(u) - P(v)|``, and
    max ``|w - w_ref|`` against the float64 reference; each with its limit (``limits``) and
    error / limit (``ratio``)."""
    flow = lab.flow
    reach, w = flow.reach.double().cpu(), flow.exit_weight.double().cpu()
    parents = lab.tree.parents[1:]
    children_reach = torch.zeros_like(reach).index_add_(0, parents, reach[1:])
    errors = {
        "sum_error": abs(float(w.sum()) - 1.0),
        "conservation_error": float((w + children_reach - reach).abs().max()),
        "reference_error": float((w - reference_exit_law(lab)).abs().max()),
    }
    limits = error_limits(lab)
    return {**errors, "limits": limits, "ratio": max(errors[key] / limits[key] for key in ERRORS)}


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


RULE = (
    "yes if, on every tree, abs(sum w - 1), the max conservation error abs(w(v) + sum_children P(u) - P(v)) and max abs(w - w_ref) against a "
    "float64 path walk of the same float32 logits stay within limits derived from float32 rounding (u = 2^-24; D the tree's depth, K the most "
    "children of a node, V the row length, Lambda the largest abs(log sum exp) of a row; E = Lambda + 3 ln V + 4 ceil(log2 V) + 4 bounds an edge "
    "probability's relative error in u, the logsumexp's rounding, cascade sum, log and exps): (1 + D)(D + K + 1) u, (2D + K + 1) u and "
    "[max(D, 1)(E + 1) + (D + 1)/e + K + ln K + 1] u (plus any mass rho's clamp at 0 removed), the same on every CPU, "
    f"and the pooled chi-square p-value of TEV's exit nodes against w is > {ALPHA:g}"
)


def check_exit_law(trees: list[dict], results: list[LabResult]) -> tuple[dict, dict]:
    """Claim 1: the exit law on real trees. Returns (claim row, measurements)."""
    errors = [exit_law_errors(t["lab"]) for t in trees]
    worst = {key: max(e[key] for e in errors) for key in ERRORS}
    ratio = {key: max(e[key] / e["limits"][key] for e in errors) for key in ERRORS}  # error / its tree's limit
    tests = {name: pooled_chi_square(trees, results, name) for name in SAMPLING_VERIFIERS}
    tev = tests["tev"]
    holds = all(r < 1 for r in ratio.values()) and tev["p_value"] > ALPHA
    this_run = (
        f"{len(trees)} trees: max abs(sum w - 1) = {worst['sum_error']:.1e}, max conservation error = {worst['conservation_error']:.1e}, "
        f"max abs(w - w_ref) = {worst['reference_error']:.1e} (at most {max(ratio.values()):.2g} of its limit); "
        f"TEV exits vs w: chi2 = {tev['statistic']:.1f}, dof {tev['dof']}, p = {tev['p_value']:.3g} ({tev['draws']} draws)"
    )
    row = claim(
        1, "Exit law (Lemma 1)", "sum_v w(v) = 1; w(v) + sum_children P(u) = P(v); Pr(exit = v) = w(v)", this_run, tev["p_value"], yes(holds), RULE,
        {**worst, "max_limit_ratio": max(ratio.values()), "chi2_statistic": tev["statistic"], "chi2_dof": tev["dof"], "chi2_p_value": tev["p_value"], "draws": tev["draws"]},
    )
    details = {"trees": [{"prompt": t["prompt"], "length": t["length"], "nodes": t["lab"].tree.num_nodes, **e} for t, e in zip(trees, errors)],
               "worst": worst, "limit_ratio": ratio, "chi_square": tests}
    return row, details


def exit_law_section(report: dict) -> list[str]:
    """Markdown for claim 1: the chi-square table, the worst errors against their limits, the depth plots."""
    m = report["measurements"]["exit_law"]
    limits = [t["limits"] for t in m["trees"]]
    return [
        "| verifier | draws | chi2 | dof | p |", "|---|---|---|---|---|",
        *(f"| {t['verifier']} | {t['draws']} | {t['statistic']:.2f} | {t['dof']} | {t['p_value']:.3g} |" for t in m["chi_square"].values()),
        "",
        f"Worst over {len(m['trees'])} trees (depth D <= {max(x['depth'] for x in limits)}, K <= {max(x['max_children'] for x in limits)}, "
        f"V = {limits[0]['vocab']}, Lambda <= {max(x['max_abs_lse'] for x in limits):.1f}), each as a fraction of its tree's float32 limit: "
        f"|sum w - 1| = {m['worst']['sum_error']:.2e} ({m['limit_ratio']['sum_error']:.2g}), conservation error = {m['worst']['conservation_error']:.2e} "
        f"({m['limit_ratio']['conservation_error']:.2g}), |w - w_ref| (float64 path walk) = {m['worst']['reference_error']:.2e} ({m['limit_ratio']['reference_error']:.2g}).",
        "",
        image(report["plots"], "exit_depth", "exit depth histogram"),
        "",
        image(report["plots"], "mass_by_depth", "mass by depth"),
    ]
