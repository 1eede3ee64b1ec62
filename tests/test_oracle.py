"""The oracle tree (the target drafting for itself): at T = 0 it is the greedy path; at T > 0 its coverage is
its nodes' reach as the engine's flow computes it, it grows with the budget, and no other tree of as many nodes
covers more. ``p`` is the target."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from tests.helpers import random_tree
from tests.tiny import tiny_target
from tev.core.sampling import SamplingLaw
from tev.core.tree import DraftTree
from tev.engine.decode import DecodeConfig, autoregressive_generate
from tev.engine.oracle_tree import oracle_tree, target_row
from tev.engine.session import CausalLMSession
from tev.engine.target import Target

VOCAB = 40
CONTEXT = [3, 17, 5, 9]


@pytest.fixture(scope="module")
def target():
    return tiny_target(VOCAB, scale=3.0)


def _session(target, context: list[int]) -> CausalLMSession:
    session = CausalLMSession(Target(target))
    session.extend(context[:-1])
    return session


def _coverage(target, context: list[int], tree, law: SamplingLaw) -> float:
    """C(T) of ``tree`` under ``context[-1]`` from the target's one forward over it (the engine's flow)."""
    session = _session(target, context)
    return session.forward_tree(tree).rows(law).flow(tree).coverage


def test_at_t0_the_oracle_tree_is_the_greedy_path(target):
    greedy = autoregressive_generate(Target(target), CONTEXT, DecodeConfig(temperature=0.0, max_new_tokens=5, stop_at_eos=False)).token_ids
    session = _session(target, CONTEXT)
    tree = oracle_tree(session, CONTEXT, SamplingLaw(0.0), budget=8, horizon=5)
    assert tree.parents.tolist() == [-1, 0, 1, 2, 3, 4]  # a chain: every sibling has reach 0 under the argmax law
    assert tree.tokens.tolist()[1:] == greedy[:5]
    assert session.length == len(CONTEXT) - 1  # the cache is left as it was given
    assert _coverage(target, CONTEXT, tree, SamplingLaw(0.0)) == pytest.approx(5.0)


@pytest.mark.parametrize("law", [SamplingLaw(1.0), SamplingLaw(0.7, top_p=0.9)], ids=["T=1", "T=0.7 top-p 0.9"])
def test_the_oracle_covers_what_its_reach_says_and_no_tree_of_its_size_covers_more(target, law):
    tree = oracle_tree(_session(target, CONTEXT), CONTEXT, law, budget=12, horizon=4)
    reach = tree.path_logprob.exp()  # P(v) of each node, as the oracle grew it
    assert tree.num_nodes == 13 and int(tree.depths.max()) <= 4
    assert _coverage(target, CONTEXT, tree, law) == pytest.approx(float(reach[1:].sum()), rel=1e-4)
    prefix = reach[1:].cumsum(0)  # each prefix of k nodes is the oracle tree of budget k: coverage grows with k
    assert bool((prefix[1:] >= prefix[:-1]).all()) and bool((reach[1:-1] >= reach[2:] - 1e-7).all())  # added best first
    root_row = target_row(_session(target, CONTEXT), len(CONTEXT) - 1, [CONTEXT[-1]], law)
    fan = DraftTree.from_parents([CONTEXT[-1], *root_row.topk(12).indices.tolist()], [-1] + [0] * 12)  # the root's 12 likeliest tokens
    path = []
    for _ in range(4):  # the likeliest token at each depth along its own path: the top-1 chain
        path.append(int(target_row(_session(target, CONTEXT), len(CONTEXT) - 1, [CONTEXT[-1], *path], law).argmax()))
    chain = DraftTree.chain(CONTEXT[-1], path)
    generator = torch.Generator().manual_seed(0)
    others = [fan, chain] + [random_tree(generator, VOCAB, budget=12, horizon=4, root_token=CONTEXT[-1]) for _ in range(20)]
    for other in others:  # every one of the same size or smaller, depth limit and root
        assert _coverage(target, CONTEXT, other, law) <= float(prefix[other.num_nodes - 2]) + 1e-5


def test_the_bench_scores_each_drafters_tree_under_the_oracles_bound(target):
    """``bench oracle-reach`` on a tiny pair: at every anchor and budget a drafter's tree covers no more than the
    oracle's, the oracle's reach by depth adds up to its coverage, and the report says the drafter's share."""
    from types import SimpleNamespace

    from tests.tiny import tiny_block_drafter
    from tev.bench.oracle_reach import _summary, anchor_coverages, format_oracle_report

    drafters = {"path": tiny_block_drafter(target, conditioning="path"), "block": tiny_block_drafter(target)}
    law = SamplingLaw(1.0)
    answer = autoregressive_generate(Target(target), CONTEXT, DecodeConfig(temperature=1.0, max_new_tokens=8, seed=3, stop_at_eos=False)).token_ids
    rows = anchor_coverages(SimpleNamespace(runner=Target(target)), drafters, CONTEXT, answer, [0, 3, 6], law, [2, 6], horizon=4)
    assert [row["anchor"] for row in rows] == [0, 3, 6]
    for row in rows:
        assert sum(row["oracle_reach_by_depth"]) == pytest.approx(row["oracle"]["6"], rel=1e-5)
        for name in drafters:
            for budget in ("2", "6"):
                assert 0 <= row["drafters"][name][budget] <= row["oracle"][budget] + 1e-5, (name, budget, row)
    summary = _summary(rows, [2, 6])
    assert 0 < summary["drafters"]["path"]["share_of_oracle"]["6"] <= 1 + 1e-6
    text = format_oracle_report({"budgets": [2, 6], "horizon": 4, "laws": {"T = 1": {"summary": summary}}})
    assert "| T = 1 | 3 | oracle |" in text and "| T = 1 | | path |" in text


