"""The walkthrough's nine steps of one round: a figure and a few sentences each, with the paper's
quantities and this round's numbers, all read from a :class:`~tev.engine.walkthrough.RoundTrace`.

Every step's tree is the same tree (the trace's), and step 6's categorical is step 5's exit law.
"""

from __future__ import annotations

import html
import math
import re
from dataclasses import dataclass

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .layout import tidy_layout
from .style import BONUS_COLOUR, EXIT_COLOUR, PATH_COLOUR, TokenText, floats, token_label
from .tree_view import _edge_lines, tree_figure

__all__ = ["STEP_TITLES", "Step", "walkthrough_step", "walkthrough_steps", "walkthrough_html"]

STEP_TITLES = (
    "1. The context and the root",
    "2. The drafter's guesses, depth by depth",
    "3. The tree the builder makes of them",
    "4. One target forward over the whole tree",
    "5. Where the target's mass flows and leaves",
    "6. The verifier's decision",
    "7. The bonus token",
    "8. The commit",
    "9. The best tree any drafter could draft here",
)
GREY = "#bbbbbb"
ACCEPT = "#2ca02c"


@dataclass(frozen=True, eq=False)
class Step:
    """One step: its title, its markdown text and its figure."""

    title: str
    text: str
    figure: go.Figure


def _q(text: str) -> str:
    """A token's text for a sentence, quoted (markdown-safe)."""
    return "`" + text.replace("`", "'") + "`"


def _axis_token(token: int, token_text: TokenText) -> str:
    """A node's token on an axis label: its text (whitespace made visible), quoted when it is whitespace
    alone, so a space token reads "␣" between quotes and not as a bare "·" beside the node's name."""
    label = html.unescape(token_label(token, token_text, 8))
    if token_text(int(token)).strip():
        return label
    return "“" + label.replace("·", "␣") + "”"


def walkthrough_step(trace, index: int, token_text: TokenText = str) -> Step:
    """Step ``index`` (0-8) of ``trace`` (a :class:`~tev.engine.walkthrough.RoundTrace`)."""
    word = lambda t: _q(html.unescape(token_label(t, token_text, 24)))  # noqa: E731
    return Step(STEP_TITLES[index], *_BUILDERS[index](trace, token_text, word))


def walkthrough_steps(trace, token_text: TokenText = str) -> list[Step]:
    """The nine steps of ``trace``."""
    return [walkthrough_step(trace, i, token_text) for i in range(len(STEP_TITLES))]


# ------------------------------------------------------------------------------- steps
def _context(trace, token_text, word):
    shown = trace.context[-24:]
    labels = [html.unescape(token_label(t, token_text, 10)) for t in shown]
    # neighbours' labels alternate above and below the squares, so two long ones never overlap; the root's is above
    # (its arrow points up from below)
    positions = ["top center" if (len(shown) - 1 - i) % 2 == 0 else "bottom center" for i in range(len(shown))]
    fig = go.Figure(go.Scatter(
        x=list(range(len(shown))), y=[0] * len(shown), mode="markers+text", text=[html.escape(s, quote=False) for s in labels], textposition=positions,
        marker=dict(symbol="square", size=18, color=[GREY] * (len(shown) - 1) + [PATH_COLOUR]),
        hovertemplate="position %{customdata}<extra></extra>", customdata=list(range(len(trace.context) - len(shown), len(trace.context))),
    ))
    fig.add_annotation(x=len(shown) - 1, y=0, text="root r", showarrow=True, ay=50, font=dict(color=PATH_COLOUR))
    _plain(fig, f"the last {len(shown)} of {len(trace.context)} committed tokens; the black one is the root", height=260)
    fig.update_xaxes(visible=False)
    fig.update_yaxes(visible=False)
    text = (f"The model has committed **{len(trace.context)} tokens** (the prompt{' and earlier rounds' if trace.round_index else ''}). "
            f"The last one, the **root** $r$ = {word(trace.context[-1])} at position {len(trace.context) - 1}, is where this round starts: "
            "its next token is what the target would sample next, and nobody has seen it yet. The target's cache already holds every "
            "token before the root.")
    return text, fig


