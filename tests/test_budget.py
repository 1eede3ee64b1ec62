"""Budget "auto": the rule on hand-built curves, best-first prefixes, the cost curve, and
exactness (chi-square, greedy equality) when every round chooses its own size."""

from __future__ import annotations

import json

import pytest
import torch

from tev.bench.exactness import ALPHA, chi_square_against
from tests.test_engine import SMALL_VOCAB, exact_first_tokens_law, greedy_reference
from tests.tiny import save_pair, tiny_ar_drafter, tiny_block_drafter, tiny_target
from tev.core.budget import Calibration, RoundRate, choose_prefix
from tev.core.tree import DraftTree
from tev.engine.auto_budget import KEPT_MEMORY, MIN_DRAFTED, AutoBudget
from tev.engine.cost_curve import CostCurve, measure_forward_costs
from tev.core.sampling import as_law
from tev.engine.decode import DecodeConfig, Request, run_to_end, speculative_generate
from tev.engine.round import RoundRecord, prefill, speculation_round
from tev.engine.session import CausalLMSession
from tev.util.timing import StageTimer
from tev.engine.target import Target
from visual import timeline_figure
from visual.budget_view import budget_figure

VOCAB = 48
Q = torch.tensor([0.8, 0.5, 0.3, 0.1, 0.05])  # best-first path probabilities of a 5-node tree


# ------------------------------------------------------------------ the rule, by hand
def test_flat_cost_curve_keeps_every_node():
    # a forward costs the same at any size (a GPU): every node with a path probability adds tokens for free
    assert choose_prefix(Q, torch.ones(6), 1.0).size == 5


def test_flat_cost_curve_stops_at_the_cap():
    # the cap bounds the tree even when more nodes would pay
    assert choose_prefix(Q, torch.ones(6), 1.0, cap=3).size == 3


def test_linear_cost_curve_keeps_no_node():
    # each token costs a whole forward and no node is sure: plain decoding is best
    assert choose_prefix(Q, torch.arange(1.0, 7.0), 1.0).size == 0


def test_steep_curve_after_two_tokens_keeps_one_node():
    # the first node (0.8) pays for 1.5x; the second (0.5) cannot pay for 3x
    assert choose_prefix(Q, torch.tensor([1.0, 1.5, 3.0, 4.5, 6.0, 7.5]), 1.0).size == 1


def test_concave_curve_keeps_the_nodes_whose_path_probability_pays():
    # rates 1, 1.50, 1.77, 1.73, 1.69, 1.62: the third node (0.1) costs more than it brings
    assert choose_prefix(Q, torch.tensor([1.0, 1.2, 1.3, 1.5, 1.6, 1.7]), 1.0).size == 2


def test_a_drafter_that_underestimates_gets_a_bigger_tree():
    # calibrated path probabilities 1, 1, 0.6, 0.2, 0.1 (capped at 1): rates 1, 1.67, 2.31, 2.40, 2.38, 2.29
    assert choose_prefix(Q, torch.tensor([1.0, 1.2, 1.3, 1.5, 1.6, 1.7]), 2.0).size == 3


def test_a_drafter_that_is_never_right_gets_plain_decoding():
    # calibration 0: no node is expected to be accepted, and any tree costs more than none
    assert choose_prefix(Q, torch.tensor([1.0, 1.01, 1.02, 1.03, 1.04, 1.05]), 0.0).size == 0


def test_at_the_going_rate_a_node_that_pays_for_itself_is_kept():
    # the ratio rule keeps 2 nodes (rates 1, 1.50, 1.77, 1.73); at 1 token per unit of cost the
    # third node (path probability 0.3 for 0.2 more) pays though it lowers the round's own ratio; the
    # fourth (0.1 for 0.1) only breaks even and is left out
    assert choose_prefix(Q, torch.tensor([1.0, 1.2, 1.3, 1.5, 1.6, 1.7]), 1.0, going_rate=1.0).size == 3


def test_a_high_going_rate_keeps_only_what_beats_it():
    # past rounds made 2 tokens per unit: the first node (0.8 for 0.2, i.e. 4 per unit) pays, the second (0.5 for 0.3) does not
    assert choose_prefix(Q, torch.tensor([1.0, 1.2, 1.5, 1.8, 2.1, 2.4]), 1.0, going_rate=2.0).size == 1


