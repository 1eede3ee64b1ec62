"""The row-invariant target forward: every node of any tree is bit for bit the row computed alone,
in float32 and in bfloat16; greedy speculation equals greedy decoding and sampling stays lossless
through it; the load-time check catches a forward whose rows move; the choice is recorded."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from tests.helpers import random_tree
from tests.test_engine import SMALL_VOCAB, VOCAB, FullTreeDrafter, exact_first_tokens_law, greedy_reference
from tests.tiny import tiny_ar_drafter, tiny_block_drafter, tiny_target
from tev.bench.exactness import ALPHA, chi_square_against
from tev.bench.row_cost import forward_rows_differ, operation_invariance, time_forwards
from tev.engine.drafters import BlockTreeDrafter
from tev.engine.drafter_threads import proposals_agree_across_threads
from tev.engine.decode import DecodeConfig, Request, autoregressive_generate, run_to_end, speculative_generate
from tev.engine.row_invariant import BLOCK, RowInvariantForward
from tev.engine.row_products import RowProducts, invariance_failures, packed_products_available
from tev.engine.session import CausalLMSession
from tev.engine.target import Target
from tev.engine.target_precision import (FORWARD_ENV, _decide, choose_target_forward, forced_target_forward, rows_agree_across_threads, thread_counts,
                                        tree_rows_differ)

DTYPES = [pytest.param(torch.float32, id="float32"), pytest.param(torch.bfloat16, id="bfloat16")]


def _skip_without(dtype):
    if not packed_products_available(dtype):
        pytest.skip(f"oneDNN's prepacked {dtype} products do not run on this CPU")


def running(target: Target, precision: str):
    """``target``'s sessions run the row-invariant forward in ``precision`` while inside."""
    return forced_target_forward(target, precision)


def rows_alone(session_of, context: list[int], tree) -> list[torch.Tensor]:
    """Each node's logits computed by one-token steps along ``context`` (ending in the root's
    token) and the node's path, a fresh session per node."""
    rows = []
    for node in range(tree.num_nodes):
        session = session_of()
        out = None
        for token in context + tree.path_tokens(node):
            out = session.extend([token])
        rows.append(out.last_logits())
    return rows


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_every_tree_row_equals_the_row_computed_alone(arch, dtype):
    _skip_without(dtype)
    runner = Target(tiny_target(VOCAB, arch=arch, context=256))
    generator = torch.Generator().manual_seed(0)
    with running(runner, str(dtype).removeprefix("torch.")):
        for context_length in (3, BLOCK - 2, BLOCK + 5, 3 * BLOCK + 1):  # the committed block ends at 0, 0/32, 32, 96/128
            context = torch.randint(0, VOCAB, (context_length,), generator=generator).tolist()
            tree = random_tree(generator, VOCAB, budget=12, horizon=6, root_token=context[-1])
            session = CausalLMSession(runner)
            session.extend(context[:-1])
            tree_logits = session.forward_tree(tree).rows(1.0).all_logits()
            alone = rows_alone(lambda: CausalLMSession(runner), context, tree)
            differing = [v for v in range(tree.num_nodes) if not torch.equal(alone[v], tree_logits[v])]
            assert not differing, (context_length, differing)


@pytest.mark.parametrize("dtype", DTYPES)
def test_the_forward_computes_the_model(dtype):
    _skip_without(dtype)
    target = tiny_target(VOCAB, context=256)
    ids = torch.randint(0, VOCAB, (80,), generator=torch.Generator().manual_seed(1))
    runner = Target(target)
    with running(runner, str(dtype).removeprefix("torch.")):
        ours = CausalLMSession(runner).extend(ids).logits
    with torch.no_grad():
        theirs = target(input_ids=ids[None]).logits[0]
    tolerance = 1e-4 if dtype == torch.float32 else 5e-2  # bfloat16 products: about 3 significant digits
    assert (ours - theirs).abs().max() < tolerance * theirs.abs().max()


def test_a_long_prompt_goes_through_in_pieces_with_the_same_rows():
    _skip_without(torch.bfloat16)
    target = tiny_target(VOCAB, context=256)
    ids = torch.randint(0, VOCAB, (150,), generator=torch.Generator().manual_seed(2)).tolist()
    runner = Target(target)
    with running(runner, "bfloat16"):
        whole = CausalLMSession(runner).extend(ids).logits  # 64 + 64 + 22 rows
        stepped = CausalLMSession(runner)
        last = [stepped.extend([token]).last_logits() for token in ids]
    assert torch.equal(whole, torch.stack(last))


