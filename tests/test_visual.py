"""Figures read the library's objects: assert on the plotly JSON against the flow's own values."""

from __future__ import annotations

import dataclasses
import json
import math
import types
from html.parser import HTMLParser

import pytest
import torch

from tests.helpers import random_tree
from tev.engine.round import STAGES, RoundRecord
from tev.core.flow import target_flow
from tev.core.tree import DraftTree
from tev.core.verify import Verdict, verify
from visual import (
    NODE_FIELDS,
    before_after_figure,
    mass_by_depth_figure,
    text_view_html,
    tidy_layout,
    timeline_figure,
    token_label,
    training_figure,
    tree_figure,
    tree_graph,
    verifier_lab_figure,
)
from visual.tree_view import MAX_HEIGHT

TEXT = {0: " a", 1: "<b>", 2: "\n", 3: "x&y", 4: "longtokenname"}


def token_text(token: int) -> str:
    return TEXT.get(token, f"t{token}")


def trace(fig, name: str):
    found = [t for t in fig.data if t.name == name]
    assert len(found) == 1, f"expected one trace named {name!r}, got {[t.name for t in fig.data]}"
    return found[0]


# ---------------------------------------------------------------------- fixtures
@pytest.fixture
def small():
    """The hand-built tree of test_flow: root -> 1 (-> 0), root -> 2; known flow."""
    tree = DraftTree.from_paths(0, [[1, 0], [2]])  # nodes: 0 root, 1 (tok 1), 2 (tok 0 under 1), 3 (tok 2)
    probs = torch.tensor(
        [
            [0.2, 0.5, 0.3, 0.0, 0.0],  # root: children 1 and 2 carry 0.8, rho = 0.2
            [0.6, 0.1, 0.1, 0.1, 0.1],  # node 1: child token 0 carries 0.6, rho = 0.4
            [0.2, 0.2, 0.2, 0.2, 0.2],  # leaf
            [0.0, 0.0, 1.0, 0.0, 0.0],  # leaf
        ],
        dtype=torch.float64,
    )
    flow = target_flow(tree, probs)
    # The target left the tree at node 1 (its child token 0 was rejected); bonus token 2 ("\n").
    verdict = Verdict(path=[0, 1], exit_node=1, bonus_token=2, verifier="tev")
    return tree, flow, verdict


def ddtree(budget: int, seed: int, vocab: int = 40, horizon: int = 8):
    """A DDTree from random per-depth marginals, its flow under random target rows, a TEV verdict."""
    generator = torch.Generator().manual_seed(seed)
    logq = torch.log_softmax(2.0 * torch.randn(horizon, vocab, generator=generator), dim=-1)
    tree = DraftTree.from_marginals(logq, budget)
    probs = torch.softmax(2.0 * torch.randn(tree.num_nodes, vocab, generator=generator), dim=-1)
    flow = target_flow(tree, probs)
    verdict = verify("tev", tree, probs, torch.Generator().manual_seed(seed + 1))
    return tree, flow, verdict


def make_record(index: int, tree, flow, verdict, emitted=None) -> RoundRecord:
    block = verdict.block_tokens(tree)
    emitted = block if emitted is None else emitted
    timings = {stage: 0.001 * (i + 1) * (index + 1) for i, stage in enumerate(STAGES)}
    return RoundRecord(tree, flow, verdict, timings, "block", "tev", position=10 * index, index=index, emitted=emitted, text="".join(map(token_text, emitted)))


# ---------------------------------------------------------------------- layout
def test_tidy_layout_hand_built():
    # root 0 -> {1, 2}; 1 -> {3, 4}. Leaves in DFS order: 3, 4, 2 take rows 0, 1, 2.
    x, y = tidy_layout([-1, 0, 0, 1, 1])
    assert x == [0, 1, 1, 2, 2]
    assert y[3] == 0 and y[4] == 1 and y[2] == 2
    assert y[1] == 0.5  # centred over its children 3 and 4
    assert y[0] == 1.25  # centred between first child (0.5) and last child (2)


