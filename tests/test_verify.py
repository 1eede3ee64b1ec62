"""Exactness of the tree verifiers: hand-built cases, the exact target law, the exit law."""

import functools
import math
from collections import Counter

import pytest
import torch

import tev.core.sampling as sampling
from tev.bench.report.exit_law import edge_error_units, reference_limit
from tev.core.flow import target_flow
from tev.core.tree import DraftTree
from tev.core.sampling import sample_rows
from tev.core.verify import SAMPLING_VERIFIERS, VERIFIERS, LogitRows, verify
from tev.engine.session import MIN_TRANSFORMERS, check_transformers
from tev.core.sampling import SamplingLaw
from tev.bench.exactness import ALPHA, chi_square_against, draws_for_power, exact_block_law
from tests.helpers import random_tree, truncated_law



def case_horizon_and_zero_children():
    """Random tree with horizon leaves (depth 3 = K) and children of zero target probability."""
    generator = torch.Generator().manual_seed(11)
    tree = random_tree(generator, vocab=4, budget=12, horizon=3, root_token=1)
    probs = torch.softmax(1.5 * torch.randn(tree.num_nodes, 4, generator=generator, dtype=torch.float64), dim=-1)
    for v in range(1, tree.num_nodes, 3):  # zero out some child tokens in their parent's row
        probs[tree.parents[v], tree.tokens[v]] = 0.0
    return tree, probs / probs.sum(1, keepdim=True)


def case_children_cover_all_mass():
    """The root's children carry all of p_root (rho(root) = 0); one inner row is one-hot."""
    tree = DraftTree.from_paths(0, [[0, 0], [0, 2, 1], [1], [2, 2]])
    probs = torch.tensor(
        [
            [0.5, 0.3, 0.2],  # root: children 0, 1, 2 cover everything
            [0.3, 0.2, 0.5],
            [0.2, 0.2, 0.6],
            [1 / 3, 1 / 3, 1 / 3],
            [0.0, 0.0, 1.0],  # one-hot onto its own child token 2
            [0.1, 0.1, 0.8],
            [0.6, 0.3, 0.1],
            [0.4, 0.4, 0.2],
        ],
        dtype=torch.float64,
    )
    assert probs.shape[0] == tree.num_nodes
    return tree, probs


def case_bushy():
    """A wider random tree over 5 tokens with peaked rows (long accepted paths)."""
    generator = torch.Generator().manual_seed(23)
    tree = random_tree(generator, vocab=4, budget=14, horizon=4, root_token=3)
    probs = torch.softmax(3.0 * torch.randn(tree.num_nodes, 4, generator=generator, dtype=torch.float64), dim=-1)
    return tree, probs


CASES = {"horizon_and_zero_children": case_horizon_and_zero_children, "cover_all": case_children_cover_all_mass, "bushy": case_bushy}


def draw_blocks(name, tree, probs, n, seed):
    generator = torch.Generator().manual_seed(seed)
    return [verify(name, tree, probs, generator, validate=False) for _ in range(n)]


@functools.cache
def sampled(name: str, case: str) -> tuple[DraftTree, torch.Tensor, dict, list]:
    """(tree, probs, exact block law, verdicts) of one sampler on one case, drawn once for the two
    tests below: enough draws that moving 1 point of mass between the two largest cells of the
    block law fails (power >= 0.9), which is more than the exit-law test needs (20,000)."""
    tree, probs = CASES[case]()
    law = exact_block_law(tree, probs)
    verdicts = draw_blocks(name, tree, probs, draws_for_power(law), seed=SAMPLING_VERIFIERS.index(name) * 100 + list(CASES).index(case))
    return tree, probs, law, verdicts


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("name", SAMPLING_VERIFIERS)
def test_output_block_matches_exact_target_law(name, case):
    tree, probs, law, verdicts = sampled(name, case)
    assert sum(law.values()) == pytest.approx(1.0)
    draws = len(verdicts)
    statistic, p_value, dof = chi_square_against(law, [tuple(v.block_tokens(tree)) for v in verdicts])
    print(f"{name} on {case}: draws={draws} chi2={statistic:.1f} dof={dof} p={p_value:.3f}")
    assert p_value > ALPHA, f"{name} on {case}: chi2={statistic:.1f}, dof={dof}, p={p_value:.2e}"