def test_the_going_rate_follows_the_rounds():
    rate = RoundRate(weight=0.5)
    assert rate.rate is None  # no round yet: the rule uses the tree's own best ratio
    rate.observe(3, 1.0)
    assert rate.rate == pytest.approx(3.0)
    rate.observe(1, 1.0)  # sums 0.5 * 3 + 1 over 0.5 * 1 + 1
    assert rate.rate == pytest.approx(2.5 / 1.5)
    with pytest.raises(ValueError):
        rate.observe(0, 1.0)


def test_a_tie_goes_to_the_smaller_tree():
    # a sure node at twice the cost: 2 tokens / 2 = 1 token / 1
    assert choose_prefix(torch.tensor([1.0]), torch.tensor([1.0, 2.0]), 1.0).size == 0


def test_an_empty_tree_is_plain_decoding():
    assert choose_prefix(torch.zeros(0), torch.ones(1), 1.0).size == 0


def test_the_choice_records_what_it_was_chosen_from():
    choice = choose_prefix(Q, torch.tensor([1.0, 1.2, 1.3, 1.5, 1.6, 1.7]), 1.0)
    assert choice.expected.tolist() == pytest.approx([1.0, 1.8, 2.3, 2.6, 2.7, 2.75])
    assert choice.rate.tolist() == pytest.approx((choice.expected / choice.cost).tolist())
    assert choice.estimate == pytest.approx(1.3)
    assert json.loads(json.dumps(choice.to_dict()))["cost_seconds"] == pytest.approx(1.3)


@pytest.mark.parametrize("cost, path_prob, calibration, message", [
    (torch.ones(3), Q, 1.0, "sizes 1 .. 6"),
    (torch.tensor([1.0, 0.0]), torch.tensor([0.5]), 1.0, "positive"),
    (torch.ones(2), torch.tensor([1.5]), 1.0, r"\[0, 1\]"),
    (torch.ones(2), torch.tensor([0.5]), -1.0, "calibration"),
])
def test_bad_rule_inputs_are_refused(cost, path_prob, calibration, message):
    with pytest.raises(ValueError, match=message):
        choose_prefix(path_prob, cost, calibration)
    with pytest.raises(ValueError, match="going rate"):
        choose_prefix(Q, torch.ones(6), 1.0, going_rate=0.0)


# ------------------------------------------------------------------ best-first prefixes are trees
def test_every_prefix_of_a_ddtree_is_the_ddtree_of_that_budget():
    logq = torch.log_softmax(3 * torch.randn(5, 30, generator=torch.Generator().manual_seed(0)), dim=-1)
    tree = DraftTree.from_marginals(logq, 24)
    order = tree.best_first_order()
    assert order.tolist() == list(range(1, tree.num_nodes))  # the builder's node order is best first
    for k in range(tree.num_nodes):
        kept, built = tree.keep(order[:k].tolist()), DraftTree.from_marginals(logq, k)
        assert kept.tokens.tolist() == built.tokens.tolist() and kept.parents.tolist() == built.parents.tolist()


def test_best_first_prefixes_of_any_tree_keep_parents_first():
    # node order is not score order here (as in the AR drafter's trees): nodes 2, 4 and 5 outscore node 1
    logprob = [0.0, -2.0, -0.1, -0.3, -0.2, -0.05, -1.0]
    tree = DraftTree.from_parents([0, 5, 6, 7, 8, 9, 10], [-1, 0, 0, 1, 2, 4, 3], logprob)
    assert tree.path_logprob.tolist() == pytest.approx([0.0, -2.0, -0.1, -2.3, -0.3, -0.35, -3.3])
    order = tree.best_first_order().tolist()
    assert order == [2, 4, 5, 1, 3, 6]
    for k in range(len(order) + 1):
        kept = tree.keep(order[:k])  # validated on construction: parents precede children
        assert kept.size == k
        assert kept.draft_coverage == pytest.approx(float(tree.path_logprob[order[:k]].exp().sum()))
        assert kept.path_tokens(kept.num_nodes - 1) == tree.path_tokens(([0] + order)[k])