def test_tidy_layout_separates_same_depth_nodes():
    tree = random_tree(torch.Generator().manual_seed(3), vocab=6, budget=120, horizon=7)
    x, y = tidy_layout(tree.parents_list)
    assert x == [float(d) for d in tree.depths.tolist()]
    for depth in set(x):
        rows = sorted(yy for xx, yy in zip(x, y) if xx == depth)
        assert all(b - a >= 1.0 for a, b in zip(rows, rows[1:])), f"nodes at depth {depth} share a row"
    for v in range(tree.num_nodes):
        kids = tree.children(v)
        if kids:
            assert y[v] == (y[kids[0]] + y[kids[-1]]) / 2


def test_tree_graph_is_the_draft_tree():
    tree = random_tree(torch.Generator().manual_seed(4), vocab=5, budget=30, horizon=4)
    graph = tree_graph(tree.parents_list)
    assert graph.number_of_nodes() == tree.num_nodes and graph.number_of_edges() == tree.size
    assert [list(graph.successors(v)) for v in range(tree.num_nodes)] == [tree.children(v) for v in range(tree.num_nodes)]
    with pytest.raises(ValueError, match="must precede its child"):
        tree_graph([-1, 2, 0])


def test_tidy_layout_deep_chain_does_not_recurse():
    x, y = tidy_layout([-1] + list(range(2000)))
    assert x[-1] == 2000 and set(y) == {0.0}


# ---------------------------------------------------------------------- tree figure
def test_token_label_whitespace_escape_and_abbreviation():
    assert token_label(0, token_text) == "·a"
    assert token_label(2, token_text) == "↵"
    assert token_label(1, token_text) == "&lt;b&gt;"
    assert token_label(4, token_text) == "longtok…" and len("longtok…") == 8
    assert token_label(7, lambda t: "") == "⟨7⟩"
    assert token_label(5, lambda t: "a\tb") == "a→b"


def test_node_colours_are_the_flow_reach(small):
    tree, flow, verdict = small
    fig = tree_figure(tree, flow, verdict, token_text=token_text)
    nodes = trace(fig, "nodes")
    # log10 of the reach on a fixed -3..0 scale: below the root a few percent still differ in colour
    assert list(nodes.marker.color) == pytest.approx([math.log10(r) for r in flow.reach.tolist()])
    assert (nodes.marker.cmin, nodes.marker.cmax) == (-3.0, 0.0)
    assert nodes.marker.colorbar.title.text == "reach P(v)"
    assert list(nodes.marker.colorbar.ticktext)[-1] == "1"


def test_a_zero_reach_takes_the_floor_colour_and_special_tokens_stay_whole(small):
    tree, flow, verdict = small
    zero = dataclasses.replace(flow, reach=torch.tensor([1.0, 0.5, 0.0, 1e-6], dtype=flow.reach.dtype))
    assert list(trace(tree_figure(tree, zero, verdict, token_text=token_text), "nodes").marker.color)[2:] == [-3.0, -3.0]
    assert token_label(1, lambda t: "<|im_end|>") == "&lt;|im_end|&gt;"  # not cut to 8 characters


def test_node_size_grows_with_missing_mass(small):
    tree, flow, verdict = small
    sizes = list(trace(tree_figure(tree, flow, verdict), "nodes").marker.size)
    assert flow.exit_weight.tolist() == pytest.approx([0.2, 0.2, 0.3, 0.3])
    assert sizes[2] > sizes[0] and sizes[0] == sizes[1] and sizes[2] == sizes[3]


def test_hover_customdata_equals_flow_values():
    tree, flow, verdict = ddtree(32, seed=1)
    fig = tree_figure(tree, flow, verdict, token_text=token_text)
    custom = trace(fig, "nodes").customdata
    col = {name: i for i, name in enumerate(NODE_FIELDS)}
    assert len(custom) == tree.num_nodes
    for v in (0, 1, 5, tree.num_nodes - 1):
        row = custom[v]
        assert row[col["node"]] == v
        assert row[col["depth"]] == int(tree.depths[v])
        assert row[col["token"]] == int(tree.tokens[v])
        assert row[col["q"]] == pytest.approx(math.exp(float(tree.draft_logprob[v])))
        assert row[col["edge_prob"]] == float(flow.edge_prob[v])
        assert row[col["reach"]] == float(flow.reach[v])
        assert row[col["rho"]] == float(flow.rho[v])
        assert row[col["w"]] == float(flow.exit_weight[v])
    template = trace(fig, "nodes").hovertemplate
    for words in ("reach P(v)", "rho(v)", "w(v)", "draft score q", "depth d(v)"):
        assert words in template
    no_q = tree_figure(tree, flow, verdict, draft_logprob=False)
    assert "draft score q" not in trace(no_q, "nodes").hovertemplate