def test_the_load_check_catches_rows_that_move():
    _skip_without(torch.float32)
    target = tiny_target(VOCAB, context=256)
    forward = RowInvariantForward(target, torch.float32)
    assert tree_rows_differ(forward, target.config) == 0
    honest = forward.project
    forward.project = lambda hidden: honest(hidden) + 1e-3 * hidden.shape[0]  # a row's logits depend on how many rows came along
    assert tree_rows_differ(forward, target.config) > 0

    class Shifty(RowProducts):  # a kernel whose row count changes a row's bits
        def _kernel(self, x):
            return super()._kernel(x) * (1 + 1e-6 * x.shape[0])

    assert invariance_failures(Shifty(torch.randn(16, 32), torch.float32), range(1, 9)) == [3, 4, 5, 6, 7, 8]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kind", ["block", "path", "chain", "ar"])
def test_greedy_speculation_equals_greedy_decoding_through_the_row_invariant_forward(kind, dtype):
    _skip_without(dtype)
    target = tiny_target(VOCAB, scale=3.0, context=256)
    drafters = {"block": lambda: tiny_block_drafter(target), "path": lambda: tiny_block_drafter(target, conditioning="path"),
                "chain": lambda: BlockTreeDrafter(tiny_block_drafter(target).model, shape="chain"), "ar": lambda: tiny_ar_drafter(VOCAB)}
    drafter = drafters[kind]()
    runner = Target(target)
    with running(runner, str(dtype).removeprefix("torch.")):
        for seed, budget in ((0, 4), (1, 16), (2, 32)):
            prompt = torch.randint(1, VOCAB, (30 + 7 * seed,), generator=torch.Generator().manual_seed(seed)).tolist()  # crosses a block
            reference = greedy_reference(runner, prompt, 48, eos=False)
            config = DecodeConfig(budget=budget, temperature=0.0, max_new_tokens=48, stop_at_eos=False)
            _, summary = run_to_end(speculative_generate(Request(runner, drafter, prompt, config)))
            assert summary.token_ids == reference.token_ids, (kind, budget, seed)


@pytest.mark.parametrize("method", ["tev", "predraw", "sequential", "ar-baseline"])
def test_sampling_through_the_bfloat16_row_invariant_forward_is_lossless(method):
    _skip_without(torch.bfloat16)
    torch.manual_seed(0)
    target = tiny_target(SMALL_VOCAB, scale=0.5, eos_token_id=SMALL_VOCAB + 7)
    prompt = [1, 2, 0]
    runner = Target(target)
    with running(runner, "bfloat16"):
        law = exact_first_tokens_law(target, prompt, logits_of=lambda ids: CausalLMSession(runner).extend(ids).logits)  # the forward's own rows
        samples = []
        for seed in range(2000):
            config = DecodeConfig(budget=20, temperature=1.0, verifier="tev" if method == "ar-baseline" else method, max_new_tokens=3, seed=seed, stop_at_eos=False)
            if method == "ar-baseline":
                summary = autoregressive_generate(runner, prompt, config)
            else:
                _, summary = run_to_end(speculative_generate(Request(runner, FullTreeDrafter(), prompt, config)))
            samples.append(tuple(summary.token_ids))
    statistic, p_value, dof = chi_square_against(law, samples)
    assert p_value > ALPHA, (method, statistic, dof)


def test_the_choice_is_checked_timed_and_recorded(monkeypatch):
    target = Target(tiny_target(VOCAB, context=256))
    assert target.precision is None and target.forward is None and target.label == "transformers"  # nothing chosen: transformers' forward
    precision = choose_target_forward(target)
    assert precision.forward in ("row-invariant", "transformers") and precision.reason
    assert set(precision.step_ms) >= {"transformers float32"} and all(set(ms) == {"1", "9"} for ms in precision.step_ms.values())
    assert target.precision is precision and target.label == precision.label
    assert (target.forward is not None) == precision.invariant
    assert CausalLMSession(target).invariant is target.forward
    monkeypatch.setenv(FORWARD_ENV, "transformers")
    assert choose_target_forward(target).label == "transformers float32" and target.forward is None
    monkeypatch.setenv(FORWARD_ENV, "float16")
    with pytest.raises(ValueError, match="TEV_TARGET_FORWARD"):
        choose_target_forward(target)
    with pytest.raises(TypeError, match="Target"):  # a bare model would drop the choice without a word
        CausalLMSession(target.model)


