"""The live engine on real transformers models: tree attention, losslessness, bad input."""

import itertools
import json
import math
import time

import pytest
import torch

import tev.core.head_screen as head_screen
from tev.core.sampling import SamplingLaw
from tev.engine.decode import DecodeConfig, autoregressive_generate, run_to_end, Request, speculative_generate
from tev.engine.drafters import BlockTreeDrafter, DraftContext, DraftState
from tev.engine.path_drafter import PathTreeDrafter
from tev.engine.models import ModelLoadError, load_bundle, load_drafter, load_tokenizer
from tev.engine.prompt_text import encode_prompt
from tev.engine.round import STAGES, prefill, speculation_round
from tev.engine.session import CausalLMSession
from tev.service.service import UserInputError, check_settings
from tev.util.timing import StageTimer
from tev.core.tree import DraftTree
from tev.bench.exactness import ALPHA, chi_square_against
from tev.util.stored import StoredResultError
from tev.engine.target import Target
from tests.helpers import truncated_law
from tests.tiny import OracleDrafter, save_pair, tiny_ar_drafter, tiny_block_drafter, tiny_target

VOCAB = 48


@pytest.fixture(scope="module")
def pair_folders(tmp_path_factory):
    return save_pair(tmp_path_factory.mktemp("pair"))


# ------------------------------------------------------------------ tree attention
@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_tree_attention_matches_sequential_forwards(arch):
    target = tiny_target(VOCAB, arch=arch)
    context = torch.randint(0, VOCAB, (9,), generator=torch.Generator().manual_seed(0))
    tree = DraftTree.from_paths(int(context[-1]), [[1, 2, 3, 4], [1, 2, 5], [1, 6], [7, 8], [9]])
    session = CausalLMSession(Target(target))
    session.extend(context[:-1])
    tree_logits = session.forward_tree(tree).logits
    worst = 0.0
    for v in range(tree.num_nodes):
        sequence = torch.cat([context, torch.tensor(tree.path_tokens(v), dtype=torch.long)])
        reference = target(input_ids=sequence[None]).logits[0, -1]
        worst = max(worst, (reference - tree_logits[v]).abs().max().item())
    assert worst < 1e-4
    # keep the path to node 3 (tokens 1, 2, 3), then continue: identical to a fresh forward
    session.commit(tree.path_to(3))
    assert session.length == context.numel() + 3 and session.cache.get_seq_length() == session.length
    continued = session.extend([11, 12]).logits
    sequence = torch.cat([context, torch.tensor([1, 2, 3, 11, 12])])
    fresh = target(input_ids=sequence[None]).logits[0, -2:]
    assert (continued - fresh).abs().max().item() < 1e-4


def test_commit_keeps_the_context_and_the_path_in_order_for_every_path_of_a_tree():
    """Commit moves only the path's entries to the places after the context: the cache it leaves equals the context
    and the path's entries gathered whole, for a path that is the tree's first nodes (nothing moves) and for paths
    whose nodes lie further on (each entry moves back), and decoding goes on from it as from a fresh forward."""
    target = tiny_target(VOCAB)
    context = torch.randint(0, VOCAB, (9,), generator=torch.Generator().manual_seed(1))
    tree = DraftTree.from_paths(int(context[-1]), [[1, 2, 3, 4], [1, 2, 5], [1, 6], [7, 8], [9]])
    for v in range(tree.num_nodes):
        session = CausalLMSession(Target(target))
        session.extend(context[:-1])
        session.forward_tree(tree)
        path = tree.path_to(v)
        keep = torch.cat([torch.arange(session.length), session.length + torch.tensor(path)])
        expected = [(layer.keys.index_select(-2, keep), layer.values.index_select(-2, keep)) for layer in session.cache.layers]
        session.commit(path)
        assert session.length == context.numel() - 1 + len(path) == session.cache.get_seq_length()
        for layer, (keys, values) in zip(session.cache.layers, expected):
            assert torch.equal(layer.keys, keys) and torch.equal(layer.values, values)
        continued = session.extend([11]).logits
        sequence = torch.cat([context, torch.tensor(tree.path_tokens(v) + [11], dtype=torch.long)])
        assert (continued[-1] - target(input_ids=sequence[None]).logits[0, -1]).abs().max().item() < 1e-4