def test_exit_node_marker_sits_on_the_exit_node(small):
    tree, flow, verdict = small
    fig = tree_figure(tree, flow, verdict, token_text=token_text)
    nodes, exit_trace = trace(fig, "nodes"), trace(fig, "exit node")
    assert (exit_trace.x[0], exit_trace.y[0]) == (nodes.x[1], nodes.y[1])
    assert exit_trace.customdata[0][0] == 1
    assert exit_trace.customdata[0][1] == pytest.approx(0.2)  # w(1) = 0.5 * 0.4


def test_bonus_token_hangs_off_the_exit_node(small):
    tree, flow, verdict = small
    fig = tree_figure(tree, flow, verdict, token_text=token_text)
    nodes, bonus, edge = trace(fig, "nodes"), trace(fig, "bonus token"), trace(fig, "bonus edge")
    assert list(bonus.text) == ["↵"]  # token 2 is a newline
    assert bonus.customdata[0] == [2, 1]  # (bonus token, exit node)
    assert bonus.x[0] == nodes.x[1] + 1  # one level below the exit node
    occupied = {(xx, yy) for xx, yy in zip(nodes.x, nodes.y)}
    assert (bonus.x[0], bonus.y[0]) not in occupied  # its own row: it covers no node
    assert (edge.x[0], edge.y[0]) == (nodes.x[1], nodes.y[1]) and edge.line.dash == "dash"


def test_the_exit_label_sits_above_its_ring_clear_of_the_bonus_edge(small):
    """The bonus edge runs right from the exit node (straight right when V is a leaf): a label to
    the node's right was crossed by it."""
    tree, flow, verdict = small
    fig = tree_figure(tree, flow, verdict, token_text=token_text)
    exit_trace, edge = trace(fig, "exit node"), trace(fig, "bonus edge")
    assert edge.x[1] > edge.x[0] and exit_trace.textposition == "top center" and exit_trace.text[0]


def test_accepted_path_trace_covers_exactly_the_path():
    tree, flow, verdict = ddtree(48, seed=4)
    assert len(verdict.path) >= 2  # a path with at least one accepted draft token
    fig = tree_figure(tree, flow, verdict)
    nodes, path = trace(fig, "nodes"), trace(fig, "accepted path")
    assert list(path.customdata) == verdict.path
    assert list(path.x) == [nodes.x[v] for v in verdict.path]
    assert list(path.y) == [nodes.y[v] for v in verdict.path]
    opacity = list(nodes.marker.opacity)
    assert all(opacity[v] == 1.0 for v in verdict.path)
    assert all(opacity[v] < 1.0 for v in range(tree.num_nodes) if v not in verdict.path)
    assert trace(fig, "edges").opacity < 1.0


def test_title_has_budget_coverage_and_block_length(small):
    tree, flow, verdict = small
    title = tree_figure(tree, flow, verdict).layout.title.text
    assert "B = 3" in title
    assert f"C(T) = {flow.coverage:.3f}" in title and "1.100" in title
    assert f"1 + C = {flow.tau_bound:.3f}" in title and "2.100" in title
    assert "L = 2" in title
    assert "L =" not in tree_figure(tree, flow).layout.title.text


def test_labels_show_tokens_escaped(small):
    tree, flow, verdict = small
    fig = tree_figure(tree, flow, verdict, token_text=token_text)
    texts = list(trace(fig, "nodes").text)
    assert texts[0] == "·a" and texts[2] == "·a" and texts[3] == "↵"
    assert texts[1] == ""  # the exit node's label is drawn by the exit trace, outside its ring
    assert list(trace(fig, "exit node").text) == ["&lt;b&gt;"]


