"""The block drafter ``q`` (DFlash-style): one forward from the target's features to K per-depth
marginals ``q_1 .. q_K``, its shape (:class:`BlockDrafterConfig`) and its files.

This is the model only (nanoGPT's ``model.py``); :class:`~tev.engine.drafters.BlockTreeDrafter`
turns its marginals into a draft tree. Its parameters, head and files are a :class:`DrafterBody`,
which the path drafter (:mod:`tev.engine.path_drafter`) reads its own way. ``p`` is the target.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import nn

from tev.core.visibility import attention_bias, window_visibility
from tev.util.int8_head import Int8Head, use_int8_head
from tev.util.precision import low_precision

__all__ = ["BlockDrafterConfig", "DrafterBody", "BlockDrafter", "read_drafter_config", "check_drafter_fits_target", "default_feature_layers", "DRAFTER_FILE", "DRAFTER_CONFIG"]

DRAFTER_FILE = "drafter.safetensors"
DRAFTER_CONFIG = "drafter_config.json"

@dataclass
class BlockDrafterConfig:
    """Shape of a :class:`BlockDrafter` and the target it was built for."""

    vocab_size: int
    target_hidden_size: int
    feature_layers: list[int]  # indices into the target's ``hidden_states``
    horizon: int = 8  # K: depths predicted in one pass
    context_window: int = 16  # W: committed positions whose target features it reads
    hidden_size: int = 256
    num_layers: int = 2
    num_heads: int = 4
    intermediate_size: int = 768
    target_num_layers: int | None = None  # to refuse a drafter paired with another target
    draft_vocab_size: int | None = None  # Vd: the tokens the drafter can propose (None: all V)
    feature_norm: str = "concat"  # "per_layer": normalise each layer's features on its own scale
    feature_dropout: float = 0.0  # dropout on the projected context features while training
    conditioning: str = "marginal"  # "path": depth d reads the drafted tokens above it (tev.engine.path_drafter)
    notes: dict = field(default_factory=dict)  # provenance (training recipe), not used by the model

    @property
    def feature_size(self) -> int:
        return len(self.feature_layers) * self.target_hidden_size


class _RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float = 1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)


class _LayerwiseRMSNorm(nn.Module):
    """RMS norm of each layer's slice of the concatenated features on its own: the residual
    streams of middle layers are many times larger (with a few huge dimensions) than the final
    normed layer, and one norm over the concatenation would let them drown it."""

    def __init__(self, layers: int, size: int, eps: float = 1e-6):
        super().__init__()
        self.layers, self.eps = layers, eps
        self.weight = nn.Parameter(torch.ones(layers * size))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        chunks = x.unflatten(-1, (self.layers, -1))  # (..., layers, H)
        chunks = chunks * torch.rsqrt(chunks.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * chunks.flatten(-2)


class _Block(nn.Module):
    """Pre-norm transformer block for the draft slots; the target's context features enter
    every block as extra keys and values (DFlash-style injection), so only the ``1 + K``
    draft slots pay for queries and the MLP."""

    def __init__(self, size: int, heads: int, intermediate: int):
        super().__init__()
        self.heads = heads
        self.attn_norm = _RMSNorm(size)
        self.context_norm = _RMSNorm(size)
        self.q = nn.Linear(size, size, bias=False)
        self.kv = nn.Linear(size, 2 * size, bias=False)
        self.out = nn.Linear(size, size, bias=False)
        self.mlp_norm = _RMSNorm(size)
        self.up = nn.Linear(size, 2 * intermediate, bias=False)
        self.down = nn.Linear(intermediate, size, bias=False)

    def _heads(self, x: torch.Tensor) -> torch.Tensor:
        batch, length, size = x.shape
        return x.view(batch, length, self.heads, size // self.heads).transpose(1, 2)  # (B, heads, T, head)

    def forward(self, x: torch.Tensor, context: torch.Tensor, key_bias: torch.Tensor) -> torch.Tensor:
        """x: `[B, S, D]` draft slots; context: `[B, W, D]`; key_bias: `[B, 1, 1, W + S]`."""
        h = self.attn_norm(x)
        keys, values = self.kv(torch.cat([self.context_norm(context), h], dim=1)).chunk(2, dim=-1)
        return self.attend(x, h, keys, values, key_bias)

    def attend(self, x: torch.Tensor, h: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, key_bias: torch.Tensor) -> torch.Tensor:
        """The block's attention over ``keys``/``values`` (`[B, M, D]`, the slots' own last) and its
        MLP: x `[B, S, D]`, h its normed copy; key_bias broadcasts to `[B, heads, S, M]`."""
        attended = F.scaled_dot_product_attention(self._heads(self.q(h)), self._heads(keys), self._heads(values), attn_mask=key_bias)
        x = x + self.out(attended.transpose(1, 2).reshape(x.shape))
        gate, up = self.up(self.mlp_norm(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


class DrafterBody(nn.Module):
    """What the block drafter and the path drafter share: their parameters, draft vocabulary,
    head and files. Each reads it its own way (:class:`BlockDrafter`: K mask slots read out as
    marginals in one pass; :class:`~tev.engine.path_drafter.PathDrafter`: token slots, each
    depth reading the path above it), and a subclass names its way in ``CONDITIONING``.

    The target's features at the last ``W`` committed positions enter every block as keys and
    values (:meth:`_context`); the token embedding and the output head are the target's own,
    shared and frozen (they are not part of this module's parameters or checkpoint).

    With ``config.draft_vocab_size`` set, the drafter proposes only the ``Vd`` tokens listed in
    its ``draft_vocab`` buffer (the most frequent in its training data) and reads only those
    rows of the head: for a 49,152-token target most of the drafter's cost is the head, and
    a token outside ``Vd`` is rarely one a tree would keep. Verification is exact whatever the
    drafter proposes, so this trades a little acceptance for a much cheaper drafter.
    """

    CONDITIONING: str  # the config's ``conditioning`` a subclass runs
    PRECISION_SHAPE: tuple[int, int, int] | None = None  # the product its precision is measured on (None: the probe's, one pass's size)

    def __init__(self, config: BlockDrafterConfig, target_embedding: torch.Tensor, target_head: torch.Tensor):
        super().__init__()
        if config.conditioning != self.CONDITIONING:
            raise ValueError(f"a drafter with conditioning {config.conditioning!r} is not a {type(self).__name__} ({self.CONDITIONING!r})")
        self.config = config
        size = config.hidden_size
        if config.feature_norm == "per_layer":
            self.feature_norm = _LayerwiseRMSNorm(len(config.feature_layers), config.target_hidden_size)
        elif config.feature_norm == "concat":
            self.feature_norm = _RMSNorm(config.feature_size)
        else:
            raise ValueError(f"feature_norm must be 'concat' or 'per_layer', got {config.feature_norm!r}")
        self.feature_dropout = nn.Dropout(config.feature_dropout)
        self.feature_proj = nn.Linear(config.feature_size, size, bias=False)
        self.root_proj = nn.Linear(config.target_hidden_size, size, bias=False)
        self.mask_embed = nn.Parameter(torch.randn(config.horizon, size) * 0.02)
        self.position_embed = nn.Parameter(torch.randn(config.context_window + 1 + config.horizon, size) * 0.02)
        self.blocks = nn.ModuleList(_Block(size, config.num_heads, config.intermediate_size) for _ in range(config.num_layers))
        self.out_norm = _RMSNorm(size)
        self.out_proj = nn.Linear(size, config.target_hidden_size, bias=False)
        if config.draft_vocab_size is not None:
            # token ids of the draft vocabulary, [Vd]; saved with the weights
            self.register_buffer("draft_vocab", torch.arange(config.draft_vocab_size), persistent=True)
        else:
            self.draft_vocab = None
        # shared with the target, kept out of the parameter list and the checkpoint
        self._shared = (target_embedding, target_head)
        self._head_copies: dict[tuple, torch.Tensor] = {}
        self._int8_heads: dict[tuple, Int8Head] = {}

    def _vocab_key(self) -> tuple | None:
        """What a cached copy of the head rows depends on: the draft vocabulary's tensor and version."""
        vocab = self.draft_vocab
        return None if vocab is None else (vocab.data_ptr(), vocab._version)

    def _head_rows(self) -> torch.Tensor:
        """`[Vd, H]` the target's head rows of the draft vocabulary (all rows without one)."""
        head, vocab = self._shared[1], self.draft_vocab
        return head if vocab is None else head[vocab.to(head.device)]

    def _draft_head(self, dtype: torch.dtype) -> torch.Tensor:
        """The head rows the drafter reads, `[Vd, H]` in ``dtype`` (cached; rebuilt when the
        draft vocabulary changes, e.g. on ``load_state_dict``)."""
        if self.draft_vocab is None and self._shared[1].dtype == dtype:
            return self._shared[1]
        key = (dtype, self._vocab_key())
        if key not in self._head_copies:
            self._head_copies.clear()
            self._head_copies[key] = self._head_rows().to(dtype).contiguous()
        return self._head_copies[key]

    def _head_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """`[..., Vd]` float32 logits of `[..., H]` read-out states over the draft head rows; at
        inference through int8 rows where :func:`~tev.util.int8_head.use_int8_head` measured them faster."""
        if not self.training and not torch.is_grad_enabled() and use_int8_head(hidden.device):
            key = (self._shared[1].data_ptr(), self._vocab_key())
            if key not in self._int8_heads:
                self._int8_heads.clear()
                self._int8_heads[key] = Int8Head(self._head_rows())
            return self._int8_heads[key](hidden)
        head = self._draft_head(self.feature_proj.weight.dtype)  # a low-precision drafter reads a matching copy (half the bytes)
        return F.linear(hidden.to(head.dtype), head).float()

    def _context(self, features: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """`[B, W, D]` projected target features (`[B, W, F]`) at the window's positions."""
        width = self.config.context_window
        return self.feature_dropout(self.feature_proj(self.feature_norm(features.to(dtype)))) + self.position_embed[:width]

    def _read_out(self, slots: torch.Tensor) -> torch.Tensor:
        """`[..., Vd]` float32 logits of `[..., D]` slot states."""
        return self._head_logits(self.out_proj(self.out_norm(slots)))

    def set_draft_vocab(self, token_ids: torch.Tensor) -> None:
        """Fill the draft vocabulary (`LongTensor[Vd]` of target token ids)."""
        if self.draft_vocab is None or token_ids.shape != self.draft_vocab.shape:
            raise ValueError(f"expected {self.config.draft_vocab_size} draft-vocabulary ids, got {tuple(token_ids.shape)}")
        self.draft_vocab.copy_(token_ids.to(self.draft_vocab.device))

    def widen_draft_vocab(self, token_ids: list[int]) -> None:
        """Add target tokens to the draft vocabulary (kept sorted; ``config.draft_vocab_size``
        follows). The drafter learns nothing per token (it reads the target's head rows), so a
        token joins without retraining."""
        if self.draft_vocab is None:
            raise ValueError("this drafter proposes the whole vocabulary; there is nothing to widen")
        merged = torch.tensor(sorted(set(self.draft_vocab.tolist()) | set(token_ids)), dtype=self.draft_vocab.dtype, device=self.draft_vocab.device)
        self.config.draft_vocab_size = int(merged.numel())
        self.draft_vocab = merged  # the buffer replaced: saved with the weights; _draft_head's key sees the new tensor
        self._head_copies.clear()
        self._int8_heads.clear()

    def draft_positions(self, token_ids: torch.Tensor, missing: int = -100) -> torch.Tensor:
        """Each target token id's index in the draft vocabulary (``missing`` where it has none);
        the identity without a draft vocabulary. Negative ids stay as they are."""
        if self.draft_vocab is None:
            return token_ids
        lookup = torch.full((self.config.vocab_size,), missing, dtype=torch.long, device=token_ids.device)
        lookup[self.draft_vocab.to(token_ids.device)] = torch.arange(self.draft_vocab.numel(), device=token_ids.device)
        return torch.where(token_ids >= 0, lookup[token_ids.clamp(min=0)], token_ids)

    def full_vocab(self, values: torch.Tensor) -> torch.Tensor:
        """`[..., Vd]` draft-vocabulary values as `[..., V]`, ``-inf`` outside the draft
        vocabulary (as they are without one)."""
        if self.draft_vocab is None:
            return values
        full = values.new_full((*values.shape[:-1], self.config.vocab_size), float("-inf"))
        return full.index_copy_(-1, self.draft_vocab.to(values.device), values)

    def window(self, features: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """The last ``W`` rows of a feature history, left-padded: (`[1, W, F]`, `[1, W]`)."""
        width, size = self.config.context_window, self.config.feature_size
        device = self.mask_embed.device
        window = torch.zeros(1, width, size, device=device)
        valid = torch.zeros(1, width, dtype=torch.bool, device=device)
        if features is not None and features.shape[0] > 0:
            recent = features[-width:]
            window[0, width - recent.shape[0] :] = recent.to(device=device, dtype=window.dtype)
            valid[0, width - recent.shape[0] :] = True
        return window, valid

    # ------------------------------------------------------------------ persistence
    @classmethod
    def serving_dtype(cls, device) -> torch.dtype:
        """The precision this kind of drafter is served in on ``device``: :func:`~tev.util.precision.low_precision`,
        measured on the size of its products (:attr:`PRECISION_SHAPE`)."""
        return low_precision(device, cls.PRECISION_SHAPE)

    def served(self) -> "DrafterBody":
        """This drafter (changed in place) in eval mode and the precision drafters are served in
        (:meth:`serving_dtype` of its device), as :meth:`from_pretrained` loads one."""
        return self.eval().to(self.serving_dtype(next(self.parameters()).device))

    def save_pretrained(self, folder: str | Path) -> None:
        """Write ``drafter_config.json`` and ``drafter.safetensors`` (own parameters only)."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / DRAFTER_CONFIG).write_text(json.dumps(asdict(self.config), indent=2))
        tensors = {
            name: (tensor.detach().to(torch.bfloat16) if tensor.is_floating_point() else tensor.detach()).contiguous().cpu()
            for name, tensor in self.state_dict().items()
        }
        save_file(tensors, folder / DRAFTER_FILE, metadata={"format": "pt", "kind": "tev-block-drafter"})

    @classmethod
    def from_pretrained(cls, folder: str | Path, target, dtype: torch.dtype | None = None) -> "DrafterBody":
        """Load a drafter saved by :meth:`save_pretrained` and bind it to ``target``.

        ``dtype`` defaults to :meth:`serving_dtype` of the target's device:
        bfloat16 (the precision it is stored in; its weights and its copy of the head read at
        half the bytes) where that is measured faster, float32 elsewhere (a CPU without bfloat16
        instructions emulates it, about 100x slower). Pass float32 to train it.
        """
        folder = Path(folder)
        config, weights_path = read_drafter_config(folder), folder / DRAFTER_FILE
        check_drafter_fits_target(config, target)
        drafter = cls.for_target(config, target)
        try:
            state = load_file(weights_path)
        except Exception as error:  # safetensors raises its own error types for corrupt files
            raise ValueError(f"{weights_path} could not be read ({error}); rebuild it with `python -m tev build-assets`") from error
        try:
            drafter.load_state_dict({name: tensor.float() if tensor.is_floating_point() else tensor for name, tensor in state.items()}, strict=True)
        except RuntimeError as error:
            raise ValueError(f"{weights_path} does not match the block drafter architecture: {str(error).splitlines()[-1].strip()}") from error
        device = next(target.parameters()).device
        return drafter.to(device=device, dtype=dtype or cls.serving_dtype(device)).eval()

    @classmethod
    def for_target(cls, config: BlockDrafterConfig, target) -> "DrafterBody":
        """A fresh drafter bound to ``target``'s embedding and output head."""
        check_drafter_fits_target(config, target)
        embedding = target.get_input_embeddings().weight.detach()
        head = target.get_output_embeddings().weight.detach()
        return cls(config, embedding, head).to(embedding.device)


class BlockDrafter(DrafterBody):
    """One-pass block drafter (DFlash-style): K per-depth marginals from target features.

    The draft slots are ``[root token | K mask slots]``; in every block they attend to each
    other and to the ``W`` context slots (the target's features, projected); mask slot ``k`` is
    read out as ``q_k``, the marginal of the token ``k`` steps after the root.
    """

    CONDITIONING = "marginal"

    def forward(self, features: torch.Tensor, valid: torch.Tensor, root_ids: torch.Tensor, full_vocab: bool = True) -> torch.Tensor:
        """Per-depth draft logits over the target's whole vocabulary, `[B, K, V]`.

        Tokens outside the draft vocabulary get ``-inf``. Training code should pass
        ``full_vocab=False`` (:meth:`draft_logits`, `[B, K, Vd]`) with :meth:`draft_positions`
        labels: ``V / Vd`` times less work, and a wrapped module (accelerate) still syncs.
        """
        logits = self.draft_logits(features, valid, root_ids)
        return self.full_vocab(logits) if full_vocab else logits

    def draft_logits(self, features: torch.Tensor, valid: torch.Tensor, root_ids: torch.Tensor) -> torch.Tensor:
        """Per-depth draft logits over the draft vocabulary.

        Args:
            features: `Tensor[B, W, F]` target features at the last ``W`` committed positions
                before the root (left-padded).
            valid: `BoolTensor[B, W]`, False on padding.
            root_ids: `LongTensor[B]`, the root tokens.

        Returns:
            `Tensor[B, K, Vd]` logits of ``q_1 .. q_K`` (``Vd = V`` without a draft vocabulary).
        """
        embedding = self._shared[0]
        batch = root_ids.shape[0]
        width, horizon = self.config.context_window, self.config.horizon
        dtype = self.feature_proj.weight.dtype
        context = self._context(features, dtype)  # (B, W, D)
        slots = torch.cat(
            [
                self.root_proj(embedding[root_ids].to(dtype)).unsqueeze(1),  # (B, 1, D)
                self.mask_embed.unsqueeze(0).expand(batch, -1, -1),  # (B, K, D)
            ],
            dim=1,
        ) + self.position_embed[width:]
        visible = window_visibility(valid, torch.ones(1, 1 + horizon, dtype=torch.bool))  # every slot sees every slot
        key_bias = attention_bias(visible, dtype)[:, None]  # (B, 1, 1, W + 1 + K): the same for every query and head
        for block in self.blocks:
            slots = block(slots, context, key_bias)
        return self._read_out(slots[:, 1:])  # the K mask slots, (B, K, Vd)

    @torch.no_grad()
    def marginals(self, features: torch.Tensor | None, root_token: int) -> torch.Tensor:
        """`Tensor[K, V]` log ``q_d`` for one context."""
        window, valid = self.window(features)
        root = torch.tensor([root_token]).to(window.device, non_blocking=True)  # queued, no wait for the device
        return torch.log_softmax(self(window, valid, root)[0], dim=-1)  # -inf outside the draft vocabulary



def read_drafter_config(folder: str | Path) -> BlockDrafterConfig:
    """The config of the drafter saved in ``folder`` (its weights must be there too)."""
    folder = Path(folder)
    config_path = folder / DRAFTER_CONFIG
    if not config_path.is_file() or not (folder / DRAFTER_FILE).is_file():
        raise FileNotFoundError(f"no block drafter in {folder}: expected {DRAFTER_CONFIG} and {DRAFTER_FILE}")
    try:
        return BlockDrafterConfig(**json.loads(config_path.read_text()))
    except (TypeError, json.JSONDecodeError) as error:
        raise ValueError(f"{config_path} is not a valid drafter config: {error}") from error


def check_drafter_fits_target(config: BlockDrafterConfig, target) -> None:
    target_config = target.config
    problems = []
    if config.vocab_size != target.get_output_embeddings().weight.shape[0]:
        problems.append(f"vocabulary {config.vocab_size} vs target {target.get_output_embeddings().weight.shape[0]}")
    if config.target_hidden_size != target_config.hidden_size:
        problems.append(f"hidden size {config.target_hidden_size} vs target {target_config.hidden_size}")
    if config.target_num_layers is not None and config.target_num_layers != target_config.num_hidden_layers:
        problems.append(f"built for a {config.target_num_layers}-layer target, this one has {target_config.num_hidden_layers}")
    if problems:
        raise ValueError("this block drafter was built for another target: " + "; ".join(problems))


def default_feature_layers(num_layers: int) -> list[int]:
    """Three evenly spaced hidden-state indices ending at the last layer (DFlash reads several)."""
    picks = sorted({max(1, round(num_layers * i / 3)) for i in (1, 2, 3)})
    return picks