def test_keeping_a_node_before_its_parent_is_refused():
    tree = DraftTree.from_parents([0, 5, 6], [-1, 0, 1])
    with pytest.raises(ValueError, match="before"):
        tree.keep([2, 1])
    with pytest.raises(ValueError, match="before"):
        tree.keep([2])


# ------------------------------------------------------------------ calibration and the cost curve
def test_calibration_learns_the_drafters_bias():
    calibration = Calibration(strength=0.5)
    assert calibration.factor == 1.0  # no round yet: the prior
    for _ in range(50):
        calibration.observe(realised=1.0, estimate=2.0)  # the drafter claims twice what the target gives
    assert calibration.factor == pytest.approx(0.5, abs=0.02)


def test_rounds_without_a_tree_let_the_calibration_return_to_its_prior():
    calibration = Calibration(strength=0.5)
    for _ in range(50):
        calibration.observe(realised=0.0, estimate=2.0)  # the target never agrees
    assert calibration.factor < 0.05
    for _ in range(100):
        calibration.observe(realised=0.0, estimate=0.0)  # plain decoding: nothing learned
    assert calibration.factor > 0.9


def test_cost_curve_interpolates_the_measurement_then_follows_the_rounds():
    curve = CostCurve({1: 1.0, 5: 2.0, 9: 4.0})
    assert curve.costs(9).tolist() == pytest.approx([1.0, 1.25, 1.5, 1.75, 2.0, 2.5, 3.0, 3.5, 4.0])  # no round yet: nothing fixed
    for seconds in (3.0, 2.0, 100.0):  # a running median: one slow round does not move it
        curve.observe(5, sized_seconds=seconds, fixed_seconds=0.5)
    assert curve.drift == 1.5 and curve.fixed == 0.5
    assert curve.costs(9)[0].item() == pytest.approx(1.0 * 1.5 + 0.5)  # every size follows the drift seen at 5
    assert curve.costs(9)[8].item() == pytest.approx(4.0 * 1.5 + 0.5)
    for _ in range(4):  # rounds at another size move every size
        curve.observe(9, sized_seconds=4.0, fixed_seconds=0.5)
    assert curve.drift == 1.0


def test_a_frozen_cost_curve_ignores_the_rounds():
    curve = CostCurve({1: 1.0, 9: 2.0}, frozen=True)
    curve.observe(5, sized_seconds=30.0, fixed_seconds=5.0)
    assert curve.costs(9).tolist() == pytest.approx([1.0 + n / 8 for n in range(9)])


def test_one_unlucky_round_does_not_halve_the_default_calibration():
    calibration = Calibration()
    calibration.observe(realised=0.0, estimate=0.8)  # a confident tree the target refused
    assert calibration.factor > 0.7


def test_a_size_the_machine_runs_faster_keeps_its_measured_cost():
    # measured: 2 or 3 new tokens cost more than 4 (matrix kernels blocked by row count)
    curve = CostCurve({1: 1.0, 2: 1.6, 3: 1.7, 4: 1.45, 5: 1.5})
    assert curve.costs(5).tolist() == pytest.approx([1.0, 1.6, 1.7, 1.45, 1.5])
    # so a tree of 3 nodes is chosen over one of 1 or 2 whenever any tree pays
    assert choose_prefix(torch.tensor([0.5, 0.3, 0.2, 0.01]), curve.costs(5), 1.0).size == 3


def test_forward_costs_are_measured_for_the_sizes_that_fit():
    target = tiny_target(VOCAB, context=40)
    measured = measure_forward_costs(Target(target), sizes=(1, 3, 17, 33), passes=1)
    assert set(measured) == {1, 3, 17, 33} and all(t > 0 for t in measured.values())


# ------------------------------------------------------------------ the choice never reads the round's rows
CURVE = {n: 1.0 + 0.08 * (n - 1) for n in (1, 2, 3, 5, 9, 17, 33)}  # each node costs 8% of a step
STEP = {1: 1.0, 9: 1.01, 17: 2.0, 33: 4.0}  # eight nodes almost free, then each costs an eighth of a step


