import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from tev.core.flow import target_flow
from tev.core.tree import DraftTree


def one_hot_rows(rows: list[list[float]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


def test_hand_built_flow():
    # root 0 -> tokens 1 and 2; node 1 -> token 0. Vocabulary of 3.
    tree = DraftTree.from_paths(0, [[1, 0], [2]])  # nodes: 0 root, 1 (tok 1), 2 (tok 0 under 1), 3 (tok 2)
    probs = one_hot_rows(
        [
            [0.2, 0.5, 0.3],  # root: children tokens 1 and 2 carry 0.8, rho = 0.2
            [0.6, 0.1, 0.3],  # node 1: child token 0 carries 0.6, rho = 0.4
            [1 / 3, 1 / 3, 1 / 3],  # leaf: rho = 1
            [0.0, 0.0, 1.0],  # leaf: rho = 1 whatever its row
        ]
    )
    flow = target_flow(tree, probs)
    assert flow.edge_prob.tolist() == pytest.approx([1.0, 0.5, 0.6, 0.3])
    assert flow.reach.tolist() == pytest.approx([1.0, 0.5, 0.3, 0.3])
    assert flow.rho.tolist() == pytest.approx([0.2, 0.4, 1.0, 1.0])
    assert flow.exit_weight.tolist() == pytest.approx([0.2, 0.2, 0.3, 0.3])
    assert flow.coverage == pytest.approx(1.1)  # 0.5 + 0.3 + 0.3
    assert flow.tau_bound == pytest.approx(2.1)
    summary = flow.by_depth()
    assert summary["reach"].tolist() == pytest.approx([1.0, 0.8, 0.3])
    assert summary["exit"].tolist() == pytest.approx([0.2, 0.5, 0.3])
    assert summary["nodes"].tolist() == [1, 2, 1]


def test_children_covering_all_mass_give_rho_zero():
    # root's two children hold all target mass: the target never exits at the root
    tree = DraftTree.from_paths(0, [[0], [1]])
    probs = one_hot_rows([[0.25, 0.75], [0.5, 0.5], [0.5, 0.5]])
    flow = target_flow(tree, probs)
    assert flow.rho[0].item() == 0.0 and flow.exit_weight[0].item() == 0.0
    assert flow.coverage == pytest.approx(1.0)


def test_rho_is_clamped_when_child_mass_rounds_above_one():
    tree = DraftTree.from_paths(0, [[0], [1]])
    probs = torch.tensor([[0.5, 0.5 + 1e-6], [0.5, 0.5], [0.5, 0.5]])  # within the 1e-3 tolerance
    flow = target_flow(tree, probs)
    assert flow.rho[0].item() == 0.0


def test_zero_probability_child_has_zero_reach_and_subtree():
    tree = DraftTree.from_paths(0, [[1, 1, 1]])
    probs = one_hot_rows([[1.0, 0.0], [0.5, 0.5], [0.5, 0.5], [0.5, 0.5]])  # p_root(1) = 0
    flow = target_flow(tree, probs)
    assert flow.reach.tolist() == [1.0, 0.0, 0.0, 0.0]
    assert flow.exit_weight.tolist() == [1.0, 0.0, 0.0, 0.0]
    assert flow.coverage == 0.0


@pytest.mark.parametrize(
    "probs,message",
    [
        (torch.full((2, 3), 1 / 3), "rows but the tree has 3 nodes"),
        (torch.tensor([[0.5, 0.5, float("nan")]] * 3), "NaN"),
        (torch.tensor([[1.2, -0.2, 0.0]] * 3), "negative"),
        (torch.tensor([[0.3, 0.3, 0.3]] * 3), "sum to 1"),
        (torch.full((3,), 1 / 3), r"shape \[N, V\]"),
    ],
)
def test_bad_probs_are_refused(probs, message):
    tree = DraftTree.from_paths(0, [[1], [2]])
    with pytest.raises(ValueError, match=message):
        target_flow(tree, probs)


@st.composite
def trees_and_probs(draw):
    vocab = draw(st.integers(2, 6))
    size = draw(st.integers(1, 30))
    tokens, parents, used = [0], [-1], [set()]
    for _ in range(1, size):
        parent = draw(st.integers(0, len(tokens) - 1))
        free = [t for t in range(vocab) if t not in used[parent]]
        if not free:
            continue
        token = draw(st.sampled_from(free))
        used[parent].add(token)
        used.append(set())
        tokens.append(token)
        parents.append(parent)
    tree = DraftTree.from_parents(tokens, parents)
    raw = draw(st.lists(st.floats(0.0, 1.0), min_size=len(tokens) * vocab, max_size=len(tokens) * vocab))
    weights = torch.tensor(raw, dtype=torch.float64).view(len(tokens), vocab) + 1e-3 * draw(st.integers(0, 1))
    weights[weights.sum(1) == 0] = 1.0
    return tree, weights / weights.sum(1, keepdim=True)


@settings(max_examples=200, deadline=None)
@given(trees_and_probs())
def test_exit_law_properties(case):
    tree, probs = case
    flow = target_flow(tree, probs)
    w, reach = flow.exit_weight, flow.reach
    assert w.sum().item() == pytest.approx(1.0, abs=1e-9)  # the exit law is a distribution
    assert (w >= 0).all()
    conservation = torch.zeros_like(reach).index_add_(0, tree.parents[1:], reach[1:])
    assert torch.allclose(w + conservation, reach, atol=1e-9)  # w(v) + sum_children P(u) = P(v)
    subtree = tree.ancestors.double()  # [v, u]: u is an ancestor of v (or v)
    assert torch.allclose(subtree.T @ w, reach, atol=1e-9)  # the subtree of v exits with mass P(v)
    assert flow.coverage == pytest.approx(float((tree.depths.double() * w).sum()), abs=1e-9)  # C = E[exit depth]
