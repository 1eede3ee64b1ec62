"""A causal LM with its KV cache: prefill, one-forward tree attention, compaction to a path.

Used for the target (``p``) and for an autoregressive drafter (``q``). Tree attention runs the
whole draft tree in ONE forward: node ``v`` sits at position ``len(cache) + d(v)`` and sees the
cached context plus its own ancestors, through a float 4-D additive mask (0 visible,
``finfo.min`` hidden; a boolean mask is silently wrong with eager attention). After the
verdict, :meth:`CausalLMSession.commit` keeps only the accepted path in the cache.

Token ids, positions, masks and kept indices are built on the host and copied to the device
with ``non_blocking=True``: the copy is queued behind the device's work instead of waiting for
it (a pageable host tensor is staged before the call returns, so this is safe).
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
import transformers
from packaging.version import Version
from transformers import DynamicCache

from tev.core.head_screen import HeadScreen
from tev.core.sampling import SamplingLaw, as_law
from tev.core.tree import DraftTree
from tev.core.verify import LogitRows, TargetRows
from tev.core.visibility import attention_bias, chain_ancestors, tree_visibility
from tev.engine.row_invariant import RowInvariantForward
from tev.engine.row_products import MAX_ROWS
from tev.engine.target import Target

__all__ = ["CausalLMSession", "ForwardOutput", "HeadRows", "ALL_ROWS_AT_ONCE", "MIN_TRANSFORMERS", "check_transformers", "max_positions"]


# Architectures whose logits are exactly ``lm_head(final hidden state)`` (no scaling or capping),
# so the head can be applied later, to the rows that are needed only.
_PLAIN_HEAD = {"llama", "qwen2", "qwen3", "mistral"}


MIN_TRANSFORMERS = "5.24"  # the forward's ``cache=`` keyword; older versions take it silently into **kwargs


def max_positions(model) -> int:
    """How many positions ``model`` attends to (its config's ``max_position_embeddings``; unbounded when it names none)."""
    return int(getattr(model.config, "max_position_embeddings", 1 << 30))


def check_transformers(version: str | None = None) -> None:
    """Refuse a transformers older than :data:`MIN_TRANSFORMERS`: there the cache this engine
    passes is ignored without an error and every forward would recompute the whole context."""
    version = version or transformers.__version__
    if Version(version) < Version(MIN_TRANSFORMERS):
        raise RuntimeError(f"transformers {version} is too old for this engine (needs >= {MIN_TRANSFORMERS}); "
                           f"install the versions of requirements.txt: python -m pip install -r requirements.txt")


def _linear_logits(hidden: torch.Tensor, head: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.linear(hidden, head).float()


# Up to this many nodes, a tree's rows are projected through the head all at once when the first
# row is asked for: the projection reads the whole head whatever the row count (measured on the
# default pair's 113 MB head, 2 threads: 1 row 10 ms, 8 rows 16 ms, 17 rows 18 ms, 33 rows 25 ms,
# 65 rows 38 ms), so the parents' rows and the exit row (often a leaf's) come from one read.
ALL_ROWS_AT_ONCE = 33


class HeadRows(LogitRows):
    """Target rows from final hidden states through the output head, projected when a verifier
    first asks: a tree of up to :data:`ALL_ROWS_AT_ONCE` nodes all at once (kept), a larger
    one row set by row set. Greedy argmaxes come from the head's bfloat16 ``screen`` when there
    is one (the float32 argmax, cheaper; :class:`~tev.core.head_screen.HeadScreen`).

    Args:
        hidden: `Tensor[N, H]` final (normed) hidden states, one per tree node.
        head: `Tensor[V, H]` the output head (``logits = hidden @ head.T``).
        law: the target's sampling law.
        screen: the head's screen, used at ``T == 0`` only.
        project: `Tensor[M, H]` -> `Tensor[M, V]` float32 logits, where the head is not a plain
            ``linear`` (a row-invariant forward's own products); None: ``hidden @ head.T``.
    """

    def __init__(self, hidden: torch.Tensor, head: torch.Tensor, law: SamplingLaw, screen: HeadScreen | None = None,
                 project: Callable[[torch.Tensor], torch.Tensor] | None = None):
        if hidden.dim() != 2 or head.dim() != 2 or hidden.shape[1] != head.shape[1]:
            raise ValueError(f"hidden states [N, H] and head [V, H] must share H, got {tuple(hidden.shape)} and {tuple(head.shape)}")
        self.hidden = hidden
        self.head = head
        self.own_project = project  # passed on to selected rows
        self.project = project or functools.partial(_linear_logits, head=head)
        self._declare(law, hidden.shape[0], head.shape[0], hidden.device)
        self.screen = screen if law.greedy and project is None else None
        self._every: torch.Tensor | None = None  # `[N, V]` every row's logits, once projected together
        self._every_argmax: torch.Tensor | None = None  # `[N]` every row's argmax, once the screen gave them

    def select(self, nodes: torch.Tensor) -> "HeadRows":
        return HeadRows(self.hidden.index_select(0, nodes), self.head, self.law, self.screen, self.own_project)

    def all_logits(self) -> torch.Tensor:
        if self._every is None:
            self._every = self.project(self.hidden)
        return self._every

    def logits_at(self, nodes: torch.Tensor) -> torch.Tensor:
        if self._every is not None or self.num_rows <= ALL_ROWS_AT_ONCE:
            return self.all_logits().index_select(0, nodes)
        return self.project(self.hidden.index_select(0, nodes))

    def argmax_at(self, nodes: torch.Tensor) -> torch.Tensor:
        if self.screen is None:
            return super().argmax_at(nodes)
        if self._every_argmax is None:  # all rows at once: one read of the bfloat16 head serves the walk and a leaf exit
            self._every_argmax = self.screen.argmax(self.hidden)
        return self._every_argmax.index_select(0, nodes)


@dataclass(eq=False)
class ForwardOutput:
    """One forward's outputs. Logits are computed on demand from the final hidden states
    when the architecture allows it (see :meth:`rows`, :meth:`last_logits`).

    Attributes:
        hidden: `Tensor[T, H]` final (normed) hidden states, or None when ``logits`` came
            straight from the model.
        head: `Tensor[V, H]` the output head for ``hidden``.
        features: `Tensor[T, F]` the concatenated hidden states of the requested layers, or None.
        screen: the head's :class:`HeadScreen` for greedy rows, or None.
        project: the head's products where they are not ``hidden @ head.T`` (a row-invariant
            forward's, :class:`HeadRows`), or None.
    """

    hidden: torch.Tensor | None
    head: torch.Tensor | None
    features: torch.Tensor | None
    _logits: torch.Tensor | None = None
    screen: HeadScreen | None = None
    project: Callable[[torch.Tensor], torch.Tensor] | None = None

    def _project(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.project(hidden) if self.project is not None else _linear_logits(hidden, self.head)

    @property
    def logits(self) -> torch.Tensor:
        """`Tensor[T, V]` float32 logits of every token (computed once when lazy)."""
        if self._logits is None:
            self._logits = self._project(self.hidden)
        return self._logits

    def last_logits(self) -> torch.Tensor:
        """`Tensor[V]` float32 logits of the last token only."""
        if self._logits is not None:
            return self._logits[-1]
        if self.project is not None:
            return self.project(self.hidden[-1:])[0]
        return torch.nn.functional.linear(self.hidden[-1], self.head).float()

    def rows(self, sampling: SamplingLaw | float) -> TargetRows:
        """The target rows of a tree forward under ``sampling`` (a law or a bare temperature),
        projected through the head when a verifier first asks (:class:`HeadRows`)."""
        law = as_law(sampling)
        if self._logits is not None:
            return LogitRows(self._logits, law=law)
        return HeadRows(self.hidden, self.head, law, self.screen, self.project)


class CausalLMSession:
    """One sequence's state in a causal LM: its cache and how many tokens it holds.

    Args:
        target: the :class:`~tev.engine.target.Target` whose model runs here (a transformers causal
            LM: any architecture that accepts a 4-D float ``attention_mask`` with ``position_ids``
            and a ``DynamicCache``), with the forward chosen for it and its head's screen.
        feature_layers: indices into ``hidden_states`` to return as features (concatenated),
            e.g. ``(-1,)`` for the last layer; empty for none.
        row_invariant: run the model through the target's row-invariant forward (``target.forward``),
            where there is one: a row then comes out the same in a tree as alone. False for the
            transformers forward (training's masks, where rows see part of the cache).
    """

    def __init__(self, target: Target, feature_layers: tuple[int, ...] = (), row_invariant: bool = True):
        check_transformers()
        if not isinstance(target, Target):  # a bare model would silently drop the forward chosen for it
            raise TypeError(f"a session runs a Target (tev.engine.target), got {type(target).__name__}; wrap a model never chosen as Target(model)")
        model = target.model
        self.target = target
        self.model = model
        self.feature_layers = tuple(feature_layers)
        self.device = next(model.parameters()).device
        self.dtype = next(model.parameters()).dtype
        self.cache = DynamicCache(config=model.config)
        self.length = 0  # tokens held in the cache
        self.max_positions = max_positions(model)
        head = model.get_output_embeddings()
        self.lazy_head = getattr(model.config, "model_type", None) in _PLAIN_HEAD and head is not None and getattr(head, "bias", None) is None
        self.head = head.weight.detach() if self.lazy_head else None  # inference only: projections keep no graph
        # the row-invariant forward is a CPU one (a ZeroGPU Space moves the model to CUDA per call)
        self.invariant: RowInvariantForward | None = target.forward if row_invariant and self.device.type == "cpu" else None
        self.screen = target.head_screen(self.head) if self.invariant is None else None

    def _forward_invariant(self, ids: torch.Tensor, positions: torch.Tensor, visible: torch.Tensor) -> ForwardOutput:
        if not bool(visible[:, : self.length].all()):
            raise ValueError("the row-invariant forward needs every new row to see the whole cache")
        hidden, features = self.invariant.forward(ids, positions, visible[:, self.length :], self.cache, self.length, self.feature_layers)
        return ForwardOutput(hidden, self.head, features, project=self.invariant.project)

    def _forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, attention_mask: torch.Tensor) -> ForwardOutput:
        want_hidden = bool(self.feature_layers)
        kwargs = dict(
            input_ids=input_ids.to(self.device, non_blocking=True)[None],
            position_ids=position_ids.to(self.device, non_blocking=True)[None],
            attention_mask=attention_mask,
            cache=self.cache,
            use_cache=True,
            output_hidden_states=want_hidden,
        )
        with torch.no_grad():
            if self.lazy_head:  # the trunk only; the head runs later on the rows that need it
                out = self.model.model(**kwargs)
                hidden, logits = out.last_hidden_state[0], None
            else:
                out = self.model(**kwargs)
                hidden, logits = None, out.logits[0].float()
        features = None
        if want_hidden:
            features = torch.cat([out.hidden_states[i][0] for i in self.feature_layers], dim=-1)
        return ForwardOutput(hidden, self.head, features, logits, self.screen)

    def extend(self, token_ids) -> ForwardOutput:
        """Append tokens causally (prefill, or catching up); returns their logits/features."""
        ids = torch.as_tensor(token_ids, dtype=torch.long)
        if ids.numel() == 0:
            raise ValueError("extend needs at least one token")
        count = ids.numel()
        if self.invariant is not None and count > MAX_ROWS:  # a long prompt in pieces: the window gathers stay small
            pieces = [self.extend(piece) for piece in ids.split(MAX_ROWS)]
            features = None if pieces[0].features is None else torch.cat([piece.features for piece in pieces])
            return ForwardOutput(torch.cat([piece.hidden for piece in pieces]), self.head, features, project=self.invariant.project)
        visible = tree_visibility(self.length, chain_ancestors(count))
        return self.forward_masked(ids, torch.arange(self.length, self.length + count), visible)

    def forward_masked(self, token_ids, positions, visible: torch.Tensor) -> ForwardOutput:
        """A forward where row ``i`` sees the cache entries and new tokens marked in ``visible``.

        Args:
            token_ids: `LongTensor[n]`; positions: `LongTensor[n]` (absolute positions).
            visible: `BoolTensor[n, length + n]`, True where the token may attend.
        The new entries stay in the cache (see :meth:`commit`, :meth:`rollback`).
        """
        ids = torch.as_tensor(token_ids, dtype=torch.long)
        positions = torch.as_tensor(positions, dtype=torch.long)
        if int(positions.max()) >= self.max_positions:
            raise ValueError(f"position {int(positions.max())} is past the model's context of {self.max_positions}")
        if self.invariant is not None:
            out = self._forward_invariant(ids, positions, visible)
        else:
            mask = attention_bias(visible, self.dtype)
            out = self._forward(ids, positions, mask.to(self.device, non_blocking=True)[None, None])
        self.length += ids.numel()
        return out

    def forward_tree(self, tree: DraftTree) -> ForwardOutput:
        """One forward over every node of ``tree`` (root first) with tree attention.

        Node ``v`` sits at position ``length + d(v)`` and sees the cache plus its ancestors.
        The tree's entries stay in the cache until :meth:`commit` keeps the accepted path.
        """
        visible = tree_visibility(self.length, tree.ancestors)
        base = self.length
        out = self.forward_masked(tree.tokens, base + tree.depths, visible)
        self.length = base  # the tree is provisional until commit
        return out

    def commit(self, path: list[int]) -> None:
        """After :meth:`forward_tree`: keep the cached context plus the tree nodes on ``path``
        (node indices, root first) and drop the other tree entries."""
        # only the path's entries move, to the places after the context (the context stays where it is: copying the
        # whole cache a round cost more than the round's verdict); a path that is the tree's first nodes moves nothing
        start, count = self.length, len(path)
        moved = [i for i, node in enumerate(path) if node != i]
        if moved:
            source = start + torch.as_tensor([path[i] for i in moved], dtype=torch.long, device=self.device)
            target = start + torch.as_tensor(moved, dtype=torch.long, device=self.device)
        for layer in self.cache.layers:
            keys, values = layer.keys, layer.values
            if moved:  # sources lie at or after their targets (node indices grow along a path): gathered before written
                keys.index_copy_(-2, target, keys.index_select(-2, source))
                values.index_copy_(-2, target, values.index_select(-2, source))
            layer.keys, layer.values = keys[..., : start + count, :], values[..., : start + count, :]
        self.length += count

    def rollback(self, length: int) -> None:
        """Shrink the cache to its first ``length`` tokens (drops a provisional tree too)."""
        cached = self.cache.get_seq_length()
        if length < cached:
            self.cache.crop(length - cached)
        self.length = min(self.length, length)
