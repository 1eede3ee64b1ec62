"""The draft-tree figure: nodes laid out by depth, coloured by the target's reach.

Trace names are stable (tests and the app read them): ``"edges"``, ``"nodes"``,
``"accepted path"``, ``"exit node"``, ``"bonus edge"`` and ``"bonus token"``.
Notation and sources of every number: :mod:`visual.style`.
"""

from __future__ import annotations

import math
from typing import Sequence

import plotly.graph_objects as go

from .layout import tidy_layout
from .style import BONUS_COLOUR, EXIT_COLOUR, PATH_COLOUR, TokenText, floats, token_label

__all__ = ["NODE_FIELDS", "tree_figure"]

# customdata columns of the "nodes" trace, in order.
NODE_FIELDS = ("node", "depth", "token", "text", "q", "edge_prob", "reach", "rho", "w")

REACH_SCALE = "Viridis"
# Reach is drawn on a log scale from 1e-3 to 1: below the root most nodes hold a few percent or
# less, and a linear 0..1 scale gives them all one colour.
REACH_LOG_FLOOR = -3.0
EDGE_COLOUR = "#9a9a9a"
FADED = 0.45  # opacity of nodes off the accepted path (edges: FADED_EDGE)
FADED_EDGE = 0.3

# Tree figure geometry (pixels).
MARGIN = dict(l=20, r=20, t=90, b=50)
ROW_PX = 22  # preferred height of one leaf row
MIN_HEIGHT, MAX_HEIGHT = 360, 1800
MIN_FONT, MAX_FONT = 8, 12
LABEL_GAP_PX = 2  # extra space required between two labels at the same depth


def _tree_geometry(num_rows: int) -> tuple[int, float, int]:
    """Figure height, pixels per leaf row, and label font size for ``num_rows`` leaf rows."""
    vertical_margin = MARGIN["t"] + MARGIN["b"]
    height = min(MAX_HEIGHT, max(MIN_HEIGHT, vertical_margin + ROW_PX * num_rows))
    row_px = (height - vertical_margin) / num_rows
    font = int(min(MAX_FONT, max(MIN_FONT, row_px * 0.6)))
    return height, row_px, font


def _place_labels(x, y, priority: Sequence[int], min_gap_rows: float, limit: int | None) -> set[int]:
    """Greedy label placement: take points in ``priority`` order, keep one when no kept label
    at the same depth is closer than ``min_gap_rows``; stop after ``limit`` labels."""
    kept: set[int] = set()
    rows_by_depth: dict[float, list[float]] = {}
    for i in priority:
        if limit is not None and len(kept) >= limit:
            break
        rows = rows_by_depth.setdefault(x[i], [])
        if all(abs(y[i] - other) >= min_gap_rows for other in rows):
            kept.add(i)
            rows.append(y[i])
    return kept


def _label_priority(flow, verdict) -> list[int]:
    """Points in labelling order: the bonus point (index ``N``), the accepted path, then the
    other nodes by decreasing reach ``P(v)`` (so crowded trees hide low-reach labels first)."""
    reach = floats(flow.reach)
    first = [len(reach)] + list(verdict.path) if verdict is not None else []
    taken = set(first)
    return first + sorted((v for v in range(len(reach)) if v not in taken), key=lambda v: (-reach[v], v))


def _edge_lines(pairs, x, y) -> tuple[list, list]:
    """Line coordinates for (parent, child) pairs, separated by ``None``."""
    xs, ys = [], []
    for a, b in pairs:
        xs += [x[a], x[b], None]
        ys += [y[a], y[b], None]
    return xs, ys


def _node_customdata(tree, flow, token_text, draft_logprob: bool) -> list[list]:
    q = [math.exp(v) for v in floats(tree.draft_logprob)] if draft_logprob else [None] * tree.num_nodes
    columns = zip(
        range(tree.num_nodes),
        tree.depths.tolist(),
        tree.tokens_list,
        [token_label(t, token_text, max_chars=40) for t in tree.tokens_list],
        q,
        floats(flow.edge_prob),
        floats(flow.reach),
        floats(flow.rho),
        floats(flow.exit_weight),
    )
    return [list(row) for row in columns]


def _node_hovertemplate(draft_logprob: bool) -> str:
    lines = [
        "<b>%{customdata[3]}</b> (token %{customdata[2]})",
        "node v = %{customdata[0]}, depth d(v) = %{customdata[1]}",
    ]
    if draft_logprob:
        lines.append("draft score q = %{customdata[4]:.4f}")
    lines += [
        "edge prob p<sub>pa(v)</sub>(x<sub>v</sub>) = %{customdata[5]:.4f}",
        "reach P(v) = %{customdata[6]:.4f}",
        "local exit rho(v) = %{customdata[7]:.4f}",
        "missing mass w(v) = %{customdata[8]:.4f}",
    ]
    return "<br>".join(lines) + "<extra></extra>"


