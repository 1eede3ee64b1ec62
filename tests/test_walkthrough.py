"""The walkthrough traces the decode loop's own round, and its steps agree with each other."""

import dataclasses
import json
import re

import pytest
import torch

from tev.core.sampling import SamplingLaw
from tev.core.verify import SAMPLING_VERIFIERS
from tev.engine.decode import DecodeConfig, run_to_end, Request, speculative_generate
from tev.engine.drafters import BlockTreeDrafter
from tev.engine.models import load_bundle
from tev.engine.walkthrough import trace_round
from tev.engine.target import Target
from tests.tiny import tiny_ar_drafter, tiny_block_drafter, tiny_target
from visual.walkthrough import STEP_TITLES, walkthrough_html, walkthrough_step, walkthrough_steps

VOCAB = 40
PROMPT = [1, 5, 9, 3, 7]


@pytest.fixture(scope="module")
def pair():
    torch.manual_seed(0)
    target = tiny_target(VOCAB, scale=2.0)
    block = tiny_block_drafter(target)
    return target, {"block": block, "chain": BlockTreeDrafter(block.model, shape="chain"), "ar": tiny_ar_drafter(VOCAB)}


CASES = [(drafter, verifier, law) for drafter in ("block", "ar") for verifier in SAMPLING_VERIFIERS
         for law in (SamplingLaw(0.7, top_p=0.9), SamplingLaw(1.0))] + [("block", "greedy", SamplingLaw(0.0)), ("ar", "tev", SamplingLaw(0.0)),
                                                                 ("chain", "tev", SamplingLaw(0.7, top_p=0.9)), ("chain", "greedy", SamplingLaw(0.0))]


@pytest.mark.parametrize("drafter,verifier,law", CASES, ids=lambda x: x.describe() if isinstance(x, SamplingLaw) else str(x))
def test_every_step_reads_the_same_round(pair, drafter, verifier, law):
    target, drafters = pair
    trace = trace_round(Target(target), drafters[drafter], PROMPT, law, verifier, 8, seed=3)
    assert trace.verifier == ("greedy" if law.greedy else verifier)
    steps = walkthrough_steps(trace, str)
    assert [s.title for s in steps] == list(STEP_TITLES)
    n = trace.tree.num_nodes
    for step in steps:
        assert step.text and step.figure.data, step.title
        json.loads(step.figure.to_json())  # every figure serialises for the browser
    # the tree of step 5 and of step 8 is the traced tree; step 5's exit law sums to 1
    for index in (4, 7):
        nodes = next(t for t in steps[index].figure.data if t.name == "nodes")
        assert len(nodes.customdata) == n
    assert abs(float(trace.flow.exit_weight.sum()) - 1) < 1e-5
    assert trace.positions.tolist() == [len(PROMPT) - 1 + d for d in trace.tree.depths.tolist()]
    if trace.verifier == "tev":  # step 6's categorical is step 5's exit law
        bars = steps[5].figure.data[0]
        assert list(bars.y) == pytest.approx(trace.flow.exit_weight.tolist())
    assert trace.block == trace.verdict.block_tokens(trace.tree) and trace.next_context == PROMPT + trace.block
    # the bonus is never one of the exit node's children
    assert trace.verdict.bonus_token not in {trace.tree.tokens_list[u] for u in trace.tree.children(trace.verdict.exit_node)}


def test_same_settings_and_seed_give_the_same_round(pair):
    target, drafters = pair
    law = SamplingLaw(1.0)
    first, again = (trace_round(Target(target), drafters["block"], PROMPT, law, "predraw", 8, seed=11) for _ in range(2))
    assert (first.verdict.path, first.verdict.bonus_token, first.decision) == (again.verdict.path, again.verdict.bonus_token, again.decision)
    other = [trace_round(Target(target), drafters["block"], PROMPT, law, "predraw", 8, seed=s).block for s in range(12, 20)]
    assert any(block != first.block for block in other)  # the seed is what fixes the round


