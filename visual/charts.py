"""Small charts of a generation, a training run and the verifiers: mass by depth, round
timeline, training progress, before / after ``tau``, and the verifier lab.

Notation and sources of every number: :mod:`visual.style`.
"""

from __future__ import annotations

import html

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from tev.engine.round import STAGES

from .style import BONUS_COLOUR, EXIT_COLOUR, PATH_COLOUR, TokenText, floats, token_label

__all__ = ["note_figure", "before_after_figure", "exit_mass_change_figure", "mass_by_depth_figure", "timeline_figure", "training_figure", "verifier_lab_figure"]


def note_figure(message: str, height: int | None = None) -> go.Figure:
    """A blank figure whose title says why there is nothing to draw (or what will be drawn)."""
    fig = go.Figure()
    fig.update_layout(title=message, xaxis=dict(visible=False), yaxis=dict(visible=False), plot_bgcolor="white")
    if height:
        fig.update_layout(height=height)
    return fig


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
        return note_figure("Mass by depth: no rounds yet")
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
            f"<br><sup>bar = reach at depth d (the bars sum to C(T) = {coverage:.3f}) · red = missing mass w leaving at d"
            "<br>depth 0: the mass that leaves at the root</sup>"
        )),
        xaxis=dict(title="depth d", dtick=1),
        yaxis=dict(title="target probability", rangemode="tozero"),
        legend=dict(orientation="h", yanchor="bottom", y=1.0, xanchor="right", x=1.0),
        plot_bgcolor="white",
        height=420,
        margin=dict(t=110),
    )
    return fig


def exit_mass_change_figure(summaries: dict) -> go.Figure:
    """Where each drafter's trees lose the target's mass, on the same held-out rounds.

    Args:
        summaries: drafter name -> ``{"internal": [...], "leaf": [...]}``, the mean exit mass
            per tree by depth ``0..K`` (:meth:`tev.train.trees.TreeBatch.exit_mass_by_depth`),
            optionally with ``tau_bound`` (its mean ``1 + C``).

    One bar per drafter at each depth: the solid part is the missing mass (the target's next
    token was not among the node's children), the pale part the mass that reached a leaf
    (the tree ended there). Trace names: ``"<name>: missing"``, ``"<name>: tree ended"``.
    """
    if not summaries:
        return note_figure("Exit mass by depth: nothing measured yet")
    palette = ["#7f7f7f", EXIT_COLOUR, "#3b7dd8", "#2ca02c"]
    fig = go.Figure()
    for i, (name, summary) in enumerate(summaries.items()):
        colour = palette[i % len(palette)]
        internal, leaf = summary["internal"], summary["leaf"]
        depths = list(range(len(internal)))
        label = f"{name} (1 + C = {summary['tau_bound']:.3f})" if "tau_bound" in summary else name
        fig.add_trace(go.Bar(x=depths, y=internal, name=f"{label}: missing", offsetgroup=name, marker_color=colour,
                             hovertemplate="depth %{x}: %{y:.3f} missing<extra>" + html.escape(name) + "</extra>"))
        fig.add_trace(go.Bar(x=depths, y=leaf, base=internal, name=f"{label}: tree ended", offsetgroup=name, marker_color=colour, opacity=0.35,
                             hovertemplate="depth %{x}: %{y:.3f} at a leaf<extra>" + html.escape(name) + "</extra>"))
    fig.update_layout(
        barmode="group", height=420, plot_bgcolor="white", margin=dict(t=90),
        title=dict(text="Where the target's mass leaves the trees, by depth (same held-out rounds)"
                        "<br><sup>solid: missing mass (the target's next token was not a child); pale: the tree ended there; each drafter's bars sum to 1</sup>"),
        xaxis=dict(title="depth of the exit node", dtick=1), yaxis=dict(title="mean exit probability per tree", rangemode="tozero"),
        legend=dict(orientation="h", yanchor="bottom", y=1.02, xanchor="right", x=1.0, font=dict(size=10)),
    )
    return fig