def _tree_title(tree, flow, verdict, title: str | None) -> str:
    numbers = f"B = {tree.size}, C(T) = {flow.coverage:.3f}, 1 + C = {flow.tau_bound:.3f}"
    if verdict is not None:
        numbers += f", this round L = {verdict.block_length} ({verdict.verifier})"
    key = "colour = reach P(v) (log scale) · marker size grows with missing mass w(v)"
    if verdict is not None:
        key += " · bold = accepted path · red ring = exit node"
    head = title if title is not None else "Draft tree"
    return f"{head}: {numbers}<br><sup>{key}</sup>"


def tree_figure(
    tree,
    flow,
    verdict=None,
    token_text: TokenText = str,
    draft_logprob: bool = True,
    title: str | None = None,
    max_label_nodes: int | None = None,
) -> go.Figure:
    """The draft tree, laid out by depth, coloured by the target's reach.

    Args:
        tree: a :class:`~tev.core.tree.DraftTree` (``N`` nodes).
        flow: its :class:`~tev.core.flow.TargetFlow` (read as given).
        verdict: an optional :class:`~tev.core.verify.Verdict`: draws the accepted path bold, fades
            the rest, rings the exit node and hangs the bonus token off it.
        token_text: token id -> text.
        draft_logprob: show the draft score ``q = exp(tree.draft_logprob[v])`` in the hover.
        title: the first words of the title (the numbers B, C(T), 1 + C, L always follow).
        max_label_nodes: at most this many node labels (the accepted path and the bonus are
            labelled first, then nodes by decreasing reach); ``None``: as many as fit.

    Node ``v``: colour = ``P(v)`` on a fixed log scale (1e-3 .. 1), size grows with ``w(v)``, text = its
    token, hover = token, ``v``, ``d(v)``, ``q``, ``p_pa(v)(x_v)``, ``P(v)``, ``rho(v)``, ``w(v)``
    (also in ``customdata``, columns ``NODE_FIELDS``).
    """
    parents = tree.parents_list
    # The bonus token gets its own leaf row under the exit node, so it never covers a node.
    x, y = tidy_layout(parents + ([verdict.exit_node] if verdict is not None else []))
    num_rows = int(max(y)) + 1
    height, row_px, font = _tree_geometry(num_rows)
    node_size = _node_sizes(flow, row_px)
    path_nodes = set(verdict.path) if verdict is not None else set()
    order = _label_priority(flow, verdict)
    labelled = _place_labels(x, y, order, (font + LABEL_GAP_PX) / row_px, max_label_nodes)

    fig = go.Figure()
    fig.add_trace(_edges_trace(tree, x, y, faded=verdict is not None))
    if verdict is not None:
        fig.add_trace(_path_trace(verdict, x, y))
    fig.add_trace(_nodes_trace(tree, flow, x, y, node_size, path_nodes, labelled, font, token_text, draft_logprob, verdict))
    if verdict is not None:
        for trace in _exit_and_bonus_traces(tree, flow, verdict, x, y, node_size, labelled, font, token_text):
            fig.add_trace(trace)
    plot_px = height - MARGIN["t"] - MARGIN["b"]
    fig.update_traces(selector=dict(name="nodes"), marker_colorbar_len=min(1.0, 280 / plot_px))
    fig.update_layout(
        title=dict(text=_tree_title(tree, flow, verdict, title), x=0.01, xanchor="left"),
        height=height,
        margin=MARGIN,
        plot_bgcolor="white",
        hovermode="closest",
        legend=dict(orientation="h", yanchor="bottom", y=1.0, xanchor="right", x=1.0),
    )
    fig.update_xaxes(title_text="depth d(v)", dtick=1, range=[-0.4, max(x) + 0.9], showgrid=False, zeroline=False)
    fig.update_yaxes(range=[num_rows - 0.5, -0.5], visible=False)  # first child on top
    return fig


def _log_reach(flow) -> list[float]:
    """``log10 P(v)``, floored at :data:`REACH_LOG_FLOOR` (a reach of 0 takes the floor's colour)."""
    return [max(REACH_LOG_FLOOR, math.log10(r)) if r > 0 else REACH_LOG_FLOOR for r in floats(flow.reach)]


def _node_sizes(flow, row_px: float) -> list[float]:
    """Marker diameter (px) per node: grows with ``sqrt(w(v))`` from a floor that fits a row."""
    smallest = max(4.0, min(8.0, 0.8 * row_px))
    largest = max(smallest + 6.0, min(30.0, 2.0 * row_px))
    return [smallest + (largest - smallest) * math.sqrt(max(w, 0.0)) for w in floats(flow.exit_weight)]