def test_the_choice_never_reads_the_rounds_target_rows(monkeypatch):
    target = tiny_target(VOCAB, scale=2.0)
    drafter = tiny_block_drafter(target)
    prompt = [3, 9, 27, 4, 11]
    original = CausalLMSession.forward_tree
    noise = {"scale": 0.0}

    def perturbed(self, tree):
        out = original(self, tree)
        generator = torch.Generator().manual_seed(7)
        if out.hidden is not None:  # the lazy head projects these rows later
            out.hidden = out.hidden + noise["scale"] * torch.randn(out.hidden.shape, generator=generator)
        else:
            out._logits = out._logits + noise["scale"] * torch.randn(out._logits.shape, generator=generator)
        return out

    monkeypatch.setattr(CausalLMSession, "forward_tree", perturbed)
    chosen, verdicts = [], []
    for scale in (0.0, 3.0, 30.0):
        noise["scale"] = scale
        session = CausalLMSession(Target(target), feature_layers=drafter.feature_layers)
        state = drafter.new_state()
        prefill(session, prompt, state)
        sizing = AutoBudget(CostCurve(STEP, frozen=True), cap=16)
        step = speculation_round(session, drafter, prompt, 0, "tev", as_law(1.0), torch.Generator().manual_seed(0), state, StageTimer(), sizing)
        chosen.append((step.choice.size, step.tree.tokens.tolist(), step.tree.parents.tolist()))
        verdicts.append((tuple(step.verdict.path), step.verdict.bonus_token, round(step.flow.coverage, 4)))
    assert 0 < chosen[0][0] < 16  # an interior choice: the rule had something to decide
    assert chosen[0] == chosen[1] == chosen[2]  # same size, same tree, whatever the rows
    assert len(set(verdicts)) > 1  # while the perturbed rows did change the round


# ------------------------------------------------------------------ exactness at auto
@pytest.fixture(scope="module")
def small_target():
    torch.manual_seed(0)
    return tiny_target(SMALL_VOCAB, scale=0.5, eos_token_id=SMALL_VOCAB + 7)  # eos outside the vocab: never stops early


@pytest.mark.parametrize("verifier", ["tev", "predraw", "sequential"])
def test_sampling_at_auto_is_lossless(small_target, verifier):
    prompt = [1, 2, 0]
    law = exact_first_tokens_law(small_target, prompt)
    drafter = tiny_block_drafter(small_target)
    # one rule across all draws, so each generation's sizes depend on the rounds before it: a
    # prior of 3 keeps 4 nodes (0.75 calibrated path probability each pays for 2.4x), the learned ~1.3 keeps none,
    # and the plain-decoding rounds decay back towards the prior
    calibration = Calibration(prior=3.0, strength=0.3, weight=0.3)
    sizing = AutoBudget(CostCurve({1: 1.0, 2: 1.4, 5: 2.4, 7: 2.8}, frozen=True), cap=6, calibration=calibration)
    samples, sizes = [], []
    for seed in range(2500):
        config = DecodeConfig(budget="auto", budget_cap=6, temperature=1.0, verifier=verifier, max_new_tokens=3, seed=seed, stop_at_eos=False)
        records, summary = run_to_end(speculative_generate(Request(Target(small_target), drafter, prompt, config), sizing=sizing))
        sizes += summary.tree_sizes
        samples.append(tuple(summary.token_ids))
    assert min(sizes.count(0), sizes.count(4)) > len(sizes) / 10, "the rule must often choose both plain decoding and a tree here"
    statistic, p_value, dof = chi_square_against(law, samples)
    print(f"{verifier} at auto: sizes {dict(sorted((k, sizes.count(k)) for k in set(sizes)))} chi2={statistic:.1f} dof={dof} p={p_value:.3f}")
    assert p_value > ALPHA