TRUNCATIONS = {
    "top_k": SamplingLaw(0.8, top_k=3),
    "top_p": SamplingLaw(0.7, top_p=0.8),
    "all_three": SamplingLaw(1.3, top_k=5, top_p=0.9, min_p=0.1),
}


def truncation_case(law: SamplingLaw):
    """A bushy tree over 6 tokens with logits whose truncation removes some child tokens."""
    generator = torch.Generator().manual_seed(31)
    tree = random_tree(generator, vocab=6, budget=12, horizon=3, root_token=2)
    logits = 2.0 * torch.randn(tree.num_nodes, 6, generator=generator)
    return tree, logits, truncated_law(logits, law.temperature, law.top_k, law.top_p, law.min_p)


@pytest.mark.parametrize("truncation", TRUNCATIONS)
@pytest.mark.parametrize("name", SAMPLING_VERIFIERS)
def test_verifiers_are_exact_for_the_truncated_law(name, truncation):
    # top-k / top-p / min-p are applied to the logits inside the verifier; the reference law is
    # truncated independently in float64. A removed token is never drawn (chi_square_against fails on one).
    law = TRUNCATIONS[truncation]
    tree, logits, reference = truncation_case(law)
    assert (reference == 0).any(), "the case must truncate something"
    rows = LogitRows(logits, law=law)
    assert torch.allclose(rows.all_rows().double(), reference, atol=1e-6)
    block_law = exact_block_law(tree, reference)
    draws = 40_000
    generator = torch.Generator().manual_seed(5 + SAMPLING_VERIFIERS.index(name))
    verdicts = [verify(name, tree, logits=logits, law=law, generator=generator) for _ in range(draws)]
    statistic, p_value, dof = chi_square_against(block_law, [tuple(v.block_tokens(tree)) for v in verdicts])
    print(f"{name} under {law.describe()}: draws={draws} chi2={statistic:.1f} dof={dof} p={p_value:.3f}")
    assert p_value > ALPHA
    lengths = torch.tensor([v.block_length for v in verdicts], dtype=torch.float64)
    tau_bound = target_flow(tree, reference).tau_bound
    assert abs(lengths.mean().item() - tau_bound) < 4 * lengths.std().item() / math.sqrt(draws)


def test_the_truncation_matches_hugging_face_warpers_on_large_rows():
    from transformers.generation.logits_process import MinPLogitsWarper, TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    generator = torch.Generator().manual_seed(3)
    for trial in range(12):
        logits = torch.randn(4, 5000, generator=generator) * (1 + trial % 4) * 2
        law = SamplingLaw(0.5 + 0.1 * trial, top_k=(0, 40, 1000)[trial % 3], top_p=(0.5, 0.9, 0.99, 1.0)[trial % 4], min_p=(0.0, 0.05)[trial % 2])
        expected = TemperatureLogitsWarper(law.temperature)(None, logits.clone())
        for warper, on in ((TopKLogitsWarper(max(law.top_k, 1)), law.top_k), (TopPLogitsWarper(law.top_p), law.top_p < 1), (MinPLogitsWarper(max(law.min_p, 1e-9)), law.min_p)):
            expected = warper(None, expected) if on else expected
        assert torch.equal(torch.isinf(law.warp(logits)), torch.isinf(expected)), law.describe()
    # the cut is looked for among the 256 largest entries first; rows whose cut lies beyond them
    # are sorted whole: a flat row (every entry ties at the cut), a peaked one, a slow ramp
    rows = torch.zeros(3, 3000)
    rows[1, :10] = 8.0
    rows[2] = -1e-3 * torch.arange(3000.0)
    kept = torch.isfinite(SamplingLaw(1.0, top_p=0.5).warp(rows)).sum(dim=-1).tolist()
    reference = (truncated_law(rows, 1.0, top_p=0.5) > 0).sum(dim=-1).tolist()
    assert kept == reference and reference[0] == 3000 and reference[1] == 10 and 256 < reference[2] < 3000


