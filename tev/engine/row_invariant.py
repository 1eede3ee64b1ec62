"""A target forward in which a row's numbers do not depend on the rows beside it.

Greedy speculation equals greedy decoding only if a node's row inside a tree is bit for bit the
row plain decoding computes alone at that position. :class:`RowInvariantForward` is a forward of a
Llama-family model (Llama, Mistral without a sliding window, Qwen2, Qwen3) built so that this holds
by construction, in float32 or in bfloat16:

- **Products** (:class:`~tev.engine.row_products.RowProducts`): one prepacked kernel, always
  handed 2 to 64 rows, checked row by row at start-up.
- **Norms** reduce each row alone, in float32 (same length, same order for every row).
- **Rotary positions** come from one table computed at build time: a position's angles are looked
  up, never recomputed in a batch of another size.
- **Element-wise SiLU** runs on widths that are multiples of 64, so every element goes through the
  vector kernel and none through the scalar tail (whose ``exp`` may round differently): an
  element-wise kernel walks the whole tensor as one line, so where the tail falls would depend on
  the row count.
- **Attention**: row ``i`` at position ``p`` attends to the keys of its own path, positions
  ``0..p``, in that order, whatever else is in the cache or the tree. The keys are split at
  ``start(p)``, a multiple of 32 that depends on ``p`` alone: the committed block
  ``[0, start(p))`` (read from the cache; query rows in chunks of exactly 16 per product) and the
  recent window ``[start(p), p]`` (gathered per row along its path into a fixed window of 64,
  padding masked). The two parts' scores sit side by side in one softmax over ``start(p) + 64``
  entries, which reduces each row alone (its maximum, exponentials and sum over a width fixed by
  the position), so a plain step and a tree node at the same position with the same path run the
  same operations on the same numbers.
- **Queries and keys** turn by their rotary angles in one pass (one table of the new rows' angles a
  forward, the queries' heads carrying the ``1/sqrt(d)`` scale): a layer's small operations cost
  more in launching than in arithmetic at a few rows, so each one saved counts 30 times a forward.

Keys and values are cached in float32 (the products' outputs widened exactly), in the session's
``DynamicCache``; commit and rollback are unchanged. The residual stream is float32; only the
products run in the chosen precision. The output head is a :class:`RowProducts` too
(:meth:`RowInvariantForward.project`).
"""

from __future__ import annotations

import torch

from tev.engine.llama_layer import LayerWeights
from tev.engine.row_products import RowProducts

__all__ = ["RowInvariantForward", "SUPPORTED_TYPES", "unsupported_reason", "rms_norm", "rotary_table", "rotate", "BLOCK", "WINDOW"]

SUPPORTED_TYPES = ("llama", "mistral", "qwen2", "qwen3")
BLOCK = 32  # the committed part of a row's keys ends at a multiple of this; a branching tree may be BLOCK - 1 deep
WINDOW = 2 * BLOCK  # the recent part: at most 63 keys, padded to this (a row's gather, so kept small)
QUERY_CHUNK = 16  # query rows per product over the committed block
_LANES = 64  # widths of exp/SiLU inputs are padded to a multiple of this (no scalar tail)


def unsupported_reason(model) -> str | None:
    """Why ``model`` cannot run here (None when it can)."""
    config = model.config
    kind = getattr(config, "model_type", None)
    if kind not in SUPPORTED_TYPES:
        return f"architecture {kind!r} (supported: {', '.join(SUPPORTED_TYPES)})"
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True) and kind == "mistral":
        return "a sliding attention window"
    if getattr(config, "hidden_act", "silu") != "silu":
        return f"activation {config.hidden_act!r}"
    if getattr(config, "mlp_bias", False):
        return "biases in the MLP"
    if getattr(model.get_output_embeddings(), "bias", None) is not None:
        return "an output head with a bias"
    if getattr(config, "tie_word_embeddings", False) is False and model.get_output_embeddings() is None:
        return "no output head"
    return None


