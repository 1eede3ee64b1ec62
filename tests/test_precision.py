"""Precision follows what the CPU does: each branch forced, and the measurement's own logic."""

import torch

from tev.util import int8_head, precision


def test_forced_float32_on_a_cpu(monkeypatch):
    monkeypatch.setenv(precision.FORCE_ENV, "0")
    assert precision.low_precision("cpu") == torch.float32


def test_forced_bfloat16_on_a_cpu(monkeypatch):
    monkeypatch.setenv(precision.FORCE_ENV, "1")
    assert precision.low_precision("cpu") == torch.bfloat16


def test_measured_choice_follows_the_speedup(monkeypatch):
    monkeypatch.delenv(precision.FORCE_ENV, raising=False)
    monkeypatch.setattr(precision, "bf16_speedup", lambda: 1 / 145)  # emulated bfloat16 (AVX2)
    assert precision.low_precision("cpu") == torch.float32
    monkeypatch.setattr(precision, "bf16_speedup", lambda: 2.3)  # native bfloat16 instructions
    assert precision.low_precision("cpu") == torch.bfloat16


def test_a_caller_of_other_sized_products_is_measured_on_its_own_size(monkeypatch):
    # bfloat16 can speed up a drafter's pass and slow down a path drafter's few-row step on one CPU
    monkeypatch.delenv(precision.FORCE_ENV, raising=False)
    monkeypatch.setattr(precision, "bf16_speedup", lambda shape=(16, 576, 4096): 2.0 if shape[0] >= 16 else 0.5)
    assert precision.low_precision("cpu") == torch.bfloat16
    assert precision.low_precision("cpu", (4, 256, 1536)) == torch.float32
    monkeypatch.setattr(precision, "bf16_speedup", lambda shape=None: 2.0)
    from tev.engine.path_drafter import PathDrafter
    from tests.tiny import tiny_block_drafter, tiny_target

    model = tiny_block_drafter(tiny_target(48), conditioning="path").model
    assert isinstance(model, PathDrafter) and model.served().feature_proj.weight.dtype == torch.bfloat16
    monkeypatch.setattr(precision, "bf16_speedup", lambda shape=None: 0.5 if shape == PathDrafter.PRECISION_SHAPE else 2.0)
    assert model.served().feature_proj.weight.dtype == torch.float32  # measured on its own step's size


def test_real_measurement_of_a_small_product_is_a_ratio():
    assert precision.bf16_speedup((4, 64, 128)) > 0


def test_cuda_is_bfloat16_whatever_the_cpu(monkeypatch):
    monkeypatch.setenv(precision.FORCE_ENV, "0")
    assert precision.low_precision("cuda") == torch.bfloat16


def test_capability_names_bf16_instructions(tmp_path):
    avx2 = tmp_path / "avx2"
    avx2.write_text("processor\t: 0\nflags\t\t: fpu sse avx avx2 fma\n")
    bf16 = tmp_path / "bf16"
    bf16.write_text("processor\t: 0\nflags\t\t: fpu avx2 avx512f avx512_bf16\n")
    amx = tmp_path / "amx"
    amx.write_text("processor\t: 0\nflags\t\t: avx512f avx512_bf16 amx_bf16 amx_tile\n")
    assert precision.cpu_capability(bf16) == "AVX512_BF16"
    assert precision.cpu_capability(amx) == "AMX"
    assert precision.cpu_capability(avx2) == torch.backends.cpu.get_cpu_capability()


def test_record_says_what_was_forced(monkeypatch):
    monkeypatch.setenv(precision.FORCE_ENV, "0")
    record = precision.precision_record("cpu")
    assert record["low_precision"] == "float32"
    assert record["forced_by"] == "TEV_CPU_BF16=0"
    assert record["threads"] == torch.get_num_threads()


def test_figure_precision_names_each_part(monkeypatch):
    monkeypatch.setenv(precision.FORCE_ENV, "1")
    target = torch.nn.Linear(2, 2)
    drafter = type("Wrapper", (), {"model": torch.nn.Linear(2, 2).bfloat16()})()  # a drafter read through its model
    record = precision.figure_precision("cpu", target, {"block": drafter})
    assert record["target_dtype"] == "float32" and record["drafter_dtypes"] == {"block": "bfloat16"}
    assert record["cpu_capability"] == precision.cpu_capability() and record["low_precision"] == "bfloat16"
    line = precision.precision_summary(record)
    assert line.startswith(f"CPU capability {record['cpu_capability']}, {torch.get_num_threads()} threads, low precision bfloat16 (TEV_CPU_BF16=1)")
    assert line.endswith("target float32, block bfloat16; drafters' head rows float")  # TEV_INT8_HEAD=0 in the tests


def test_record_says_how_drafters_read_their_head(monkeypatch):
    monkeypatch.setenv("TEV_INT8_HEAD", "1")
    assert precision.precision_record("cpu")["draft_head"] == "int8"
    monkeypatch.delenv("TEV_INT8_HEAD")
    for module in (precision, int8_head):  # measured: 5x faster
        monkeypatch.setattr(module, "int8_head_speedup", lambda: 5.0)
    record = precision.precision_record("cpu")
    assert record["draft_head"] == "int8" and record["int8_head_speedup"] == 5.0
    assert precision.precision_summary({**record, "target_dtype": "float32", "drafter_dtypes": {}}).endswith("drafters' head rows int8, 5x float32")
