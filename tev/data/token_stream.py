"""A corpus split as one token stream, the form every training stage samples windows from."""

from __future__ import annotations

import torch

from tev.data.corpus import load_split

__all__ = ["encode_corpus"]


def encode_corpus(tokenizer, split: str, train_limit_files: int | None = None) -> tuple[torch.Tensor, int]:
    """The split as one stream ``[EOS, file 1, EOS, file 2, ...]``.

    Args:
        tokenizer: a Hugging Face tokenizer with an ``eos_token_id`` (the document separator).
        split: ``"train"`` or ``"heldout"``.
        train_limit_files: keep only the first this many train files (quick builds); the
            held-out split is always read whole.

    Returns:
        (`LongTensor[n]` token ids, the split's size in UTF-8 bytes).
    """
    files = load_split(split, limit_files=train_limit_files if split == "train" else None)
    encoded = tokenizer([f.text for f in files], add_special_tokens=False, verbose=False)["input_ids"]
    eos = tokenizer.eos_token_id
    stream = []
    for ids in encoded:
        stream.append(eos)
        stream.extend(ids)
    return torch.tensor(stream, dtype=torch.long), sum(len(f.text.encode("utf-8")) for f in files)