@pytest.mark.parametrize("kind", ["block", "ar", "path"])
def test_greedy_speculation_at_auto_equals_greedy_decoding(kind):
    target = tiny_target(VOCAB, scale=3.0)
    drafter = {"block": lambda: tiny_block_drafter(target), "ar": lambda: tiny_ar_drafter(VOCAB), "path": lambda: tiny_block_drafter(target, conditioning="path")}[kind]()
    sizes = set()
    for seed, curve in enumerate((STEP, CURVE, {1: 1.0, 2: 1.6, 3: 3.0, 33: 40.0}, None)):  # None: this machine's measured curve
        prompt = torch.randint(1, VOCAB, (5 + seed,), generator=torch.Generator().manual_seed(seed)).tolist()
        reference = greedy_reference(Target(target), prompt, 40, eos=False)
        config = DecodeConfig(budget="auto", budget_cap=16, temperature=0.0, max_new_tokens=40, stop_at_eos=False)
        sizing = AutoBudget(CostCurve(curve, frozen=True), cap=16) if curve else None
        records, summary = run_to_end(speculative_generate(Request(Target(target), drafter, prompt, config), sizing=sizing))
        assert summary.token_ids == reference.token_ids, (kind, seed)
        assert all(r.choice is not None and r.tree.size == r.choice.size for r in records)
        sizes |= set(summary.tree_sizes)
    assert len(sizes) > 1


def test_a_seeded_run_on_a_frozen_curve_repeats_exactly():
    target = tiny_target(VOCAB, scale=2.0)
    drafter = tiny_block_drafter(target)
    config = DecodeConfig(budget="auto", budget_cap=16, temperature=1.0, max_new_tokens=20, seed=5, stop_at_eos=False)
    runs = [run_to_end(speculative_generate(Request(Target(target), drafter, [3, 9, 27], config), sizing=AutoBudget(CostCurve(STEP, frozen=True), cap=16)))[1] for _ in range(2)]
    assert runs[0].token_ids == runs[1].token_ids and runs[0].tree_sizes == runs[1].tree_sizes


def test_an_auto_budget_needs_budget_auto():
    target = tiny_target(VOCAB)
    with pytest.raises(ValueError, match="auto"):
        run_to_end(speculative_generate(Request(Target(target), tiny_block_drafter(target), [1, 2], DecodeConfig(budget=4)), sizing=AutoBudget(CostCurve(CURVE))))
    with pytest.raises(ValueError, match="auto"):
        DecodeConfig(budget="big")
    with pytest.raises(ValueError, match="budget_cap"):
        DecodeConfig(budget="auto", budget_cap=0)


# ------------------------------------------------------------------ the record, the JSON, the figure
def test_generate_command_line_at_auto_records_each_choice(tmp_path, capsys):
    from tev.cli import main

    paths = save_pair(tmp_path)
    code = main(["generate", "--prompt", "def add(a, b):", "--target", str(paths["target"]), "--draft", str(paths["block"]),
                 "--budget", "auto", "--budget-cap", "8", "--temperature", "1", "--max-new-tokens", "10", "--seed", "3", "--json"])
    assert code == 0
    payload = json.loads(capsys.readouterr().out)
    for r in payload["rounds_detail"]:
        choice = r["auto_budget"]
        assert choice["size"] == r["budget"] <= choice["cap"] == 8
        assert choice["estimate"] == pytest.approx(r["draft_coverage"], abs=1e-5)
        assert len(choice["rate_by_size"]) == len(choice["cost_seconds_by_size"]) and choice["cost_seconds"] > 0
    assert payload["tree_sizes"] == [r["budget"] for r in payload["rounds_detail"]]
    with pytest.raises(SystemExit) as refused:
        main(["generate", "--prompt", "x", "--target", str(paths["target"]), "--budget", "many"])
    assert refused.value.code == 2 and "'auto'" in capsys.readouterr().err


def test_budget_figure_reads_the_rounds_choice():
    target = tiny_target(VOCAB, scale=2.0)
    config = DecodeConfig(budget="auto", budget_cap=16, temperature=1.0, max_new_tokens=12, stop_at_eos=False)
    records, _ = run_to_end(speculative_generate(Request(Target(target), tiny_block_drafter(target), [3, 9, 27], config), sizing=AutoBudget(CostCurve(CURVE, frozen=True), cap=16)))
    record = records[-1]
    fig = budget_figure(record)
    line, going, chosen = fig.data
    assert list(line.y) == pytest.approx(record.choice.rate.tolist())
    assert list(going.y) == pytest.approx([record.choice.going_rate] * 2)
    assert list(chosen.x) == [record.choice.size] == [record.tree.size]
    sized = [t for t in timeline_figure(records).data if t.name == "tree size k (auto)"]
    assert len(sized) == 1 and list(sized[0].y) == [r.tree.size for r in records]  # the rounds chart shows each round's choice
    fixed = RoundRecord(**{**record.__dict__, "choice": None})
    assert "tree size k (auto)" not in [t.name for t in timeline_figure([fixed]).data]
    with pytest.raises(ValueError, match="fixed budget"):
        budget_figure(fixed)