# ------------------------------------------------------------------ greedy equivalence
def greedy_reference(target: Target, prompt, max_new_tokens, eos=True):
    config = DecodeConfig(temperature=0.0, max_new_tokens=max_new_tokens, stop_at_eos=eos)
    return autoregressive_generate(target, prompt, config)


@pytest.mark.parametrize("kind", ["block", "chain", "ar", "path", "path-chain", "block-int8", "path-int8"])
@pytest.mark.parametrize("budget", [1, 4, 16, 64])
def test_greedy_speculation_equals_greedy_decoding(kind, budget, monkeypatch):
    if kind.endswith("-int8"):  # the drafter reads its head rows as int8 (tev.util.int8_head)
        monkeypatch.setenv("TEV_INT8_HEAD", "1")
        kind = kind.removesuffix("-int8")
    target = tiny_target(VOCAB, scale=3.0)
    drafters = {
        "block": lambda: tiny_block_drafter(target),
        "chain": lambda: BlockTreeDrafter(tiny_block_drafter(target).model, shape="chain"),
        "ar": lambda: tiny_ar_drafter(VOCAB),
        "path": lambda: tiny_block_drafter(target, conditioning="path"),
        "path-chain": lambda: PathTreeDrafter(tiny_block_drafter(target, conditioning="path").model, shape="chain"),
    }
    drafter = drafters[kind]()
    for seed in range(3):
        prompt = torch.randint(1, VOCAB, (5 + seed,), generator=torch.Generator().manual_seed(seed)).tolist()
        reference = greedy_reference(Target(target), prompt, 40, eos=False)
        config = DecodeConfig(budget=budget, temperature=0.0, max_new_tokens=40, stop_at_eos=False)
        records, summary = run_to_end(speculative_generate(Request(Target(target), drafter, prompt, config)))
        assert summary.token_ids == reference.token_ids, (kind, budget, seed)
        assert sum(len(r.emitted) for r in records) == 40 and summary.stop_reason == "max_new_tokens"


def test_eos_in_the_middle_of_a_block_stops_exactly_like_greedy_decoding():
    target = tiny_target(VOCAB, scale=3.0)
    prompt = [5, 17, 3, 22]
    free_run = greedy_reference(Target(target), prompt, 30, eos=False).token_ids
    eos = free_run[9]  # a token greedy decoding meets at step 10
    target.config.eos_token_id = eos
    reference = greedy_reference(Target(target), prompt, 30)
    assert reference.stop_reason == "eos" and reference.token_ids == free_run[: free_run.index(eos)]
    oracle = OracleDrafter(prompt + free_run, len(prompt), VOCAB, depth=6)
    records, summary = run_to_end(speculative_generate(Request(Target(target), oracle, prompt, DecodeConfig(budget=16, temperature=0.0, max_new_tokens=30))))
    assert summary.token_ids == reference.token_ids and summary.stop_reason == "eos"
    last = records[-1]
    assert eos in last.verdict.block_tokens(last.tree)[:-1] or last.bonus_token == eos
    assert len(last.emitted) < last.block_length  # the block was cut at EOS
    # tau counts what the answer got; the raw blocks (what 1 + C bounds) also count EOS and what follows it
    assert summary.tau == pytest.approx(len(summary.token_ids) / summary.rounds) == pytest.approx(sum(len(r.emitted) for r in records) / len(records))
    assert summary.mean_block_length == pytest.approx(sum(r.block_length for r in records) / len(records))
    assert summary.mean_block_length > summary.tau
    assert summary.to_dict()["tau"] == summary.tau and summary.to_dict()["mean_block_length"] == summary.mean_block_length


