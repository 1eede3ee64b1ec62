"""The drafter's int8 head rows: close to the float product, chosen by measurement or by
``TEV_INT8_HEAD``, used only at inference (training keeps its gradient through float rows)."""

import torch

from tev.util import int8_head
from tev.util.int8_head import INT8_ENV, Int8Head, use_int8_head
from tests.tiny import tiny_block_drafter, tiny_target


def test_the_int8_product_is_the_float_product_within_a_percent_of_its_range():
    generator = torch.Generator().manual_seed(0)
    rows = torch.randn(300, 64, generator=generator) * torch.linspace(0.1, 3.0, 300)[:, None]  # rows of very different scales
    hidden = torch.randn(2, 5, 64, generator=generator)
    exact = hidden @ rows.T
    product = Int8Head(rows)(hidden)
    assert product.shape == (2, 5, 300) and product.dtype == torch.float32
    assert (product - exact).abs().max() < 0.02 * exact.abs().max()


def test_the_choice_is_forced_by_the_environment_or_measured(monkeypatch):
    monkeypatch.setenv(INT8_ENV, "1")
    assert use_int8_head("cpu")
    monkeypatch.setenv(INT8_ENV, "0")
    assert not use_int8_head("cpu")
    assert not use_int8_head("meta")  # only a CPU reads int8 rows
    monkeypatch.delenv(INT8_ENV)
    monkeypatch.setattr(int8_head, "int8_head_speedup", lambda: 1.1)
    assert not use_int8_head("cpu")  # measured, and not fast enough to be worth it
    monkeypatch.setattr(int8_head, "int8_head_speedup", lambda: 4.0)
    assert use_int8_head("cpu")


def test_the_speedup_is_measured_on_this_machine():
    int8_head.int8_head_speedup.cache_clear()
    speedup = int8_head.int8_head_speedup()
    assert speedup == 0.0 or speedup > 0.05  # 0 where torch lacks the kernel; a real ratio otherwise


def test_a_drafter_reads_int8_rows_at_inference_and_float_rows_in_training(monkeypatch):
    monkeypatch.setenv(INT8_ENV, "1")
    target = tiny_target(48, scale=3.0)
    for conditioning in ("marginal", "path"):
        model = tiny_block_drafter(target, conditioning=conditioning).model
        features = torch.randn(6, model.config.feature_size)
        window, valid = model.window(features)
        model.train()
        trained = model.draft_logits(window, valid, torch.tensor([5]))
        assert trained.requires_grad  # the gradient flows through float rows
        model.eval()
        with torch.no_grad():
            served = model.draft_logits(window, valid, torch.tensor([5]))
            monkeypatch.setenv(INT8_ENV, "0")
            exact = model.draft_logits(window, valid, torch.tensor([5]))
            monkeypatch.setenv(INT8_ENV, "1")
        assert not torch.equal(served, exact)  # the int8 rows were read
        assert (served - exact).abs().max() < 0.05 * exact.abs().max() + 1e-3


def test_the_int8_rows_hold_a_quarter_of_the_float_bytes_and_say_so():
    rows = torch.randn(300, 64)
    head = Int8Head(rows)
    assert head.nbytes == 300 * 64 + 300 * 8  # int8 rows and a float64 scale per row
    assert head.nbytes < rows.numel() * rows.element_size() / 3


def test_the_direct_kernel_call_is_the_quantised_modules_own_product_bit_for_bit():
    generator = torch.Generator().manual_seed(1)
    head = Int8Head(torch.randn(257, 96, generator=generator))
    for rows in (1, 3, 16):
        hidden = torch.randn(rows, 96, generator=generator)
        assert torch.equal(head(hidden), head._linear(hidden))