def _marginals(trace, token_text, word):
    if trace.marginals is None:
        depths = trace.tree.depths.tolist()
        q = [math.exp(v) for v in floats(trace.tree.draft_logprob)]
        fig = go.Figure(go.Scatter(
            x=depths[1:], y=q[1:], mode="markers+text", text=[html.escape(html.unescape(token_label(t, token_text))) for t in trace.tree.tokens_list[1:]],
            textposition="middle right", marker=dict(size=10, color="#3b7dd8"), hovertemplate="depth %{x}<br>q = %{y:.3f}<extra></extra>"))
        _plain(fig, "the drafter's q of each token it proposed, by depth", xaxis="depth d", yaxis="q")
        what = ("This drafter is a small language model" if trace.drafter == "ar" else
                f"The {trace.drafter} drafter reads the target's hidden states at the committed tokens and the path drafted so far")
        text = (f"{what}: its $q$ at a node is conditional on the path to it, so there are no per-depth marginals to show. It grows the "
                "tree depth by depth (EAGLE-2 style), one forward per depth over the best frontier nodes together, each node's children "
                "its most likely next tokens $q(\\cdot \\mid \\text{path})$. The dots are the $q$ of every token it proposed.")
        return text, fig
    tokens, probs = trace.marginals
    depth_count, top = tokens.shape
    z = probs.T.tolist()  # [rank, depth]
    labels = [[html.escape(html.unescape(token_label(int(tokens[d, r]), token_text, 10))) for d in range(depth_count)] for r in range(top)]
    fig = go.Figure(go.Heatmap(
        z=z, x=[f"q{d + 1}" for d in range(depth_count)], y=[f"#{r + 1}" for r in range(top)], text=labels, texttemplate="%{text}",
        colorscale="Blues", zmin=0, zmax=max(0.05, float(probs.max())), colorbar=dict(title="q"),
        hovertemplate="%{x}, rank %{y}: %{text}<br>q = %{z:.3f}<extra></extra>",
    ))
    _plain(fig, f"the block drafter's top {top} tokens at each depth, from one pass", yaxis="rank", height=360)
    fig.update_yaxes(autorange="reversed")
    best = [float(p) for p in probs[:, 0]]  # the best guess's q at each depth
    surest, least = max(range(depth_count), key=best.__getitem__), min(range(depth_count), key=best.__getitem__)
    half = depth_count // 2
    if all(a >= b for a, b in zip(best, best[1:])):
        trend = "each depth's best guess is less sure than the one before it: further ahead, less sure"
    elif half and sum(best[:half]) / half > sum(best[-half:]) / half:
        trend = (f"its surest best guess is at depth {surest + 1} ($q_{{{surest + 1}}}$ = {best[surest]:.2f}) and its least sure at depth "
                 f"{least + 1} ({best[least]:.2f}): on the whole, further ahead, less sure")
    else:
        trend = (f"its surest best guess is at depth {surest + 1} ($q_{{{surest + 1}}}$ = {best[surest]:.2f}) and its least sure at depth "
                 f"{least + 1} ({best[least]:.2f}): guesses further ahead are usually less sure, but not in this round")
    text = (f"The block drafter reads the target's hidden states at the committed tokens and, **in one pass**, gives a distribution "
            f"$q_d$ over the next token at each depth $d = 1..{depth_count}$ (independently per depth: the block's marginals). "
            f"Its best guess for the root's next token: {word(int(tokens[0, 0]))} with $q_1$ = {best[0]:.2f}; {trend}.")
    return text, fig