def test_the_first_round_is_the_decode_loop_s_first_round(pair):
    # same prompt, tree and verdict as speculative_generate's first round with the same seed
    target, drafters = pair
    for verifier in SAMPLING_VERIFIERS:
        trace = trace_round(Target(target), drafters["block"], PROMPT, SamplingLaw(1.0), verifier, 8, seed=5)
        records, _ = run_to_end(speculative_generate(Request(Target(target), drafters["block"], PROMPT, DecodeConfig(budget=8, temperature=1.0, verifier=verifier, seed=5, max_new_tokens=1, stop_at_eos=False))))
        assert records[0].tree.tokens_list == trace.tree.tokens_list and records[0].verdict.path == trace.verdict.path
        assert records[0].bonus_token == trace.verdict.bonus_token


def test_the_html_export_holds_every_step_and_opens_offline(pair):
    target, drafters = pair
    traces = [trace_round(Target(target), drafters["block"], PROMPT, SamplingLaw(0.7, top_p=0.9), "tev", 8, seed=1)]
    traces.append(trace_round(Target(target), drafters["block"], traces[0].next_context, traces[0].law, "tev", 8, seed=1, round_index=1))
    page = walkthrough_html(traces, str)
    assert page.count("class='step'") == 2 * len(STEP_TITLES)
    assert page.count("plotly.js v") == 1  # the library inlined once, no network needed
    assert not re.search(r"<script[^>]+src=", page)


def test_the_command_line_export_writes_the_steps(tmp_path, monkeypatch):
    from tests.tiny import save_pair
    from visual import walkthrough_export

    paths = save_pair(tmp_path / "pair")
    monkeypatch.setattr(walkthrough_export, "load_bundle", lambda pair=None: load_bundle(paths["target"], paths["block"]))
    out = tmp_path / "walk.html"
    walkthrough_export.main(["--prompt", "def add(a, b):\n    ", "--rounds", "2", "--out", str(out), "--budget", "6"])
    page = out.read_text()
    assert page.count("class='step'") == 2 * len(STEP_TITLES) == 18 and "8. The commit" in page and "9. The best tree any drafter could draft here" in page


def test_the_oracle_step_sets_the_best_tree_of_the_same_size_beside_the_drafter_s(pair):
    """Step 9: the oracle tree (the target drafting for itself) at the same root, law and B, whose 1 + C no tree of
    B nodes exceeds, beside this round's tree; at T = 0 it is the target's greedy path."""
    target, drafters = pair
    for law in (SamplingLaw(0.7, top_p=0.9), SamplingLaw(1.0)):
        trace = trace_round(Target(target), drafters["block"], PROMPT, law, "tev", 8, seed=1)
        best, drafted = trace.oracle_flow, trace.flow
        assert trace.oracle.num_nodes - 1 <= 8 and best.coverage >= drafted.coverage - 1e-5  # no tree of 8 nodes covers more
        assert float(best.exit_weight.sum()) == pytest.approx(1.0, abs=1e-4)
        step = walkthrough_step(trace, 8, str)
        assert f"$1 + C$ = **{best.tau_bound:.3f}**" in step.text and f"$1 + C$ = **{drafted.tau_bound:.3f}**" in step.text
        assert len(step.figure.layout.annotations) == 2  # the two trees' titles, side by side
    greedy = trace_round(Target(target), drafters["block"], PROMPT, SamplingLaw(0.0), "greedy", 6, seed=0)
    records, _ = run_to_end(speculative_generate(Request(Target(target), drafters["block"], PROMPT, DecodeConfig(budget=0, temperature=0, max_new_tokens=6,
                                                                                                            stop_at_eos=False))))
    plain = [token for record in records for token in record.emitted]
    chain = [greedy.oracle.tokens_list[v] for v in range(1, greedy.oracle.num_nodes)]
    assert chain == plain[: len(chain)] and greedy.oracle_flow.coverage == pytest.approx(len(chain))  # the greedy path, each reach 1
    assert "its greedy path" in walkthrough_step(greedy, 8, str).text
    assert trace_round(Target(target), drafters["block"], PROMPT, SamplingLaw(0.7), "tev", 0, seed=0).oracle is None  # B = 0: nothing to set beside


