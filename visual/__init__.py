"""Plotly figures and HTML views drawn from tev's own objects (never recomputing the math)."""

from .charts import (
    before_after_figure,
    exit_mass_change_figure,
    mass_by_depth_figure,
    note_figure,
    timeline_figure,
    training_figure,
    verifier_lab_figure,
)
from .layout import tidy_layout, tree_graph
from .style import token_label
from .text_view import text_view_html
from .tree_view import NODE_FIELDS, tree_figure

__all__ = [
    "NODE_FIELDS",
    "before_after_figure",
    "exit_mass_change_figure",
    "mass_by_depth_figure",
    "note_figure",
    "text_view_html",
    "tidy_layout",
    "timeline_figure",
    "token_label",
    "training_figure",
    "tree_figure",
    "tree_graph",
    "verifier_lab_figure",
]
