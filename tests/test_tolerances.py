"""The exit law's float32 limits (tev.bench.report.exit_law) on rows built to sit near them: each
limit holds, and a limit 10x smaller would fail, so the derivation is neither violated nor vacuous."""

import torch

from tev.bench.report.exit_law import U32, conservation_limit, edge_error_units, exit_law_errors, reference_limit, sum_limit
from tev.core.flow import flow_from_edge_prob
from tev.core.tree import DraftTree
from tev.core.verify import LogitRows, ProbRows, TargetRows
from tev.engine.lab import LabTree

DEPTH = 8


def lab_of(tree: DraftTree, rows: TargetRows) -> LabTree:
    return LabTree(tree, rows, flow_from_edge_prob(tree, rows.edge_prob(tree)), "built")


def worst_logsumexp_row() -> torch.Tensor:
    """`Tensor[8]`: logits near 1030 whose float32 logsumexp rounds by almost half an ulp
    (2^-13 / 2 = 1024 u there), picked from 400 rows that differ in one logit."""
    rows = torch.tensor([-5.0, 0.0, -6.0, -7.0, -8.0, -9.0, -10.0, -11.0]).repeat(400, 1)
    rows[:, 0] += 1e-3 * torch.arange(400.0)
    scaled = 1030.0 + rows
    edge32 = torch.exp(scaled[:, 1] - torch.logsumexp(scaled, dim=-1)).double()  # as TargetRows.edge_prob computes it
    exact = scaled.double()
    edge64 = torch.exp(exact[:, 1] - torch.logsumexp(exact, dim=-1))
    return scaled[(edge32 / edge64 - 1).abs().argmax()]


def test_reference_error_reaches_its_limit_on_a_chain_of_large_logits():
    # Every node has the same row, so the logsumexp's rounding repeats along the path: the
    # leaf's reach is off by DEPTH times one edge's error (about 0.9 of the limit).
    row = worst_logsumexp_row()
    tree = DraftTree.from_paths(3, [[1] * DEPTH])
    lab = lab_of(tree, LogitRows(row.expand(tree.num_nodes, -1).clone()))
    errors = exit_law_errors(lab)
    limit = errors["limits"]["reference_error"]
    assert limit == reference_limit(DEPTH, 1, edge_error_units(8, errors["limits"]["max_abs_lse"]))
    assert limit / 10 < errors["reference_error"] < limit, (errors["reference_error"], limit)


def test_sum_and_conservation_errors_reach_their_limits_on_a_star():
    # The root's 32 children: one edge of 0.9, then 31 of just over half an ulp of 0.9, each
    # rounding the child mass up by about u / 2: the mass is off by about 15 u.
    children = 32
    small = 0.5001 * U32  # ulp(0.9) = 2^-24 = u
    probs = torch.zeros(children + 1, children + 2)
    probs[0, 0], probs[0, 1:children], probs[0, -1] = 0.9, small, 0.1 - (children - 1) * small
    probs[1:, -1] = 1.0
    tree = DraftTree.from_paths(children + 1, [[t] for t in range(children)])
    errors = exit_law_errors(lab_of(tree, ProbRows(probs)))
    assert errors["limits"]["sum_error"] == sum_limit(1, children)
    assert errors["limits"]["conservation_error"] == conservation_limit(1, children)
    for key in ("sum_error", "conservation_error"):
        assert errors["limits"][key] / 10 < errors[key] < errors["limits"][key], (key, errors[key], errors["limits"][key])