def _builder(trace, token_text, word):
    tree = trace.tree
    scores = _path_scores(tree)
    labels = [f"#{v} {token_label(t, token_text)}" if v else "r" for v, t in enumerate(tree.tokens_list)]
    fig = _tree_scatter(tree, labels, [math.log10(max(s, 1e-6)) for s in scores], "path score ∏q (log10)",
                        [f"node v = {v} (taken {v}{'st' if v == 1 else 'th'})<br>path score ∏q = {s:.4f}" for v, s in enumerate(scores)])
    _plain(fig, f"the {tree.num_nodes - 1} nodes in the order they were added (#1 first); colour = path score ∏q", xaxis="depth d")
    last = tree.num_nodes - 1
    how = {
        "tree": (f"DDTree's builder keeps a heap of prefixes scored by the product of their $q$'s and takes the best one each time, "
                 f"adding it as a node (its parent is always already in the tree), until the budget **B = {tree.size}** is spent. "),
        "chain": (f"The chain drafter keeps only the top guess of each depth: one path of at most B = {tree.size} nodes, however "
                  "sure or unsure each guess is (a tree would spend the same budget on second guesses where $q$ is spread). "),
        "dynamic": (f"The drafter grew the tree depth by depth, expanding the best frontier nodes by path score, and kept the "
                    f"B = {tree.size} best nodes overall (a child never outscores its parent, so they form a tree). "),
    }[trace.shape]
    text = how + (f"It took {word(tree.tokens_list[1])} first (path score {scores[1]:.3f}) and {word(tree.tokens_list[last])} last "
                  f"({scores[last]:.4f}); the tree is {tree.max_depth} deep." if last else "With B = 0 there is no node: this round is one plain step.")
    text += (" A child never outscores its parent, so the best k nodes by path score always form a tree: the Live tab's budget auto drafts "
             "up to its cap and keeps the best k whose expected tokens (their path scores, scaled to what past rounds realised) pay for a forward over k + 1 tokens "
             "on this machine.")
    return text, fig


def _forward(trace, token_text, word):
    tree = trace.tree
    n = tree.num_nodes
    names = [f"v{v} {_axis_token(t, token_text)} @{int(p)}" for v, (t, p) in enumerate(zip(tree.tokens_list, trace.positions.tolist()))]
    sees = tree.ancestors.int().tolist()
    fig = go.Figure(go.Heatmap(
        z=sees, x=names, y=names, colorscale=[[0, "#f4f4f4"], [1, "#3b7dd8"]], showscale=False, xgap=1, ygap=1,
        hovertemplate="%{y} sees %{x}: %{z}<extra></extra>",
    ))
    _plain(fig, "tree attention: row v sees column u (blue) when u is v or one of its ancestors", height=max(360, 18 * n + 160))
    fig.update_yaxes(autorange="reversed", visible=True, tickfont=dict(size=9))
    fig.update_xaxes(tickangle=-60, tickfont=dict(size=9), visible=True)
    context = len(trace.context) - 1
    text = (f"The target scores **all {n} tree tokens in one forward pass**. Node $v$ sits at position {context} + $d(v)$ (the @ in the "
            f"labels) and attends to the {context} cached context tokens and to its own ancestors only (this mask), so each node's output "
            f"row $p_v$ is exactly the target's next-token law after the path to $v$. One forward costs about one plain step on a GPU; "
            f"on this CPU, more.")
    return text, fig


def _rows(trace, token_text, word):
    flow, tree = trace.flow, trace.tree
    fig = tree_figure(tree, flow, None, token_text=token_text, title="The target's reach and missing mass on the tree")
    w = floats(flow.exit_weight)
    root_w = w[0]
    best = max(range(1, tree.num_nodes), key=lambda v: float(flow.reach[v]), default=0)
    text = (f"From the rows: each edge's probability $p_{{pa(v)}}(x_v)$, the **reach** $P(v) = P(pa(v))\\,p_{{pa(v)}}(x_v)$ (colour), the "
            f"**local exit** $\\rho(v) = 1 - \\sum_{{u \\in Ch(v)}} p_v(x_u)$ and the **exit law** $w(v) = P(v)\\,\\rho(v)$ (size): the "
            f"target mass that leaves the tree at $v$. The $w(v)$ sum to **{sum(w):.3f}**; {root_w:.0%} leaves at the root already. "
            + (f"The best-reached node is {word(tree.tokens_list[best])} ($P$ = {float(flow.reach[best]):.3f}). " if best else "")
            + f"Coverage $C(T) = \\sum_{{v \\ne r}} P(v)$ = **{flow.coverage:.3f}**, so " + _bound_sentence(flow) + ".")
    return text, fig