def test_a_law_cut_read_at_a_few_tokens_gives_the_law_s_own_numbers():
    """A tree's parent rows are kept as a LawCut (top-p's mask over the vocabulary left undone): read at
    tokens, or whole, it gives bit for bit what SamplingLaw.log_probs gives, for rows cut inside the top
    256 (deferred) and beyond it (sorted whole), and for top-k and min-p beside top-p."""
    generator = torch.Generator().manual_seed(5)
    peaked = torch.randn(5, 4000, generator=generator) * 6  # their 0.9 lies in the largest 256 entries
    flat = torch.randn(2, 4000, generator=generator) * 0.1  # theirs beyond
    laws = (SamplingLaw(0.7, top_p=0.9), SamplingLaw(1.0, top_k=50, top_p=0.8), SamplingLaw(1.2, top_p=0.95, min_p=0.02), SamplingLaw(0.9, top_k=7))
    for law in laws:
        for logits in (peaked, flat, torch.cat([peaked, flat])):
            cut, expected = law.cut(logits), law.log_probs(logits)
            rows = torch.arange(logits.shape[0]).repeat_interleave(30)
            tokens = torch.cat([torch.cat([expected[r].topk(20).indices, torch.randint(0, 4000, (10,), generator=generator)])
                                for r in range(logits.shape[0])])  # each row's 20 likeliest (kept and cut) and 10 anywhere
            assert torch.equal(cut.log_probs_at(rows, tokens), expected[rows, tokens]), law.describe()
            assert torch.equal(cut.log_probs(), expected) and torch.equal(cut.log_probs(torch.tensor([1, 0])), expected[[1, 0]])
    assert SamplingLaw(0.7, top_p=0.9).cut(peaked).floor is not None  # deferred where the rows allow it
    assert SamplingLaw(0.7, top_p=0.9).cut(flat).floor is None


def test_a_bad_sampling_law_is_refused():
    for bad in (dict(top_k=-1), dict(top_k=1.5), dict(top_p=0.0), dict(top_p=1.5), dict(min_p=1.0), dict(min_p=-0.1), dict(temperature=float("nan"))):
        with pytest.raises(ValueError):
            SamplingLaw(**bad)
    with pytest.raises(ValueError, match="greedy"):
        SamplingLaw(0.0).warp(torch.zeros(3))


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("name", SAMPLING_VERIFIERS)
def test_exit_law_and_coverage_bound(name, case):
    tree, probs, _, verdicts = sampled(name, case)
    flow = target_flow(tree, probs)
    n = len(verdicts)
    # exit-node frequencies follow w(v)
    law = {v: float(flow.exit_weight[v]) for v in range(tree.num_nodes)}
    _, p_value, _ = chi_square_against(law, [v.exit_node for v in verdicts])
    assert p_value > ALPHA
    # mean block length equals 1 + C(T) within 4 standard errors
    lengths = torch.tensor([v.block_length for v in verdicts], dtype=torch.float64)
    standard_error = lengths.std().item() / math.sqrt(n)
    assert abs(lengths.mean().item() - flow.tau_bound) < 4 * standard_error + 1e-12
    # every verdict is a valid path ending at the exit node, with a bonus outside its children
    for verdict in verdicts[:500]:
        assert verdict.path == tree.path_to(verdict.exit_node)
        assert verdict.bonus_token not in {tree.tokens_list[u] for u in tree.children(verdict.exit_node)}


def test_greedy_follows_argmax_and_agrees_with_samplers_on_one_hot_rows():
    tree = DraftTree.from_paths(0, [[1, 2, 3], [1, 4], [2]])
    # nodes: 0 root, 1 (1), 2 (2 under 1), 3 (3), 4 (4 under 1), 5 (2 under root)
    best = [1, 4, 0, 0, 3, 1]  # root -> 1 -> 4, then 4's argmax 3 is not a child: exit at node 4, bonus 3
    probs = torch.nn.functional.one_hot(torch.tensor(best), 5).double() * 0.9 + 0.02
    greedy = verify("greedy", tree, probs)
    assert greedy.path == [0, 1, 4] and greedy.exit_node == 4 and greedy.bonus_token == 3
    exact = torch.nn.functional.one_hot(torch.tensor(best), 5).double()
    for name in VERIFIERS:  # with one-hot rows every exact verifier is forced to the greedy verdict
        verdict = verify(name, tree, exact, torch.Generator().manual_seed(0))
        assert (verdict.path, verdict.bonus_token) == ([0, 1, 4], 3), name


