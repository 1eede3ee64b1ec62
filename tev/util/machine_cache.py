"""What a start measured on this machine, kept for the next start.

A process that loads the target checks and times its forwards (:mod:`tev.engine.target_precision`)
and measures budget auto's cost curve (:mod:`tev.engine.cost_curve`): about 15 s of a 24 s start
on a 2-core AVX2 EPYC at one thread. Their results depend on the machine's kernels and speed, not
on the moment, so the next start on the same machine reads them back instead.

An entry is found by what it depends on: the CPU (its model name and instruction flags), the
cores this process may use, torch's and transformers' versions, torch's thread count, and the
caller's own parts (the model's shapes, the candidate forwards). Another CPU, another torch,
another thread count or another model misses and is measured again. The file is a JSON object
written whole and renamed into place, so a reader never sees half of it; a file that cannot be
read is measured over, and one that cannot be written leaves the start as it was.

``TEV_MACHINE_CACHE`` names the file's folder (default ``~/.cache/tev-explorer``); ``off``
turns the cache off (the tests' default: each test measures what it checks).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import tempfile
import time
from pathlib import Path

import torch
import transformers

__all__ = ["CACHE_ENV", "cache_file", "machine_identity", "model_shape", "recall", "remember"]

CACHE_ENV = "TEV_MACHINE_CACHE"
_FILE = "machine-measurements.json"
_VERSION = 1  # the entries' layout: another version is ignored


def cache_file() -> Path | None:
    """The cache's file, or None when ``TEV_MACHINE_CACHE=off``."""
    folder = os.environ.get(CACHE_ENV, "").strip()
    if folder.lower() == "off":
        return None
    return Path(folder or Path.home() / ".cache" / "tev-explorer") / _FILE


def _cpu() -> dict[str, str]:
    """The CPU's model name and its instruction flags (from ``/proc/cpuinfo`` where there is one)."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return {"model": platform.processor() or platform.machine(), "flags": ""}
    fields = {}
    for line in text.splitlines():
        name, _, value = line.partition(":")
        fields.setdefault(name.strip(), value.strip())
    return {"model": fields.get("model name", platform.machine()), "flags": " ".join(sorted(fields.get("flags", "").split()))}


def machine_identity() -> dict[str, object]:
    """What a measurement here depends on besides the caller's own parts."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {**_cpu(), "cores": cores, "torch": torch.__version__, "transformers": transformers.__version__, "threads": torch.get_num_threads()}


def model_shape(model) -> dict:
    """A model's config as plain values, less where it was loaded from and by which version: its
    shapes, which decide the kernels a forward runs (their speed and their rows' bits), not its
    weights' values."""
    config = model.config.to_dict()
    return {name: value for name, value in config.items() if name not in ("_name_or_path", "transformers_version")}


def _key(section: str, parts: dict) -> str:
    text = json.dumps({"section": section, "machine": machine_identity(), "parts": parts}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def _read(path: Path) -> dict:
    try:
        stored = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return stored.get("entries", {}) if isinstance(stored, dict) and stored.get("version") == _VERSION else {}


def recall(section: str, parts: dict) -> dict | None:
    """The value stored for ``section`` and ``parts`` on this machine (with ``"measured_at"``, a
    UTC date), or None."""
    path = cache_file()
    if path is None:
        return None
    entry = _read(path).get(_key(section, parts))
    return entry if isinstance(entry, dict) else None


def remember(section: str, parts: dict, value: dict) -> None:
    """Store ``value`` (plain JSON values) for ``section`` and ``parts`` on this machine; a folder
    that cannot be written is left alone."""
    path = cache_file()
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        entries = _read(path)
        entries[_key(section, parts)] = {**value, "measured_at": time.strftime("%Y-%m-%d", time.gmtime())}
        with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as handle:
            json.dump({"version": _VERSION, "entries": entries}, handle)
        os.replace(handle.name, path)
    except OSError:
        return