def _decision(trace, token_text, word):
    verdict, tree = trace.verdict, trace.tree
    exit_text = f"node v{verdict.exit_node} ({word(tree.tokens_list[verdict.exit_node]) if verdict.exit_node else 'the root'}, depth {int(tree.depths[verdict.exit_node])})"
    if trace.verifier == "tev":
        w = trace.decision["exit_law"]
        names = [f"v{v} {_axis_token(t, token_text)}" for v, t in enumerate(tree.tokens_list)]
        colours = [EXIT_COLOUR if v == verdict.exit_node else GREY for v in range(tree.num_nodes)]
        fig = go.Figure(go.Bar(x=names, y=w, marker_color=colours, hovertemplate="%{x}: w = %{y:.4f}<extra></extra>"))
        _plain(fig, "TEV's categorical over nodes: the exit law w(v); red = the node drawn", xaxis="node", yaxis="w(v)")
        fig.update_xaxes(tickangle=-60, visible=True)
        text = (f"**TEV** draws the exit node in one step, $V \\sim w$: the categorical over the tree's nodes is exactly step 5's exit law. "
                f"This round it drew {exit_text}, which had $w(V)$ = {w[verdict.exit_node]:.3f}. The path to $V$ is accepted: "
                f"{len(verdict.path) - 1} draft token(s).")
    elif trace.verifier == "predraw":
        draws = trace.decision["draws"]
        labels = [f"{token_label(t, token_text)} → {token_label(draws[v], token_text)}" for v, t in enumerate(tree.tokens_list)]
        fig = _tree_scatter(tree, labels, [1.0 if v in verdict.path else 0.0 for v in range(tree.num_nodes)], None,
                            [f"node v{v}: the target drew {html.escape(html.unescape(token_label(draws[v], token_text, 20)))}" for v in range(tree.num_nodes)],
                            colours=[ACCEPT if v in verdict.path else GREY for v in range(tree.num_nodes)])
        _plain(fig, "predraw: one draw R_v ~ p_v at every node (→); follow the child whose token matches; green = the walk", xaxis="depth d")
        text = (f"**Predraw** (DDTree) draws one token $R_v \\sim p_v$ at every node, then walks from the root to the child whose "
                f"token equals the draw, while there is one. The walk stopped at {exit_text}: its draw {word(draws[verdict.exit_node])} "
                f"matched no child, so it is the bonus token. Same exit law $w$ as TEV, a different route.")
    elif trace.verifier == "sequential":
        lines = []
        xs, ys, texts, colours = [], [], [], []
        for row, (v, tried) in enumerate(trace.decision["tests"]):
            for col, (u, token, g, ok) in enumerate(tried):
                xs.append(col)
                ys.append(row)
                texts.append(f"{token_label(token, token_text)} g={g:.2f}")
                colours.append(ACCEPT if ok else EXIT_COLOUR)
            lines.append(f"at v{v}: " + ", ".join(f"{word(token)} {'accepted' if ok else 'rejected'} (g = {g:.2f})" for _, token, g, ok in tried) if tried else f"at v{v}: no child")
        fig = go.Figure(go.Scatter(x=xs, y=ys, mode="markers+text", text=texts, textposition="middle right", marker=dict(size=14, color=colours)))
        _plain(fig, "sequential: each visited node's children tested in order (green accepted, red rejected)", xaxis="test", yaxis="visited node (depth)")
        fig.update_yaxes(autorange="reversed", visible=True)
        text = ("**Sequential** verification (EAGLE/SpecInfer style) tests a node's children in order: child $x$ is accepted with "
                "probability $g(x)$ under the current residual $g$ (which starts as $p_v$); a rejection removes $x$ and renormalises. "
                + "; ".join(lines) + f". It exited at {exit_text}.")
    else:
        best = trace.decision["argmax"]
        labels = [f"{token_label(t, token_text)}" + (f" → {token_label(best[v], token_text)}" if v in best else "") for v, t in enumerate(tree.tokens_list)]
        fig = _tree_scatter(tree, labels, [1.0 if v in verdict.path else 0.0 for v in range(tree.num_nodes)], None,
                            [f"node v{v}" for v in range(tree.num_nodes)], colours=[ACCEPT if v in verdict.path else GREY for v in range(tree.num_nodes)])
        _plain(fig, "greedy: follow the target's argmax (→) while it is a child; green = the walk", xaxis="depth d")
        text = (f"At **T = 0** the target's law is a point mass on its argmax, so verification is a walk: from the root, follow the child "
                f"whose token is the argmax of $p_v$ while there is one. It stopped at {exit_text}. (At T = 0 every reach is 0 or 1: "
                "sample with T > 0 to see mass spread over the tree.)")
    return text, fig


