"""The physical reference: a model's weight bytes and the time to read them once."""

import pytest
import torch

from tev.util.weight_read import read_bandwidth_gb_per_s, weight_bytes, weight_read_reference
from tests.tiny import tiny_target


def test_weight_bytes_count_a_tied_matrix_once_and_every_dtype_by_its_size():
    layer = torch.nn.Linear(10, 4)  # 40 weights + 4 biases, float32
    assert weight_bytes(layer) == 44 * 4
    tied = torch.nn.Sequential(torch.nn.Embedding(8, 3), torch.nn.Linear(3, 8, bias=False))
    tied[1].weight = tied[0].weight
    assert weight_bytes(tied) == 24 * 4
    assert weight_bytes(layer.to(torch.bfloat16)) == 44 * 2


def test_the_reference_is_bytes_over_the_measured_bandwidth():
    model = tiny_target(64)
    reference = weight_read_reference(model)
    assert reference["bytes"] == weight_bytes(model) > 0
    assert reference["gb_per_s"] > 0.1  # any machine reads faster than 100 MB/s
    # the same quotient in another order: three float64 roundings each side, so within 6 * 2^-53
    assert reference["ms"] == pytest.approx(reference["bytes"] / (reference["gb_per_s"] * 1e9) * 1e3, rel=6 * 2.0**-53, abs=0)
    assert read_bandwidth_gb_per_s(megabytes=8, repeats=2) > 0.1