def test_paired_coverage_scores_both_drafters_on_the_same_anchors_without_the_oracle(target):
    """``bench adapted-coverage`` reads each drafter's coverage at the same anchors as ``bench oracle-reach`` (the
    oracle left out), pairs them per anchor and gives the change, its error over prompts and the prompts won."""
    from types import SimpleNamespace

    from tests.tiny import tiny_block_drafter
    from tev.bench.adapted_coverage import _law_summary, format_paired_coverage, rounds_on_text
    from tev.bench.oracle_reach import anchor_coverages

    drafters = {"base": tiny_block_drafter(target), "adapted": tiny_block_drafter(target, conditioning="path")}
    law, bundle = SamplingLaw(0.7, top_p=0.9), SimpleNamespace(runner=Target(target))
    per_prompt = []
    for seed in (1, 2, 3):
        answer = autoregressive_generate(Target(target), CONTEXT, DecodeConfig(temperature=0.7, top_p=0.9, max_new_tokens=8, seed=seed, stop_at_eos=False)).token_ids
        alone = anchor_coverages(bundle, drafters, CONTEXT, answer, [0, 2, 4], law, [4], horizon=4, with_oracle=False)
        beside = anchor_coverages(bundle, drafters, CONTEXT, answer, [0, 2, 4], law, [4], horizon=4)
        assert all("oracle" not in row for row in alone) and [row["drafters"] for row in alone] == [row["drafters"] for row in beside]
        per_prompt.append({"answer_tokens": 8, "pairs": [(row["drafters"]["base"]["4"], row["drafters"]["adapted"]["4"]) for row in alone],
                           "rounds": [rounds_on_text([row["matched"][name]["4"] for row in alone]) for name in ("base", "adapted")]})
    summary = _law_summary(per_prompt)
    pairs = [pair for row in per_prompt for pair in row["pairs"]]
    base, adapted = 1 + sum(p[0] for p in pairs) / len(pairs), 1 + sum(p[1] for p in pairs) / len(pairs)
    assert summary["anchors"] == 9 and summary["prompts"] == 3 and summary["mean_1_plus_c"]["gain"] == pytest.approx(adapted / base - 1)
    rounds = [sum(row["rounds"][i] for row in per_prompt) for i in (0, 1)]
    assert summary["tau"]["gain"] == pytest.approx(rounds[0] / rounds[1] - 1)
    itself = _law_summary([{**row, "pairs": [(b, b) for b, _ in row["pairs"]], "rounds": [row["rounds"][0]] * 2} for row in per_prompt])
    assert itself["tau"]["gain"] == 0 and itself["tau"]["se"] == 0 and itself["prompts_won"] == 0
    text = format_paired_coverage({"budget": 4, "max_new_tokens": 8, "prompts": 3, "laws": {"T = 0.7, top-p 0.9": {"summary": summary}}})
    assert "| T = 0.7, top-p 0.9 |" in text