def _bonus(trace, token_text, word):
    bonus, verdict = trace.bonus, trace.verdict
    removed = {t for t, p in bonus["removed"] if p > 0}  # V's children the target could have drawn: grey bars
    row = [(t, p) for t, p in bonus["row"] if p > 0]  # the row's top tokens; truncation (top-p, top-k) zeroes the rest
    if removed and not removed & {t for t, _ in row}:  # no child among them: the likeliest child joins them, so grey is shown
        row.append(max(((t, p) for t, p in bonus["removed"] if p > 0), key=lambda pair: pair[1]))
    residual = [] if bonus["greedy"] else [(t, p) for t, p in bonus["residual"] if p > 0]
    fig = go.Figure()
    fig.add_trace(go.Bar(y=[html.unescape(token_label(t, token_text, 12)) for t, _ in row], x=[p for _, p in row], orientation="h",
                         name="p_V" + (" (softmax at T = 1)" if bonus["greedy"] else ""), marker_color=[GREY if t in removed else "#3b7dd8" for t, _ in row]))
    if residual:
        fig.add_trace(go.Bar(y=[html.unescape(token_label(t, token_text, 12)) for t, _ in residual], x=[p for _, p in residual], orientation="h",
                             name="residual p_V^res", marker_color=[BONUS_COLOUR if t == verdict.bonus_token else "#ffbf80" for t, _ in residual]))
    grey = " (grey: V's children, removed)" if removed else ""  # promised only where a grey bar is drawn
    shown = (f"the exit row p_V{grey} and the residual the bonus is drawn from" if residual else
             "the exit row p_V (softmax at T = 1 for display); at T = 0 no residual is drawn from")
    _plain(fig, shown + " (tokens of probability 0 left out)", xaxis="probability")
    fig.update_yaxes(autorange="reversed", visible=True)
    fig.update_layout(barmode="group", showlegend=True)
    # each child with its probability under p_V, said once ("(, (0.00))" read as punctuation)
    removed_text = "with their $p_V$: " + ", ".join(f"{word(t)} {p:.2f}" for t, p in bonus["removed"]) if bonus["removed"] else ""
    if bonus["greedy"]:
        text = (f"At T = 0 the bonus token is the target's argmax at the exit node: {word(verdict.bonus_token)}. There is no residual: "
                f"nothing is drawn, so nothing needs removing. The argmax is never one of $V$'s children "
                f"({removed_text or 'V is a leaf: it has none'}): had it been, the walk would have gone on.")
    else:
        if not bonus["removed"]:
            removal = "$V$ is a leaf, so nothing is removed: the residual is $p_V$ itself"
        elif removed:
            removal = f"the children the tree already offered at $V$ are removed ({removed_text}), because the target did not go there"
        else:  # every child was cut by the truncation: the residual is the row itself
            removal = (f"$V$'s children ({removed_text}) already have probability 0 under the sampling law's truncation, so removing them "
                       "changes nothing: the residual is $p_V$ itself")
        text = (f"The bonus token is drawn from the **residual** at the exit node, $p_V^{{res}}(a) \\propto p_V(a)\\,[a \\notin Ch(V)]$: "
                f"{removal}. Drawn: {word(verdict.bonus_token)}, with $p_V^{{res}}$ = {bonus['bonus_residual_prob']:.3f}. This is what makes the "
                "output exact: the path's probability times the residual is the target's own probability of the block.")
    return text, fig


