"""The bfloat16 head screen returns the float32 argmax, near ties included."""

import pytest
import torch

import tev.core.head_screen as head_screen
from tev.core.head_screen import HeadScreen
from tev.core.tree import DraftTree
from tev.core.sampling import SamplingLaw
from tev.core.verify import verify_rows
from tev.engine.session import HeadRows


def random_head(vocab=3000, size=64, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(vocab, size, generator=generator) * 0.5, generator


def test_screen_argmax_equals_the_float32_argmax_on_random_rows():
    head, generator = random_head()
    screen = HeadScreen(head)
    assert screen.enabled
    for scale in (0.1, 3.0, 40.0):
        hidden = scale * torch.randn(200, head.shape[1], generator=generator)
        expected = torch.nn.functional.linear(hidden, head).argmax(dim=-1)
        assert torch.equal(screen.argmax(hidden), expected)


def test_a_tie_the_bfloat16_copy_cannot_see_is_broken_as_in_float32():
    # rows 5 and 9 round to the same bfloat16 row; in float32, row 9 is larger by 1e-4 along dimension 0
    head, generator = random_head(vocab=50, size=16)
    head[5] = torch.randn(16, generator=generator).bfloat16().float()
    head[9] = head[5].clone()
    head[9, 0] += 1e-4
    hidden = 50 * head[5].unsqueeze(0).clone()
    hidden[0, 0] = abs(float(hidden[0, 0])) + 1.0  # dimension 0 counts positively
    exact = torch.nn.functional.linear(hidden, head)
    assert int(exact.argmax()) == 9
    assert torch.equal(HeadScreen(head).screen[5], HeadScreen(head).screen[9])  # the screen alone sees a tie
    assert int(HeadScreen(head).argmax(hidden)) == 9


def test_rows_of_near_duplicate_tokens_each_get_their_float32_winner():
    # groups of 4 tokens whose rows (mostly) round to one bfloat16 row, yet differ clearly in float32
    # (gaps far above float32 rounding, which can order two float32 kernels' near-equal sums either way)
    generator = torch.Generator().manual_seed(5)
    base = torch.randn(40, 24, generator=generator).bfloat16().float()
    head = base.repeat_interleave(4, dim=0)  # [160, 24]
    head += 2e-4 * torch.randn(head.shape, generator=generator)  # below bfloat16's spacing near 1 (2^-8)
    screen = HeadScreen(head)
    for _ in range(20):
        groups = torch.randint(0, 40, (7,), generator=generator)
        hidden = 30 * base[groups] + 0.01 * torch.randn(7, 24, generator=generator)
        expected = torch.nn.functional.linear(hidden, head).argmax(dim=-1)
        assert torch.equal(screen.argmax(hidden), expected)
        assert torch.equal(expected // 4, groups)  # the winner is in the row's group, decided below the copy's resolution
    assert (screen.screen.view(40, 4, 24) == screen.screen.view(40, 4, 24)[:, :1]).float().mean() > 0.8  # the copy cannot tell most apart


def test_a_head_changed_in_place_is_screened_afresh():
    head, generator = random_head(vocab=100, size=32)
    screen = HeadScreen(head)
    hidden = torch.randn(8, 32, generator=generator)
    assert torch.equal(screen.argmax(hidden), torch.nn.functional.linear(hidden, head).argmax(dim=-1))  # the copy is made
    with torch.no_grad():
        head[7] = 100 * hidden.mean(0)  # now token 7 wins most rows
    assert torch.equal(screen.argmax(hidden), torch.nn.functional.linear(hidden, head).argmax(dim=-1))


def test_without_float32_accumulation_the_screen_is_off_and_exact(monkeypatch):
    monkeypatch.setattr(head_screen, "_accumulates_in_float32", lambda: False)
    head, generator = random_head(vocab=100, size=32)
    screen = HeadScreen(head)
    assert not screen.enabled
    hidden = torch.randn(4, 32, generator=generator)
    assert torch.equal(screen.argmax(hidden), torch.nn.functional.linear(hidden, head).argmax(dim=-1))


def test_non_finite_hidden_states_fall_back_to_float32():
    head, generator = random_head(vocab=100, size=32)
    hidden = torch.randn(3, 32, generator=generator)
    hidden[1, 4] = float("inf")
    expected = torch.nn.functional.linear(hidden, head).argmax(dim=-1)
    assert torch.equal(HeadScreen(head).argmax(hidden), expected)


def test_greedy_verdicts_are_the_same_with_and_without_the_screen():
    head, generator = random_head(vocab=400, size=32, seed=3)
    screen = HeadScreen(head)
    for trial in range(20):
        hidden = 8 * torch.randn(16, 32, generator=generator)
        best = torch.nn.functional.linear(hidden, head).argmax(dim=-1).tolist()
        # a tree that follows the target's argmax for a while (nodes 1, 2), then branches off it
        tree = DraftTree.from_paths(0, [[best[0], best[1] if trial % 2 else 3, 5], [7, 8], [best[0], 11], [13, 14, 15, 16]])
        hidden = hidden[: tree.num_nodes]
        plain = HeadRows(hidden, head, SamplingLaw(0.0))
        screened = HeadRows(hidden, head, SamplingLaw(0.0), screen)
        a, b = verify_rows("greedy", tree, plain), verify_rows("greedy", tree, screened)
        assert (a.path, a.bonus_token) == (b.path, b.bonus_token)
        assert torch.equal(plain.edge_prob(tree), screened.edge_prob(tree))


def test_the_screen_is_used_only_at_temperature_zero():
    head, generator = random_head(vocab=100, size=32)
    hidden = torch.randn(4, 32, generator=generator)
    assert HeadRows(hidden, head, SamplingLaw(1.0), HeadScreen(head)).screen is None
    assert HeadRows(hidden, head, SamplingLaw(0.0), HeadScreen(head)).screen is not None


def test_a_float16_head_is_refused():
    with pytest.raises(ValueError, match="float32"):
        HeadScreen(torch.zeros(10, 4, dtype=torch.float16))
