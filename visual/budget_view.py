"""How a round with budget "auto" chose its tree size: expected tokens per second against size.

Every number is read from the round's :class:`~tev.core.budget.BudgetChoice`
(``record.choice``): nothing is recomputed here. The lesson: a node is worth adding while its
calibrated path probability (the drafter's estimate of the target's reach) pays for what it costs on this machine, at the rate the rounds before it achieved.
"""

from __future__ import annotations

import plotly.graph_objects as go

from tev.engine.round import RoundRecord

from .style import EXIT_COLOUR, floats

__all__ = ["budget_figure"]


def budget_figure(record: RoundRecord) -> go.Figure:
    """Expected tokens per second (``(1 + c sum q) / cost``) of each best-first prefix size
    ``k = 0 .. M`` of one round's drafted tree, the chosen size marked, and the rate of the
    rounds before it (``choice.going_rate``: a node was kept while its expected tokens paid for
    its time at that rate, so the chosen size can lie past the curve's peak).

    Trace names: ``"expected tokens per second"``, ``"chosen"`` and ``"rate of past rounds"``.
    Raises ValueError for a round drafted at a fixed budget (it made no choice).
    """
    choice = record.choice
    if choice is None:
        raise ValueError("this round had a fixed budget: there is no choice to draw")
    sizes = list(range(len(choice.rate)))
    rate, expected, cost = floats(choice.rate), floats(choice.expected), floats(choice.cost)
    custom = [[expected[k], 1e3 * cost[k]] for k in sizes]
    hover = "keep %{x} nodes<br>expected block 1 + c·Σq: %{customdata[0]:.2f} tokens<br>round cost: %{customdata[1]:.1f} ms<br>%{y:.1f} tokens/s<extra></extra>"
    k = choice.size
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=sizes, y=rate, mode="lines+markers", name="expected tokens per second", marker=dict(size=5, color="#3b7dd8"),
                             customdata=custom, hovertemplate=hover))
    fig.add_trace(go.Scatter(x=[sizes[0], sizes[-1]], y=[choice.going_rate] * 2, mode="lines", name="rate of past rounds",
                             line=dict(color="#888888", dash="dash"), hovertemplate="rate of the rounds before: %{y:.1f} tokens/s<extra></extra>"))
    fig.add_trace(go.Scatter(x=[k], y=[rate[k]], mode="markers", name="chosen", marker=dict(size=13, color=EXIT_COLOUR, symbol="star"),
                             customdata=[custom[k]], hovertemplate=hover))
    plain = "plain decoding (k = 0)" if k == 0 else f"{k} of {len(sizes) - 1} drafted nodes"
    fig.update_layout(
        title=dict(text=(
            f"Round {record.index + 1}: budget auto keeps {plain}"
            f"<br><sup>expected block {expected[k]:.2f} tokens for {1e3 * cost[k]:.1f} ms; calibration c = {choice.calibration:.2f} "
            f"(realised C / drafter's Σq in past rounds); cap {choice.cap}"
            f"<br>a node is kept while its expected tokens pay for its time at {choice.going_rate:.1f} tokens/s (dashed), the rate of the rounds before</sup>"
        )),
        # automargin: the margins grow to hold the axis titles and ticks, which were cut off at the left
        xaxis=dict(title="tree size k (the drafter's best k nodes)", rangemode="tozero", automargin=True),
        yaxis=dict(title="expected tokens/s", rangemode="tozero", automargin=True),  # short: it fits a short plot's height too
        plot_bgcolor="white",
        showlegend=False,
        margin=dict(t=110),
    )
    return fig