def test_leaf_exit_draws_bonus_from_the_full_row():
    # a chain root -> 0 whose child row is the exit row at a leaf: the bonus follows p_leaf fully,
    # including token 0, which is the leaf's own token (only children are removed)
    tree = DraftTree.from_paths(0, [[0]])
    probs = torch.tensor([[1.0, 0.0], [0.3, 0.7]], dtype=torch.float64)
    for name in SAMPLING_VERIFIERS:
        verdicts = draw_blocks(name, tree, probs, 4000, seed=1)
        assert all(v.exit_node == 1 for v in verdicts)  # the root's child holds all its mass
        share = Counter(v.bonus_token for v in verdicts)[0] / 4000
        assert abs(share - 0.3) < 4 * math.sqrt(0.3 * 0.7 / 4000), name


def test_root_exit_bonus_excludes_child_tokens():
    # the root has children 0 and 1; exiting at the root must draw the bonus from {2} only
    tree = DraftTree.from_paths(0, [[0], [1]])
    probs = torch.tensor([[0.2, 0.3, 0.5], [1.0, 0.0, 0.0], [1.0, 0.0, 0.0]], dtype=torch.float64)
    for name in SAMPLING_VERIFIERS:
        verdicts = draw_blocks(name, tree, probs, 2000, seed=2)
        assert {v.bonus_token for v in verdicts if v.exit_node == 0} == {2}


@pytest.mark.parametrize("name", VERIFIERS)
def test_same_seed_same_verdict(name):
    tree, probs = case_bushy()
    first = draw_blocks(name, tree, probs, 50, seed=99)
    second = draw_blocks(name, tree, probs, 50, seed=99)
    assert [(v.path, v.bonus_token) for v in first] == [(v.path, v.bonus_token) for v in second]


def test_logits_with_temperature_give_the_same_law_as_probs():
    tree, probs = case_bushy()
    logits = torch.log(probs) * 0.5  # softmax(logits / 0.5) == probs
    rows = LogitRows(logits, temperature=0.5)
    reference = target_flow(tree, probs)
    flow = target_flow(tree, rows.all_rows())
    # float32 limit (tev.bench.report.exit_law) plus the logits' own rounding to float32: u |s| per entry
    scaled = torch.log(probs)
    edge_units = edge_error_units(probs.shape[1], float(torch.logsumexp(scaled, dim=-1).abs().max())) + 2 * float(scaled.abs().max())
    limit = reference_limit(int(tree.depths.max()), int(torch.bincount(tree.parents[1:]).max()), edge_units)
    assert torch.allclose(rows.edge_prob(tree).double(), reference.edge_prob, rtol=0, atol=limit)
    assert torch.allclose(flow.exit_weight.double(), reference.exit_weight, rtol=0, atol=limit)
    a = verify("tev", tree, logits=logits, temperature=0.5, generator=torch.Generator().manual_seed(4))
    b = verify("tev", tree, logits=logits, temperature=0.5, generator=torch.Generator().manual_seed(4))
    assert (a.path, a.bonus_token) == (b.path, b.bonus_token)
    greedy = verify("greedy", tree, logits=logits, temperature=0.0)
    assert greedy.path == verify("greedy", tree, probs).path