def test_max_new_tokens_is_never_overshot():
    target = tiny_target(VOCAB, scale=3.0)
    prompt = [4, 9, 13]
    free_run = greedy_reference(Target(target), prompt, 20, eos=False).token_ids
    oracle = OracleDrafter(prompt + free_run + [0] * 10, len(prompt), VOCAB, depth=6)
    for limit in (1, 2, 5, 7, 13):
        _, summary = run_to_end(speculative_generate(Request(Target(target), oracle, prompt, DecodeConfig(budget=16, temperature=0.0, max_new_tokens=limit, stop_at_eos=False))))
        assert summary.token_ids == free_run[:limit]
        assert summary.tau == pytest.approx(limit / summary.rounds) and summary.tau <= summary.mean_block_length  # the length limit cuts tau too


# ------------------------------------------------------------------ lossless sampling
SMALL_VOCAB = 4


def exact_first_tokens_law(target, prompt, length=3, truncation=None, logits_of=None):
    """Enumerate p(x1, x2, x3 | prompt) exactly from the target (under ``truncation``, a
    :class:`SamplingLaw`, when given: its rows come from the reference ``truncated_law``).
    ``logits_of(ids)`` gives a sequence's `[L, V]` logits (default: transformers' forward)."""
    law = {}
    for sequence in itertools.product(range(SMALL_VOCAB), repeat=length):
        ids = torch.tensor(prompt + list(sequence))
        with torch.no_grad():
            logits = (target(input_ids=ids[None]).logits[0] if logits_of is None else logits_of(ids)).double()
        if truncation is None:
            rows = torch.softmax(logits, dim=-1)
        else:
            rows = truncated_law(logits, truncation.temperature, truncation.top_k, truncation.top_p, truncation.min_p)
        law[sequence] = math.prod(rows[len(prompt) - 1 + i, t].item() for i, t in enumerate(sequence))
    return law


class FullTreeDrafter:
    """Every token at depth 1 and 2 (4 + 16 nodes): accepts deep, exercises every branch."""

    name = "full"
    shape = "tree"
    feature_layers: tuple[int, ...] = ()

    def new_state(self):
        return DraftState()

    def marginals(self, context, state):
        return None

    def propose(self, context, budget, state, timer=None):
        depth = min(2, context.max_depth)
        paths = [list(p) for p in itertools.product(range(SMALL_VOCAB), repeat=depth)]
        return DraftTree.from_paths(context.token_ids[-1], paths)


@pytest.fixture(scope="module")
def small_target():
    torch.manual_seed(0)
    return tiny_target(SMALL_VOCAB, scale=0.5, eos_token_id=SMALL_VOCAB + 7)  # eos outside the vocab: never stops early


@pytest.mark.parametrize("method", ["tev", "predraw", "sequential", "ar-baseline", "tev-block", "tev-path", "tev-path-int8"])
def test_sampling_is_lossless(small_target, method, monkeypatch):
    if method.endswith("-int8"):  # the drafter reads its head rows as int8 (tev.util.int8_head)
        monkeypatch.setenv("TEV_INT8_HEAD", "1")
        method = method.removesuffix("-int8")
    prompt = [1, 2, 0]
    law = exact_first_tokens_law(small_target, prompt)
    draws, samples, lengths, bounds = 2500, [], [], []
    drafters = {"tev-block": lambda: tiny_block_drafter(small_target), "tev-path": lambda: tiny_block_drafter(small_target, conditioning="path")}
    drafter = drafters.get(method, FullTreeDrafter)()
    verifier = "tev" if method in ("ar-baseline", "tev-block", "tev-path") else method
    for seed in range(draws):
        budget = 6 if method in drafters else 20  # a partial tree for the trained-shape drafters
        config = DecodeConfig(budget=budget, temperature=1.0, verifier=verifier, max_new_tokens=3, seed=seed, stop_at_eos=False)
        if method == "ar-baseline":
            summary = autoregressive_generate(Target(small_target), prompt, config)
        else:
            records, summary = run_to_end(speculative_generate(Request(Target(small_target), drafter, prompt, config)))
            lengths += [r.block_length for r in records[:1]]
            bounds += [r.flow.tau_bound for r in records[:1]]
        samples.append(tuple(summary.token_ids))
    statistic, p_value, dof = chi_square_against(law, samples)
    print(f"{method}: draws={draws} chi2={statistic:.1f} dof={dof} p={p_value:.3f}")
    assert p_value > ALPHA
    if lengths:
        # first rounds only (all see the same tree): mean block length (not tau, which stops cut) vs 1 + C within 4 standard errors
        mean = sum(lengths) / len(lengths)
        se = math.sqrt(sum((x - mean) ** 2 for x in lengths) / (len(lengths) - 1) / len(lengths))
        assert abs(mean - sum(bounds) / len(bounds)) < 4 * se + 1e-6