def test_the_choice_prefers_the_row_invariant_forward_within_its_margins():
    """What each measured case chooses (milliseconds as the medians would give them): the margins
    sit far from what the project's CPUs measure, so a start's noise cannot flip the choice."""
    plain = {"1": 60.0, "9": 130.0}
    # AVX2 at one thread: a step 8-15% slower, a tree far cheaper -> row-invariant (10% of the fastest pass flipped here)
    for step in (65.0, 69.0):
        assert _decide({"transformers float32": plain, "row-invariant float32": {"1": step, "9": 100.0}})[0] == "row-invariant float32"
    # a step 30% slower: plain decoding would pay too much -> transformers, and the reason says which figure lost
    name, why = _decide({"transformers float32": plain, "row-invariant float32": {"1": 78.0, "9": 100.0}})
    assert name == "transformers float32" and "one-token step is more than 25% slower" in why
    # a tree no cheaper -> transformers
    name, why = _decide({"transformers float32": plain, "row-invariant float32": {"1": 55.0, "9": 131.0}})
    assert name == "transformers float32" and "9-token forward is no faster" in why
    # two qualify: the cheaper tree wins
    both = {"transformers float32": plain, "row-invariant float32": {"1": 50.0, "9": 90.0}, "row-invariant bfloat16": {"1": 45.0, "9": 70.0}}
    assert _decide(both)[0] == "row-invariant bfloat16"


def test_rows_are_checked_equal_at_every_thread_count_a_server_runs():
    _skip_without(torch.float32)
    target = tiny_target(VOCAB, context=256)
    forward = RowInvariantForward(target, torch.float32)
    before = torch.get_num_threads()
    assert rows_agree_across_threads(forward, target.config, (1, 2))
    assert torch.get_num_threads() == before  # the check leaves the caller's count as it was
    torch.set_num_threads(2)
    try:
        assert thread_counts() == (1, 2)  # the count the target loads at, and one
    finally:
        torch.set_num_threads(before)


def test_a_model_it_cannot_run_keeps_transformers_forward_and_says_why():
    target = Target(GPT2LMHeadModel(GPT2Config(vocab_size=50, n_embd=32, n_layer=1, n_head=2, n_positions=64)).eval())
    precision = choose_target_forward(target)
    assert precision.forward == "transformers" and target.forward is None
    assert "gpt2" in precision.refused["row-invariant float32"] and "gpt2" in precision.reason


def test_a_forward_that_fails_while_checked_is_refused_and_the_load_goes_on(monkeypatch):
    target = tiny_target(VOCAB, context=256)

    def broken(*args, **kwargs):
        raise RuntimeError("no kernel for this shape\nmore detail")

    monkeypatch.setattr("tev.engine.target_precision.tree_rows_differ", broken)
    runner = Target(target)
    precision = choose_target_forward(runner)
    assert precision.label == "transformers float32" and runner.forward is None
    assert precision.refused["row-invariant float32"] == "it failed on this model: no kernel for this shape"  # (bfloat16's: the same, or emulated)


def test_a_mask_that_hides_part_of_the_cache_is_refused_by_the_row_invariant_session():
    _skip_without(torch.float32)
    target = tiny_target(VOCAB, context=256)
    runner = Target(target)
    with running(runner, "float32"):
        session = CausalLMSession(runner)
        session.extend([1, 2, 3, 4])
        visible = torch.ones(2, 6, dtype=torch.bool)
        visible[:, 0] = False
        with pytest.raises(ValueError, match="whole cache"):
            session.forward_masked([5, 6], [4, 5], visible)
        assert CausalLMSession(runner, row_invariant=False).invariant is None  # training's masks take transformers' forward


