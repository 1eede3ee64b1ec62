"""The target's features and soft labels of a drafter's training data, cached on disk in parts.

The feature forward of ten shards is about an hour of a 2-core CPU, so the cache is written as it
goes: a part of :data:`PART_SEQUENCES` sequences at a time, each an atomic safetensors file, and a
stopped build redoes at most one part. The parts live under a key of what they depend on (the
feature layers, the token ids, the lengths, the draft vocabulary, the soft labels' width); a folder
of another key is emptied first. The features are stored in bfloat16 whatever the forward ran in:
ten shards of float32 features, right-padded, are about 21 GB, nearly all of these machines' 24 GB,
and the drafter reads them through its own norm and projection (the shipped drafters were trained
on bfloat16 features).
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from tqdm import tqdm

from tev.train.data import SoftLabels
from tev.train.teacher import target_features
from tev.util.files import atomic_file, write_text_atomic

__all__ = ["PART_SEQUENCES", "FEATURE_STORE", "feature_key", "cached_features"]

PART_SEQUENCES = 256  # a part: about a minute of a 2-core CPU's forward, the most a stop loses
FEATURE_STORE = torch.bfloat16


def feature_key(ids: torch.Tensor, lengths: torch.Tensor, layers: list[int], vocab: torch.Tensor, soft_top: int) -> dict:
    """What the cached features of ``ids`` (`LongTensor[S, T]`) depend on, as JSON values."""
    return {"layers": list(layers), "ids": hashlib.sha256(ids.numpy().tobytes()).hexdigest(), "lengths": lengths.tolist(),
            "vocab": hashlib.sha256(vocab.numpy().tobytes()).hexdigest(), "soft_top": soft_top, "store": str(FEATURE_STORE).removeprefix("torch."),
            "part_sequences": PART_SEQUENCES}


def cached_features(folder: Path, target, ids: torch.Tensor, lengths: torch.Tensor, layers: list[int], vocab: torch.Tensor, soft_top: int,
                    progress: bool = True) -> tuple[torch.Tensor, SoftLabels]:
    """Features `[S, T, F]` (bfloat16) and the target's top-``soft_top`` laws over ``vocab`` of the
    right-padded sequences ``ids`` (`LongTensor[S, T]`, ``lengths`` `[S]`), from the parts in
    ``folder``, computing the parts it lacks."""
    folder = Path(folder)
    key = feature_key(ids, lengths, layers, vocab, soft_top)
    key_file = folder / "key.json"
    if not (key_file.is_file() and json.loads(key_file.read_text()) == key):
        shutil.rmtree(folder, ignore_errors=True)  # another build's parts, or a cache of the single-file format
        folder.mkdir(parents=True)
        write_text_atomic(key_file, json.dumps(key))
    order = torch.argsort(lengths, descending=True, stable=True)  # similar lengths share a part: less padding
    parts = [order[start : start + PART_SEQUENCES] for start in range(0, len(order), PART_SEQUENCES)]
    features = soft = None
    for number, rows in enumerate(tqdm(parts, desc="target features", unit="part", disable=not progress)):
        part = _part(folder / f"part-{number:04d}.safetensors", target, ids, lengths, rows, layers, vocab, soft_top)
        if features is None:
            features = torch.zeros(*ids.shape, part["features"].shape[-1], dtype=FEATURE_STORE)
            soft = SoftLabels(torch.zeros(*ids.shape, part["soft_positions"].shape[-1], dtype=part["soft_positions"].dtype),
                              torch.zeros(*ids.shape, part["soft_probs"].shape[-1], dtype=part["soft_probs"].dtype))
        width = part["features"].shape[1]
        features[rows, :width] = part["features"]
        soft.positions[rows, :width] = part["soft_positions"]
        soft.probs[rows, :width] = part["soft_probs"]
    return features, soft


def _part(path: Path, target, ids, lengths, rows: torch.Tensor, layers, vocab, soft_top: int) -> dict:
    """One part's tensors (``rows``' features and soft labels, as wide as its longest sequence),
    read from ``path`` or computed and saved there. A saved part holds these ``rows``: the folder's key
    fixes the order and the part size."""
    if path.is_file():
        return load_file(path)
    width = int(lengths[rows].max())
    features, soft = target_features(target, ids[rows, :width], lengths[rows], layers, progress=False, soft_vocab=vocab, soft_top=soft_top, store=FEATURE_STORE)
    part = {"rows": rows.contiguous(), "features": features, "soft_positions": soft.positions, "soft_probs": soft.probs}
    with atomic_file(path) as temporary:
        save_file(part, temporary)
    return part