def test_bench_e2e_interleaves_auto_with_each_fixed_budget(tmp_path):
    from tev.bench.e2e import bench_e2e, format_auto_table
    from tev.engine.models import load_bundle

    paths = save_pair(tmp_path)
    bundle = load_bundle(paths["target"], paths["block"], device="cpu")
    prompts = [{"ids": [1, 5, 9, 13]}, {"ids": [2, 4, 8, 16, 3]}]
    result = bench_e2e(bundle, prompts, budgets=("auto", 2, 4), temperatures=(0.0,), methods=(("block", "tev"),), max_new_tokens=6, peers=(), progress=False)
    rows = {(r["budget"], r["method"]): r for r in result["rows"]}
    assert rows[("auto", "block+greedy")]["runs"] == rows[(2, "block+greedy")]["runs"] == 2
    assert rows[("auto", "autoregressive")]["tokens_per_second"] == rows[(4, "autoregressive")]["tokens_per_second"]  # one baseline run per prompt serves every budget
    compared = {r["budget"]: r for r in result["auto_vs_fixed"]}
    assert set(compared) == {2, 4} and all(r["method"] == "block+greedy" and r["median_ratio"] > 0 for r in compared.values())
    assert "B = 4" in format_auto_table(result)


def test_bench_e2e_runs_each_method_in_each_forward_beside_both_generate_peers(tmp_path):
    from tev.bench.e2e import bench_e2e, format_e2e_table
    from tev.engine.models import load_bundle

    paths = save_pair(tmp_path)
    bundle = load_bundle(paths["target"], paths["block"], device="cpu")
    chosen = bundle.runner.precision
    prompts = [{"ids": [1, 5, 9, 13]}, {"ids": [2, 4, 8, 16, 3]}]
    result = bench_e2e(bundle, prompts, budgets=("auto",), temperatures=(0.0,), methods=(("block", "tev"),), max_new_tokens=6,
                       peers=("hf-generate", "hf-generate-bf16"), forwards=("transformers", "float32"), progress=False)
    rows = {r["method"]: r for r in result["rows"]}
    assert set(rows) == {"autoregressive@transformers", "autoregressive@float32", "hf-generate", "hf-generate-bf16",
                         "block+greedy@transformers", "block+greedy@float32"}
    # greedy: the same tokens in every forward, and each speculative row is over its own forward's loop
    assert all(r["runs"] == 2 for r in rows.values()) and rows["block+greedy@float32"]["speedup_vs_hf_bf16"] > 0
    assert result["forwards"] == ["transformers", "float32"] and bundle.runner.precision is chosen  # the choice comes back
    assert "vs HF generate bf16" in format_e2e_table(result)


def test_bench_e2e_methods_flag_names_drafter_and_verifier():
    from tev.bench.e2e import parse_methods

    assert parse_methods(["block+tev", "chain+tev"]) == (("block", "tev"), ("chain", "tev"))
    with pytest.raises(SystemExit, match="unknown method block\\+sequential: choose from chain\\+tev, block\\+predraw, block\\+tev"):
        parse_methods(["block+sequential"])


