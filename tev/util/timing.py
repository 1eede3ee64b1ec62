"""Stage timing that is honest on CPU and CUDA, and the machine description reports carry."""

from __future__ import annotations

import os
import platform
import time
from contextlib import contextmanager

import torch

__all__ = ["StageTimer", "cuda_event_time", "wall_time", "median_seconds", "time_once", "machine_info", "machine_summary"]


class StageTimer:
    """Accumulates wall time per named stage.

    On CUDA it synchronises around each stage so the time is the stage's own work (the
    engine is sync-bound anyway: every verdict crosses to the host once).
    """

    def __init__(self, device: torch.device | str = "cpu"):
        self.cuda = torch.device(device).type == "cuda"
        self.seconds: dict[str, float] = {}

    @contextmanager
    def stage(self, name: str):
        if self.cuda:
            torch.cuda.synchronize()
        start = time.perf_counter()
        try:
            yield
        finally:
            if self.cuda:
                torch.cuda.synchronize()
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start


def cuda_event_time(fn, device) -> float:
    """Seconds of GPU time for ``fn()`` measured with CUDA events."""
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize(device)
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize(device)
    return start.elapsed_time(end) / 1000.0


def wall_time(fn) -> float:
    """Seconds of wall time for ``fn()``."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def median_seconds(fn, repeats: int, give_up: float = float("inf")) -> float:
    """Median wall time of ``fn()`` over ``repeats`` runs after one warm-up; the first run slower
    than ``give_up`` seconds ends it and is returned (an emulated kernel need not be timed long)."""
    fn()
    times = []
    for _ in range(repeats):
        times.append(wall_time(fn))
        if times[-1] > give_up:
            return times[-1]
    return sorted(times)[len(times) // 2]


def time_once(fn, device) -> float:
    """Seconds for one ``fn()``: CUDA events on a CUDA device, wall time otherwise."""
    if torch.device(device).type == "cuda":
        return cuda_event_time(fn, device)
    return wall_time(fn)


def machine_info(device: torch.device | str = "cpu") -> dict:
    """What a reader needs to judge a timing: CPU, threads, torch, device."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    device = torch.device(device)
    info = {
        "cpu": cpu,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "device": str(device),
    }
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    return info


def machine_summary(info: dict) -> str:
    """One line from :func:`machine_info`: CPU, threads, torch, device (and GPU)."""
    gpu = f" ({info['gpu']})" if "gpu" in info else ""
    return f"{info['cpu']}, {info['torch_threads']} threads, torch {info['torch']}, device {info['device']}{gpu}"