@pytest.mark.parametrize("method", ["tev", "predraw", "sequential", "ar-baseline"])
def test_sampling_with_top_k_and_top_p_is_lossless(small_target, method):
    # the decode loop samples the truncated law the configuration names, end to end
    config = dict(temperature=0.8, top_k=3, top_p=0.85)
    law = exact_first_tokens_law(small_target, [1, 2, 0], truncation=DecodeConfig(**config).law)
    assert sum(p == 0 for p in law.values()) > 10, "the truncation must remove tokens in this case"
    samples = []
    for seed in range(2500):
        settings = DecodeConfig(budget=20, verifier="tev" if method == "ar-baseline" else method, max_new_tokens=3, seed=seed, stop_at_eos=False, **config)
        if method == "ar-baseline":
            summary = autoregressive_generate(Target(small_target), [1, 2, 0], settings)
        else:
            summary = run_to_end(speculative_generate(Request(Target(small_target), FullTreeDrafter(), [1, 2, 0], settings)))[1]
        samples.append(tuple(summary.token_ids))
    statistic, p_value, dof = chi_square_against(law, samples)
    print(f"{method} with top-k 3, top-p 0.85: chi2={statistic:.1f} dof={dof} p={p_value:.3f}")
    assert p_value > ALPHA


def test_mean_block_length_matches_mean_coverage_bound_over_many_rounds():
    target = tiny_target(VOCAB, scale=2.0)
    drafter = tiny_block_drafter(target)
    lengths, bounds = [], []
    for seed in range(30):
        prompt = torch.randint(1, VOCAB, (6,), generator=torch.Generator().manual_seed(100 + seed)).tolist()
        config = DecodeConfig(budget=32, temperature=1.0, max_new_tokens=40, seed=seed, stop_at_eos=False)
        records, summary = run_to_end(speculative_generate(Request(Target(target), drafter, prompt, config)))
        lengths += summary.block_lengths  # raw blocks: 1 + C bounds them, not the tokens emitted (tau)
        bounds += summary.tau_bounds
    n = len(lengths)
    mean = sum(lengths) / n
    # Var(L_i) summed over rounds bounds the error of the mean; bounds vary by round, so compare sums
    se = math.sqrt(sum((x - mean) ** 2 for x in lengths) / (n - 1) / n)
    assert abs(mean - sum(bounds) / n) < 4 * se


