import itertools

import pytest
import torch

from tev.core.tree import DraftTree
from tests.helpers import random_tree


def brute_force_top_prefixes(logq: torch.Tensor, budget: int) -> set[tuple[int, ...]]:
    """All prefixes of length 1..K scored by prod_d q_d, the best ``budget`` of them."""
    horizon, vocab = logq.shape
    scored = []
    for depth in range(1, horizon + 1):
        for prefix in itertools.product(range(vocab), repeat=depth):
            score = sum(float(logq[d, t]) for d, t in enumerate(prefix))
            scored.append((score, prefix))
    scored.sort(key=lambda item: -item[0])
    return {prefix for _, prefix in scored[:budget]}


def tree_prefixes(tree: DraftTree) -> set[tuple[int, ...]]:
    return {tuple(tree.path_tokens(v)) for v in range(1, tree.num_nodes)}


@pytest.mark.parametrize("horizon,vocab", [(1, 6), (2, 5), (3, 4), (4, 3)])
@pytest.mark.parametrize("budget", [1, 3, 7, 15, 40])
def test_ddtree_equals_brute_force_top_prefixes(horizon, vocab, budget):
    generator = torch.Generator().manual_seed(1000 * horizon + budget)
    # continuous random scores: no ties, so the top-B set is unique
    logq = torch.log_softmax(2 * torch.randn(horizon, vocab, generator=generator), dim=-1)
    tree = DraftTree.from_marginals(logq, budget, root_token=7)
    expected = brute_force_top_prefixes(logq, budget)
    assert tree.size == len(expected) == min(budget, sum(vocab**d for d in range(1, horizon + 1)))
    assert tree_prefixes(tree) == expected
    assert tree.root_token == 7
    assert int(tree.depths.max()) <= horizon
    # draft_logprob holds q_d(x_v) of each node's own token
    for v in range(1, tree.num_nodes):
        assert tree.draft_logprob[v].item() == pytest.approx(logq[tree.depths[v] - 1, tree.tokens[v]].item())


def test_ddtree_budget_larger_than_possible_and_zero_budget():
    logq = torch.log_softmax(torch.randn(2, 3), dim=-1)
    assert DraftTree.from_marginals(logq, 1000).size == 3 + 9  # every prefix, no more
    assert DraftTree.from_marginals(logq, 0).size == 0  # root only


def test_ddtree_skips_zero_probability_prefixes():
    # depth 1 has one possible token, depth 2 two: only 1 + 2 prefixes have probability > 0
    logq = torch.full((2, 4), float("-inf"))
    logq[0, 2] = 0.0
    logq[1, 0] = logq[1, 3] = torch.log(torch.tensor(0.5))
    tree = DraftTree.from_marginals(logq, 10)
    assert tree_prefixes(tree) == {(2,), (2, 0), (2, 3)}


def test_ddtree_is_deterministic_with_ties():
    logq = torch.log(torch.full((3, 5), 0.2))  # every prefix of a depth ties
    first = DraftTree.from_marginals(logq, 12)
    second = DraftTree.from_marginals(logq, 12)
    assert torch.equal(first.tokens, second.tokens) and torch.equal(first.parents, second.parents)


def test_ddtree_breaks_a_score_tie_by_push_order():
    # q_1 = q_2 = (0.6, 0.4): prefixes (0, 1) and (1, 0) tie at 0.24 (the sums of logs are
    # bitwise equal). Pops: (0) pushes (1) then (0, 0); (1) pushes (1, 0); (0, 0) pushes
    # (0, 1). So (1, 0) was pushed first and takes the fourth and last slot of B = 4.
    logq = torch.log(torch.tensor([[0.6, 0.4], [0.6, 0.4]]))
    top = logq.tolist()
    assert top[0][0] + top[1][1] == top[0][1] + top[1][0]  # a real tie
    tree = DraftTree.from_marginals(logq, 4)
    assert tree.tokens.tolist() == [0, 0, 1, 0, 0] and tree.parents.tolist() == [-1, 0, 0, 1, 2]
    assert tree_prefixes(tree) == {(0,), (1,), (0, 0), (1, 0)}
    assert (0, 1) in tree_prefixes(DraftTree.from_marginals(logq, 5))  # the tied loser comes next


def test_ddtree_parents_precede_children_and_scores_fall():
    logq = torch.log_softmax(torch.randn(5, 30, generator=torch.Generator().manual_seed(3)), dim=-1)
    tree = DraftTree.from_marginals(logq, 64)
    assert (tree.parents[1:] < torch.arange(1, tree.num_nodes)).all()
    path_scores = [sum(tree.draft_logprob[u].item() for u in tree.path_to(v)) for v in range(1, tree.num_nodes)]
    assert all(a >= b - 1e-6 for a, b in zip(path_scores, path_scores[1:]))  # popped best-first


def test_from_paths_merges_shared_prefixes():
    tree = DraftTree.from_paths(9, [[1, 2, 3], [1, 2, 4], [5], [1, 2, 3]])
    # root 9 -> 1 -> 2 -> {3, 4}; root -> 5; the repeated path adds nothing
    assert tree.tokens.tolist() == [9, 1, 2, 3, 4, 5]
    assert tree.parents.tolist() == [-1, 0, 1, 2, 2, 0]
    assert tree.depths.tolist() == [0, 1, 2, 3, 3, 1]
    assert tree.children(2) == [3, 4] and tree.children(0) == [1, 5] and tree.children(5) == []
    assert tree.path_to(4) == [0, 1, 2, 4] and tree.path_tokens(4) == [1, 2, 4]


def test_ancestors_rows_are_parent_row_plus_self():
    tree = random_tree(torch.Generator().manual_seed(5), vocab=6, budget=40, horizon=5)
    mask = tree.ancestors
    assert mask.dtype == torch.bool and mask.shape == (tree.num_nodes, tree.num_nodes)
    assert mask[0].tolist() == [True] + [False] * (tree.num_nodes - 1)
    for v in range(1, tree.num_nodes):
        expected = mask[tree.parents[v]].clone()
        expected[v] = True
        assert torch.equal(mask[v], expected)
    assert torch.equal(mask.sum(1) - 1, tree.depths)  # EAGLE's depth identity


def test_chain_tree():
    tree = DraftTree.chain(4, [7, 8, 9], [-0.1, -0.2, -0.3])
    assert tree.parents.tolist() == [-1, 0, 1, 2] and tree.depths.tolist() == [0, 1, 2, 3]
    assert tree.draft_logprob.tolist() == pytest.approx([0.0, -0.1, -0.2, -0.3])


@pytest.mark.parametrize(
    "tokens,parents,message",
    [
        ([0, 1, 1], [-1, 0, 0], "sibling tokens must be distinct"),
        ([0, 1, 2], [-1, 2, 0], "parent must precede"),
        ([0, 1], [0, 0], "root"),
        ([0, -3], [-1, 0], "non-negative"),
    ],
)
def test_bad_trees_are_refused(tokens, parents, message):
    with pytest.raises(ValueError, match=message):
        DraftTree.from_parents(tokens, parents)


def test_bad_builder_arguments():
    with pytest.raises(ValueError, match="budget must be >= 0"):
        DraftTree.from_marginals(torch.zeros(2, 3), -1)
    with pytest.raises(ValueError, match=r"shape \[K, V\]"):
        DraftTree.from_marginals(torch.zeros(3), 4)
    with pytest.raises(ValueError, match="depth"):
        DraftTree(tokens=torch.tensor([0, 1]), parents=torch.tensor([-1, 0]), depths=torch.tensor([0, 2]), draft_logprob=None)