def test_without_verdict_nothing_is_faded_and_no_exit_traces(small):
    tree, flow, _ = small
    fig = tree_figure(tree, flow)
    assert {t.name for t in fig.data} == {"edges", "nodes"}
    assert set(trace(fig, "nodes").marker.opacity) == {1.0}


def visible_labels(fig):
    """(x, y) of every point with a visible label in the label-bearing traces."""
    points = []
    for name in ("nodes", "exit node", "bonus token"):
        found = [t for t in fig.data if t.name == name]
        for t in found:
            points += [(xx, yy) for xx, yy, text in zip(t.x, t.y, t.text) if text]
    return points


def assert_no_label_overlap(fig):
    layout = fig.layout
    low, high = sorted(layout.yaxis.range)
    pixels_per_unit = (layout.height - layout.margin.t - layout.margin.b) / (high - low)
    font = trace(fig, "nodes").textfont.size
    by_depth: dict[float, list[float]] = {}
    for xx, yy in visible_labels(fig):
        by_depth.setdefault(xx, []).append(yy)
    closest = min(
        (b - a for rows in by_depth.values() for a, b in zip(sorted(rows), sorted(rows)[1:])),
        default=float("inf"),
    )
    assert closest * pixels_per_unit >= font, f"two labels at one depth are {closest * pixels_per_unit:.1f}px apart, font {font}px"
    return pixels_per_unit, font


def test_budget_64_is_readable():
    tree, flow, verdict = ddtree(64, seed=7)
    assert tree.size == 64
    fig = tree_figure(tree, flow, verdict, token_text=token_text)
    leaves = int(tree.is_leaf.sum())
    assert fig.layout.height >= 20 * leaves  # height follows the number of leaves
    _, font = assert_no_label_overlap(fig)
    assert font >= 10
    # every node is labelled at this budget (the exit node by the exit trace)
    assert len(visible_labels(fig)) == tree.num_nodes + 1


def test_budget_256_renders_and_keeps_path_labels():
    tree, flow, verdict = ddtree(256, seed=11, vocab=60, horizon=6)
    assert tree.size == 256
    fig = tree_figure(tree, flow, verdict, token_text=token_text)
    sent = {t["name"]: t for t in json.loads(fig.to_json())["data"]}  # what the browser receives
    assert set(sent) == {"edges", "accepted path", "nodes", "exit node", "bonus edge", "bonus token"}
    x, y = tidy_layout(tree.parents_list + [verdict.exit_node])
    assert sent["nodes"]["x"] == x[: tree.num_nodes] and sent["nodes"]["y"] == y[: tree.num_nodes]
    assert sent["nodes"]["marker"]["color"] == pytest.approx([max(-3.0, math.log10(r)) if r > 0 else -3.0 for r in flow.reach.tolist()])
    segments = [tuple(sent["edges"]["x"][i : i + 3]) for i in range(0, len(sent["edges"]["x"]), 3)]
    assert segments == [(x[u], x[v], None) for v, u in enumerate(tree.parents_list) if v > 0]  # one per edge pa(v) -> v
    assert fig.layout.height <= MAX_HEIGHT
    assert len(trace(fig, "nodes").customdata) == tree.num_nodes  # hover for every node
    assert_no_label_overlap(fig)
    nodes = trace(fig, "nodes")
    labelled = {v for v, text in enumerate(nodes.text) if text} | {verdict.exit_node}
    assert set(verdict.path) <= labelled
    assert len(labelled) < tree.num_nodes  # crowded: some low-reach labels are hidden
    hidden_reach = [float(flow.reach[v]) for v in range(tree.num_nodes) if v not in labelled]
    shown_off_path = [float(flow.reach[v]) for v in labelled if v not in verdict.path]
    assert max(hidden_reach) <= max(shown_off_path)


def test_max_label_nodes_limits_labels():
    tree, flow, verdict = ddtree(32, seed=2)
    fig = tree_figure(tree, flow, verdict, max_label_nodes=5)
    assert len(visible_labels(fig)) == 5