def test_the_steps_say_what_this_round_shows(pair):
    """Step 2's caption follows this round's marginals, step 7 leaves out tokens of probability 0."""
    target, drafters = pair
    trace = trace_round(Target(target), drafters["block"], PROMPT, SamplingLaw(0.7, top_k=2), "tev", 8, seed=2)
    tokens, probs = trace.marginals
    falling = torch.linspace(0.9, 0.1, probs.shape[0]).unsqueeze(1).expand_as(probs).contiguous()
    assert "less sure than the one before it" in walkthrough_step(dataclasses.replace(trace, marginals=(tokens, falling)), 1, str).text
    bump = falling.clone()
    bump[1] = 0.95  # surest at depth 2, still falling on the whole
    assert "surest best guess is at depth 2" in walkthrough_step(dataclasses.replace(trace, marginals=(tokens, bump)), 1, str).text
    rising = falling.flip(0)
    assert "but not in this round" in walkthrough_step(dataclasses.replace(trace, marginals=(tokens, rising)), 1, str).text
    bonus = walkthrough_step(trace, 6, str)
    assert all(x > 0 for bars in bonus.figure.data for x in bars.x)
    assert any(p == 0 for _, p in trace.bonus["row"])  # top-k 2: four of the row's top six tokens have probability 0
    greedy = trace_round(Target(target), drafters["block"], PROMPT, SamplingLaw(0.0), "greedy", 8, seed=2)
    assert "There is no residual" in walkthrough_step(greedy, 6, str).text and len(walkthrough_step(greedy, 6, str).figure.data) == 1


def test_steps_5_and_8_tell_one_story_about_1_plus_c(pair):
    """Step 5 and step 8 say the same of 1 + C, with this round's numbers: it bounds the expected
    block length, and one round's L may exceed it; a round with C = 0 is not told it might keep fewer."""
    target, drafters = pair
    for seed in range(4):
        trace = trace_round(Target(target), drafters["block"], PROMPT, SamplingLaw(0.7, top_p=0.9), "tev", 8, seed=seed)
        five, eight = walkthrough_step(trace, 4, str).text, walkthrough_step(trace, 7, str).text
        bound = f"$1 + C$ = **{trace.flow.tau_bound:.3f}** bounds the **expected** block length"
        assert bound in five and bound in eight and "may exceed it" in five and "not a bound" not in eight
        length = trace.verdict.block_length
        said = "exceeds" if length > trace.flow.tau_bound else "falls short of"
        assert f"this round's L = {length} {said} it" in eight
    plain = trace_round(Target(target), drafters["block"], PROMPT, SamplingLaw(0.7, top_p=0.9), "tev", 0, seed=0)  # B = 0: C = 0
    assert "C = 0, so L = 1 (the bonus alone) is the only outcome" in walkthrough_step(plain, 7, str).text
    greedy = trace_round(Target(target), drafters["block"], PROMPT, SamplingLaw(0.0), "greedy", 8, seed=0)
    assert "every draw keeps the same L" in walkthrough_step(greedy, 7, str).text


def test_step_1_labels_alternate_above_and_below(pair):
    """Neighbouring context tokens' labels alternate above and below, so two long ones never collide;
    the root's sits above (its arrow comes from below)."""
    target, drafters = pair
    trace = trace_round(Target(target), drafters["block"], PROMPT * 6, SamplingLaw(0.7, top_p=0.9), "tev", 8, seed=0)
    scatter = walkthrough_step(trace, 0, str).figure.data[0]
    positions = list(scatter.textposition)
    assert len(positions) == 24 and positions[-1] == "top center"
    assert all(a != b for a, b in zip(positions, positions[1:]))


def test_a_whitespace_token_reads_as_a_quoted_space_in_the_attention_labels(pair):
    """A space token showed as a bare "·" between a node's name and its position in the attention mask's labels."""
    target, drafters = pair
    trace = trace_round(Target(target), drafters["block"], PROMPT, SamplingLaw(1.0), "tev", 8, seed=0)
    space = trace.tree.tokens_list[1]
    heatmap = walkthrough_step(trace, 3, lambda t: " " if t == space else f"w{t}").figure.data[0]
    assert heatmap.x[1].startswith("v1 “␣” @") and all("“" not in name for name in heatmap.x[2:] if f"w{space}" not in name)


