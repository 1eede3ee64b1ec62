"""The sequences ExitTrain draws its anchors from.

A training anchor is a position ``a`` of a sequence: the drafter reads the target's features up
to ``a``, the root is token ``a + 1`` and the labels are the tokens after it. Fixed-length
corpus sequences (the tiny pair) start their anchors at one shared position; chat
conversations (the default pair) are right-padded and each row's anchors start at its own
last prompt position, so every tree is drafted inside a response, as at decoding time.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from tev.util.files import atomic_file

__all__ = ["AnchorData", "DOMAINS", "save_anchor_data", "load_anchor_data", "anchor_data_from_conversations"]

DOMAINS = ("dialogue", "code", "math")


@dataclass
class AnchorData:
    """Sequences and where their anchors may lie.

    Attributes:
        ids: `LongTensor[S, T]`, right-padded token ids.
        lengths: `LongTensor[S]`, each row's real length.
        first_anchors: `LongTensor[S]`, each row's first anchor (its last context position);
            anchors run from there to ``lengths - 2`` (a root must follow).
        domains: one of :data:`DOMAINS` per row, or None when unlabelled.
    """

    ids: torch.Tensor
    lengths: torch.Tensor
    first_anchors: torch.Tensor
    domains: list[str] | None = None

    def __post_init__(self):
        if self.ids.dim() != 2 or self.ids.shape[0] < 1:
            raise ValueError("no training sequences: expected ids of shape [S, T] with S >= 1")
        if self.lengths.shape != (self.ids.shape[0],) or self.first_anchors.shape != (self.ids.shape[0],):
            raise ValueError("lengths and first_anchors need one entry per sequence")
        if bool((self.lengths > self.ids.shape[1]).any()) or bool((self.first_anchors < 0).any()):
            raise ValueError("a length exceeds the padded width, or a first anchor is negative")
        if bool((self.spans < 1).any()):
            raise ValueError("every sequence needs room for an anchor and its root after its context")
        if self.domains is not None and len(self.domains) != self.ids.shape[0]:
            raise ValueError("domains need one entry per sequence")

    @classmethod
    def of(cls, sequences: "torch.Tensor | AnchorData", first_anchor: int = 0) -> "AnchorData":
        """``sequences`` as anchor data: fixed-length `LongTensor[S, T]` rows whose anchors all
        start at ``first_anchor``, or anchor data as it is."""
        if isinstance(sequences, AnchorData):
            return sequences
        if sequences.dim() != 2 or sequences.shape[0] < 1:
            raise ValueError("no training sequences: expected [S, T] token ids with S >= 1")
        if sequences.shape[1] < first_anchor + 3:
            raise ValueError("training sequences must be [S, T] with room for anchors after the context")
        rows = sequences.shape[0]
        return cls(sequences.long(), torch.full((rows,), sequences.shape[1]), torch.full((rows,), first_anchor))

    def __len__(self) -> int:
        return self.ids.shape[0]

    @property
    def spans(self) -> torch.Tensor:
        """`LongTensor[S]`: how many anchor positions each row has."""
        return self.lengths - 1 - self.first_anchors

    def select(self, rows) -> "AnchorData":
        """The rows ``rows`` (indices), trimmed to their longest length."""
        rows = torch.as_tensor(rows, dtype=torch.long)
        width = int(self.lengths[rows].max())
        domains = None if self.domains is None else [self.domains[i] for i in rows.tolist()]
        return AnchorData(self.ids[rows, :width], self.lengths[rows], self.first_anchors[rows], domains)

    def domain(self, name: str) -> "AnchorData":
        """The rows of one domain."""
        if self.domains is None:
            raise ValueError("these sequences carry no domain labels")
        rows = [i for i, d in enumerate(self.domains) if d == name]
        if not rows:
            raise ValueError(f"no sequences of domain {name!r} (have: {', '.join(sorted(set(self.domains)))})")
        return self.select(rows)


def save_anchor_data(path: Path, parts: dict[str, AnchorData]) -> None:
    """Write named parts (e.g. ``train``, ``heldout``) to one safetensors file, swapped in whole."""
    tensors = {}
    for name, part in parts.items():
        tensors[f"{name}.ids"] = part.ids.to(torch.int32)
        tensors[f"{name}.lengths"] = part.lengths.to(torch.int32)
        tensors[f"{name}.first_anchors"] = part.first_anchors.to(torch.int32)
        if part.domains is not None:
            tensors[f"{name}.domains"] = torch.tensor([DOMAINS.index(d) for d in part.domains], dtype=torch.int8)
    with atomic_file(Path(path)) as temporary:
        save_file(tensors, temporary)


def load_anchor_data(path: Path) -> dict[str, AnchorData]:
    """The named parts :func:`save_anchor_data` wrote."""
    tensors = load_file(Path(path))
    parts = {}
    for name in sorted({key.split(".")[0] for key in tensors}):
        domains = tensors.get(f"{name}.domains")
        parts[name] = AnchorData(
            tensors[f"{name}.ids"].long(), tensors[f"{name}.lengths"].long(), tensors[f"{name}.first_anchors"].long(),
            None if domains is None else [DOMAINS[int(i)] for i in domains],
        )
    return parts


def anchor_data_from_conversations(conversations, pad_id: int, max_response_tokens: int, min_anchors: int = 8) -> AnchorData:
    """Chat conversations (a :class:`tev.train.chat_data.ChatSequences`) as anchor data: each
    cut to its prompt and at most ``max_response_tokens`` of its response, anchors from its last
    prompt position on; a conversation with fewer than ``min_anchors`` anchors is left out."""
    kept = [i for i, (ids, start) in enumerate(zip(conversations.token_ids, conversations.prompt_lengths))
            if min(len(ids), start + max_response_tokens) - start >= min_anchors]
    if not kept:
        raise ValueError(f"no conversation has a response of {min_anchors} tokens or more")
    rows = [conversations.token_ids[i][: conversations.prompt_lengths[i] + max_response_tokens] for i in kept]
    ids = torch.full((len(rows), max(len(r) for r in rows)), pad_id, dtype=torch.long)
    for row, sequence in enumerate(rows):
        ids[row, : len(sequence)] = torch.tensor(sequence)
    lengths = torch.tensor([len(r) for r in rows])
    first_anchors = torch.tensor([conversations.prompt_lengths[i] - 1 for i in kept])
    return AnchorData(ids, lengths, first_anchors, [conversations.domains[i] for i in kept])
