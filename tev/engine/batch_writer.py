"""The target's answers to many prompts at once, with every slot of the batch kept busy.

The data writer of drafter training. Where :mod:`tev.engine.batch_generate` continues one
left-padded batch until its longest row ends (rows that finish leave, so the batch shrinks and
the last steps run a handful of rows), :class:`BatchWriter` holds ``slots`` rows in a cache of
fixed size and gives a slot to the next prompt as soon as its answer ends (continuous batching).
Every step is one product of ``slots`` rows: on a CPU a product's cost per row falls with its rows
until the cores are saturated (on a 2-core AVX-512 Xeon about 1.1 ms a row of SmolLM2-135M at
128-192 rows in float32, 2.3 ms at 16 rows), so a batch that never thins out writes more tokens
a second. The forward is written for the Llama family (Llama, Mistral without a sliding window,
Qwen2, Qwen3) with query/key/value and gate/up fused into one product each, the rotary angles
from one table, and keys and values written in place (no concatenation of the cache per step).

Each prompt's answer is drawn with a generator of its own (seeded by the prompt's index), so an
answer depends on its prompt and seed, not on the order in which slots free up; batched
arithmetic may still move a near-tie, as in any batched decoding. Sampling is exact: one uniform
per token, inverse CDF over ``softmax(logits / T)`` (a sum per block of 256 tokens, then one block).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tev.engine.batch_generate import generate_batch
from tev.engine.llama_layer import LayerWeights
from tev.engine.row_invariant import rms_norm, rotary_table, rotate, unsupported_reason
from tev.util.precision import low_precision

__all__ = ["BatchWriter", "WriterPrompt", "writer_unsupported_reason", "write_answers", "writer_dtype"]

_BLOCK = 256  # the sampler's first search runs over sums of this many tokens


def writer_unsupported_reason(model) -> str | None:
    """Why :class:`BatchWriter` cannot run ``model`` (None when it can): the row-invariant
    forward's architectures, on the CPU."""
    if next(model.parameters()).device.type != "cpu":
        return "not on the CPU"
    return unsupported_reason(model)


def writer_dtype(model, slots: int) -> torch.dtype:
    """The products' precision for ``slots`` rows: bfloat16 where this CPU measures a product of
    that many rows faster in it (with AMX), float32 otherwise (on a 2-core AVX512_BF16 Xeon without
    AMX, float32 was 1.5x faster at 96-128 rows although bfloat16 wins at 1-16)."""
    config = model.config
    return low_precision("cpu", shape=(slots, config.hidden_size, 2 * config.intermediate_size))


def write_answers(model, prompts: list["WriterPrompt"], max_new_tokens: int, stop_id: int | None, slots: int, continuous: bool = True):
    """Every prompt's answer: a generator of ``(index, answer)`` as answers end, ``None`` between
    forwards. :class:`BatchWriter` where it runs the model; elsewhere (or without ``continuous``)
    transformers' forward in batches of ``slots`` prompts of one temperature, each batch sampled
    with its first prompt's seed (:func:`~tev.engine.batch_generate.generate_batch`)."""
    if continuous and writer_unsupported_reason(model) is None:
        length = max((len(p.ids) for p in prompts), default=1) + max_new_tokens
        writer = BatchWriter(model, min(slots, max(1, len(prompts))), length, writer_dtype(model, slots))
        yield from writer.run(prompts, max_new_tokens, stop_id)
        return
    start = 0
    while start < len(prompts):
        stop = start + 1
        while stop < min(start + slots, len(prompts)) and prompts[stop].temperature == prompts[start].temperature:
            stop += 1
        chunk = prompts[start:stop]
        written = generate_batch(model, [list(p.ids) for p in chunk], max_new_tokens, chunk[0].temperature, stop_id, chunk[0].seed)
        yield None
        yield from zip(range(start, stop), written)
        start = stop


@dataclass(frozen=True)
class WriterPrompt:
    """One prompt to answer: its token ids, its temperature (0: greedy) and its sampler's seed."""

    ids: tuple[int, ...]
    temperature: float
    seed: int


def _linear(dtype: torch.dtype):
    """The writer's products: ``linear`` over the weight (and bias) in ``dtype``."""

    def product(weight: torch.Tensor, bias: torch.Tensor | None):
        weight, bias = weight.to(dtype).contiguous(), None if bias is None else bias.to(dtype)
        return lambda x: torch.nn.functional.linear(x, weight, bias)

    return product


