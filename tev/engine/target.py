"""The target as the engine runs it: its model, the forward chosen for it here, and what it costs.

Rules:

1. Nothing is looked up by the model. Every session, cost curve and budget rule on a target reads
   one :class:`Target`, passed explicitly; two Targets of one model share nothing.
2. A target whose forward was never chosen runs transformers' forward as loaded (``Target(model)``:
   a tiny test model, a drafter run as a causal LM, a model only being trained on).
3. :func:`~tev.engine.target_precision.choose_target_forward` sets ``precision`` and ``forward`` at
   load (:func:`~tev.engine.models.load_bundle`); a comparison may switch them for a while
   (:func:`~tev.engine.target_precision.forced_target_forward`), and the sessions made meanwhile run
   the forward in force as they were made.
4. What a start measures on the target stays with it: the row-invariant forwards built for it (one
   build per precision however often a comparison switches), its head's greedy screen, and its cost
   curves, one per torch thread count and forward (a bfloat16 row costs another price than a float32 one).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import torch

from tev.core.head_screen import HeadScreen
from tev.engine.row_invariant import RowInvariantForward
from tev.util.precision import low_precision

__all__ = ["Target", "TargetPrecision"]


@dataclass(frozen=True)
class TargetPrecision:
    """The target's forward on this machine, and why.

    Attributes:
        forward: ``"row-invariant"`` or ``"transformers"``.
        dtype: the precision of its matrix products (``"float32"`` or ``"bfloat16"``).
        reason: one sentence: why this one.
        step_ms: measured milliseconds of a forward and its head, per candidate
            (``"row-invariant bfloat16"``, ...), per new-token count (``"1"``, ``"9"``).
        refused: candidates left out, with why.
    """

    forward: str
    dtype: str
    reason: str
    step_ms: dict = field(default_factory=dict)
    refused: dict = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"{self.forward} {self.dtype}"

    @property
    def invariant(self) -> bool:
        return self.forward == "row-invariant"

    def to_dict(self) -> dict:
        return {**asdict(self), "label": self.label}


class Target:
    """A causal LM with the forward its sessions run and what this process measured on it.

    Args:
        model: a transformers causal LM.
        precision: what was chosen for it and why (None: nothing chosen, transformers' forward).
        forward: the row-invariant forward its sessions run on a CPU (None: transformers' forward).

    Attributes:
        built: per precision (``"float32"``, ``"bfloat16"``), the row-invariant forward built for the
            model, or None, and why it may not run (None: it may); filled by the choice.
        curves: :class:`~tev.engine.cost_curve.CostCurve` per (torch threads, forward label), measured
            on first use (:func:`~tev.engine.cost_curve.machine_cost_curve`).
    """

    def __init__(self, model, precision: TargetPrecision | None = None, forward: RowInvariantForward | None = None):
        self.model = model
        self.precision = precision
        self.forward = forward
        self.built: dict[str, tuple[RowInvariantForward | None, str | None]] = {}
        self.curves: dict[tuple[int, str], object] = {}
        self._screen: HeadScreen | None = None

    def __repr__(self) -> str:
        return f"Target({type(self.model).__name__}, {self.label})"

    @property
    def label(self) -> str:
        """The forward its sessions run, e.g. ``"row-invariant float32"``; ``"transformers"`` when none was chosen."""
        return self.precision.label if self.precision is not None else "transformers"

    def run(self, precision: TargetPrecision | None, forward: RowInvariantForward | None) -> TargetPrecision | None:
        """From now on its sessions run ``forward`` (None: transformers'), chosen as ``precision`` says."""
        self.precision, self.forward = precision, forward
        return precision

    def head_screen(self, head: torch.Tensor | None) -> HeadScreen | None:
        """The :class:`HeadScreen` of ``head`` (`Tensor[V, H]`, the model's output head) for greedy
        argmaxes: float32 heads on a CPU where a bfloat16 product is measured faster and accumulates
        in float32, else None. One per target: its bfloat16 head copy is shared by every session."""
        if head is None or head.dtype != torch.float32 or head.device.type != "cpu" or low_precision(head.device) != torch.bfloat16:
            return None
        screen = self._screen
        if screen is None or screen.head.data_ptr() != head.data_ptr() or screen.head.shape != head.shape:
            screen = self._screen = HeadScreen(head)
        return screen if screen.enabled else None