def _commit(trace, token_text, word):
    verdict, tree = trace.verdict, trace.tree
    fig = tree_figure(tree, trace.flow, verdict, token_text=token_text, title=f"Round {trace.round_index + 1}")
    accepted = verdict.accepted_tokens(tree)
    kept = " ".join(word(t) for t in accepted) or "no draft token"
    length, bound = verdict.block_length, trace.flow.tau_bound
    if abs(length - bound) >= 5e-4:
        draw = f"this round's L = {length} {'exceeds' if length > bound else 'falls short of'} it, as one draw may"
    elif trace.flow.coverage < 5e-4:  # no mass enters the tree: no draw can keep a draft token
        draw = "here C = 0, so L = 1 (the bonus alone) is the only outcome"
    elif trace.law.greedy:
        draw = f"at T = 0 every reach is 0 or 1, so every draw keeps the same L = {length} = 1 + C"
    else:
        draw = f"this round's L = {length} equals it"
    text = (f"Committed: {kept} + the bonus {word(verdict.bonus_token)}: **L = {verdict.block_length} token(s) for one target forward**. "
            f"As in step 5, {_bound_sentence(trace.flow)}: {draw}; over many rounds the mean of $L$, $\\tau$, approaches the mean $1 + C$. "
            f"The cache keeps the accepted path and drops the rest of the tree; the next round starts from the root "
            f"{word(verdict.bonus_token)}. The round took {1e3 * trace.seconds:.0f} ms on this machine. **Next** runs the next round.")
    return text, fig


def _oracle(trace, token_text, word):
    """The drafter's tree beside the oracle's (the target drafting for itself, same root, law and B)."""
    tree, flow, best, best_flow = trace.tree, trace.flow, trace.oracle, trace.oracle_flow
    if best is None:
        text = ("This round drafted no tree (B = 0), so there is nothing to set beside the best tree of its size." if tree.size == 0 else
                "The oracle tree was not traced for this round.")
        return text, tree_figure(tree, flow, trace.verdict, token_text=token_text, title=f"Round {trace.round_index + 1}")
    ours = tree_figure(tree, flow, trace.verdict, token_text=token_text, title="drafter")
    theirs = tree_figure(best, best_flow, None, token_text=token_text, draft_logprob=False, title="oracle")
    fig = _beside(ours, theirs, (f"the {trace.drafter} drafter's tree: C = {flow.coverage:.3f}", f"the oracle's tree: C = {best_flow.coverage:.3f}"))
    share = flow.tau_bound / best_flow.tau_bound
    drafted = _paths(tree)
    # the oracle's nodes the drafter lacks, most reach first and, among equals, the shallowest (where the drafter left its path)
    missed = sorted((-round(float(best_flow.reach[v]), 3), int(best.depths[v]), v) for v, path in enumerate(_paths(best)) if v and path not in drafted)
    missed = [(-p, v) for p, _, v in missed if -p >= 5e-4][:3]
    missing = ("; the oracle's nodes of most reach that the drafter did not draft: "
               + ", ".join(f"{word(best.tokens_list[v])} at depth {int(best.depths[v])} (P = {p:.3f})" for p, v in missed)) if missed else ""
    if trace.law.greedy:
        law_words = (f"At T = 0 the target's law is a point mass, so the oracle is its greedy path, {best.num_nodes - 1} deep: C = "
                     f"{best_flow.coverage:.0f}. A drafter reaches it only by guessing the greedy continuation token for token.")
    else:
        law_words = (f"At {trace.law.describe()} the target's own tree still loses mass: {_leaves(best, best_flow, word)}. That loss is "
                     "the law's (its spread at each node), not any drafter's: no tree of this size holds it.")
    text = (f"**How far this drafter stands from the best any drafter could do on this round.** Right: the **oracle tree**, the "
            f"{best.num_nodes - 1} nodes of largest reach under the same root at the same law, grown best first from the target's own "
            f"rows (one target forward per node: a measurement, not a drafter). As reach only falls along a path, no tree of "
            f"B = {tree.size} nodes covers more: its $1 + C$ = **{best_flow.tau_bound:.3f}** bounds what any drafter's tree of this size "
            f"gives TEV here. Left: this round's tree, $1 + C$ = **{flow.tau_bound:.3f}**, **{share:.0%}** of the oracle's{missing}. "
            f"Where the drafter's tree loses mass: {_leaves(tree, flow, word)}. {law_words}")
    return text, fig