# ---------------------------------------------------------------------- timeline
def timeline_figure(records) -> go.Figure:
    """Round-by-round view of a generation.

    Args:
        records: a list of :class:`~tev.engine.round.RoundRecord`.

    Panels: realised block length ``L`` and ``1 + C(T)`` per round with the running ``tau``
    (mean ``L`` so far) and, when budget auto sized the trees, each round's chosen size ``k``
    (trace ``"tree size k (auto)"``, right axis); a histogram of exit depths ``d(V)``; stacked
    stage times per round in ms. Every per-round trace has one point per record (x = ``record.index``).
    """
    records = list(records)
    if not records:
        return note_figure("Timeline: no rounds yet")
    budget_is_auto = any(r.choice is not None for r in records)
    # at budget auto the right axis ("nodes kept") needs room before the histogram, whose count the subplot title names
    # (an axis title of its own overlapped "nodes kept")
    fig = make_subplots(
        rows=2, cols=2, column_widths=[0.7, 0.3], vertical_spacing=0.2, horizontal_spacing=0.2 if budget_is_auto else 0.08,
        specs=[[{"secondary_y": True}, {}], [{"colspan": 2}, None]],
        subplot_titles=("block length L per round vs 1 + C(T)", "rounds by exit depth d(V)", "stage time per round (ms)"),
    )
    rounds = [r.index for r in records]
    lengths = [r.verdict.block_length for r in records]
    bounds = [r.flow.tau_bound for r in records]
    running = [sum(lengths[: i + 1]) / (i + 1) for i in range(len(lengths))]
    fig.add_trace(go.Scatter(x=rounds, y=lengths, name="L (realised)", mode="lines+markers", line=dict(color="#3b7dd8")), row=1, col=1)
    fig.add_trace(go.Scatter(x=rounds, y=bounds, name="1 + C(T)", mode="lines+markers", line=dict(color="#2ca02c", dash="dot")), row=1, col=1)
    fig.add_trace(go.Scatter(x=rounds, y=running, name="running tau", mode="lines", line=dict(color=PATH_COLOUR, width=3)), row=1, col=1)
    if budget_is_auto:
        sizes = [r.tree.size for r in records]
        fig.add_trace(go.Scatter(x=rounds, y=sizes, name="tree size k (auto)", mode="markers", marker=dict(color="#999999", symbol="diamond-open", size=7),
                                 hovertemplate="round %{x}: budget auto kept %{y} nodes<extra></extra>"), row=1, col=1, secondary_y=True)
    exit_depths = [int(r.tree.depths[r.verdict.exit_node]) for r in records]
    depth_axis = list(range(max(exit_depths) + 1))
    counts = [exit_depths.count(d) for d in depth_axis]
    fig.add_trace(go.Bar(x=depth_axis, y=counts, name="exit depth", marker_color=EXIT_COLOUR, showlegend=False), row=1, col=2)
    palette = ("#4c78a8", "#f58518", "#54a24b", "#e45756", "#72b7b2")
    for i, stage in enumerate(STAGES):
        ms = [1000.0 * r.timings.get(stage, 0.0) for r in records]
        fig.add_trace(go.Bar(x=rounds, y=ms, name=stage, marker_color=palette[i % len(palette)], legendgroup="stages"), row=2, col=1)
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
    fig.update_yaxes(title_text="tokens", rangemode="tozero", row=1, col=1, secondary_y=False)
    fig.update_yaxes(title_text="nodes kept", rangemode="tozero", showgrid=False, visible=budget_is_auto, row=1, col=1, secondary_y=True,
                     color="#999999")  # the grey of its diamonds: it reads as theirs, not the histogram's
    fig.update_yaxes(title_text="ms", row=2, col=1)
    return fig

# ---------------------------------------------------------------------- training
def training_figure(history) -> go.Figure:
    """ExitTrain progress.

    Args:
        history: a list of dicts with ``step``, ``loss``, ``loss_tok``, ``loss_tree``,
            ``tau_bound`` and ``heldout_tau_bound`` (``None`` where not measured).

    Left: the three losses. Right: the expected block length ``1 + C(T)`` of the realized
    training trees and, where measured, on held-out prompts.
    """
    history = list(history)
    if not history:
        return note_figure("Training: no steps yet")
    fig = make_subplots(rows=1, cols=2, subplot_titles=("loss", "expected block length 1 + C(T)"))
    steps = [h["step"] for h in history]
    styles = {"loss": dict(color=PATH_COLOUR, width=2), "loss_tok": dict(color="#3b7dd8"), "loss_tree": dict(color=EXIT_COLOUR)}
    for key, line in styles.items():
        fig.add_trace(go.Scatter(x=steps, y=[h.get(key) for h in history], name=key, mode="lines", line=line), row=1, col=1)
    train_tau = [h.get("tau_bound") for h in history]
    fig.add_trace(go.Scatter(x=steps, y=train_tau, name="1 + C (train trees)", mode="lines", line=dict(color="#2ca02c")), row=1, col=2)
    heldout = [(h["step"], h["heldout_tau_bound"]) for h in history if h.get("heldout_tau_bound") is not None]
    if heldout:
        fig.add_trace(go.Scatter(
            x=[s for s, _ in heldout], y=[v for _, v in heldout], name="1 + C (held out)", mode="lines+markers",
            line=dict(color=BONUS_COLOUR, width=3),
        ), row=1, col=2)
    fig.update_xaxes(title_text="step")
    # the legend under the panels: above them it covered the title
    fig.update_layout(title="ExitTrain: L = L_tok + lambda L_exit", plot_bgcolor="white", height=460, margin=dict(b=110),
                      legend=dict(orientation="h", yanchor="top", y=-0.2, xanchor="left", x=0.0))
    return fig