def test_the_rounds_counted_on_a_text_are_the_rounds_speculation_takes_to_emit_it(target):
    """At T = 0 the tokens a tree accepts along the greedy answer are its coverage there, and walking the answer block by
    block (``rounds_on_text``) gives the rounds greedy speculation takes; at T = 1 the same walk over a sampled text
    gives, on average over texts, the tokens per round that TEV's decoding reaches."""
    from types import SimpleNamespace

    from tests.tiny import tiny_block_drafter
    from tev.bench.adapted_coverage import rounds_on_text
    from tev.bench.oracle_reach import anchor_coverages, matched_depth
    from tev.engine.decode import Request, run_to_end, speculative_generate

    assert rounds_on_text([2, 0, 0, 1, 0]) == 2 and rounds_on_text([0, 0, 0]) == 3 and rounds_on_text([]) == 0
    tree = DraftTree(tokens=[0, 5, 6, 7], parents=[-1, 0, 1, 0], depths=[0, 1, 2, 1], draft_logprob=[0.0, -1.0, -1.0, -1.0])
    assert matched_depth(tree, [5, 6, 9]) == 2 and matched_depth(tree, [7, 5]) == 1 and matched_depth(tree, [8]) == 0
    drafter, bundle = tiny_block_drafter(target, conditioning="path"), SimpleNamespace(runner=Target(target))
    config = DecodeConfig(budget=6, temperature=0.0, max_new_tokens=12, stop_at_eos=False)
    answer = autoregressive_generate(Target(target), CONTEXT, config).token_ids
    rows = anchor_coverages(bundle, {"d": drafter}, CONTEXT, answer, list(range(len(answer))), SamplingLaw(0.0), [6], horizon=4, with_oracle=False)
    assert [row["matched"]["d"]["6"] for row in rows] == [round(row["drafters"]["d"]["6"]) for row in rows]
    records, summary = run_to_end(speculative_generate(Request(Target(target), drafter, CONTEXT, config)))
    assert summary.token_ids == answer and rounds_on_text([row["matched"]["d"]["6"] for row in rows]) == len(records)
    # T = 1: rounds on the target's own samples against TEV decoding's, over 80 seeds each
    sampled = DecodeConfig(budget=6, temperature=1.0, max_new_tokens=10, stop_at_eos=False)
    on_text = decoded = 0
    for seed in range(80):
        text = autoregressive_generate(Target(target), CONTEXT, dataclasses.replace(sampled, seed=1000 + seed)).token_ids
        walked = anchor_coverages(bundle, {"d": drafter}, CONTEXT, text, list(range(len(text))), SamplingLaw(1.0), [6], horizon=4, with_oracle=False)
        on_text += rounds_on_text([row["matched"]["d"]["6"] for row in walked])
        decoded += len(run_to_end(speculative_generate(Request(Target(target), drafter, CONTEXT, dataclasses.replace(sampled, seed=seed))))[0])
    assert on_text < 80 * 10 and abs(on_text - decoded) <= 0.1 * decoded, (on_text, decoded)  # fewer rounds than tokens: trees accept
