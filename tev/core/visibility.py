"""Which entries each new row of a forward may attend to: tree attention's one rule, written once.

A forward of ``n`` new rows after ``held`` entries already in a cache gives each row a
`BoolTensor` row over ``held + n`` columns, True where it may look. Every row sees a prefix of
the cache (the committed context) and, of the rows after it, only those on its own path: its
ancestors and itself. Two shapes of that rule occur:

- :func:`tree_visibility`: the new rows are a tree (or a chain, :func:`chain_ancestors`, or several
  trees side by side): the new block is their ancestor matrix;
- :func:`slot_visibility`: the new rows extend a tree grown depth by depth, whose earlier nodes
  already sit in the cache as slots after the prefix: each row sees its ancestors' slots and itself.

A drafter's slots read a window of the target's features instead of a cache: :func:`window_visibility` gives
each slot the window's valid entries (a short history is left-padded) and the slots the drafter lets it see
(all of them for the block drafter's one pass, those above it for the path drafter's).
"""

from __future__ import annotations

import torch

__all__ = ["chain_ancestors", "tree_visibility", "slot_visibility", "window_visibility", "attention_bias"]


def chain_ancestors(count: int) -> torch.Tensor:
    """`BoolTensor[count, count]`, the ancestor matrix of a chain: row ``i`` sees rows ``0..i`` (causal attention)."""
    return torch.ones(count, count, dtype=torch.bool).tril()


def tree_visibility(held: int, ancestors: torch.Tensor, prefix: int | torch.Tensor | None = None) -> torch.Tensor:
    """`BoolTensor[n, held + n]` for ``n`` new rows after ``held`` cached entries.

    Args:
        ancestors: `BoolTensor[n, n]`, ``ancestors[i, j]``: new row ``i`` sees new row ``j`` (its path, itself included).
        prefix: the cached entries each row sees, from the first: all ``held`` (None), one count for every row,
            or `LongTensor[n]`, a count per row (trees side by side, each after its own root).
    """
    n = ancestors.shape[0]
    visible = torch.zeros(n, held + n, dtype=torch.bool)
    if prefix is None or isinstance(prefix, int):
        visible[:, : held if prefix is None else prefix] = True
    else:
        visible[:, :held] = torch.arange(held)[None, :] < torch.as_tensor(prefix)[:, None]
    visible[:, held:] = ancestors
    return visible


def slot_visibility(prefix: int, held: int, ancestor_slots: list[list[int]]) -> torch.Tensor:
    """`BoolTensor[n, prefix + held + n]` for ``n`` new rows after a cache of ``prefix`` entries every row sees
    and ``held`` slots of earlier rows: row ``i`` sees the prefix, the slots ``ancestor_slots[i]`` (its
    ancestors' places among the ``held``) and itself."""
    # lists made into one tensor: a drafter's every depth step builds this, and indexing a tensor row by row cost 3x more
    n, rows = len(ancestor_slots), []
    for row, slots in enumerate(ancestor_slots):
        own = [False] * (held + n)
        for slot in slots:
            own[slot] = True
        own[held + row] = True
        rows.append([True] * prefix + own)
    return torch.tensor(rows, dtype=torch.bool).reshape(n, prefix + held + n)


def window_visibility(valid: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """`BoolTensor[B, S', W + S]`: slot row ``i`` of each of ``B`` windows sees that window's valid entries
    (``valid``: `BoolTensor[B, W]`) and the slots ``slots[i]`` marks (`BoolTensor[S', S]`; one row when every slot
    sees the same)."""
    rows = slots.shape[0]
    return torch.cat([valid[:, None, :].expand(-1, rows, -1), slots.to(valid.device).expand(valid.shape[0], -1, -1)], dim=2)


def attention_bias(visible: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``visible`` as an additive attention bias of ``dtype``: 0 where a row may look, the dtype's lowest value elsewhere."""
    return torch.zeros(visible.shape, dtype=dtype, device=visible.device).masked_fill(~visible, torch.finfo(dtype).min)