# ---------------------------------------------------------------------- mass by depth
def test_mass_by_depth_stacks_equal_flow_by_depth(small):
    _, flow, _ = small
    fig = mass_by_depth_figure(flow)
    table = flow.by_depth()
    continues, missing = trace(fig, "continues deeper"), trace(fig, "missing mass")
    assert fig.layout.barmode == "stack"
    assert list(missing.x) == [0, 1, 2]
    assert list(missing.y) == pytest.approx(table["exit"].tolist())  # [0.2, 0.5, 0.3]
    assert continues.y[0] == 0.0  # the root's reach is not coverage
    totals = [c + m for c, m in zip(continues.y, missing.y)]
    assert totals[1:] == pytest.approx(table["reach"][1:].tolist())  # [0.8, 0.3]
    assert sum(totals[1:]) == pytest.approx(flow.coverage)
    assert "loses target mass" in fig.layout.title.text and "depth 1" in fig.layout.title.text


def test_mass_by_depth_averages_a_list(small):
    tree, flow, _ = small
    other = target_flow(DraftTree.chain(0, [1]), torch.tensor([[0.5, 0.5], [0.5, 0.5]]))  # depths 0..1
    fig = mass_by_depth_figure([flow, other])
    expected_exit = [(0.2 + 0.5) / 2, (0.5 + 0.5) / 2, 0.3 / 2]
    assert list(trace(fig, "missing mass").y) == pytest.approx(expected_exit)
    totals = [c + m for c, m in zip(trace(fig, "continues deeper").y, trace(fig, "missing mass").y)]
    assert totals[1:] == pytest.approx([(0.8 + 0.5) / 2, 0.3 / 2])


# ---------------------------------------------------------------------- records: timeline, text
@pytest.fixture
def records(small):
    tree, flow, verdict = small
    big_tree, big_flow, big_verdict = ddtree(16, seed=5)
    exit_at_root = Verdict(path=[0], exit_node=0, bonus_token=3, verifier="tev")
    return [
        make_record(0, tree, flow, verdict),  # accepted "<b>", bonus "\n"
        make_record(1, big_tree, big_flow, big_verdict),
        make_record(2, tree, flow, exit_at_root),  # only the bonus "x&y"
        make_record(3, tree, flow, Verdict(path=[0, 1, 2], exit_node=2, bonus_token=4, verifier="tev"), emitted=[1]),  # cut at a stop
    ]


def test_timeline_has_one_point_per_round(records):
    fig = timeline_figure(records)
    rounds = [0, 1, 2, 3]
    lengths = [r.verdict.block_length for r in records]
    assert list(trace(fig, "L (realised)").x) == rounds
    assert list(trace(fig, "L (realised)").y) == lengths
    assert list(trace(fig, "1 + C(T)").y) == pytest.approx([r.flow.tau_bound for r in records])
    running = trace(fig, "running tau").y
    assert len(running) == 4 and running[-1] == pytest.approx(sum(lengths) / 4)
    for stage in STAGES:
        bars = trace(fig, stage)
        assert len(bars.x) == 4
        assert list(bars.y) == pytest.approx([1000 * r.timings[stage] for r in records])
    exit_depths = [int(r.tree.depths[r.verdict.exit_node]) for r in records]
    histogram = trace(fig, "exit depth")
    assert sum(histogram.y) == 4
    assert histogram.y[0] == exit_depths.count(0) and histogram.y[1] == exit_depths.count(1)


def test_timeline_at_auto_leaves_room_for_the_nodes_kept_axis(records):
    """At budget auto the round panel's right axis ("nodes kept") and the histogram's axis overlapped:
    the panels stand further apart and the histogram's count is named in its subplot title."""
    fixed = timeline_figure(records)
    at_auto = timeline_figure([dataclasses.replace(r, choice=object()) for r in records])  # timeline_figure reads only whether a choice was made
    assert trace(at_auto, "tree size k (auto)") and at_auto.layout.yaxis2.title.text == "nodes kept"
    histogram_axis = at_auto.layout[trace(at_auto, "exit depth").yaxis.replace("y", "yaxis")]
    assert not histogram_axis.title.text and "rounds by exit depth" in str(at_auto.layout.annotations)
    gap = lambda fig: fig.layout[trace(fig, "exit depth").xaxis.replace("x", "xaxis")].domain[0] - fig.layout.xaxis.domain[1]  # noqa: E731
    assert gap(at_auto) >= 0.18 > gap(fixed)