class BatchWriter:
    """Continuous-batching decoding of a Llama-family model on the CPU.

    Args:
        model: a transformers causal LM (see :func:`writer_unsupported_reason`).
        slots: rows decoded at once.
        max_length: the longest prompt plus answer a slot holds (its cache's width).
        dtype: the products' precision (float32 or bfloat16); keys and values are kept in it too.
    """

    def __init__(self, model, slots: int, max_length: int, dtype: torch.dtype = torch.float32):
        reason = writer_unsupported_reason(model)
        if reason is not None:
            raise ValueError(f"the batch writer cannot run this target: {reason}")
        config, body = model.config, model.model
        self.dtype, self.capacity, self.max_length = dtype, slots, max_length
        self.embed = body.embed_tokens.weight.detach().to(dtype)
        self.layers = [LayerWeights.read(layer, _linear(dtype), lambda gain: gain.to(dtype)) for layer in body.layers[: config.num_hidden_layers]]
        self.norm = body.norm.weight.detach().to(dtype)
        self.head = model.get_output_embeddings().weight.detach().to(dtype).contiguous()
        self.eps = float(config.rms_norm_eps)
        self.num_heads, self.num_kv = config.num_attention_heads, config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        cos, sin, self.half_turn = rotary_table(body, self.head_dim, max_length)
        self.cos, self.sin = cos.to(dtype), sin.to(dtype)  # [max_length, d]
        self._allocate()

    def _allocate(self) -> None:
        """A cache of ``capacity`` slots: keys and values `[slots, kv heads, max_length, d]` a layer."""
        self.slots = self.capacity
        shape = (self.slots, self.num_kv, self.max_length, self.head_dim)
        self.keys = [torch.zeros(shape, dtype=self.dtype) for _ in self.layers]
        self.values = [torch.zeros(shape, dtype=self.dtype) for _ in self.layers]

    # ------------------------------------------------------------------ the forward
    def _norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        return rms_norm(x, weight, self.eps)

    def _layer_inputs(self, layer: LayerWeights, x: torch.Tensor, positions: torch.Tensor):
        """Queries, keys and values of rows ``x [..., H]`` at ``positions [...]``: `[..., heads, d]`."""
        h = self._norm(x, layer.input_norm)
        q, k, v = layer.qkv(h).split(layer.qkv_sizes, dim=-1)
        lead, d = x.shape[:-1], self.head_dim
        q, k, v = q.view(*lead, self.num_heads, d), k.view(*lead, self.num_kv, d), v.view(*lead, self.num_kv, d)
        if layer.q_norm is not None:
            q, k = self._norm(q, layer.q_norm), self._norm(k, layer.k_norm)
        cos, sin = self.cos[positions].unsqueeze(-2), self.sin[positions].unsqueeze(-2)
        return rotate(q, cos, sin, self.half_turn), rotate(k, cos, sin, self.half_turn), v

    def _layer_outputs(self, layer: LayerWeights, x: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        """The residual stream after the attention output ``attended [..., heads * d]`` and the MLP."""
        x = x + layer.o(attended)
        gate, up = layer.gate_up(self._norm(x, layer.post_norm)).chunk(2, dim=-1)
        return x + layer.down(torch.nn.functional.silu(gate) * up)

    def _logits(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(self._norm(x, self.norm), self.head).float()

    @torch.no_grad()
    def share_prefix(self, prefix: tuple[int, ...]) -> None:
        """Compute the keys and values of ``prefix`` (the tokens every prompt starts with, such as a
        chat template's system turn) once; :meth:`prefill` copies them into a slot instead of
        computing them again."""
        self.prefix = tuple(prefix)
        self.prefix_keys, self.prefix_values = [], []
        if not prefix:
            return
        positions = torch.arange(len(prefix))
        x = self.embed[torch.tensor(prefix)][None]  # [1, P, H]
        for layer in self.layers:
            q, key, value = self._layer_inputs(layer, x, positions[None])
            self.prefix_keys.append(key[0].transpose(0, 1))  # [kv, P, d]
            self.prefix_values.append(value[0].transpose(0, 1))
            out = torch.nn.functional.scaled_dot_product_attention(
                q.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), is_causal=True, enable_gqa=True)
            x = self._layer_outputs(layer, x, out.transpose(1, 2).reshape(1, len(prefix), -1))

    @torch.no_grad()
    def prefill(self, slots: list[int], prompts: list[tuple[int, ...]]) -> torch.Tensor:
        """Write ``prompts`` into ``slots`` (positions from 0; the shared prefix copied, the rest
        computed); `Tensor[k, V]` each one's next-token logits."""
        start = len(getattr(self, "prefix", ()))
        if any(tuple(p[:start]) != self.prefix or len(p) <= start for p in prompts):
            raise ValueError("every prompt must start with the shared prefix and go on past it")
        k, width = len(prompts), max(len(p) for p in prompts) - start
        ids = torch.zeros(k, width, dtype=torch.long)
        for row, prompt in enumerate(prompts):  # right-padded: a causal row never sees its padding
            ids[row, : len(prompt) - start] = torch.tensor(prompt[start:])
        index = torch.tensor(slots)
        positions = torch.arange(start, start + width).expand(k, width)
        # a new row sees the whole prefix and the new rows up to its own
        mask = torch.zeros(width, start + width, dtype=self.dtype)
        mask[:, start:].masked_fill_(torch.ones(width, width, dtype=torch.bool).triu(1), float("-inf"))
        x = self.embed[ids]  # [k, width, H]
        for number, layer in enumerate(self.layers):
            q, key, value = self._layer_inputs(layer, x, positions)  # [k, width, heads, d]
            keys, values = self.keys[number], self.values[number]
            if start:
                keys[index, :, :start] = self.prefix_keys[number]
                values[index, :, :start] = self.prefix_values[number]
            keys[index, :, start : start + width] = key.transpose(1, 2)
            values[index, :, start : start + width] = value.transpose(1, 2)
            out = torch.nn.functional.scaled_dot_product_attention(
                q.transpose(1, 2), keys[index, :, : start + width], values[index, :, : start + width], attn_mask=mask, enable_gqa=True)
            x = self._layer_outputs(layer, x, out.transpose(1, 2).reshape(k, width, -1))
        last = torch.tensor([len(p) - 1 - start for p in prompts])
        return self._logits(x[torch.arange(k), last])

    def shrink(self, kept: list[int]) -> None:
        """Keep only the slots ``kept`` (in that order, renumbered from 0): once no prompt waits,
        the last answers run in a smaller batch instead of beside idle rows."""
        index = torch.tensor(kept)
        self.keys = [keys[index] for keys in self.keys]
        self.values = [values[index] for values in self.values]
        self.slots = len(kept)

    @torch.no_grad()
    def step(self, tokens: torch.Tensor, lengths: torch.Tensor, width: int) -> torch.Tensor:
        """One new token in every slot: ``tokens [slots]`` at positions ``lengths [slots]`` (each
        slot's tokens so far; an idle slot's row is computed and ignored). Attention reads the
        first ``width`` (> every length) cache columns. Returns `Tensor[slots, V]` logits."""
        s, d, group = self.slots, self.head_dim, self.num_heads // self.num_kv
        rows = torch.arange(s)
        mask = torch.zeros(s, 1, 1, width, dtype=self.dtype)
        mask.masked_fill_(torch.arange(width)[None, None, None] > lengths[:, None, None, None], float("-inf"))
        x = self.embed[tokens]  # [s, H]
        for number, layer in enumerate(self.layers):
            q, key, value = self._layer_inputs(layer, x, lengths)  # [s, heads, d]
            keys, values = self.keys[number], self.values[number]
            keys[rows, :, lengths] = key
            values[rows, :, lengths] = value
            # a kv head's `group` query heads attend as `group` query rows of one sequence
            out = torch.nn.functional.scaled_dot_product_attention(
                q.view(s, self.num_kv, group, d), keys[:, :, :width], values[:, :, :width], attn_mask=mask)
            x = self._layer_outputs(layer, x, out.reshape(s, -1))
        return self._logits(x)

    # ------------------------------------------------------------------ the loop
    def run(self, prompts: list[WriterPrompt], max_new_tokens: int, stop_id: int | None, refill: int = 8):
        """Answer every prompt: a generator yielding ``(index, answer)`` as each answer ends (in the
        order they end; ``answer`` the new ids, ``stop_id`` kept), and between forwards ``None``.

        The prompts' common first tokens are computed once (:meth:`share_prefix`). ``refill``: free
        slots gathered before new prompts are prefilled together (fewer, larger prefills), unless
        nothing else is running. Once no prompt waits, the batch halves as its answers end.
        """
        if not prompts:
            return
        if any(len(p.ids) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        if any(len(p.ids) + max_new_tokens > self.max_length for p in prompts):
            raise ValueError(f"a prompt plus {max_new_tokens} new tokens is longer than the writer's {self.max_length} positions")
        if self.slots != self.capacity:  # an earlier run shrank the batch
            self._allocate()
        self.share_prefix(_common_prefix([p.ids for p in prompts]))
        pending = list(range(len(prompts)))[::-1]  # popped from the end: in order
        slots = _SlotState(self.slots)
        while pending or slots.busy():
            free = slots.free()
            if pending and free and (len(free) >= min(refill, len(pending)) or not slots.busy()):
                chosen = [pending.pop() for _ in free[: len(pending)]]
                taken = free[: len(chosen)]
                logits = self.prefill(taken, [prompts[i].ids for i in chosen])
                for slot, index in zip(taken, chosen):
                    slots.start(slot, index, prompts[index])
                yield None
            else:
                if not pending and len(slots.busy()) <= self.slots // 2:
                    kept = slots.busy()
                    self.shrink(kept)
                    slots = slots.select(kept)
                live = slots.owner >= 0
                logits = self.step(slots.tokens, slots.lengths, int(slots.lengths[live].max()) + 1)
                slots.lengths = torch.where(live, slots.lengths + 1, slots.lengths)
                yield None
                taken = slots.busy()
                logits = logits[taken]
            drawn = self._draw(logits, slots.temperatures[taken], [slots.generators[slot] for slot in taken])
            for slot, token in zip(taken, drawn.tolist()):
                slots.answers[slot].append(token)
                slots.tokens[slot] = token
                if token == stop_id or len(slots.answers[slot]) >= max_new_tokens:
                    yield int(slots.owner[slot]), slots.answers[slot]
                    slots.owner[slot] = -1

    @staticmethod
    def _draw(logits: torch.Tensor, temperatures: torch.Tensor, generators: list[torch.Generator]) -> torch.Tensor:
        """One token per row of ``logits [k, V]``: the argmax where the temperature is 0, else a
        draw from ``softmax(logits / T)`` with the row's own generator (one uniform per token)."""
        drawn = logits.argmax(-1)
        sampled = (temperatures > 0).nonzero().flatten().tolist()
        if not sampled:
            return drawn
        scaled = logits[sampled] / temperatures[sampled, None]
        weights = (scaled - scaled.amax(-1, keepdim=True)).exp()  # [n, V]
        n, vocab = weights.shape
        pad = (-vocab) % _BLOCK
        blocks = torch.nn.functional.pad(weights, (0, pad)).view(n, -1, _BLOCK)  # [n, blocks, 256]
        block_cdf = blocks.sum(-1).cumsum(-1)  # [n, blocks]
        uniform = torch.cat([torch.rand(1, generator=generators[i]) for i in sampled])
        goal = uniform * block_cdf[:, -1]
        block = torch.searchsorted(block_cdf, goal[:, None], right=True).squeeze(1).clamp(max=block_cdf.shape[1] - 1)
        before = torch.where(block > 0, block_cdf.gather(1, (block - 1).clamp(min=0)[:, None]).squeeze(1), torch.zeros(n))
        inside = blocks[torch.arange(n), block].cumsum(-1)  # [n, 256]
        offset = torch.searchsorted(inside, (goal - before)[:, None], right=True).squeeze(1)
        # rounding between the two sums may point one past a block's last positive entry: step back to it
        last_positive = (blocks[torch.arange(n), block] > 0).cumsum(-1).argmax(-1)
        offset = torch.minimum(offset, last_positive)
        drawn[sampled] = (block * _BLOCK + offset).clamp(max=vocab - 1)
        return drawn


def _common_prefix(prompts: list[tuple[int, ...]]) -> tuple[int, ...]:
    """The longest first tokens every prompt shares, leaving each at least one token of its own."""
    first = prompts[0]
    length = min(len(p) for p in prompts) - 1
    for prompt in prompts[1:]:
        same = 0
        while same < length and prompt[same] == first[same]:
            same += 1
        length = same
    return tuple(first[:length])


class _SlotState:
    """What each slot of :meth:`BatchWriter.run` holds: `owner [slots]` the prompt it answers
    (-1: idle), its answer so far, sampler, temperature, last token and length."""

    def __init__(self, slots: int):
        self.owner = torch.full((slots,), -1, dtype=torch.long)
        self.answers: list[list[int]] = [[] for _ in range(slots)]
        self.generators: list[torch.Generator | None] = [None] * slots
        self.temperatures = torch.zeros(slots)
        self.tokens = torch.zeros(slots, dtype=torch.long)
        self.lengths = torch.zeros(slots, dtype=torch.long)

    def busy(self) -> list[int]:
        return (self.owner >= 0).nonzero().flatten().tolist()

    def free(self) -> list[int]:
        return (self.owner < 0).nonzero().flatten().tolist()

    def start(self, slot: int, index: int, prompt: WriterPrompt) -> None:
        self.owner[slot], self.answers[slot] = index, []
        self.generators[slot] = torch.Generator().manual_seed(prompt.seed)
        self.temperatures[slot] = prompt.temperature
        self.lengths[slot] = len(prompt.ids)

    def select(self, kept: list[int]) -> "_SlotState":
        """The slots ``kept``, renumbered from 0 (as :meth:`BatchWriter.shrink` renumbers the cache)."""
        state = _SlotState(len(kept))
        index = torch.tensor(kept)
        state.owner, state.temperatures = self.owner[index], self.temperatures[index]
        state.tokens, state.lengths = self.tokens[index], self.lengths[index]
        state.answers = [self.answers[i] for i in kept]
        state.generators = [self.generators[i] for i in kept]
        return state