def test_the_row_cost_tool_times_every_forward_and_finds_which_rows_move():
    target = Target(tiny_target(VOCAB, context=256))
    models = {"float32": target, "bfloat16": Target(tiny_target(VOCAB, context=256).to(torch.bfloat16))}
    names = ["transformers float32", "row-invariant float32"]
    timing = time_forwards(models, names, sizes=[1, 3], passes=1, progress=False)
    assert set(timing) == set(names) and all(cells[n]["min_ms"] > 0 for cells in timing.values() for n in ("1", "3"))
    assert forward_rows_differ(target, "float32", size=9, context=40) == 0  # by construction
    checks = operation_invariance(target.model)
    assert checks["prepacked, 2-64 rows, head"] == [] and isinstance(checks["attention over a cache plus a masked tree (SDPA)"], bool)
    assert target.forward is None and target.precision is None  # the tool's switches leave no forward behind


def _skip_unless_rows_agree_across_threads(target):
    """Whether a row's bits depend on the thread count is the CPU's kernels' to say: where they do, the server runs one count."""
    if not rows_agree_across_threads(RowInvariantForward(target, torch.float32), target.config, (1, 2)):
        pytest.skip("the float32 row-invariant forward's rows come out with other bits at 1 and 2 threads on this CPU: the server runs one count here")


@pytest.mark.parametrize("kind", ["block", "path", "ar"])
def test_a_drafter_that_passes_the_start_check_gives_the_same_rounds_over_a_whole_run(kind):
    """What lets the server give a visitor's run two threads and background work one: through the row-invariant forward
    a seed's rounds (trees, coverage, exits, tokens) over a 40-token run do not depend on the count a step ran with,
    for a drafter that passed the start's 3-token check (a drafter that fails it runs at one count)."""
    _skip_without(torch.float32)
    target = tiny_target(VOCAB, scale=3.0, context=256)
    _skip_unless_rows_agree_across_threads(target)
    drafter = {"block": lambda: tiny_block_drafter(target), "path": lambda: tiny_block_drafter(target, conditioning="path"),
               "ar": lambda: tiny_ar_drafter(VOCAB)}[kind]()
    prompt = torch.randint(1, VOCAB, (37,), generator=torch.Generator().manual_seed(5)).tolist()
    config = DecodeConfig(budget=16, temperature=0.7, top_p=0.9, max_new_tokens=40, seed=3, stop_at_eos=False)
    before, runs = torch.get_num_threads(), []
    runner = Target(target)
    with running(runner, "float32"):
        if not proposals_agree_across_threads(runner, drafter, (1, 2)):
            pytest.skip(f"the tiny {kind} drafter's products round differently at 1 and 2 threads on this CPU: the server runs it at one count")
        try:
            for count in (1, 2, 1):
                torch.set_num_threads(count)
                records, summary = run_to_end(speculative_generate(Request(runner, drafter, prompt, config)))
                runs.append((summary.token_ids, [(r.tree.tokens.tolist(), float(r.flow.coverage), r.verdict.exit_node) for r in records]))
        finally:
            torch.set_num_threads(before)
    assert runs[0] == runs[1] == runs[2]


def test_a_drafter_is_checked_for_its_rounds_at_both_thread_counts():
    """The server's check before it lets a drafter's runs take the full count: the same rounds at both counts, or every
    step at the reduced one. A drafter whose probabilities move with the count (as the block drafters' float32 layers do
    on the AVX2 EPYC) is caught; one whose trees cannot move with it passes."""
    _skip_without(torch.float32)
    target = tiny_target(VOCAB, scale=3.0, context=256)
    _skip_unless_rows_agree_across_threads(target)
    drafter = tiny_block_drafter(target, conditioning="path")
    honest, kept = drafter.propose, {}

    def steady(context, *args, **kwargs):  # the first tree proposed after each context, whatever the count (the state still advances)
        return kept.setdefault(tuple(context.token_ids), honest(context, *args, **kwargs))

    def shifty(*args, **kwargs):  # draft probabilities that depend on the thread count
        tree = steady(*args, **kwargs)
        return dataclasses.replace(tree, draft_logprob=tree.draft_logprob * (1 + 1e-6 * torch.get_num_threads()))

    runner = Target(target)
    with running(runner, "float32"):
        drafter.propose = steady
        assert proposals_agree_across_threads(runner, drafter, (1, 2))
        drafter.propose = shifty
        before = torch.get_num_threads()
        assert not proposals_agree_across_threads(runner, drafter, (1, 2))
        assert torch.get_num_threads() == before  # the caller's count as it was