def test_budget_figure_margins_hold_its_axis_titles():
    from visual.budget_view import budget_figure

    record = types.SimpleNamespace(index=0, choice=types.SimpleNamespace(
        rate=torch.tensor([10.0, 12.0, 11.0]), expected=torch.tensor([1.0, 1.5, 1.7]), cost=torch.tensor([0.1, 0.125, 0.155]),
        size=1, going_rate=11.5, calibration=1.1, cap=2))
    fig = budget_figure(record)
    assert fig.layout.yaxis.automargin and fig.layout.xaxis.automargin and fig.layout.yaxis.title.text == "expected tokens/s"


class TokenSpans(HTMLParser):
    """Collects (round, class, background, title, text) of the token spans of a text view."""

    def __init__(self):
        super().__init__(convert_charrefs=False)
        self.spans, self.depth, self.current = [], 0, None

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "span" and "data-round" in attrs:
            background = attrs["style"].split("background:")[1].split(";")[0]
            self.current = [attrs["data-round"], attrs["class"], background, attrs["title"], ""]
            self.depth = 0
        elif tag == "span" and self.current is not None:
            self.depth += 1

    def handle_endtag(self, tag):
        if tag == "span" and self.current is not None:
            if self.depth == 0:
                self.spans.append(tuple(self.current))
                self.current = None
            else:
                self.depth -= 1

    def handle_data(self, data):
        if self.current is not None:
            self.current[4] += data

    def handle_entityref(self, name):
        self.handle_data(f"&{name};")


def test_text_view_escapes_and_marks_bonus(records):
    page = text_view_html(records[:1] + records[2:], token_text=token_text, prompt_text="Q: 1<2\n")
    assert "Q: 1&lt;2\n" in page
    assert "&lt;b&gt;" in page and "<b>" not in page
    assert "white-space:pre-wrap" in page
    parser = TokenSpans()
    parser.feed(page)
    assert [(r, kind, text) for r, kind, _, _, text in parser.spans] == [
        ("0", "tev-draft", "&lt;b&gt;"),
        ("0", "tev-bonus", "↵\n"),  # the newline is kept (after a faint mark)
        ("2", "tev-bonus", "x&amp;y"),
        ("3", "tev-draft", "&lt;b&gt;"),  # cut at a stop: no bonus this round
    ]
    titles = [title for _, _, _, title, _ in parser.spans]
    assert "round 0: draft token" in titles[0] and "round 0: bonus token" in titles[1]
    backgrounds = {(r, kind): bg for r, kind, bg, _, _ in parser.spans}
    assert backgrounds[("0", "tev-draft")] != backgrounds[("0", "tev-bonus")]
    assert backgrounds[("0", "tev-draft")] != backgrounds[("3", "tev-draft")]  # palettes alternate per round


# ---------------------------------------------------------------------- other figures
def test_training_figure_skips_missing_heldout():
    history = [
        {
            "step": s, "loss": 3.0 - 0.1 * s, "loss_tok": 2.0, "loss_tree": 1.0 - 0.1 * s,
            "tau_bound": 1.5 + 0.05 * s,
            "heldout_tau_bound": (1.4 + 0.05 * s) if s % 5 == 0 else None,  # measured every 5 steps
        }
        for s in range(1, 11)
    ]
    fig = training_figure(history)
    assert list(trace(fig, "loss").y) == pytest.approx([3.0 - 0.1 * s for s in range(1, 11)])
    assert len(trace(fig, "loss_tree").x) == 10
    heldout = trace(fig, "1 + C (held out)")
    assert list(heldout.x) == [5, 10] and list(heldout.y) == pytest.approx([1.65, 1.9])
    assert list(trace(fig, "1 + C (train trees)").y)[0] == pytest.approx(1.55)