def test_evaluation_rows_give_tau_per_forward_with_its_error_over_prompts():
    from tev.engine.evaluation import evaluate_drafter, format_tau_table
    from tev.util.stats import ratio_standard_error

    target = tiny_target(VOCAB, scale=3.0)
    drafter = tiny_block_drafter(target)
    prompts = [{"ids": [1 + i, 5, 9 + 2 * i]} for i in range(4)]
    row, = evaluate_drafter(Target(target), None, drafter, prompts, budgets=(8,), temperatures=(0.0,), max_new_tokens=12, progress=False)
    summaries = [run_to_end(speculative_generate(Request(Target(target), drafter, p["ids"], DecodeConfig(budget=8, temperature=0.0, max_new_tokens=12, seed=i))))[1]
                 for i, p in enumerate(prompts)]
    tokens, rounds = [len(s.token_ids) for s in summaries], [s.rounds for s in summaries]
    assert row["tau"] == pytest.approx(sum(tokens) / sum(rounds)) and row["tokens"] == sum(tokens) and row["prompts"] == 4
    assert row["tau_se"] == pytest.approx(ratio_standard_error(tokens, rounds)) and row["tau_se"] > 0  # over prompts, not rounds
    lengths = [x for s in summaries for x in s.block_lengths]
    assert row["mean_block_length"] == pytest.approx(sum(lengths) / len(lengths))
    assert "| 0 | 8 | " + f"{row['tau']:.3f} +- {row['tau_se']:.3f} | {row['mean_block_length']:.3f} |" in format_tau_table([row])
    # a row measured before tau counted tokens per forward holds only the mean block length, names it, and is shown as such
    old = {"temperature": 0.0, "budget": 16, "mean_block_length": 2.254, "mean_block_length_se": 0.038, "tau_bound": 2.254,
           "prompt_mean_block_length_q25": 1.9, "prompt_mean_block_length_q75": 2.6, "rounds": 680, "figure": "mean_block_length"}
    assert "| 0 | 16 | not measured | 2.254 +- 0.038 (s.e. over rounds) | 2.254 | - | 680 |" in format_tau_table([old])
    with pytest.raises(StoredResultError, match="migrate"):  # one that does not name it is refused, not guessed at
        format_tau_table([{key: value for key, value in old.items() if key != "figure"}])


def test_ratio_standard_error_is_the_spread_over_units():
    from tev.util.stats import ratio_standard_error

    assert ratio_standard_error([2, 4], [1, 1]) == pytest.approx(1.0)  # equal denominators: the standard error of the ratios 2 and 4
    assert ratio_standard_error([6, 6], [2, 3]) > 0 and math.isnan(ratio_standard_error([3], [1]))  # one prompt: no error over prompts


def test_a_paired_change_cancels_what_makes_a_prompt_easy_for_both():
    import random

    from tev.util.stats import paired_ratio_change, ratio_standard_error

    # prompts differ a lot in how easy they are; the second drafter is a steady 20% better on each
    draw = random.Random(0)
    before = [(draw.choice((60, 120, 200)), 64) for _ in range(8)]
    after = [(int(tokens * 1.2), rounds) for tokens, rounds in before]
    gain, se = paired_ratio_change(after, before)
    assert gain == pytest.approx(1.2 * sum(t for t, _ in before) / sum(t for t, _ in before) - 1, abs=0.01)
    assert se < 0.01  # a steady gain: no spread left once each prompt meets itself
    unpaired = math.hypot(*(ratio_standard_error(*zip(*cells)) / (sum(t for t, _ in cells) / sum(r for _, r in cells)) for cells in (after, before)))
    assert unpaired > 0.1  # the same figures taken as independent carry the prompts' spread
    # with a gain that differs by prompt, the error is its spread over prompts (a one-prompt change has none)
    noisy = [(tokens * (1.4 if i % 2 else 1.0), rounds) for i, (tokens, rounds) in enumerate(before)]
    assert 0.05 < paired_ratio_change(noisy, before)[1] < 0.15 and math.isnan(paired_ratio_change(after[:1], before[:1])[1])
    with pytest.raises(ValueError, match="paired units differ"):
        paired_ratio_change(after, before[:3])

# ------------------------------------------------------------------ context limit and bad input
def test_prompt_near_the_context_limit_stops_cleanly():
    target = tiny_target(VOCAB, context=32)
    drafter = tiny_block_drafter(target)
    for length in (28, 31, 32):
        prompt = [1 + (i % 40) for i in range(length)]
        records, summary = run_to_end(speculative_generate(Request(Target(target), drafter, prompt, DecodeConfig(budget=16, temperature=0.0, max_new_tokens=50, stop_at_eos=False))))
        assert summary.stop_reason == "context_limit"
        assert len(prompt) + len(summary.token_ids) == 33  # positions 0..31 processed, plus the last prediction
        assert all(r.position + r.tree.max_depth <= 31 for r in records)
        reference = greedy_reference(Target(target), prompt, 50, eos=False)
        assert summary.token_ids == reference.token_ids and reference.stop_reason == "context_limit"