def test_bad_input_is_refused():
    tree = DraftTree.from_paths(0, [[1], [2]])
    probs = torch.full((3, 3), 1 / 3)
    with pytest.raises(ValueError, match="unknown verifier 'eagle'"):
        verify("eagle", tree, probs)
    with pytest.raises(ValueError, match="rows but the tree has 3 nodes"):
        verify("tev", tree, probs[:2])
    with pytest.raises(ValueError, match="sum to 1"):
        verify("predraw", tree, probs * 2)
    with pytest.raises(ValueError, match="temperature must be"):
        verify("tev", tree, logits=torch.zeros(3, 3), temperature=-1.0)
    with pytest.raises(ValueError, match="use the 'greedy' verifier"):
        verify("tev", tree, logits=torch.zeros(3, 3), temperature=0.0)
    with pytest.raises(ValueError, match="outside the target vocabulary"):
        verify("tev", DraftTree.from_paths(0, [[7]]), torch.full((2, 3), 1 / 3))
    with pytest.raises(ValueError, match="NaN"):
        verify("tev", tree, logits=torch.tensor([[0.0, float("nan"), 0.0]] * 3))


def test_a_zero_weight_is_never_drawn_even_when_the_cumulative_sum_rounds_up_there(monkeypatch):
    """A GPU's parallel scan may add in another order than a sequential one: model that by a
    sum that rises by a rounding step at every zero weight and dips once."""
    true_cumsum = torch.cumsum

    def rounded_cumsum(x, dim):
        cdf = true_cumsum(x, dim=dim)
        bumps = true_cumsum((x == 0).to(cdf.dtype) * 1e-3, dim=dim)  # far larger than a rounding step: any leak shows
        return cdf + bumps

    monkeypatch.setattr(sampling.torch, "cumsum", rounded_cumsum)
    weights = torch.tensor([[0.0, 0.3, 0.0, 0.0, 0.2, 0.0, 0.5, 0.0]]).repeat(4000, 1)
    drawn = sample_rows(weights, torch.Generator().manual_seed(0))
    assert (weights.gather(1, drawn[:, None]) > 0).all()
    counts = torch.bincount(drawn, minlength=8).float() / len(drawn)
    assert torch.allclose(counts[[1, 4, 6]], torch.tensor([0.3, 0.2, 0.5]), atol=0.03)  # still the right law


def test_a_transformers_older_than_the_engine_needs_is_refused():
    with pytest.raises(RuntimeError, match=f">= {MIN_TRANSFORMERS}"):
        check_transformers("5.17.0")
    check_transformers(MIN_TRANSFORMERS)


def test_the_lab_s_folded_rows_keep_the_exit_law_exactly():
    # the verifier lab draws on rows folded to the tree's tokens + "any other token": the exit law
    # (and so 1 + C) is the same number, and the folded verifiers' exit frequencies follow it
    from tev.engine.lab import LabTree, folded, run_lab

    generator = torch.Generator().manual_seed(8)
    tree = random_tree(generator, vocab=40, budget=14, horizon=4, root_token=3)
    logits = 2.0 * torch.randn(tree.num_nodes, 40, generator=generator)
    for v in range(1, tree.num_nodes):  # drafted tokens likely, as with a good drafter
        logits[tree.parents[v], tree.tokens[v]] += 3.0
    rows = LogitRows(logits, law=SamplingLaw(0.8, top_p=0.95))
    flow = target_flow(tree, rows.all_rows().double())
    lab = LabTree(tree, rows, flow, "test")
    assert flow.coverage > 0.1 and (flow.exit_weight == 0).any()  # some mass flows down; truncation closes some edges
    small_tree, small_rows = folded(lab)
    assert small_rows.vocab_size == len(set(tree.tokens_list)) + 1
    assert torch.allclose(target_flow(small_tree, small_rows.probs).exit_weight, flow.exit_weight, atol=1e-6)
    result = run_lab(lab, draws=20_000, seed=1, timed_draws=2)
    law = {v: float(flow.exit_weight[v]) for v in range(tree.num_nodes)}
    for name, frequencies in result.frequencies.items():
        counts = [round(f * 20_000) for f in frequencies]
        _, p_value, _ = chi_square_against(law, [v for v, c in enumerate(counts) for _ in range(c)])
        assert p_value > ALPHA, name
        assert abs(result.mean_lengths[name] - flow.tau_bound) < 4 * result.length_se[name] + 1e-9
