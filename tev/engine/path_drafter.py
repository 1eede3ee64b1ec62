"""The path-conditioned drafter ``q`` and its tree front end: each depth drafted from the path above it.

The block drafter emits K per-depth marginals in one pass, so a path's score is a product of
marginals and depth 2 onwards never sees which token was drafted above it. This drafter keeps
the block drafter's body (the target's features at the last ``W`` committed positions, injected
as keys and values into every block; the target's own embedding and head rows) but its slots
are tokens: slot 0 holds the root, slot ``k`` the token drafted at depth ``k``, each attending
causally to the slots above it, and slot ``k`` is read out as ``q(x_{k+1} | c, x_1 .. x_k)``.

It is trained as the block drafter is, teacher-forced on the target's own text (the tokens it
wrote fill the slots; one pass gives every depth), and no depth ever reads a feature the target
did not compute, so what it reads at depth ``d`` while drafting is what it read in training
whenever the path above is the target's (the only case in which depth ``d`` can be accepted).

:class:`PathTreeDrafter` grows the tree best first by conditional path score, one cheap step per
depth over a key/value cache of the round's slots (EAGLE-2's dynamic tree). ``p`` is the target.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from tev.core.tree import DraftTree
from tev.core.visibility import attention_bias, chain_ancestors, slot_visibility, window_visibility
from tev.engine.block_drafter import DrafterBody
from tev.engine.drafters import DraftContext, DraftState, _check_shape
from tev.engine.tree_growth import GrowingTree, Step, frontier_width, grow_tree
from tev.util.int8_head import Int8Head, use_int8_head
from tev.util.timing import StageTimer

__all__ = ["PathDrafter", "PathTreeDrafter"]


class PathDrafter(DrafterBody):
    """Causal token slots over the target's features: `q_d` conditioned on the path above depth ``d``.

    The block drafter's body (:class:`~tev.engine.block_drafter.DrafterBody`: its parameters, draft
    vocabulary, head and files, ``config.conditioning == "path"``) read through token slots;
    ``mask_embed[d]`` marks the slot at depth ``d``.
    """

    CONDITIONING = "path"
    # a depth's step: a few frontier rows through a block's widest layer (bfloat16 measured 1.5-3x
    # slower than float32 at this size on a CPU whose larger products it speeds up 2x)
    PRECISION_SHAPE = (4, 256, 1536)

    @classmethod
    def serving_dtype(cls, device) -> torch.dtype:
        """float32 on a CPU where the step reads int8 rows (:func:`~tev.util.int8_head.use_int8_head`): its products
        then never run in the drafter's dtype, so bfloat16 would only add conversions around its norms and attention
        (on a 2-core AVX512_BF16 EPYC a 3-row depth step took 0.54 ms in bfloat16 and 0.39 ms in float32, where
        the float product of this size measured bfloat16 faster); elsewhere as every drafter."""
        if torch.device(device).type == "cpu" and use_int8_head(device):
            return torch.float32
        return super().serving_dtype(device)

    def _slot_inputs(self, tokens: torch.Tensor, depths: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """`[B, S, D]` slot inputs of target token ids `[B, S]` at tree depths `[B, S]` (root 0)."""
        width = self.config.context_window
        embedding = self._shared[0]
        return self.root_proj(embedding[tokens].to(dtype)) + self.mask_embed[depths] + self.position_embed[width + depths]

    def draft_logits(self, features: torch.Tensor, valid: torch.Tensor, root_ids: torch.Tensor, path_ids: torch.Tensor | None = None) -> torch.Tensor:
        """Per-depth draft logits over the draft vocabulary, teacher-forced on a path.

        Args:
            features: `Tensor[B, W, F]` target features at the last ``W`` committed positions
                before the root (left-padded); valid: `BoolTensor[B, W]`, False on padding.
            root_ids: `LongTensor[B]`, the root tokens.
            path_ids: `LongTensor[B, K']` (``K' <= K - 1``) the tokens at depths ``1 .. K'`` that
                the deeper depths condition on (negative ids, past a sequence's end, read as 0:
                only depths whose labels are ignored see them).

        Returns:
            `Tensor[B, K' + 1, Vd]` logits of ``q(x_{d} | c, x_1 .. x_{d-1})``, ``d = 1 .. K' + 1``.
        """
        batch = root_ids.shape[0]
        dtype = self.feature_proj.weight.dtype
        path_ids = root_ids.new_zeros(batch, 0) if path_ids is None else path_ids[:, : self.config.horizon - 1].clamp(min=0)
        tokens = torch.cat([root_ids[:, None], path_ids], dim=1)  # [B, S]
        slots_count = tokens.shape[1]
        depths = torch.arange(slots_count, device=tokens.device).expand(batch, -1)
        slots = self._slot_inputs(tokens, depths, dtype)
        context = self._context(features, dtype)
        visible = window_visibility(valid, chain_ancestors(slots_count))  # [B, S, W + S]: each slot the ones above it
        key_bias = attention_bias(visible, dtype)[:, None]
        for block in self.blocks:
            slots = block(slots, context, key_bias)
        return self._read_out(slots)

    def forward(self, features: torch.Tensor, valid: torch.Tensor, root_ids: torch.Tensor, path_ids: torch.Tensor | None = None,
                full_vocab: bool = True) -> torch.Tensor:
        logits = self.draft_logits(features, valid, root_ids, path_ids)
        return self.full_vocab(logits) if full_vocab else logits

    # ------------------------------------------------------------------ one round's growing tree
    @torch.no_grad()
    def start_round(self, features: torch.Tensor | None) -> "_RoundCache":
        """The round's key/value cache, holding the target features' keys and values per block."""
        step = self._inference_step()
        width = self.config.context_window
        recent = features[-width:] if features is not None else features
        context = step.context(recent, width) if recent is not None and recent.shape[0] else None  # [w, D], w <= W rows, no padding
        return _RoundCache(step, [step.context_kv(index, context) for index in range(len(self.blocks))])

    def _inference_step(self) -> "_FusedStep":
        """The fused weights of one depth's step (built again when a parameter or the draft vocabulary changed)."""
        key = (self.feature_proj.weight.dtype, use_int8_head(self.mask_embed.device), self._vocab_key(), self._shared[1].data_ptr(),
               tuple((p.data_ptr(), p._version) for p in self.parameters()))
        if getattr(self, "_step_key", None) != key:
            self._step, self._step_key = _FusedStep(self), key
        return self._step

    @torch.no_grad()
    def extend(self, cache: "_RoundCache", tokens: list[int], depths: list[int], ancestors: list[list[int]]) -> torch.Tensor:
        """Forward new slots (token ids at tree depths; ``ancestors[i]``: the cache slots each sees
        besides itself) and keep their keys and values; returns `Tensor[n, Vd]` log q of the next depth."""
        step, device = cache.step, self.mask_embed.device
        n, held, width = len(tokens), cache.slots, cache.context_rows
        x = step.slots(torch.tensor(tokens, device=device), torch.tensor(depths, device=device))  # [n, D]
        visible = slot_visibility(width, held, ancestors).to(device)
        bias = torch.full(visible.shape, float("-inf"), dtype=step.dtype, device=device).masked_fill_(visible, 0.0)  # [n, M]: 0 where a slot may look
        cache.slots += n
        return step.forward(x, cache.memory, bias)


class _FusedStep:
    """One depth's step with the module's products fused for inference (the same function, fewer
    and smaller products: at a few rows a step is bound by per-call overhead and by reading its
    weights, which the target's forward evicts from the caches between rounds).

    Each norm's gain is folded into the product after it; a block's query, key and value
    projections are one product; the read-out norm's gain, ``out_proj`` and the head rows are one
    `[Vd, D]` product (``out_proj`` is linear, so the head of its output is the product of the
    two). Where :func:`~tev.util.int8_head.use_int8_head` says so every product reads int8 rows:
    a quarter of the bytes (measured in the decode loop: a depth's step 1.4 ms against 1.6-1.8 ms
    with float rows for the small products). Dropout is off (inference).

    It is kept beside the modules' own forward because it is faster than that forward compiled:
    at the shipped path drafter's shape on one CPU thread a step took 1.20 ms fused, 1.54 ms
    through the block modules and 1.67 ms through them under ``torch.compile`` (after 65 s of
    compiling). A change to a block must change it too: ``tests/test_path_drafter.py`` checks
    that each depth grown with it equals the modules' teacher-forced pass.
    """

    def __init__(self, model: PathDrafter):
        self.dtype = model.feature_proj.weight.dtype
        self.heads, self.eps = model.config.num_heads, model.blocks[0].attn_norm.eps
        self.head_size = model.config.hidden_size // self.heads
        self.scale = self.head_size ** -0.5
        self.int8 = use_int8_head(model.mask_embed.device)
        width = model.config.context_window
        norm = model.feature_norm
        self.feature_layers = getattr(norm, "layers", 1)  # per-layer norm: each layer's slice on its own
        self.feature = self._product(model.feature_proj.weight * norm.weight)
        self.context_position = model.position_embed[:width].detach()  # [W, D]
        self.embedding = model._shared[0]
        self.root = self._product(model.root_proj.weight)
        self.slot_bias = (model.mask_embed + model.position_embed[width : width + model.config.horizon]).detach().to(self.dtype)  # [K, D]: depth marker + position
        self.blocks = []
        for block in model.blocks:
            qkv = torch.cat([block.q.weight, block.kv.weight]) * block.attn_norm.weight  # [3D, D]
            self.blocks.append((self._product(qkv), self._product(block.kv.weight * block.context_norm.weight), self._product(block.out.weight),
                                self._product(block.up.weight * block.mlp_norm.weight), self._product(block.down.weight)))
        rows = model._head_rows().double() @ (model.out_proj.weight.double() * model.out_norm.weight.double())  # [Vd, D]
        self.head = self._product(rows)

    def _product(self, weight: torch.Tensor):
        """``x -> x @ weight.T`` (`weight`: `[out, in]`) in the step's dtype, through int8 rows where chosen."""
        weight = weight.detach()
        if self.int8:
            return Int8Head(weight)
        weight = weight.to(self.dtype)
        return lambda x: F.linear(x, weight)

    def context(self, features: torch.Tensor, width: int) -> torch.Tensor:
        """`[w, D]` projected target features of the last ``w <= W`` committed positions (`[w, F]`),
        at the last ``w`` of the window's ``W`` positions."""
        x = features.to(self.dtype).unflatten(-1, (self.feature_layers, -1))
        x = F.rms_norm(x, x.shape[-1:], eps=self.eps).flatten(-2)
        return self.feature(x).to(self.dtype) + self.context_position[width - features.shape[0]:]

    def slots(self, tokens: torch.Tensor, depths: torch.Tensor) -> torch.Tensor:
        """`[n, D]` slot inputs of token ids `[n]` at tree depths `[n]` (root 0)."""
        return self.root(self.embedding[tokens].to(self.dtype)).to(self.dtype) + self.slot_bias[depths]

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, x.shape[-1:], eps=self.eps)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        return x.view(x.shape[0], self.heads, -1).transpose(0, 1)  # [heads, M, head]

    def context_kv(self, index: int, context: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """Block ``index``'s keys and values of the projected context `[w, D]` (None: no context yet),
        each `[heads, w, head]`."""
        if context is None:
            empty = torch.zeros(self.heads, 0, self.head_size, dtype=self.dtype, device=self.slot_bias.device)
            return empty, empty
        keys, values = self.blocks[index][1](self._norm(context)).to(self.dtype).chunk(2, dim=-1)
        return self._heads(keys), self._heads(values)

    def forward(self, x: torch.Tensor, memory: list, bias: torch.Tensor) -> torch.Tensor:
        """`[n, Vd]` log q of new slots `x` (`[n, D]`) that see the keys of ``memory`` and their own
        where ``bias`` (`[n, M]`, 0 or -inf) is 0; appends their keys and values to ``memory``."""
        for index, (qkv, _, out, up, down) in enumerate(self.blocks):
            query, keys, values = qkv(self._norm(x)).to(x.dtype).chunk(3, dim=-1)
            past_keys, past_values = memory[index]
            keys, values = torch.cat([past_keys, self._heads(keys)], dim=1), torch.cat([past_values, self._heads(values)], dim=1)
            memory[index] = (keys, values)
            weights = torch.baddbmm(bias, self._heads(query), keys.transpose(1, 2), alpha=self.scale).softmax(-1)  # [heads, n, M]
            attended = torch.bmm(weights, values)  # [heads, n, head]: at a few rows faster than SDPA's kernel
            x = x + out(attended.transpose(0, 1).reshape(x.shape)).to(x.dtype)
            gate, lift = up(self._norm(x)).to(x.dtype).chunk(2, dim=-1)
            x = x + down(F.silu(gate) * lift).to(x.dtype)
        return torch.log_softmax(self.head(self._norm(x)).float(), dim=-1)


class _RoundCache:
    """Keys and values per block (`[heads, M, head]`) of the context and of the slots forwarded so far this round."""

    def __init__(self, step: _FusedStep, memory: list[tuple[torch.Tensor, torch.Tensor]]):
        self.step = step
        self.memory = memory
        self.context_rows = memory[0][0].shape[1]  # the committed positions every slot sees (no padding)
        self.slots = 0


class PathTreeDrafter:
    """A :class:`PathDrafter` growing an EAGLE-2-style dynamic tree (``shape="tree"``), or its top-1 chain
    (:func:`~tev.engine.tree_growth.grow_tree`).

    Per round one step per depth: the ``width`` best frontier nodes by path score ``sum log q``
    (at most 8) are forwarded together (each attends to the target's features and its own
    ancestors) and each proposes its ``width`` most likely children; the ``budget`` best nodes
    overall are kept. Depths stop early once no frontier node could still enter the best
    ``budget``, or none has a path probability of at least ``min_path_prob``, or the context's
    floor (budget auto's: such a node adds less than that to the expected block and is rarely
    kept, and each depth costs the drafter a step).
    """

    def __init__(self, model: PathDrafter, shape: str = "tree", name: str | None = None, horizon: int | None = None, min_path_prob: float = 1e-3):
        _check_shape(shape)
        self.min_path_prob = min_path_prob
        self.model = model
        self.shape = shape
        self.name = name or ("path" if shape == "tree" else "path-chain")
        self.feature_layers = tuple(model.config.feature_layers)
        self.horizon = min(horizon or model.config.horizon, model.config.horizon)

    def new_state(self) -> DraftState:
        return DraftState(window=self.model.config.context_window)

    def warm(self) -> None:
        """Build the fused inference weights now rather than in the first round (0.7 s for the shipped drafter)."""
        self.model._inference_step()

    def marginals(self, context: DraftContext, state: DraftState) -> None:
        return None  # each depth's q is conditional on its path

    def width_for(self, budget: int) -> int:
        return 1 if self.shape == "chain" else frontier_width(budget, cap=8)

    def propose(self, context: DraftContext, budget: int, state: DraftState, timer: StageTimer | None = None) -> DraftTree:
        timer = timer or StageTimer()
        horizon = min(self.horizon, context.max_depth, budget if self.shape == "chain" else self.horizon)
        with timer.stage("draft"):
            grown = grow_tree(context.token_ids[-1], budget, horizon, self.width_for(budget), self._step(state),
                              max(self.min_path_prob, context.min_path_prob), token_ids=self.model.draft_vocab)
        with timer.stage("build"):
            return grown.best(budget)

    def _step(self, state: DraftState) -> Step:
        """The grower's step over the round's key/value cache (started by the root's step)."""
        cache = None

        def step(nodes: list[int], tree: GrowingTree) -> torch.Tensor:
            nonlocal cache
            if cache is None:
                cache = self.model.start_round(state.features)
            ancestors = [tree.ancestor_slots(v) for v in nodes]
            return self.model.extend(cache, [tree.tokens[v] for v in nodes], [tree.depths[v] for v in nodes], ancestors).float().cpu()  # [n, Vd]

        return step
