"""Plotly figures drawn from the library's own objects.

``p`` is the target model and ``q`` the draft model. Every number drawn here is read from a
:class:`~tev.core.tree.DraftTree`, :class:`~tev.core.flow.TargetFlow`, :class:`~tev.core.verify.Verdict` or
:class:`~tev.engine.decode.RoundRecord`; no probability is recomputed (``flow.reach``,
``flow.exit_weight`` etc. are used as given). Token text comes from a ``token_text``
callable (for example ``lambda t: tokenizer.decode([t])``); the default is ``str``.

Trace names are stable (tests and the app read them): the tree figure has ``"edges"``,
``"nodes"``, ``"accepted path"``, ``"exit node"``, ``"bonus edge"`` and ``"bonus token"``.
"""

from __future__ import annotations

import html
import math
from typing import Callable, Sequence

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .layout import tidy_layout

__all__ = [
    "NODE_FIELDS",
    "token_label",
    "tree_figure",
    "mass_by_depth_figure",
    "timeline_figure",
    "text_view_html",
    "training_figure",
    "before_after_figure",
    "verifier_lab_figure",
]

TokenText = Callable[[int], str]

# customdata columns of the "nodes" trace, in order.
NODE_FIELDS = ("node", "depth", "token", "text", "q", "edge_prob", "reach", "rho", "w")
STAGES = ("draft", "tree_build", "verify", "verify_decision", "commit")  # tev.engine.decode.STAGES

REACH_SCALE = "Viridis"
PATH_COLOUR = "#111111"
EXIT_COLOUR = "#d62728"
BONUS_COLOUR = "#ff7f0e"
EDGE_COLOUR = "#9a9a9a"
FADED = 0.45  # opacity of nodes off the accepted path (edges: FADED_EDGE)
FADED_EDGE = 0.3

# Tree figure geometry (pixels).
MARGIN = dict(l=20, r=20, t=90, b=50)
ROW_PX = 22  # preferred height of one leaf row
MIN_HEIGHT, MAX_HEIGHT = 360, 1800
MIN_FONT, MAX_FONT = 8, 12
LABEL_GAP_PX = 2  # extra space required between two labels at the same depth

_VISIBLE_WHITESPACE = {" ": "·", "\n": "↵", "\t": "→", "\r": "␍"}


# ---------------------------------------------------------------------- token text
def _visible(text: str) -> str:
    return "".join(_VISIBLE_WHITESPACE.get(ch, ch) for ch in text)


def token_label(token: int, token_text: TokenText = str, max_chars: int | None = 8) -> str:
    """The token's text with whitespace made visible, cut to ``max_chars`` with '…'.

    The result is HTML-escaped (plotly renders a subset of HTML in text and hover).
    An empty decoding shows as ``⟨id⟩``.
    """
    text = _visible(token_text(int(token)))
    if not text:
        text = f"⟨{int(token)}⟩"
    if max_chars is not None and len(text) > max_chars:
        text = text[: max_chars - 1] + "…"
    return html.escape(text, quote=False)


def _floats(tensor) -> list[float]:
    return [float(v) for v in tensor.detach().cpu().tolist()]