def test_a_degenerate_round_says_so_and_how_to_get_a_richer_one():
    """At the walkthrough's defaults a round can hold all the target's mass on one path (C(T) = 1.000 in every
    round), so every verifier replays 2.000 +- 0.000: the page says why and what to change."""
    import types

    from ui.walkthrough import degenerate_note

    round_ = lambda w, law: types.SimpleNamespace(flow=types.SimpleNamespace(exit_weight=torch.tensor(w), tau_bound=2.0), law=law)  # noqa: E731
    said = degenerate_note(round_([0.0, 1.0, 0.0], SamplingLaw(0.7, top_p=0.9)))
    assert said.startswith("**A degenerate round:**") and "exit node is v1 with probability 1" in said and "raise T or top-p" in said
    assert degenerate_note(round_([0.2, 0.8, 0.0], SamplingLaw(0.7, top_p=0.9))) == ""  # a spread to replay
    assert degenerate_note(round_([0.0, 1.0, 0.0], SamplingLaw(0.0))) == ""  # greedy: the replay is refused, saying why


def test_every_step_flags_a_round_at_t_0_and_a_one_deep_fan():
    """At T = 0 step 5 showed C(T) = 4.000 with no word, and B = 16 drew 16 next-token guesses side by side with none:
    every step of such a round says what it is."""
    import types

    from ui.walkthrough import round_note

    def round_(depths, law):
        tree = types.SimpleNamespace(size=len(depths), depths=torch.tensor([0, *depths]))
        flow = types.SimpleNamespace(exit_weight=torch.tensor([0.1] * (len(depths) + 1)), tau_bound=1.5, coverage=0.5)
        return types.SimpleNamespace(tree=tree, flow=flow, law=law)

    sampled = SamplingLaw(0.7, top_p=0.9)
    assert "**At T = 0**" in round_note(round_([1, 2, 3], SamplingLaw(0.0))) and "A one-deep fan" not in round_note(round_([1, 2, 3], SamplingLaw(0.0)))
    assert "**A one-deep fan:** all 4 nodes guess the next token" in round_note(round_([1, 1, 1, 1], sampled))
    assert round_note(round_([1, 2, 1], sampled)) == ""  # two deep, sampled, mass spread: nothing to flag


def test_step_7_draws_the_removed_children_it_names(pair):
    """Step 7 promises grey removed children only where it draws them (a child outside the row's top
    tokens included), and says so in words when truncation had already given them probability 0."""
    target, drafters = pair
    trace = trace_round(Target(target), drafters["block"], PROMPT, SamplingLaw(0.7, top_p=0.9), "tev", 8, seed=1)
    outside = next(t for t in range(VOCAB) if t not in {u for u, _ in trace.bonus["row"]})
    kept = dataclasses.replace(trace, bonus={**trace.bonus, "removed": [(outside, 0.01)]})
    step = walkthrough_step(kept, 6, str)
    row = step.figure.data[0]
    assert str(outside) in list(row.y) and "#bbbbbb" in list(row.marker.color) and "grey" in step.figure.layout.title.text
    cut = dataclasses.replace(trace, bonus={**trace.bonus, "removed": [(outside, 0.0)]})
    step = walkthrough_step(cut, 6, str)
    assert "grey" not in step.figure.layout.title.text and str(outside) not in list(step.figure.data[0].y)
    assert f"with their $p_V$: `{outside}` 0.00" in step.text and "already have probability 0" in step.text


def test_the_export_writes_its_formulas_as_text(pair):
    target, drafters = pair
    trace = trace_round(Target(target), drafters["block"], PROMPT, SamplingLaw(0.7, top_p=0.9), "tev", 8, seed=1)
    page = walkthrough_html([trace], str)
    paragraphs = re.findall(r"<p>(.*?)</p>", page, flags=re.S)
    assert len(paragraphs) == len(STEP_TITLES) and sum(p.count("$") for p in paragraphs) == 0
    assert "p<sub>V</sub><sup>res</sup>(a) ∝" in page and "ρ(v)" in page