def _paths(tree) -> list[tuple[int, ...]]:
    """Each node's tokens from the root down (the root's is empty): the same node in another tree has the same path."""
    paths = [()] * tree.num_nodes
    for v in range(1, tree.num_nodes):
        paths[v] = paths[tree.parents_list[v]] + (tree.tokens_list[v],)
    return paths


def _leaves(tree, flow, word) -> str:
    """Where the most of the target's mass leaves a tree: its two nodes of largest exit weight w(v)."""
    top = sorted(((float(w), v) for v, w in enumerate(flow.exit_weight.tolist())), reverse=True)[:2]
    return " and ".join(f"{'the root' if v == 0 else word(tree.tokens_list[v])} (w = {w:.3f})" for w, v in top if w >= 5e-4) or "nowhere"


def _beside(left: go.Figure, right: go.Figure, titles: tuple[str, str]) -> go.Figure:
    """Two tree figures side by side, one colour scale (the right one's bar hidden)."""
    spans = [max(2.0, part.layout.xaxis.range[1] - part.layout.xaxis.range[0]) for part in (left, right)]  # depth drawn: each tree's share of the width
    fig = make_subplots(rows=1, cols=2, subplot_titles=[html.escape(t) for t in titles], horizontal_spacing=0.08,
                        column_widths=[span / sum(spans) for span in spans])
    for col, part in ((1, left), (2, right)):
        for trace in part.data:
            if col == 2 and getattr(trace, "marker", None) is not None and trace.marker.colorbar is not None:
                trace.marker.showscale = False
            fig.add_trace(trace, row=1, col=col)
        fig.update_xaxes(title_text=part.layout.xaxis.title.text, range=part.layout.xaxis.range, dtick=1, showgrid=False, zeroline=False, row=1, col=col)
        fig.update_yaxes(range=part.layout.yaxis.range, visible=False, row=1, col=col)
    fig.update_layout(height=max(left.layout.height or 400, right.layout.height or 400), plot_bgcolor="white", hovermode="closest",
                      margin=dict(l=20, r=20, t=70, b=50), legend=dict(orientation="h", yanchor="bottom", y=1.06, xanchor="right", x=1.0))
    return fig


_BUILDERS = (_context, _marginals, _builder, _forward, _rows, _decision, _bonus, _commit, _oracle)


# ------------------------------------------------------------------------------- helpers
def _bound_sentence(flow) -> str:
    """What 1 + C says about this tree, in the same words in step 5 and step 8."""
    return (f"$1 + C$ = **{flow.tau_bound:.3f}** bounds the **expected** block length: every exact verifier keeps $E[L] \\le 1 + C$ "
            "tokens on average from this tree (TEV attains it), while one round's $L$ is a single draw and may exceed it")


def _path_scores(tree) -> list[float]:
    q = [math.exp(v) for v in floats(tree.draft_logprob)]
    scores = [1.0] * tree.num_nodes
    for v in range(1, tree.num_nodes):
        scores[v] = scores[tree.parents_list[v]] * q[v]
    return scores


