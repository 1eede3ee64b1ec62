"""Claim 3, fixed-tree equivalence (Table 4): the saturated verifiers' ``tau`` agree on identical trees.

Measure: the pairwise differences of the mean block lengths claim 2 measured. Rule: each
below :data:`EQUIVALENCE_MARGIN` plus :data:`~tev.bench.report.coverage.Z_LIMIT` standard
errors of the difference. Table: one row per pair.
"""

from __future__ import annotations

import math

from tev.bench.report.common import claim, yes
from tev.bench.report.coverage import Z_LIMIT
from tev.core.verify import SAMPLING_VERIFIERS

__all__ = ["EQUIVALENCE_MARGIN", "check_equivalence", "equivalence_section"]

EQUIVALENCE_MARGIN = 0.03  # the paper's Table 4 tolerance


def check_equivalence(coverage: dict) -> dict:
    """Claim 3 from claim 2's measurements; the row carries its ``pairs``."""
    v = coverage["verifiers"]
    pairs = []
    for i, a in enumerate(SAMPLING_VERIFIERS):
        for b in SAMPLING_VERIFIERS[i + 1 :]:
            diff = abs(v[a]["mean_length"] - v[b]["mean_length"])
            se = math.hypot(v[a]["se"], v[b]["se"])  # s.e. of a difference of independent means
            pairs.append({"pair": f"{a} vs {b}", "diff": diff, "se": se, "limit": EQUIVALENCE_MARGIN + Z_LIMIT * se})
    worst = max(pairs, key=lambda p: p["diff"])
    holds = all(p["diff"] < p["limit"] for p in pairs)
    row = claim(
        3, "Fixed-tree equivalence (Table 4)", "tau within 0.03 across verifiers", f"max abs(tau difference) = {worst['diff']:.4f} +- {worst['se']:.4f} ({worst['pair']})",
        worst["diff"], yes(holds), f"yes if every pairwise abs(tau_a - tau_b) < {EQUIVALENCE_MARGIN} + {Z_LIMIT:g} s.e. of the difference",
        {"max_diff": worst["diff"], "max_diff_se": worst["se"]},
    )
    row["pairs"] = pairs
    return row


def equivalence_section(report: dict) -> list[str]:
    """Markdown for claim 3: one row per verifier pair."""
    row = report["claims"][2]
    return ["| pair | abs(tau diff) | s.e. | limit (0.03 + 4 s.e.) |", "|---|---|---|---|", *(f"| {p['pair']} | {p['diff']:.4f} | {p['se']:.4f} | {p['limit']:.4f} |" for p in row["pairs"])]