def test_bad_input_is_refused_clearly(pair_folders):
    target = tiny_target(VOCAB, context=32)
    drafter = tiny_block_drafter(target)
    with pytest.raises(ValueError, match="prompt is empty"):
        next(speculative_generate(Request(Target(target), drafter, [])))
    with pytest.raises(ValueError, match="context is 32"):
        next(speculative_generate(Request(Target(target), drafter, list(range(1, 40)))))
    with pytest.raises(ValueError, match="budget must be"):
        DecodeConfig(budget=-1)
    with pytest.raises(ValueError, match="temperature must be"):
        DecodeConfig(temperature=-0.5)
    with pytest.raises(ValueError, match="temperature must be"):
        DecodeConfig(temperature=float("nan"))
    with pytest.raises(ValueError, match="unknown verifier"):
        DecodeConfig(verifier="medusa")
    bundle = load_bundle(pair_folders["target"], pair_folders["block"])
    with pytest.raises(ValueError, match="drafter 'exittrain' is not available"):
        bundle.drafter("exittrain")
    tokenizer = load_tokenizer(pair_folders["target"])
    with pytest.raises(ValueError, match="prompt is empty"):
        encode_prompt(tokenizer, "")
    assert load_tokenizer(pair_folders["other_ar"]).get_vocab() != tokenizer.get_vocab()
    with pytest.raises(ModelLoadError, match="different tokenizers"):
        load_drafter(pair_folders["other_ar"], bundle.target, tokenizer)
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_bundle(pair_folders["target"].parent / "no-such-model")
    empty = pair_folders["target"].parent / "empty"
    empty.mkdir(exist_ok=True)
    with pytest.raises(ModelLoadError, match="could not load the tokenizer from folder"):
        load_bundle(empty)


def test_bundle_loads_every_drafter_kind(pair_folders):
    bundle = load_bundle(pair_folders["target"], pair_folders["block"])
    assert set(bundle.drafters) == {"block", "chain"}
    ar_bundle = load_bundle(pair_folders["target"], pair_folders["ar"])
    assert set(ar_bundle.drafters) == {"ar", "chain"}
    prompt = encode_prompt(bundle.tokenizer, "def add(a, b):", bundle.context_length)
    assert prompt[0] == bundle.tokenizer.bos_token_id
    for b, kind in ((bundle, "block"), (bundle, "chain"), (ar_bundle, "ar"), (ar_bundle, "chain")):
        records, summary = run_to_end(speculative_generate(Request(b.runner, b.drafter(kind), prompt, DecodeConfig(budget=8, max_new_tokens=12, seed=1)), b.tokenizer))
        assert summary.text == b.tokenizer.decode(summary.token_ids) or summary.stop_reason == "eos"
        assert records and all(set(r.timings) == set(STAGES) for r in records)


@pytest.mark.parametrize("verifier,law", [("tev", SamplingLaw(0.7, top_p=0.9)), ("predraw", SamplingLaw(1.0)), ("greedy", SamplingLaw(0.0))])
def test_the_stages_sum_to_the_round_s_time(pair_folders, verifier, law):
    # draft, build, forward, head, verify, commit: every statement of a round is inside one stage
    bundle = load_bundle(pair_folders["target"], pair_folders["block"])
    drafter = bundle.drafter("block")
    prompt = encode_prompt(bundle.tokenizer, "def add(a, b):", bundle.context_length)
    session = CausalLMSession(bundle.runner, feature_layers=drafter.feature_layers)
    state = drafter.new_state()
    prefill(session, prompt, state)
    generator = torch.Generator().manual_seed(0)
    untimed = []
    for _ in range(4):
        timer = StageTimer()
        start = time.perf_counter()
        record = speculation_round(session, drafter, prompt, 8, verifier, law, generator, state, timer)
        total = time.perf_counter() - start
        prompt = prompt + record.verdict.block_tokens(record.tree)
        assert tuple(timer.seconds) == STAGES  # each stage once, in the round's order
        assert sum(timer.seconds.values()) <= total
        untimed.append((total - sum(timer.seconds.values())) / total)
    # work outside the stages would leave a gap in every round; a busy machine pausing this
    # process between two stages leaves one in some
    assert min(untimed) < 0.05, untimed