def _tree_scatter(tree, labels, colour_values, colour_title, hovers, colours=None) -> go.Figure:
    """Nodes at the tree layout (depth across), with labels, colours and hover text."""
    x, y = tidy_layout(tree.parents_list)
    fig = go.Figure()
    xs, ys = _edge_lines(((tree.parents_list[v], v) for v in range(1, tree.num_nodes)), x, y)
    fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", line=dict(color="#cccccc", width=1), hoverinfo="skip", showlegend=False))
    marker = dict(size=12, color=colours) if colours is not None else dict(
        size=12, color=colour_values, colorscale="Viridis", colorbar=dict(title=colour_title, thickness=12))
    fig.add_trace(go.Scatter(x=x, y=y, mode="markers+text", text=[html.escape(html.unescape(s), quote=False) for s in labels], textposition="middle right",
                             textfont=dict(size=10), marker=marker, hovertext=hovers, hoverinfo="text", showlegend=False, cliponaxis=False))
    fig.update_yaxes(autorange="reversed", visible=False)
    fig.update_xaxes(range=[-0.4, max(x) + 1.2], dtick=1)
    fig.update_layout(height=max(360, 22 * (int(max(y)) + 1) + 140))
    return fig


def _plain(fig: go.Figure, title: str, xaxis: str | None = None, yaxis: str | None = None, height: int | None = None) -> None:
    fig.update_layout(title=dict(text=html.escape(title), font=dict(size=14)), plot_bgcolor="white", margin=dict(l=40, r=20, t=60, b=60))
    if height:
        fig.update_layout(height=height)
    if xaxis:
        fig.update_xaxes(title_text=xaxis)
    if yaxis:
        fig.update_yaxes(title_text=yaxis)


def walkthrough_html(traces, token_text: TokenText = str, title: str = "TEV Explorer: one round, step by step") -> str:
    """A standalone HTML page (plotly.js inlined once: it opens offline) with every step of every
    round in ``traces``: each step's title, text and figure."""
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>",
             "<style>body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;line-height:1.5} .step{margin:2.5em 0}"
             " code{background:#f2f2f2;padding:0 3px}</style>",
             "</head><body>", f"<h1>{html.escape(title)}</h1>"]
    first = True
    for trace in traces:
        parts.append(f"<h2>Round {trace.round_index + 1}: {html.escape(trace.law.describe())}, verifier {html.escape(trace.verifier)}, B = {trace.tree.size}</h2>")
        for step in walkthrough_steps(trace, token_text):
            figure = step.figure.to_html(full_html=False, include_plotlyjs=True if first else False)
            first = False
            parts.append(f"<div class='step'><h3>{html.escape(step.title)}</h3><p>{_markdown_inline(step.text)}</p>{figure}</div>")
    parts.append("</body></html>")
    return "\n".join(parts)


_SYMBOLS = {"rho": "ρ", "sum": "Σ", "notin": "∉", "in": "∈", "ne": "≠", "le": "≤", "to": "→", "cdot": "·", "mid": "|", "propto": "∝",
            "sim": "∼", "tau": "τ", "theta": "θ", "lambda": "λ", ",": "\u2009"}


def _formula_html(tex: str) -> str:
    """One ``$...$`` formula of the steps' text as plain HTML (symbols, sub- and superscripts), so the
    exported page needs no formula renderer: ``p_V^{res}(a)`` -> p<sub>V</sub><sup>res</sup>(a)."""
    out = re.sub(r"\\(mathrm|text)\{([^}]*)\}", r"\2", tex)
    out = re.sub(r"\\([a-z]+|,)", lambda m: _SYMBOLS.get(m.group(1), m.group(1)), out)
    out = re.sub(r"([_^])(?:\{([^}]*)\}|(\w))", lambda m: ("<sub>{}</sub>" if m.group(1) == "_" else "<sup>{}</sup>").format(m.group(2) or m.group(3)), out)
    return f"<i>{out.replace('{', '').replace('}', '')}</i>"


def _markdown_inline(text: str) -> str:
    """The steps' markdown (code, formulas, bold) as HTML; each $...$ formula outside code is written as
    text (:func:`_formula_html`), so a token's own ``$`` stays as it is."""
    pieces = html.escape(text, quote=False).split("`")
    out = "".join(f"<code>{piece}</code>" if i % 2 else
                  "".join(_formula_html(part) if j % 2 else part for j, part in enumerate(piece.split("$"))) for i, piece in enumerate(pieces))
    pieces = out.split("**")
    return "".join(piece if i % 2 == 0 else f"<b>{piece}</b>" for i, piece in enumerate(pieces))