def test_bench_e2e_runs_a_drafter_from_a_folder_beside_the_pairs_interleaved(tmp_path):
    """``--folder NAME=FOLDER`` adds a saved drafter as method ``NAME+tev``, run on the same prompts
    and seeds as the others; a name the bundle already has is refused before anything runs."""
    import argparse
    import json

    from tev.bench import e2e

    paths = save_pair(tmp_path)
    parser = argparse.ArgumentParser()
    e2e.add_arguments(parser)
    common = ["--target", str(paths["target"]), "--draft", str(paths["block"]), "--device", "cpu", "--methods", "block+tev", "--budgets", "2",
              "--temperatures", "0", "--num-prompts", "3", "--max-new-tokens", "4", "--peers", "hf-generate", "--skip-memory"]
    e2e.run(parser.parse_args(common + ["--folder", f"again={paths['block']}", "--json", str(tmp_path / "e2e.json")]))
    result = json.loads((tmp_path / "e2e.json").read_text())
    rows = {r["method"]: r for r in result["rows"]}
    assert {"block+greedy", "again+greedy"} <= set(rows) and rows["again+greedy"]["runs"] == rows["block+greedy"]["runs"] == 3
    assert rows["again+greedy"]["tau"] == rows["block+greedy"]["tau"]  # the same drafter, greedy: the same rounds
    # and it is compared with the pair's drafter of its kind prompt by prompt, from the runs each row keeps
    paired, = result["drafters_paired"]
    mine, theirs = rows["again+greedy"]["tokens_per_second_by_run"], rows["block+greedy"]["tokens_per_second_by_run"]
    ratios = sorted(a / b for a, b in zip(mine, theirs))
    assert (paired["method"], paired["against"], paired["runs"]) == ("again+greedy", "block+greedy", 3)
    assert paired["median_ratio"] == pytest.approx(ratios[1]) and paired["wins"] == sum(r > 1 for r in ratios)
    with pytest.raises(SystemExit, match="'block' already names"):
        e2e.run(parser.parse_args(common + ["--folder", f"block={paths['block']}"]))
    with pytest.raises(SystemExit, match="NAME=FOLDER"):
        e2e.run(parser.parse_args(common + ["--folder", str(paths["block"])]))


def test_auto_drafts_twice_the_largest_recent_kept_tree_and_grows_when_a_round_keeps_all():
    target = tiny_target(VOCAB, scale=2.0)
    drafter = tiny_block_drafter(target)
    drafted = []
    propose = drafter.propose
    drafter.propose = lambda context, budget, state, timer=None: drafted.append(budget) or propose(context, budget, state, timer)
    config = DecodeConfig(budget="auto", budget_cap=32, temperature=1.0, max_new_tokens=40, seed=3, stop_at_eos=False)
    sizing = AutoBudget(CostCurve(STEP, frozen=True), cap=32)
    records, summary = run_to_end(speculative_generate(Request(Target(target), drafter, [3, 9, 27], config), sizing=sizing))
    kept = summary.tree_sizes
    assert drafted[0] == 32  # nothing kept yet: the cap
    expected = [min(32, max(MIN_DRAFTED, 2 * max(kept[max(0, i - KEPT_MEMORY):i]))) for i in range(1, len(kept))]
    assert drafted[1:] == expected
    assert all(size <= budget for size, budget in zip(kept, drafted))
    assert min(drafted) < 32  # the rule kept small trees here, so later rounds drafted fewer nodes


def test_auto_gives_the_drafter_half_the_least_probable_kept_nodes_path_probability_as_its_floor():
    target = tiny_target(VOCAB, scale=2.0)
    drafter = tiny_block_drafter(target, conditioning="path")
    floors = []
    propose = drafter.propose
    drafter.propose = lambda context, budget, state, timer=None: floors.append(context.min_path_prob) or propose(context, budget, state, timer)
    config = DecodeConfig(budget="auto", budget_cap=16, temperature=1.0, max_new_tokens=40, seed=3, stop_at_eos=False)
    records, _ = run_to_end(speculative_generate(Request(Target(target), drafter, [3, 9, 27], config), sizing=AutoBudget(CostCurve(STEP, frozen=True), cap=16)))
    least = [float(r.tree.path_logprob[1:].exp().min()) if r.tree.num_nodes > 1 else None for r in records]
    assert floors[0] == 0.0  # nothing kept yet
    for i in range(1, len(records)):
        recent = [x for x in least[max(0, i - KEPT_MEMORY):i] if x is not None]
        assert floors[i] == pytest.approx(0.5 * min(recent) if recent else 0.0)
    assert max(floors) > 0
