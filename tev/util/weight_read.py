"""The physical reference of a decoding step: the time to read a model's weights once.

A one-token step of a small model on a CPU (or of any model on a GPU at batch 1) is bound by
memory traffic: every weight is read once per forward. Dividing a method's time per token by
this reference says how far it is from that floor (1.0 would be one weight read per token;
speculation can go below 1 because one read serves several tokens).
"""

from __future__ import annotations

import statistics
import time

import torch

__all__ = ["read_bandwidth_gb_per_s", "weight_bytes", "weight_read_reference"]


def read_bandwidth_gb_per_s(megabytes: int = 512, repeats: int = 5, device: torch.device | str = "cpu") -> float:
    """Median GB/s of summing a ``megabytes`` float32 buffer (larger than the caches) once."""
    buffer = torch.ones(megabytes * (1 << 20) // 4, dtype=torch.float32, device=device)
    buffer.sum()  # first touch: the pages are mapped before timing
    times = []
    for _ in range(repeats):
        if buffer.device.type == "cuda":
            torch.cuda.synchronize(buffer.device)
        start = time.perf_counter()
        buffer.sum().item()
        times.append(time.perf_counter() - start)
    return buffer.numel() * 4 / statistics.median(times) / 1e9


def weight_bytes(model: torch.nn.Module) -> int:
    """Bytes of ``model``'s parameters and buffers (a tied matrix counted once)."""
    tensors = {id(t): t for t in (*model.parameters(), *model.buffers())}
    return sum(t.numel() * t.element_size() for t in tensors.values())


def weight_read_reference(model: torch.nn.Module) -> dict:
    """``{"bytes", "gb_per_s", "ms"}``: the model's weight bytes, the measured read bandwidth
    of its device and the milliseconds one read of all weights takes at that bandwidth."""
    device = next(model.parameters()).device
    size = weight_bytes(model)
    bandwidth = read_bandwidth_gb_per_s(device=device)
    return {"bytes": size, "gb_per_s": bandwidth, "ms": 1e3 * size / (bandwidth * 1e9)}