# ---------------------------------------------------------------------- tree figure
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
    reach = _floats(flow.reach)
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
    q = [math.exp(v) for v in _floats(tree.draft_logprob)] if draft_logprob else [None] * tree.num_nodes
    columns = zip(
        range(tree.num_nodes),
        tree.depths.tolist(),
        tree.tokens_list,
        [token_label(t, token_text, max_chars=40) for t in tree.tokens_list],
        q,
        _floats(flow.edge_prob),
        _floats(flow.reach),
        _floats(flow.rho),
        _floats(flow.exit_weight),
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
    numbers = f"B = {tree.budget}, C(T) = {flow.coverage:.3f}, 1 + C = {flow.tau_bound:.3f}"
    if verdict is not None:
        numbers += f", this round L = {verdict.block_length} ({verdict.verifier})"
    key = "colour = reach P(v) · marker size grows with missing mass w(v)"
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

    Node ``v``: colour = ``P(v)`` on a fixed 0..1 scale, size grows with ``w(v)``, text = its
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


def _node_sizes(flow, row_px: float) -> list[float]:
    """Marker diameter (px) per node: grows with ``sqrt(w(v))`` from a floor that fits a row."""
    smallest = max(4.0, min(8.0, 0.8 * row_px))
    largest = max(smallest + 6.0, min(30.0, 2.0 * row_px))
    return [smallest + (largest - smallest) * math.sqrt(max(w, 0.0)) for w in _floats(flow.exit_weight)]


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
    return go.Scatter(
        x=x[:n], y=y[:n], mode="markers+text", name="nodes", showlegend=False,
        text=labels, textposition="middle right", textfont=dict(size=font, color="#333"),
        customdata=_node_customdata(tree, flow, token_text, draft_logprob),
        hovertemplate=_node_hovertemplate(draft_logprob),
        marker=dict(
            color=_floats(flow.reach), colorscale=REACH_SCALE, cmin=0.0, cmax=1.0, size=sizes,
            opacity=[1.0 if keep else FADED for keep in on_path],
            line=dict(color=[PATH_COLOUR if verdict is not None and keep else "white" for keep in on_path],
                      width=[2 if verdict is not None and keep else 0.5 for keep in on_path]),
            colorbar=dict(title=dict(text="reach P(v)"), thickness=12, yanchor="top", y=1.0),
        ),
    )


def _exit_and_bonus_traces(tree, flow, verdict, x, y, sizes, labelled, font, token_text) -> list[go.Scatter]:
    v, b = verdict.exit_node, tree.num_nodes  # b: the bonus point appended to the layout
    w = _floats(flow.exit_weight)[v]
    exit_trace = go.Scatter(
        x=[x[v]], y=[y[v]], mode="markers+text", name="exit node", customdata=[[v, w]],
        text=[token_label(tree.tokens_list[v], token_text) if v in labelled else ""], textposition="middle right",
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
        x=[x[b]], y=[y[b]], mode="markers+text", name="bonus token",
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


# ---------------------------------------------------------------------- mass by depth
def _mean_by_depth(flows) -> tuple[list[float], list[float], list[float]]:
    """Per-depth (reach, exit, nodes) from ``flow.by_depth()``, averaged over ``flows``
    (a depth a tree does not reach counts as 0)."""
    tables = [flow.by_depth() for flow in flows]
    size = max(len(table["reach"]) for table in tables)

    def mean(key):
        total = [0.0] * size
        for table in tables:
            for d, value in enumerate(table[key].tolist()):
                total[d] += value
        return [value / len(tables) for value in total]

    return mean("reach"), mean("exit"), mean("nodes")


def mass_by_depth_figure(flow_or_flows) -> go.Figure:
    """Where the tree loses target mass, depth by depth.

    Args:
        flow_or_flows: one :class:`~tev.core.flow.TargetFlow`, or a list of them (averaged).

    At depth ``d >= 1`` the bar's full height is the reach summed at that depth (the
    coverage depth ``d`` contributes; the heights add up to ``C(T)``), split into the part
    that goes on deeper and the **missing mass** that leaves the tree at depth ``d`` (the
    exit weight ``w`` summed at ``d``; missing mass is part of the reach, so it is a slice
    of the bar, not an extra block on top). Depth 0 shows the root's exit ``w(r)``.
    Trace names: ``"continues deeper"`` and ``"missing mass"``.
    """
    flows = list(flow_or_flows) if isinstance(flow_or_flows, (list, tuple)) else [flow_or_flows]
    if not flows:
        return _empty_figure("Mass by depth: no rounds yet")
    reach, exits, nodes = _mean_by_depth(flows)
    depths = list(range(len(reach)))
    continues = [0.0] + [max(0.0, reach[d] - exits[d]) for d in depths[1:]]
    custom = [[reach[d] if d else 0.0, exits[d], nodes[d]] for d in depths]
    hover = (
        "depth %{x}<br>reach at d: %{customdata[0]:.4f}<br>missing mass at d: %{customdata[1]:.4f}"
        "<br>nodes: %{customdata[2]:.1f}<extra>%{fullData.name}</extra>"
    )
    fig = go.Figure()
    fig.add_trace(go.Bar(x=depths, y=continues, name="continues deeper", marker_color="#3b7dd8", customdata=custom, hovertemplate=hover))
    fig.add_trace(go.Bar(x=depths, y=exits, name="missing mass", marker_color=EXIT_COLOUR, customdata=custom, hovertemplate=hover))
    worst = max(depths, key=lambda d: exits[d])
    coverage = sum(reach[1:])
    over = f" (mean of {len(flows)} trees)" if len(flows) > 1 else ""
    fig.update_layout(
        barmode="stack",
        title=dict(text=(
            f"Where the tree loses target mass: most at depth {worst} ({exits[worst]:.1%} of it){over}"
            f"<br><sup>bar height = reach at depth d (sums to C(T) = {coverage:.3f}); "
            "red = missing mass w leaving at d; depth 0 = the root's exit</sup>"
        )),
        xaxis=dict(title="depth d", dtick=1),
        yaxis=dict(title="target probability", rangemode="tozero"),
        legend=dict(orientation="h", yanchor="bottom", y=1.0, xanchor="right", x=1.0),
        plot_bgcolor="white",
        height=420,
        margin=dict(t=90),
    )
    return fig


def _empty_figure(message: str) -> go.Figure:
    fig = go.Figure()
    fig.update_layout(title=message, xaxis=dict(visible=False), yaxis=dict(visible=False), plot_bgcolor="white")
    return fig


# ---------------------------------------------------------------------- timeline
def timeline_figure(records) -> go.Figure:
    """Round-by-round view of a generation.

    Args:
        records: a list of :class:`~tev.engine.decode.RoundRecord`.

    Panels: realised block length ``L`` and ``1 + C(T)`` per round with the running ``tau``
    (mean ``L`` so far); a histogram of exit depths ``d(V)``; stacked stage times per round
    in ms. Every per-round trace has one point per record (x = ``record.index``).
    """
    records = list(records)
    if not records:
        return _empty_figure("Timeline: no rounds yet")
    fig = make_subplots(
        rows=2, cols=2, column_widths=[0.7, 0.3], vertical_spacing=0.2, horizontal_spacing=0.08,
        specs=[[{}, {}], [{"colspan": 2}, None]],
        subplot_titles=("block length L per round vs 1 + C(T)", "exit depth d(V)", "stage time per round (ms)"),
    )
    rounds = [r.index for r in records]
    lengths = [r.verdict.block_length for r in records]
    bounds = [r.flow.tau_bound for r in records]
    running = [sum(lengths[: i + 1]) / (i + 1) for i in range(len(lengths))]
    fig.add_trace(go.Scatter(x=rounds, y=lengths, name="L (realised)", mode="lines+markers", line=dict(color="#3b7dd8")), row=1, col=1)
    fig.add_trace(go.Scatter(x=rounds, y=bounds, name="1 + C(T)", mode="lines+markers", line=dict(color="#2ca02c", dash="dot")), row=1, col=1)
    fig.add_trace(go.Scatter(x=rounds, y=running, name="running tau", mode="lines", line=dict(color=PATH_COLOUR, width=3)), row=1, col=1)
    exit_depths = [int(r.tree.depths[r.verdict.exit_node]) for r in records]
    depth_axis = list(range(max(exit_depths) + 1))
    counts = [exit_depths.count(d) for d in depth_axis]
    fig.add_trace(go.Bar(x=depth_axis, y=counts, name="exit depth", marker_color=EXIT_COLOUR, showlegend=False), row=1, col=2)
    palette = ("#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2")
    for stage, colour in zip(STAGES, palette):
        ms = [1000.0 * r.timings.get(stage, 0.0) for r in records]
        fig.add_trace(go.Bar(x=rounds, y=ms, name=stage, marker_color=colour, legendgroup="stages"), row=2, col=1)
    tau = running[-1]
    mean_bound = sum(bounds) / len(bounds)
    fig.update_layout(
        barmode="stack", height=680, plot_bgcolor="white", margin=dict(t=80, b=110),
        title=f"{len(records)} rounds: tau = {tau:.3f}, mean 1 + C = {mean_bound:.3f}",
        legend=dict(orientation="h", traceorder="normal", yanchor="top", y=-0.12, xanchor="left", x=0.0),
    )
    fig.update_xaxes(title_text="round", row=1, col=1)
    fig.update_xaxes(title_text="depth", dtick=1, row=1, col=2)
    fig.update_xaxes(title_text="round", row=2, col=1)
    fig.update_yaxes(title_text="tokens", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text="rounds", row=1, col=2)
    fig.update_yaxes(title_text="ms", row=2, col=1)
    return fig


# ---------------------------------------------------------------------- text view
# Two palettes, alternating per round: (draft token background, bonus token background).
TEXT_PALETTES = (("#d6e6ff", "#8fb8ff"), ("#dff3d6", "#9bd68a"))
NEWLINE_MARK = '<span class="tev-nl" style="opacity:0.45">↵</span>'


def _span(text: str, css_class: str, background: str, title: str, bold: bool = False, round_index: int | None = None) -> str:
    """One coloured token; a newline keeps its line break and shows a faint '↵' before it."""
    weight = "font-weight:600;" if bold else ""
    data = f' data-round="{round_index}"' if round_index is not None else ""
    body = html.escape(text).replace("\n", NEWLINE_MARK + "\n")
    return (
        f'<span{data} class="{css_class}" style="background:{background};{weight}border-radius:3px" '
        f'title="{html.escape(title)}">{body}</span>'
    )


def _round_spans(record, token_text: TokenText) -> list[str]:
    """Spans for one round's kept tokens: accepted draft tokens, then the bonus token."""
    draft_bg, bonus_bg = TEXT_PALETTES[record.index % 2]
    accepted = len(record.verdict.path) - 1
    spans = []
    for i, token in enumerate(record.emitted):
        text = token_text(int(token))
        if i < accepted:
            title = f"round {record.index}: draft token (accepted, depth {i + 1})"
            spans.append(_span(text, "tev-draft", draft_bg, title, round_index=record.index))
        else:
            title = f"round {record.index}: bonus token (drawn from the target at the exit node)"
            spans.append(_span(text, "tev-bonus", bonus_bg, title, bold=True, round_index=record.index))
    return spans


def text_view_html(records, token_text: TokenText = str, prompt_text: str = "") -> str:
    """HTML of the generated text, each round's tokens coloured.

    Args:
        records: a list of :class:`~tev.engine.decode.RoundRecord`; ``record.emitted`` are the tokens
            kept (the last round may be cut at a stop): the first ``len(accepted)`` are
            accepted draft tokens, the rest is the bonus token.
        token_text: token id -> text (each token is decoded on its own).
        prompt_text: shown first, in grey.

    Spans carry ``class="tev-draft"`` or ``"tev-bonus"``, ``data-round`` and a ``title``
    (hover) naming the round and the kind. Text is HTML-escaped; whitespace is kept
    (``white-space: pre-wrap``) and a newline token also shows a faint '↵'.
    """
    parts = []
    if prompt_text:
        parts.append(f'<span class="tev-prompt" style="color:#777" title="prompt">{html.escape(prompt_text)}</span>')
    for record in records:
        parts += _round_spans(record, token_text)
    legend = (
        '<div class="tev-legend" style="font-size:0.85em;color:#555;margin-bottom:4px">'
        + _span("accepted draft", "tev-key", TEXT_PALETTES[0][0], "accepted draft tokens")
        + " "
        + _span("bonus", "tev-key", TEXT_PALETTES[0][1], "bonus token from the target", bold=True)
        + " · colours alternate per round; hover a token for its round</div>"
    )
    body = "".join(parts)
    return f'{legend}<div class="tev-text" style="white-space:pre-wrap;font-family:ui-monospace,monospace;line-height:1.7">{body}</div>'


# ---------------------------------------------------------------------- training
def training_figure(history) -> go.Figure:
    """ExitTrain progress.

    Args:
        history: a list of dicts with ``step``, ``loss``, ``loss_tok``, ``loss_exit``,
            ``expected_tau`` and ``heldout_expected_tau`` (``None`` where not measured).

    Left: the three losses. Right: the expected block length ``1 + C(T)`` of the realized
    training trees and, where measured, on held-out prompts.
    """
    history = list(history)
    if not history:
        return _empty_figure("Training: no steps yet")
    fig = make_subplots(rows=1, cols=2, subplot_titles=("loss", "expected block length 1 + C(T)"))
    steps = [h["step"] for h in history]
    styles = {"loss": dict(color=PATH_COLOUR, width=2), "loss_tok": dict(color="#3b7dd8"), "loss_exit": dict(color=EXIT_COLOUR)}
    for key, line in styles.items():
        fig.add_trace(go.Scatter(x=steps, y=[h.get(key) for h in history], name=key, mode="lines", line=line), row=1, col=1)
    train_tau = [h.get("expected_tau") for h in history]
    fig.add_trace(go.Scatter(x=steps, y=train_tau, name="1 + C (train trees)", mode="lines", line=dict(color="#2ca02c")), row=1, col=2)
    heldout = [(h["step"], h["heldout_expected_tau"]) for h in history if h.get("heldout_expected_tau") is not None]
    if heldout:
        fig.add_trace(go.Scatter(
            x=[s for s, _ in heldout], y=[v for _, v in heldout], name="1 + C (held out)", mode="lines+markers",
            line=dict(color=BONUS_COLOUR, width=3),
        ), row=1, col=2)
    fig.update_xaxes(title_text="step")
    fig.update_layout(title="ExitTrain: L = L_tok + lambda L_exit", plot_bgcolor="white", height=420,
                      legend=dict(orientation="h", yanchor="bottom", y=1.08, xanchor="right", x=1.0))
    return fig


# ---------------------------------------------------------------------- before / after
def _quartile_error(rows) -> dict | None:
    """Asymmetric error bars from ``tau_q25`` to ``tau_q75``; ``None`` when any is missing."""
    if not all(r.get("tau_q25") is not None and r.get("tau_q75") is not None for r in rows):
        return None
    up = [r["tau_q75"] - r["tau"] for r in rows]
    down = [r["tau"] - r["tau_q25"] for r in rows]
    return dict(type="data", symmetric=False, array=up, arrayminus=down)


def before_after_figure(rows) -> go.Figure:
    """Measured ``tau`` by drafter and temperature.

    Args:
        rows: dicts ``{"drafter", "temperature", "tau", "tau_q25", "tau_q75"}`` (the quartiles
            are optional) — one grouped bar per drafter at each temperature, error bars from
            the 25th to the 75th percentile.
    """
    rows = list(rows)
    if not rows:
        return _empty_figure("Before / after: no measurements yet")
    drafters = list(dict.fromkeys(r["drafter"] for r in rows))
    fig = go.Figure()
    for drafter in drafters:
        mine = sorted((r for r in rows if r["drafter"] == drafter), key=lambda r: float(r["temperature"]))
        error = _quartile_error(mine)
        fig.add_trace(go.Bar(
            x=[f"T = {float(r['temperature']):g}" for r in mine], y=[r["tau"] for r in mine], name=drafter, error_y=error,
            hovertemplate="%{x}<br>tau = %{y:.3f}<extra>" + html.escape(str(drafter)) + "</extra>",
        ))
    fig.add_hline(y=1.0, line_dash="dot", line_color="#888", annotation_text="autoregressive (tau = 1)", annotation_position="bottom right")
    fig.update_layout(barmode="group", height=420, title="Mean block length tau by drafter (bars: 25th-75th percentile)",
                      yaxis=dict(title="tau = mean L", rangemode="tozero"), xaxis=dict(title="temperature"), plot_bgcolor="white")
    return fig


# ---------------------------------------------------------------------- verifier lab
def verifier_lab_figure(
    tree,
    flow,
    frequencies: dict[str, list[float]],
    mean_lengths: dict[str, float],
    token_text: TokenText = str,
) -> go.Figure:
    """Each verifier's empirical exit law against the exact one.

    Args:
        tree, flow: the tree and its target flow.
        frequencies: verifier name -> empirical exit frequency per node (length ``N``).
        mean_lengths: verifier name -> empirical mean block length.
        token_text: token id -> text, for the node axis.

    Left: per node the exit law ``w(v)`` as bars (trace ``"exit law w(v)"``), each verifier's
    frequencies as markers. Right: each verifier's mean ``L`` against ``1 + C(T)`` (dashed).
    """
    nodes = list(range(tree.num_nodes))
    ticks = [f"{v}:{token_label(t, token_text, 6)}" for v, t in zip(nodes, tree.tokens_list)]
    fig = make_subplots(rows=1, cols=2, column_widths=[0.75, 0.25], horizontal_spacing=0.08,
                        subplot_titles=("exit law w(v) and empirical exit frequency", "mean block length"))
    w = _floats(flow.exit_weight)
    depth = tree.depths.tolist()
    fig.add_trace(go.Bar(
        x=nodes, y=w, name="exit law w(v)", marker_color="#bbbbbb", customdata=[[t, d] for t, d in zip(ticks, depth)],
        hovertemplate="node %{customdata[0]} (depth %{customdata[1]})<br>w(v) = %{y:.4f}<extra></extra>",
    ), row=1, col=1)
    symbols = ("circle", "diamond", "square", "x", "triangle-up", "cross")
    for i, (name, freq) in enumerate(frequencies.items()):
        fig.add_trace(go.Scatter(
            x=nodes, y=list(freq), name=name, mode="markers", legendgroup=name,
            marker=dict(symbol=symbols[i % len(symbols)], size=9),
            hovertemplate="node %{x}<br>frequency = %{y:.4f}<extra>" + html.escape(name) + "</extra>",
        ), row=1, col=1)
    names = list(mean_lengths)
    fig.add_trace(go.Bar(x=names, y=[mean_lengths[k] for k in names], name="mean L", marker_color="#3b7dd8", showlegend=False,
                         hovertemplate="%{x}: mean L = %{y:.3f}<extra></extra>"), row=1, col=2)
    fig.add_hline(y=flow.tau_bound, line_dash="dash", line_color="#2ca02c", row=1, col=2,
                  annotation_text=f"1 + C = {flow.tau_bound:.3f}", annotation_position="top left")
    fig.update_xaxes(tickmode="array", tickvals=nodes, ticktext=ticks, tickangle=-45, row=1, col=1)
    fig.update_yaxes(title_text="probability", rangemode="tozero", row=1, col=1)
    fig.update_yaxes(title_text="L", rangemode="tozero", row=1, col=2)
    fig.update_layout(title=f"Verifier lab: every exact saturated verifier exits at v with probability w(v); E[L] = 1 + C = {flow.tau_bound:.3f}",
                      plot_bgcolor="white", height=460, legend=dict(orientation="h", yanchor="bottom", y=1.08, xanchor="right", x=1.0))
    return fig