def _edges_trace(tree, x, y, faded: bool) -> go.Scatter:
    xs, ys = _edge_lines(((tree.parents_list[v], v) for v in range(1, tree.num_nodes)), x, y)
    return go.Scatter(
        x=xs, y=ys, mode="lines", name="edges", hoverinfo="skip", showlegend=False,
        line=dict(color=EDGE_COLOUR, width=1), opacity=FADED_EDGE if faded else 0.8,
    )


def _path_trace(verdict, x, y) -> go.Scatter:
    path = list(verdict.path)
    return go.Scatter(
        x=[x[v] for v in path], y=[y[v] for v in path], customdata=path, mode="lines",
        name="accepted path", line=dict(color=PATH_COLOUR, width=4), hoverinfo="skip",
    )


def _nodes_trace(tree, flow, x, y, sizes, path_nodes, labelled, font, token_text, draft_logprob, verdict) -> go.Scatter:
    n = tree.num_nodes
    exit_node = verdict.exit_node if verdict is not None else -1  # its label sits outside the exit ring
    labels = [token_label(t, token_text) if v in labelled and v != exit_node else "" for v, t in enumerate(tree.tokens_list)]
    on_path = [verdict is None or v in path_nodes for v in range(n)]
    # an accepted node's label sits above it: to its right runs the thick path line
    positions = ["top center" if verdict is not None and v in path_nodes else "middle right" for v in range(n)]
    return go.Scatter(
        x=x[:n], y=y[:n], mode="markers+text", name="nodes", showlegend=False, cliponaxis=False,
        text=labels, textposition=positions, textfont=dict(size=font, color="#333"),
        customdata=_node_customdata(tree, flow, token_text, draft_logprob),
        hovertemplate=_node_hovertemplate(draft_logprob),
        marker=dict(
            color=_log_reach(flow), colorscale=REACH_SCALE, cmin=REACH_LOG_FLOOR, cmax=0.0, size=sizes,
            opacity=[1.0 if keep else FADED for keep in on_path],
            line=dict(color=[PATH_COLOUR if verdict is not None and keep else "white" for keep in on_path],
                      width=[2 if verdict is not None and keep else 0.5 for keep in on_path]),
            colorbar=dict(title=dict(text="reach P(v)"), thickness=12, yanchor="top", y=1.0,
                          tickvals=[-3, -2, -1, 0], ticktext=["≤ 0.001", "0.01", "0.1", "1"]),
        ),
    )


def _exit_and_bonus_traces(tree, flow, verdict, x, y, sizes, labelled, font, token_text) -> list[go.Scatter]:
    v, b = verdict.exit_node, tree.num_nodes  # b: the bonus point appended to the layout
    w = floats(flow.exit_weight)[v]
    exit_trace = go.Scatter(
        x=[x[v]], y=[y[v]], mode="markers+text", name="exit node", customdata=[[v, w]], cliponaxis=False,
        # above the ring: to its right runs the bonus edge (straight right when V is a leaf)
        text=[token_label(tree.tokens_list[v], token_text) if v in labelled else ""], textposition="top center",
        textfont=dict(size=font, color=EXIT_COLOUR),
        marker=dict(symbol="circle-open", size=sizes[v] + 12, color=EXIT_COLOUR, line=dict(width=3)),
        hovertemplate=(
            f"<b>exit node</b> V = {v}: {token_label(tree.tokens_list[v], token_text, 40)} (depth {int(tree.depths[v])})"
            f"<br>the target left the tree here; w(V) = {w:.4f}<extra></extra>"
        ),
    )
    edge = go.Scatter(
        x=[x[v], x[b]], y=[y[v], y[b]], mode="lines", name="bonus edge", showlegend=False, hoverinfo="skip",
        line=dict(color=BONUS_COLOUR, width=2, dash="dash"),
    )
    text = token_label(verdict.bonus_token, token_text)
    bonus = go.Scatter(
        x=[x[b]], y=[y[b]], mode="markers+text", name="bonus token", cliponaxis=False,
        text=[text if b in labelled else ""], textposition="middle right",
        textfont=dict(size=font, color=BONUS_COLOUR), customdata=[[verdict.bonus_token, v]],
        marker=dict(symbol="diamond", size=max(10, sizes[v]), color=BONUS_COLOUR, line=dict(color="white", width=1)),
        hovertemplate=(
            f"<b>bonus token</b> {token_label(verdict.bonus_token, token_text, 40)} (token {verdict.bonus_token})"
            f"<br>drawn from the target at the exit node V = {v}"
            "<br>(never one of V's child tokens: the residual p<sub>V</sub><sup>res</sup>)<extra></extra>"
        ),
    )
    return [exit_trace, edge, bonus]