@pytest.mark.parametrize("forced,dtype", [("0", torch.float32), ("1", torch.bfloat16)])
def test_bfloat16_paths_are_taken_only_where_this_cpu_runs_them_faster(pair_folders, monkeypatch, forced, dtype):
    # TEV_CPU_BF16 forces what tev.util.precision would measure: the drafter's weights and the greedy head screen follow it
    monkeypatch.setenv("TEV_CPU_BF16", forced)
    bundle = load_bundle(pair_folders["target"], pair_folders["block"])
    assert next(bundle.drafter("block").model.parameters()).dtype == dtype
    screen = CausalLMSession(bundle.runner).screen
    if dtype == torch.float32:
        assert screen is None
    else:
        assert screen is not None or not head_screen._accumulates_in_float32()


def test_greedy_at_a_positive_temperature_is_refused_in_the_library_the_page_and_the_command_line(pair_folders, capsys):
    from tev.cli import main

    with pytest.raises(ValueError, match="greedy verifier needs temperature 0"):
        DecodeConfig(verifier="greedy", temperature=1.0)
    with pytest.raises(UserInputError, match="greedy verifier needs temperature 0"):
        check_settings("greedy", 8, 1.0, 8, 0)
    code = main(["generate", "--prompt", "def add(a, b):", "--target", str(pair_folders["target"]), "--draft", str(pair_folders["block"]),
                 "--verifier", "greedy", "--temperature", "1"])
    assert code == 2 and "greedy verifier needs temperature 0" in capsys.readouterr().err
    assert DecodeConfig(verifier="tev", temperature=0.0).effective_verifier == "greedy"  # T = 0 is greedy decoding, whatever verifier is named


def test_generate_command_line_json(pair_folders, capsys):
    from tev.cli import main

    code = main(["generate", "--prompt", "def add(a, b):", "--target", str(pair_folders["target"]), "--draft", str(pair_folders["block"]),
                 "--budget", "8", "--temperature", "1", "--max-new-tokens", "10", "--seed", "3", "--json"])
    assert code == 0
    payload = json.loads(capsys.readouterr().out)
    assert len(payload["token_ids"]) <= 10 and payload["rounds"] == len(payload["rounds_detail"])
    for r in payload["rounds_detail"]:  # L = accepted + 1 bonus, along the path the verdict took
        assert r["block_length"] == len(r["path"]) == len(r["accepted"]) + 1 and r["path"][-1] == r["exit_node"]
        assert 0 <= r["coverage"] <= r["budget"]
    assert set(payload["stage_seconds"]) == set(STAGES)
    assert payload["precision"]["target_dtype"] == "float32" and set(payload["precision"]["drafter_dtypes"]) == {"block"}
    code = main(["generate", "--prompt", "", "--target", str(pair_folders["target"]), "--draft", str(pair_folders["block"])])
    assert code == 2 and "prompt is empty" in capsys.readouterr().err


def test_the_ar_drafter_grows_no_node_below_the_contexts_floor():
    drafter = tiny_ar_drafter(VOCAB)
    free = drafter.propose(DraftContext([1, 2, 5], max_depth=10), 20, drafter.new_state())
    floor = float(free.path_logprob[1:].exp().max()) * 1.01  # above every drafted node
    floored = drafter.propose(DraftContext([1, 2, 5], max_depth=10, min_path_prob=floor), 20, drafter.new_state())
    assert int(free.depths.max()) > 1
    assert int(floored.depths.max()) == 1  # the root's children are proposed; none is worth growing