def test_training_figure_keeps_its_legend_off_the_title_and_plots_the_held_out_after():
    from ui.exittrain import with_heldout_after

    history = [{"step": 0, "loss": math.nan, "loss_tok": math.nan, "loss_tree": math.nan, "tau_bound": 1.5, "heldout_tau_bound": 1.5}]
    history += [{"step": s, "loss": 3.0, "loss_tok": 2.0, "loss_tree": 1.0, "tau_bound": 1.6, "heldout_tau_bound": None} for s in (1, 2, 3)]
    fig = training_figure(with_heldout_after(history, 1.7))
    heldout = trace(fig, "1 + C (held out)")
    assert list(heldout.x) == [0, 3] and list(heldout.y) == pytest.approx([1.5, 1.7])  # the 'before' and the 'after'
    assert fig.layout.legend.y < 0 and fig.layout.legend.yanchor == "top"  # under the panels, not over the title
    assert history[-1]["heldout_tau_bound"] is None  # the run's own history is left as it was


def test_before_after_grouped_bars_with_spread():
    rows = [
        {"drafter": "base", "temperature": 0.0, "tau": 2.0, "tau_q25": 1.5, "tau_q75": 2.5},
        {"drafter": "base", "temperature": 1.0, "tau": 1.8, "tau_q25": 1.0, "tau_q75": 2.0},
        {"drafter": "exittrain", "temperature": 1.0, "tau": 2.4, "tau_q25": 2.0, "tau_q75": 3.0},
        {"drafter": "exittrain", "temperature": 0.0, "tau": 2.6, "tau_q25": 2.1, "tau_q75": 3.2},
    ]
    fig = before_after_figure(rows)
    assert fig.layout.barmode == "group"
    after = trace(fig, "exittrain")
    assert list(after.x) == ["T = 0", "T = 1"] and list(after.y) == [2.6, 2.4]
    assert list(after.error_y.array) == pytest.approx([0.6, 0.6])
    assert list(after.error_y.arrayminus) == pytest.approx([0.5, 0.4])


def test_verifier_lab_bars_are_the_exit_law(small):
    tree, flow, _ = small
    frequencies = {"tev": [0.21, 0.19, 0.3, 0.3], "predraw": [0.2, 0.2, 0.31, 0.29]}
    fig = verifier_lab_figure(tree, flow, frequencies, {"tev": 2.09, "predraw": 2.11}, token_text=token_text)
    assert list(trace(fig, "exit law w(v)").y) == flow.exit_weight.tolist()
    assert list(trace(fig, "predraw").y) == frequencies["predraw"]
    assert list(trace(fig, "mean L").y) == [2.09, 2.11]
    lines = [s for s in fig.layout.shapes if s.type == "line"]
    assert any(s.y0 == pytest.approx(flow.tau_bound) for s in lines)
    assert "2.100" in fig.layout.title.text
    # the same frequencies would put one verifier's markers on another's: each verifier sits beside the others over the node
    tev, predraw = trace(fig, "tev"), trace(fig, "predraw")
    assert all(a < b for a, b in zip(tev.x, predraw.x)) and all(abs(x - v) < 0.4 for v, x in enumerate(tev.x))


def test_empty_inputs_give_placeholder_figures():
    assert "no rounds" in timeline_figure([]).layout.title.text
    assert "no rounds" in mass_by_depth_figure([]).layout.title.text
    assert text_view_html([]).count("tev-draft") == 0


def test_root_only_tree_draws_root_exit_and_bonus():
    tree = DraftTree.from_parents([5], [-1])  # budget 0: the target always exits at the root
    flow = target_flow(tree, torch.tensor([[0.5, 0.5]]))
    fig = tree_figure(tree, flow, Verdict(path=[0], exit_node=0, bonus_token=1, verifier="tev"))
    assert list(trace(fig, "accepted path").customdata) == [0]
    assert (trace(fig, "exit node").x[0], trace(fig, "bonus token").x[0]) == (0, 1)
    assert "C(T) = 0.000" in fig.layout.title.text and "L = 1" in fig.layout.title.text
