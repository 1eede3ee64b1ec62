"""One Llama-family decoder layer's weights as the hand-written forwards read them.

The row-invariant forward (:mod:`tev.engine.row_invariant`) and the continuous-batching writer
(:mod:`tev.engine.batch_writer`) both run a Llama-family layer (Llama, Mistral, Qwen2, Qwen3) from
its transformers module's weights, with query/key/value fused into one product and gate/up into
another (fewer, larger kernel calls). :class:`LayerWeights` reads them once, the same way for both;
each forward says how a product is held (prepacked row-invariant products, or plain ``linear``) and
in which precision its norm gains are kept.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch

__all__ = ["LayerWeights", "Product"]

# (weight `[out, in]`, bias `[out]` or None) -> a product `x [M, in] -> [M, out]`
Product = Callable[[torch.Tensor, torch.Tensor | None], Callable[[torch.Tensor], torch.Tensor]]


@dataclass(frozen=True, eq=False)
class LayerWeights:
    """One decoder layer's products and norm gains.

    Attributes:
        qkv: the fused query, key and value product (``qkv_sizes``: each part's width); o: the output projection;
        gate_up: the fused gate and up product; down: the down projection.
        input_norm, post_norm: the norms' gains before attention and before the MLP.
        q_norm, k_norm: Qwen3's norms over each head's dimension (None elsewhere).
    """

    qkv: Callable[[torch.Tensor], torch.Tensor]
    qkv_sizes: list[int]
    o: Callable[[torch.Tensor], torch.Tensor]
    gate_up: Callable[[torch.Tensor], torch.Tensor]
    down: Callable[[torch.Tensor], torch.Tensor]
    input_norm: torch.Tensor
    post_norm: torch.Tensor
    q_norm: torch.Tensor | None
    k_norm: torch.Tensor | None

    @classmethod
    def read(cls, layer, product: Product, gain: Callable[[torch.Tensor], torch.Tensor]) -> "LayerWeights":
        """``layer`` (a transformers decoder layer) with each product made by ``product`` and each norm gain
        kept as ``gain`` gives it (its precision)."""
        attention, mlp = layer.self_attn, layer.mlp
        projections = (attention.q_proj, attention.k_proj, attention.v_proj)
        biases = None if projections[0].bias is None else torch.cat([p.bias.detach() for p in projections])
        q_norm = getattr(attention, "q_norm", None)
        return cls(
            qkv=product(torch.cat([p.weight.detach() for p in projections]), biases),
            qkv_sizes=[p.weight.shape[0] for p in projections],
            o=product(attention.o_proj.weight.detach(), None if attention.o_proj.bias is None else attention.o_proj.bias.detach()),
            gate_up=product(torch.cat([mlp.gate_proj.weight.detach(), mlp.up_proj.weight.detach()]), None),
            down=product(mlp.down_proj.weight.detach(), None),
            input_norm=gain(layer.input_layernorm.weight.detach()),
            post_norm=gain(layer.post_attention_layernorm.weight.detach()),
            q_norm=None if q_norm is None else gain(q_norm.weight.detach()),
            k_norm=None if q_norm is None else gain(attention.k_norm.weight.detach()),
        )
