"""Plotly figures and HTML views drawn from tev's own objects (never recomputing the math)."""

from .figures import (
    NODE_FIELDS,
    before_after_figure,
    mass_by_depth_figure,
    text_view_html,
    timeline_figure,
    token_label,
    training_figure,
    tree_figure,
    verifier_lab_figure,
)
from .layout import tidy_layout

__all__ = [
    "NODE_FIELDS",
    "before_after_figure",
    "mass_by_depth_figure",
    "text_view_html",
    "tidy_layout",
    "timeline_figure",
    "token_label",
    "training_figure",
    "tree_figure",
    "verifier_lab_figure",
]
