"""Drafter training data: target-written sequences, where their anchors lie, and what an anchor
reads.

One anchor convention for every use (distillation, workload adaptation, ExitTrain): anchor ``t``
reads the target's features up to position ``t``; its root is token ``x_{t+1}`` and its labels
are ``x_{t+2} .. x_{t+1+K}``. A decoding round whose root sits at position ``r`` is anchor
``r - 1``, so the first anchor of a sequence is ``prompt_length - 2``: its root is the last
prompt token, as at decoding time, and the first round's tree is trained too. The last anchor
is ``length - 3`` (at least one label).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from tev.util.files import atomic_file

__all__ = ["IGNORE", "DOMAINS", "SoftLabels", "TrainData", "save_train_data", "load_train_data"]

IGNORE = -100  # label of a depth past the end of a sequence (or outside a draft vocabulary)
DOMAINS = ("dialogue", "code", "math")


@dataclass
class SoftLabels:
    """The target's next-token law at every position, cut to its top tokens (the one soft-label form).

    Attributes:
        positions: `Tensor[S, T, k]` (int16 or int32), indices into the draft vocabulary.
        probs: `Tensor[S, T, k]` (float16 or float32), the law over them
            (:func:`tev.train.teacher.top_law`); renormalised when read, as float16 storage or a
            cache cut to fewer tokens than it stores leaves it slightly off 1.
    """

    positions: torch.Tensor
    probs: torch.Tensor

    def top(self, k: int) -> "SoftLabels":
        """The laws cut to their ``k`` most likely tokens (stored most likely first)."""
        if k >= self.positions.shape[-1]:
            return self
        return SoftLabels(self.positions[..., :k].contiguous(), self.probs[..., :k].contiguous())


@dataclass
class TrainData:
    """Target-written sequences, optionally with the target's features and soft labels: the one
    training-data type, from the target's answers to a workload's prompts and its chat
    conversations (as lists, :meth:`from_lists`; as JSON, :meth:`to_json`) to the batches a step reads.

    Attributes:
        token_ids: `LongTensor[S, T]`, right-padded.
        lengths: `LongTensor[S]`, each row's real length.
        prompt_lengths: `LongTensor[S]`, where the target's own text starts (a continuation or an answer).
        features: `Tensor[S, T, F]`, target hidden states at the feature layers, or None (then an
            on-policy step computes them for the rows it draws).
        soft: the target's laws at every position, or None.
        domains: one of :data:`DOMAINS` per row, or None.
        requests: the user message of each row (chat conversations), or None.
    """

    token_ids: torch.Tensor
    lengths: torch.Tensor
    prompt_lengths: torch.Tensor
    features: torch.Tensor | None = None
    soft: SoftLabels | None = None
    domains: list[str] | None = None
    requests: list[str] | None = None

    def __post_init__(self):
        rows = self.token_ids.shape[0] if self.token_ids.dim() == 2 else 0
        if rows < 1:
            raise ValueError("no training sequences: expected ids of shape [S, T] with S >= 1")
        if self.lengths.shape != (rows,) or self.prompt_lengths.shape != (rows,):
            raise ValueError("lengths and prompt_lengths need one entry per sequence")
        if bool((self.lengths > self.token_ids.shape[1]).any()) or bool((self.prompt_lengths < 2).any()):
            raise ValueError("a length exceeds the padded width, or a prompt is shorter than two tokens")
        if bool((self.spans < 1).any()):
            raise ValueError("every sequence needs room for an anchor and a label after its prompt")
        if self.domains is not None and len(self.domains) != rows:
            raise ValueError("domains need one entry per sequence")
        if self.requests is not None and len(self.requests) != rows:
            raise ValueError("requests need one entry per sequence")

    @classmethod
    def of(cls, sequences: torch.Tensor, prompt_length: int) -> "TrainData":
        """Fixed-length sequences `LongTensor[S, T]` whose target text starts at ``prompt_length``."""
        rows = sequences.shape[0]
        return cls(sequences.long(), torch.full((rows,), sequences.shape[1]), torch.full((rows,), prompt_length))

    @classmethod
    def from_lists(cls, sequences: list[list[int]], prompt_lengths: list[int], pad_id: int = 0, domains: list[str] | None = None,
                   requests: list[str] | None = None) -> "TrainData":
        """Variable-length sequences, right-padded with ``pad_id`` (never attended to nor labelled)."""
        ids = torch.full((len(sequences), max(len(s) for s in sequences)), pad_id, dtype=torch.long)
        for row, sequence in enumerate(sequences):
            ids[row, : len(sequence)] = torch.tensor(sequence)
        return cls(ids, torch.tensor([len(s) for s in sequences]), torch.tensor(prompt_lengths), domains=domains, requests=requests)

    @classmethod
    def from_json(cls, data: dict, pad_id: int = 0) -> "TrainData":
        """Sequences as :meth:`to_json` wrote them."""
        return cls.from_lists(data["token_ids"], data["prompt_lengths"], pad_id, data.get("domains"), data.get("requests"))

    def to_json(self) -> dict:
        """The sequences as JSON lists (``token_ids``, ``prompt_lengths``, ``domains``, ``requests``); features are not kept."""
        return {"token_ids": self.sequences, "prompt_lengths": self.prompt_lengths.tolist(), "domains": self.domains, "requests": self.requests}

    @classmethod
    def concat(cls, parts: list["TrainData"], pad_id: int = 0) -> "TrainData":
        """The sequences of ``parts``, one after another (their features are not kept)."""
        joined = lambda name: None if any(getattr(p, name) is None for p in parts) else sum((getattr(p, name) for p in parts), [])  # noqa: E731
        return cls.from_lists([s for p in parts for s in p.sequences], [n for p in parts for n in p.prompt_lengths.tolist()], pad_id,
                              joined("domains"), joined("requests"))

    def __len__(self) -> int:
        return self.token_ids.shape[0]

    @property
    def sequences(self) -> list[list[int]]:
        """Each row's ids without its padding."""
        return [row[:length] for row, length in zip(self.token_ids.tolist(), self.lengths.tolist())]

    @property
    def response_tokens(self) -> int:
        """The tokens the target wrote (after the prompts)."""
        return int((self.lengths - self.prompt_lengths).sum())

    @property
    def first_anchors(self) -> torch.Tensor:
        """`LongTensor[S]`: each row's first anchor (its root is the last prompt token)."""
        return self.prompt_lengths - 2

    @property
    def spans(self) -> torch.Tensor:
        """`LongTensor[S]`: how many anchors each row has (``first .. length - 3``)."""
        return self.lengths - 2 - self.first_anchors

    @property
    def anchors(self) -> torch.Tensor:
        """`LongTensor[A, 2]` of (row, anchor) over every row, in order."""
        pieces = []
        for row, (first, span) in enumerate(zip(self.first_anchors.tolist(), self.spans.tolist())):
            positions = torch.arange(first, first + span)
            pieces.append(torch.stack([torch.full_like(positions, row), positions], dim=1))
        return torch.cat(pieces)

    @property
    def num_anchors(self) -> int:
        return int(self.spans.sum())

    def select(self, rows) -> "TrainData":
        """The rows ``rows`` (indices), trimmed to their longest length."""
        rows = torch.as_tensor(rows, dtype=torch.long)
        width = int(self.lengths[rows].max())
        pick = lambda x: None if x is None else x[rows, :width]  # noqa: E731
        soft = None if self.soft is None else SoftLabels(pick(self.soft.positions), pick(self.soft.probs))
        domains = None if self.domains is None else [self.domains[i] for i in rows.tolist()]
        requests = None if self.requests is None else [self.requests[i] for i in rows.tolist()]
        return TrainData(self.token_ids[rows, :width], self.lengths[rows], self.prompt_lengths[rows], pick(self.features), soft, domains, requests)

    def split(self, heldout: int) -> tuple["TrainData", "TrainData"]:
        """(train, held-out): the last ``heldout`` rows are held out."""
        cut = len(self) - heldout
        return self.select(range(cut)), self.select(range(cut, len(self)))

    def domain(self, name: str) -> "TrainData":
        """The rows of one domain."""
        if self.domains is None:
            raise ValueError("these sequences carry no domain labels")
        rows = [i for i, d in enumerate(self.domains) if d == name]
        if not rows:
            raise ValueError(f"no sequences of domain {name!r} (have: {', '.join(sorted(set(self.domains)))})")
        return self.select(rows)

    def draw(self, sequences: int, anchors: int, generator: torch.Generator) -> torch.Tensor:
        """`LongTensor[s * A, 2]`: ``sequences`` distinct rows, ``anchors`` distinct sorted anchors
        of each (fewer where a row is shorter), grouped by row (one target forward serves a row)."""
        rows = torch.randperm(len(self), generator=generator)[: min(sequences, len(self))]
        per = min(anchors, int(self.spans[rows].min()))
        picks = [torch.randperm(int(self.spans[r]), generator=generator)[:per].sort().values + self.first_anchors[r] for r in rows.tolist()]
        return torch.stack([torch.stack([torch.full_like(p, r), p], dim=1) for r, p in zip(rows.tolist(), picks)]).flatten(0, 1)

    def batch(self, index: torch.Tensor, window: int, horizon: int, short_history: torch.Tensor | None = None):
        """Features `[B, W, F]`, valid `[B, W]`, root ids `[B]`, labels `[B, K]` (IGNORE past the end)
        of the anchors ``index`` (`LongTensor[B, 2]`)."""
        row, anchor = index[:, 0], index[:, 1]
        offsets = torch.arange(-window + 1, 1)
        positions = anchor[:, None] + offsets[None]  # [B, W]
        valid = positions >= 0
        if short_history is not None:
            valid &= offsets[None] > -short_history[:, None]
        features = self.features[row[:, None], positions.clamp(min=0)] * valid[..., None]
        root = self.token_ids[row, anchor + 1]
        label_positions = anchor[:, None] + 2 + torch.arange(horizon)[None]  # [B, K]
        labels = self.token_ids[row[:, None], label_positions.clamp(max=self.token_ids.shape[1] - 1)]
        labels = torch.where(label_positions < self.lengths[row, None], labels, torch.full_like(labels, IGNORE))
        return features, valid, root, labels

    def soft_labels(self, index: torch.Tensor, horizon: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The target's laws of the labelled tokens of anchors ``index``: draft-vocabulary
        positions `LongTensor[B, K, k]` and probabilities `Tensor[B, K, k]` summing to 1 (the law
        of ``x_{t+2+d}`` is the one the target gave at position ``t+1+d``)."""
        row, anchor = index[:, 0], index[:, 1]
        at = (anchor[:, None] + 1 + torch.arange(horizon)[None]).clamp(max=self.token_ids.shape[1] - 1)
        positions = self.soft.positions[row[:, None], at].long()
        probs = self.soft.probs[row[:, None], at].float()
        return positions, probs / probs.sum(-1, keepdim=True).clamp(min=1e-6)

def save_train_data(path: Path, parts: dict[str, TrainData]) -> None:
    """Write named parts' sequences (e.g. ``train``, ``heldout``) to one safetensors file, swapped in whole."""
    tensors = {}
    for name, part in parts.items():
        tensors[f"{name}.ids"] = part.token_ids.to(torch.int32)
        tensors[f"{name}.lengths"] = part.lengths.to(torch.int32)
        tensors[f"{name}.prompt_lengths"] = part.prompt_lengths.to(torch.int32)
        if part.domains is not None:
            tensors[f"{name}.domains"] = torch.tensor([DOMAINS.index(d) for d in part.domains], dtype=torch.int8)
    with atomic_file(Path(path)) as temporary:
        save_file(tensors, temporary)


def load_train_data(path: Path) -> dict[str, TrainData]:
    """The named parts :func:`save_train_data` wrote. Files written before the one anchor
    convention store ``first_anchors`` (the last prompt position) instead of ``prompt_lengths``;
    the tiny pair's file stores ``train``, ``heldout`` and one ``first_anchor``."""
    tensors = load_file(Path(path))
    if "first_anchor" in tensors:
        prompt = int(tensors["first_anchor"].item()) + 1
        return {name: TrainData.of(tensors[name].long(), prompt) for name in ("train", "heldout")}
    parts = {}
    for name in sorted({key.split(".")[0] for key in tensors}):
        prompts = tensors.get(f"{name}.prompt_lengths")
        prompts = tensors[f"{name}.first_anchors"].long() + 1 if prompts is None else prompts.long()
        domains = tensors.get(f"{name}.domains")
        parts[name] = TrainData(tensors[f"{name}.ids"].long(), tensors[f"{name}.lengths"].long(), prompts,
                                domains=None if domains is None else [DOMAINS[int(i)] for i in domains])
    return parts