def _silu(x: torch.Tensor) -> torch.Tensor:
    """SiLU of float32 ``x [M, w]``, ``w`` padded to a multiple of 64 (no scalar tail)."""
    width = x.shape[-1]
    pad = (-width) % _LANES
    if pad:
        return torch.nn.functional.silu(torch.nn.functional.pad(x, (0, pad)))[..., :width]
    return torch.nn.functional.silu(x)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """``x [..., H]`` normalised over its last dimension, row by row.

    In float32 the mean square is one dot product per row (``vecdot``): five small kernels where
    ``F.rms_norm`` runs seven, measured 12-20 against 20-37 microseconds a call on a 2-core AVX2
    EPYC, and a forward makes 61 such calls. Other precisions take ``F.rms_norm`` (it widens)."""
    if x.dtype != torch.float32:
        return torch.nn.functional.rms_norm(x, (x.shape[-1],), weight, eps)
    inverse = torch.linalg.vecdot(x, x).mul_(1.0 / x.shape[-1]).add_(eps).rsqrt_()  # [...]
    return x * inverse.unsqueeze(-1) * weight


def rotary_table(body, head_dim: int, length: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The model's own rotary angles for positions ``0..length-1``, as :func:`rotate` reads them:
    float32 `cos [length, d]`, `sin [length, d]` with rotate_half's sign folded in, and the
    `LongTensor[d]` index that turns a vector by half (rotate_half(x) = x[..., half_turn] * sign)."""
    cos, sin = body.rotary_emb(torch.zeros(1, 1, head_dim), position_ids=torch.arange(length)[None])
    half = head_dim // 2
    half_turn = torch.cat([torch.arange(half, head_dim), torch.arange(half)])
    sign = torch.cat([-torch.ones(half), torch.ones(half)])
    return cos[0].float(), sin[0].float() * sign, half_turn


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, half_turn: torch.Tensor) -> torch.Tensor:
    """``x [..., d]`` rotated by angles ``cos, sin`` (broadcast to ``x``; from :func:`rotary_table`)."""
    return x * cos + x.index_select(-1, half_turn) * sin


def _chunked(rows: torch.Tensor, product) -> torch.Tensor:
    """``product`` of ``rows [kv, r, k]`` in chunks of exactly :data:`QUERY_CHUNK` rows (zero rows
    pad the last), so every call has one shape however many rows there are: `[kv, r, out]`."""
    count = rows.shape[1]
    pad = (-count) % QUERY_CHUNK
    if pad:
        rows = torch.nn.functional.pad(rows, (0, 0, 0, pad))
    if rows.shape[1] == QUERY_CHUNK:
        return product(rows)[:, :count]
    return torch.cat([product(chunk) for chunk in rows.split(QUERY_CHUNK, dim=1)], dim=1)[:, :count]


class _Keys:
    """Where each row's keys are, shared by every layer of one forward.

    Args:
        length: cached tokens before the forward (``L``).
        positions: `LongTensor[n]` each new row's absolute position.
        visible: `BoolTensor[n, n]` new row ``i`` sees new row ``j`` (its path, itself included).
    """

    def __init__(self, length: int, positions: torch.Tensor, visible: torch.Tensor):
        n = positions.numel()
        self.length, self.positions = length, positions
        depth = positions - length  # [n]
        if int(depth.min()) < 0:
            raise ValueError("a new row sits before the cached tokens")
        # along_path[i, d]: the new row on row i's path at position L + d (-1: none)
        along_path = torch.full((n, int(depth.max()) + 1), -1, dtype=torch.long)
        rows, cols = visible.nonzero(as_tuple=True)
        along_path[rows, depth[cols]] = cols
        on_path = torch.arange(along_path.shape[1]) <= depth[:, None]
        if (not torch.equal(along_path >= 0, on_path) or int(visible.sum()) != int((depth + 1).sum())
                or not torch.equal(along_path[torch.arange(n), depth], torch.arange(n))):
            raise ValueError("each new row must see exactly one new row per position up to its own, itself last (a path)")
        self.start = torch.clamp(positions + 1 - BLOCK, min=0) // BLOCK * BLOCK  # [n] committed block's end
        # the recent window: positions start .. start + WINDOW - 1, index into [cache; new rows]
        window_pos = self.start[:, None] + torch.arange(WINDOW)  # [n, WINDOW]
        real = window_pos <= positions[:, None]
        from_new = window_pos >= length
        depth_in_window = (window_pos - length).clamp(min=0, max=along_path.shape[1] - 1)
        index = torch.where(from_new, length + along_path.gather(1, depth_in_window), window_pos)
        self.window_index = torch.where(real, index, torch.zeros_like(index))  # [n, WINDOW]
        self.window_mask = torch.zeros(n, WINDOW).masked_fill_(~real, float("-inf"))  # [n, WINDOW]
        # rows by committed-block end (0: none); the block must be the row's own path in cache order
        self.groups: list[tuple[int, torch.Tensor]] = []
        for start in sorted(set(self.start.tolist())):
            members = (self.start == start).nonzero().flatten()
            if start > length:  # the block reaches into the new rows: only a chain in order may
                needed = along_path[members, : start - length]
                if not torch.equal(needed, torch.arange(start - length).expand_as(needed)):
                    raise ValueError(f"a tree deeper than {BLOCK - 1} below the cache is not supported")
            self.groups.append((start, members))


class RowInvariantForward:
    """A row-invariant forward of ``model`` (see the module note) with products in ``dtype``.

    Args:
        model: a transformers causal LM of :data:`SUPPORTED_TYPES` (on the CPU).
        dtype: the products' precision; the head's may differ (``head_dtype``, default the same).
    """

    def __init__(self, model, dtype: torch.dtype, head_dtype: torch.dtype | None = None):
        reason = unsupported_reason(model)
        if reason is not None:
            raise ValueError(f"no row-invariant forward for this target: {reason}")
        config = model.config
        body = model.model
        self.dtype = dtype
        self.head_dtype = head_dtype or dtype
        self.embed = body.embed_tokens.weight.detach()
        self.layers = [LayerWeights.read(layer, lambda weight, bias: RowProducts(weight, dtype, bias), lambda gain: gain.float())
                       for layer in body.layers[: config.num_hidden_layers]]
        self.norm = body.norm.weight.detach().float()
        self.eps = float(config.rms_norm_eps)
        self.head = RowProducts(model.get_output_embeddings().weight, self.head_dtype)
        self.num_heads = config.num_attention_heads
        self.num_kv = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        self.scale = self.head_dim ** -0.5
        self.max_positions = int(getattr(config, "max_position_embeddings", 8192))
        self.cos, self.sin, self._half_turn = rotary_table(body, self.head_dim, self.max_positions)  # [positions, head_dim]

    def _rotary(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`cos, sin [n, heads + kv, d]` of the new rows, the queries' heads scaled by 1/sqrt(d),
        built once a forward so each layer turns its queries and keys in one pass."""
        heads = (self.num_heads, self.num_kv)
        cos, sin = self.cos[positions][:, None], self.sin[positions][:, None]  # [n, 1, d]
        return (torch.cat([(cos * self.scale).expand(-1, heads[0], -1), cos.expand(-1, heads[1], -1)], dim=1),
                torch.cat([(sin * self.scale).expand(-1, heads[0], -1), sin.expand(-1, heads[1], -1)], dim=1))

    @property
    def num_layers(self) -> int:
        return len(self.layers)

    def project(self, hidden: torch.Tensor) -> torch.Tensor:
        """`Tensor[M, H]` final hidden states -> `Tensor[M, V]` float32 logits."""
        return self.head(hidden)

    @torch.no_grad()
    def forward(self, token_ids: torch.Tensor, positions: torch.Tensor, visible: torch.Tensor, cache, length: int,
                feature_layers: tuple[int, ...] = ()) -> tuple[torch.Tensor, torch.Tensor | None]:
        """New rows through every layer; their keys and values are appended to ``cache``.

        Args:
            token_ids, positions: `LongTensor[n]`.
            visible: `BoolTensor[n, n]` which new rows each new row sees (its path, itself included;
                every cached token is seen).
            cache: the session's ``DynamicCache`` (float32 keys and values, ``length`` tokens).
            feature_layers: hidden-state indices to return (0 the embeddings, ``k`` layer ``k``'s
                output, the last one normed), as transformers numbers ``hidden_states``.
        Returns:
            `Tensor[n, H]` float32 final normed hidden states, and `Tensor[n, F]` features or None.
        """
        keys = _Keys(length, positions, visible)
        rotary = self._rotary(positions)
        x = self.embed[token_ids].float()  # [n, H]
        wanted = {i % (self.num_layers + 1) for i in feature_layers}
        features = {0: x} if 0 in wanted else {}
        for index, layer in enumerate(self.layers):
            x = x + self._attention(layer, rms_norm(x, layer.input_norm, self.eps), keys, rotary, cache.layers[index])
            h = rms_norm(x, layer.post_norm, self.eps)
            gate, up = layer.gate_up(h).chunk(2, dim=-1)
            x = x + layer.down(_silu(gate) * up)
            if index + 1 in wanted and index + 1 < self.num_layers:
                features[index + 1] = x
        x = rms_norm(x, self.norm, self.eps)
        if self.num_layers in wanted:
            features[self.num_layers] = x
        picked = torch.cat([features[i % (self.num_layers + 1)] for i in feature_layers], dim=-1) if feature_layers else None
        return x, picked

    def _attention(self, layer: LayerWeights, h: torch.Tensor, keys: _Keys, rotary, cached) -> torch.Tensor:
        n, d, heads = h.shape[0], self.head_dim, self.num_heads
        qkv = layer.qkv(h)  # [n, (heads + 2 kv) d]
        qk = qkv[:, : (heads + self.num_kv) * d].view(n, heads + self.num_kv, d)
        v = qkv[:, (heads + self.num_kv) * d:].view(n, self.num_kv, d)
        if layer.q_norm is not None:
            q, k = qk.split([heads, self.num_kv], dim=1)
            qk = torch.cat([rms_norm(q, layer.q_norm, self.eps), rms_norm(k, layer.k_norm, self.eps)], dim=1)
        cos, sin = rotary  # [n, heads + kv, d]; the queries' carry the 1/sqrt(d) scale
        qk = torch.addcmul(qk * cos, qk.index_select(-1, self._half_turn), sin)  # queries and keys turned at once
        all_keys, all_values = cached.update(qk[:, heads:].transpose(0, 1)[None], v.transpose(0, 1)[None])  # [1, kv, L + n, d]
        queries = qk[:, :heads].view(n, self.num_kv, -1, d).transpose(0, 1)  # [kv, n, rep, d]
        if len(keys.groups) == 1:  # every row's committed block ends at the same place (a step, most trees)
            start, _ = keys.groups[0]
            out = self._attend(queries, all_keys[0], all_values[0], keys.window_index, keys.window_mask, start)
        else:
            out = torch.empty_like(queries)
            for start, members in keys.groups:
                out[:, members] = self._attend(queries[:, members], all_keys[0], all_values[0], keys.window_index[members], keys.window_mask[members], start)
        return layer.o(out.transpose(0, 1).reshape(n, heads * d))

    def _attend(self, queries, all_keys, all_values, window_index, window_mask, start: int) -> torch.Tensor:
        """Softmax attention of ``m`` rows whose committed block is ``[0, start)``.

        Args:
            queries: `[kv, m, rep, d]` (scaled, rotated); all_keys, all_values: `[kv, L + n, d]`.
            window_index: `LongTensor[m, 64]` each row's recent keys; window_mask: `[m, 64]`.
        Returns:
            `[kv, m, rep, d]`. The recent window's products batch over (kv head, row), ``rep``
            query rows each; the committed block's over kv heads, query rows in chunks of exactly 16.
            One softmax over each row's ``start + 64`` scores (both parts side by side): a row is
            reduced alone, over a width that depends on its position only.
        """
        kv, m, rep, d = queries.shape
        index = window_index.flatten()
        window_k = all_keys.index_select(1, index).view(kv, m, WINDOW, d)
        window_v = all_values.index_select(1, index).view(kv, m, WINDOW, d)
        scores = torch.matmul(queries, window_k.transpose(-1, -2)).add_(window_mask[:, None, :])  # [kv, m, rep, 64]
        if start:
            block_k, block_v = all_keys[:, :start], all_values[:, :start]  # [kv, start, d]
            committed = _chunked(queries.reshape(kv, m * rep, d), lambda chunk: torch.matmul(chunk, block_k.transpose(-1, -2)))
            scores = torch.cat([committed.view(kv, m, rep, start), scores], dim=-1)  # [kv, m, rep, start + 64]
        weights = torch.softmax(scores, dim=-1)
        out = torch.matmul(weights[..., start:], window_v)  # [kv, m, rep, d]
        if start:
            out += _chunked(weights[..., :start].reshape(kv, m * rep, start), lambda chunk: torch.matmul(chunk, block_v)).view(kv, m, rep, d)
        return out
