"""Tree attention's one rule: each new row sees a prefix of the cache and its own path, nothing else."""

import torch

from tev.core.tree import DraftTree
from tev.core.visibility import attention_bias, chain_ancestors, slot_visibility, tree_visibility, window_visibility


def test_a_tree_after_the_cache_sees_the_cache_and_its_own_path():
    tree = DraftTree.from_parents([5, 6, 7, 8], [-1, 0, 0, 1], [0.0, -0.1, -0.2, -0.3])
    visible = tree_visibility(3, tree.ancestors)
    assert visible.shape == (4, 7) and visible[:, :3].all()
    assert visible[:, 3:].tolist() == [[True, False, False, False], [True, True, False, False], [True, False, True, False], [True, True, False, True]]
    chain = tree_visibility(2, chain_ancestors(3))
    assert chain.tolist() == [[True, True, True, False, False], [True, True, True, True, False], [True, True, True, True, True]]


def test_trees_side_by_side_each_see_the_text_up_to_their_own_root_and_not_each_other():
    block = torch.block_diag(chain_ancestors(2), chain_ancestors(1))
    visible = tree_visibility(4, block, torch.tensor([2, 2, 4]))
    assert visible.tolist() == [[True, True, False, False, True, False, False], [True, True, False, False, True, True, False],
                                [True, True, True, True, False, False, True]]
    assert tree_visibility(4, block, 1)[:, :4].sum(dim=1).tolist() == [1, 1, 1]


def test_a_depth_of_a_growing_tree_sees_the_prefix_its_ancestors_slots_and_itself():
    visible = slot_visibility(2, 3, [[0], [0, 2], []])
    assert visible.shape == (3, 8) and slot_visibility(1, 0, []).shape == (0, 1)  # no new rows: an empty mask of the right width
    assert visible.tolist() == [[True, True, True, False, False, True, False, False], [True, True, True, False, True, False, True, False],
                                [True, True, False, False, False, False, False, True]]


def test_a_drafters_slots_see_their_windows_valid_entries_and_the_slots_it_lets_them():
    valid = torch.tensor([[False, True, True], [True, True, True]])  # the first window's history was one entry short
    causal = window_visibility(valid, torch.ones(2, 2, dtype=torch.bool).tril())  # the path drafter: the slots above
    assert causal.shape == (2, 2, 5)
    assert causal[0].tolist() == [[False, True, True, True, False], [False, True, True, True, True]]
    assert causal[1, :, :3].all() and causal[1, :, 3:].tolist() == [[True, False], [True, True]]
    every = window_visibility(valid, torch.ones(1, 3, dtype=torch.bool))  # the block drafter: one row for every slot
    assert every.shape == (2, 1, 6) and every[0, 0].tolist() == [False, True, True, True, True, True]
    bias = attention_bias(causal, torch.float32)
    assert (bias[causal] == 0).all() and (bias[~causal] == torch.finfo(torch.float32).min).all()
