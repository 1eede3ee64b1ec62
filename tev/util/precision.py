"""Which precision is fast on this machine: measured once per process, never assumed.

On a CPU with bfloat16 instructions (AVX-512 BF16, AMX) a bfloat16 matrix product of a few
rows runs about 2x faster than float32; on one without them (AVX2-only parts, AVX-512 Xeons
before Cooper Lake) torch emulates it, about 145x slower. Every optional bfloat16 path of the
project (the drafter's weights at inference, its training autocast, the data writer, the
feature caches, the greedy head screen) asks :func:`low_precision` which dtype to use.

``TEV_CPU_BF16=1`` / ``=0`` forces the CPU's answer (tests force each branch this way).
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

import torch

from tev.util.int8_head import INT8_ENV, int8_head_speedup, use_int8_head
from tev.util.timing import median_seconds

__all__ = ["cpu_capability", "bf16_speedup", "low_precision", "precision_record", "part_dtype", "figure_precision", "precision_summary", "FORCE_ENV"]

FORCE_ENV = "TEV_CPU_BF16"
# A product the size of the drafter's work in a round: 16 rows through a 576-wide layer.
_PROBE_SHAPE = (16, 576, 4096)
_WORTH_IT = 1.2  # bfloat16 is used only when measured at least this much faster


def cpu_capability(cpuinfo: Path = Path("/proc/cpuinfo")) -> str:
    """torch's vector capability (``AVX2``, ``AVX512``, ...), refined by the CPU's own flags to
    ``AVX512_BF16`` or ``AMX`` where it has bfloat16 instructions."""
    capability = torch.backends.cpu.get_cpu_capability()
    try:
        flags = next((line.split(":", 1)[1].split() for line in cpuinfo.read_text().splitlines() if line.startswith("flags")), [])
    except OSError:
        flags = []
    if "amx_bf16" in flags:
        return "AMX"
    if "avx512_bf16" in flags:
        return "AVX512_BF16"
    return capability


@functools.cache
def bf16_speedup(shape: tuple[int, int, int] = _PROBE_SHAPE) -> float:
    """float32 time / bfloat16 time of a ``(rows, inner, cols)`` product on this CPU (> 1:
    bfloat16 is faster); by default the probe, a product the size of a drafter's pass. A few
    milliseconds where bfloat16 is native; where it is emulated, the first slow run ends it."""
    rows, inner, cols = shape
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(rows, inner, generator=generator)
    b = torch.randn(inner, cols, generator=generator)
    repeats = 7 if rows * inner * cols >= 2**24 else 31  # a small product is timed more often: its runs are noisier
    full = median_seconds(lambda: a @ b, repeats)
    a, b = a.bfloat16(), b.bfloat16()
    half = median_seconds(lambda: a @ b, repeats, give_up=4 * full)
    return full / half


def low_precision(device: torch.device | str = "cpu", shape: tuple[int, int, int] | None = None) -> torch.dtype:
    """bfloat16 where it is faster on ``device``, float32 otherwise. On CUDA bfloat16; on a
    CPU by measurement (:func:`bf16_speedup`, of ``shape`` where the caller's products are of
    another size than the probe's) unless ``TEV_CPU_BF16`` forces it."""
    if torch.device(device).type == "cuda":
        return torch.bfloat16
    forced = os.environ.get(FORCE_ENV, "").strip()
    if forced in ("0", "1"):
        return torch.bfloat16 if forced == "1" else torch.float32
    speedup = bf16_speedup() if shape is None else bf16_speedup(shape)
    return torch.bfloat16 if speedup >= _WORTH_IT else torch.float32


def precision_record(device: torch.device | str = "cpu") -> dict:
    """What a figure's reader needs to know of the machine: the CPU's capability, torch's
    threads, bfloat16's measured speed-up and the low precision chosen here."""
    record = {"cpu_capability": cpu_capability(), "threads": torch.get_num_threads(),
              "low_precision": str(low_precision(device)).removeprefix("torch.")}
    if torch.device(device).type == "cpu":
        record["bf16_matmul_speedup"] = round(bf16_speedup(), 2)
        forced = os.environ.get(FORCE_ENV, "").strip()
        if forced in ("0", "1"):
            record["forced_by"] = f"{FORCE_ENV}={forced}"
        record["draft_head"] = "int8" if use_int8_head(device) else "float"
        if os.environ.get(INT8_ENV, "").strip() not in ("0", "1"):
            record["int8_head_speedup"] = round(int8_head_speedup(), 2)
    return record


def part_dtype(part) -> str:
    """The dtype a model part computes in: its own ``dtype`` where it states one, else its
    first floating-point parameter's (a drafter wrapper is read through its ``model``)."""
    stated = getattr(part, "dtype", None)
    if isinstance(stated, torch.dtype):
        return str(stated).removeprefix("torch.")
    module = part if isinstance(part, torch.nn.Module) else getattr(part, "model", None)
    if isinstance(module, torch.nn.Module):
        for parameter in module.parameters():
            if parameter.is_floating_point():
                return str(parameter.dtype).removeprefix("torch.")
    return "unknown"


def figure_precision(device: torch.device | str, target, drafters: dict | None = None, target_forward: str | None = None) -> dict:
    """:func:`precision_record` plus the precision each part ran in: ``target_dtype`` (the loaded
    weights'), ``target_forward`` (the forward its sessions ran, e.g. ``row-invariant bfloat16``,
    when one was chosen) and ``drafter_dtypes`` (``{name: dtype}``), for a figure's JSON."""
    record = {**precision_record(device), "target_dtype": part_dtype(target),
              "drafter_dtypes": {name: part_dtype(drafter) for name, drafter in (drafters or {}).items()}}
    if target_forward:
        record["target_forward"] = target_forward
    return record


def precision_summary(record: dict) -> str:
    """One line from :func:`figure_precision`: capability, threads, the low precision chosen
    (and why), each part's dtype."""
    speedup = f", bf16 matmul {record['bf16_matmul_speedup']:g}x float32" if "bf16_matmul_speedup" in record else ""
    chosen = f"low precision {record['low_precision']}" + (f" ({record['forced_by']})" if "forced_by" in record else speedup)
    target = f"target {record['target_dtype']}" + (f" (its forward: {record['target_forward']})" if record.get("target_forward") else "")
    parts = ", ".join([target, *(f"{name} {dtype}" for name, dtype in record["drafter_dtypes"].items())])
    if "draft_head" in record:
        speed = f", {record['int8_head_speedup']:g}x float32" if "int8_head_speedup" in record else ""
        parts += f"; drafters' head rows {record['draft_head']}{speed}"
    return f"CPU capability {record['cpu_capability']}, {record['threads']} threads, {chosen}; {parts}"