# ---------------------------------------------------------------------- before / after
def _quartile_error(rows) -> dict | None:
    """Asymmetric error bars from ``tau_q25`` to ``tau_q75``; ``None`` when any is missing."""
    if not all(r.get("tau_q25") is not None and r.get("tau_q75") is not None for r in rows):
        return None
    up = [r["tau_q75"] - r["tau"] for r in rows]
    down = [r["tau"] - r["tau_q25"] for r in rows]
    return dict(type="data", symmetric=False, array=up, arrayminus=down)


def before_after_figure(rows, title: str | None = None, yaxis: str = "tau = mean L") -> go.Figure:
    """Measured ``tau`` (or another per-drafter figure, named by ``title`` and ``yaxis``) by
    drafter and temperature.

    Args:
        rows: dicts ``{"drafter", "temperature", "tau", "tau_q25", "tau_q75"}`` (the quartiles
            are optional) — one grouped bar per drafter at each temperature, error bars from
            the 25th to the 75th percentile.
    """
    rows = list(rows)
    if not rows:
        return note_figure("Before / after: no measurements yet")
    drafters = list(dict.fromkeys(r["drafter"] for r in rows))
    fig = go.Figure()
    for drafter in drafters:
        mine = sorted((r for r in rows if r["drafter"] == drafter), key=lambda r: float(r["temperature"]))
        error = _quartile_error(mine)
        fig.add_trace(go.Bar(
            x=[f"T = {float(r['temperature']):g}" for r in mine], y=[r["tau"] for r in mine], name=drafter, error_y=error,
            hovertemplate="%{x}<br>" + html.escape(yaxis) + " = %{y:.3f}<extra>" + html.escape(str(drafter)) + "</extra>",
        ))
    fig.add_hline(y=1.0, line_dash="dot", line_color="#888", annotation_text="autoregressive (tau = 1)", annotation_position="bottom right")
    fig.update_layout(barmode="group", height=420, title=title or "Mean block length tau by drafter (bars: 25th-75th percentile)",
                      yaxis=dict(title=yaxis, rangemode="tozero"), xaxis=dict(title="temperature"), plot_bgcolor="white")
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
    ticks = [f"v{v} {token_label(t, token_text, 8)}" for v, t in zip(nodes, tree.tokens_list)]  # node, then its token
    fig = make_subplots(rows=1, cols=2, column_widths=[0.75, 0.25], horizontal_spacing=0.08,
                        subplot_titles=("exit law w(v) and empirical exit frequency", "mean block length"))
    w = floats(flow.exit_weight)
    depth = tree.depths.tolist()
    fig.add_trace(go.Bar(
        x=nodes, y=w, name="exit law w(v)", marker_color="#bbbbbb", customdata=[[t, d] for t, d in zip(ticks, depth)],
        hovertemplate="node %{customdata[0]} (depth %{customdata[1]})<br>w(v) = %{y:.4f}<extra></extra>",
    ), row=1, col=1)
    symbols = ("circle", "diamond", "square", "x", "triangle-up", "cross")
    # every exact verifier's frequencies lie on w(v): each verifier's markers sit side by side over the node's bar, so none hides another's
    spread = min(0.6, 0.15 * max(0, len(frequencies) - 1))
    for i, (name, freq) in enumerate(frequencies.items()):
        shift = spread * (i / (len(frequencies) - 1) - 0.5) if len(frequencies) > 1 else 0.0
        fig.add_trace(go.Scatter(
            x=[v + shift for v in nodes], y=list(freq), name=name, mode="markers", legendgroup=name, customdata=ticks,
            marker=dict(symbol=symbols[i % len(symbols)], size=9),
            hovertemplate="node %{customdata}<br>frequency = %{y:.4f}<extra>" + html.escape(name) + "</extra>",
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
