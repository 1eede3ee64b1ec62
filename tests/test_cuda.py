"""The engine, the verifiers and ExitTrain on a CUDA device (every test skips without one).

The CPU suite checks the same properties in float32; these rerun them where the arithmetic
differs: CUDA kernels, bfloat16 (the default dtype on a GPU), a CUDA random generator, and the
host syncs a round makes. The GPU check (``bash scripts/gpu-check.sh``, ``tev/drive/gpu_check.py``) runs this file on a lent GPU machine.
"""

import dataclasses
import math

import pytest
import torch

from tev.core.sampling import SamplingLaw, sample_rows
from tev.core.tree import DraftTree
from tev.core.verify import SAMPLING_VERIFIERS, verify_rows
from tev.engine.decode import DecodeConfig, autoregressive_generate, run_to_end, Request, speculative_generate
from tev.engine.drafters import ARTreeDrafter, BlockTreeDrafter, DraftContext
from tev.engine.models import load_causal_lm
from tev.engine.round import prefill, speculation_round
from tev.engine.session import CausalLMSession
from tev.train.data import TrainData
from tev.train.experiment import Experiment
from tev.pipelines.exittrain import EXITTRAIN_SETTINGS
from tev.train.teacher import regenerate_sequences
from tev.util.timing import StageTimer
from tev.bench.exactness import ALPHA, chi_square_against, count_host_syncs, draws_for_power, exact_block_law, first_difference, greedy_margins, rounding_tie
from tev.engine.target import Target
from tests.helpers import random_tree
from tests.tiny import tiny_block_drafter, tiny_target

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

VOCAB = 48
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
KINDS = ("block", "chain", "ar")
BUDGETS = (4, 32)
NEW_TOKENS = 40


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    """The tiny target of the CPU greedy tests (peaked rows) and an AR drafter, saved once, so
    each test loads them on a device in a dtype as a user would (``load_causal_lm``)."""
    root = tmp_path_factory.mktemp("cuda-models")
    paths = {"target": root / "target", "ar": root / "ar"}
    tiny_target(VOCAB, scale=3.0).save_pretrained(paths["target"])
    tiny_target(VOCAB, arch="qwen3", seed=2).save_pretrained(paths["ar"])  # what tiny_ar_drafter builds
    return paths


def load_pair(folders, kind: str, device: str, dtype: torch.dtype):
    """(target, drafter) on ``device`` in ``dtype``; the block drafter in ``dtype`` too, as
    ``BlockDrafter.from_pretrained`` loads it (bfloat16 by default)."""
    target = load_causal_lm(folders["target"], device=device, dtype=dtype)
    if kind == "ar":
        return target, ARTreeDrafter(load_causal_lm(folders["ar"], device=device, dtype=dtype), horizon=4)
    block = tiny_block_drafter(target)  # seeded: the same weights on every device
    block.model.to(dtype)
    return target, block if kind == "block" else BlockTreeDrafter(block.model, shape="chain")


def prompts() -> list[list[int]]:
    return [torch.randint(1, VOCAB, (5 + seed,), generator=torch.Generator().manual_seed(seed)).tolist() for seed in range(2)]


def greedy_runs(target, drafter) -> dict:
    """{(prompt index, budget): (speculative tokens, autoregressive tokens)} at T = 0."""
    runs = {}
    for i, prompt in enumerate(prompts()):
        reference = autoregressive_generate(Target(target), prompt, DecodeConfig(temperature=0.0, max_new_tokens=NEW_TOKENS, stop_at_eos=False))
        for budget in BUDGETS:
            config = DecodeConfig(budget=budget, temperature=0.0, max_new_tokens=NEW_TOKENS, stop_at_eos=False)
            _, summary = run_to_end(speculative_generate(Request(Target(target), drafter, prompt, config)))
            runs[i, budget] = (summary.token_ids, reference.token_ids)
    return runs


# ------------------------------------------------------------------ (a) greedy equivalence
@pytest.mark.parametrize("kind", KINDS)
def test_float32_greedy_speculation_equals_greedy_decoding_on_cuda_and_on_the_cpu(folders, kind):
    cuda = greedy_runs(*load_pair(folders, kind, "cuda", torch.float32))
    cpu = greedy_runs(*load_pair(folders, kind, "cpu", torch.float32))
    for key, (speculative, reference) in cuda.items():
        assert len(speculative) == NEW_TOKENS
        assert speculative == reference, (kind, key, first_difference(speculative, reference))
        assert speculative == cpu[key][0] == cpu[key][1], (kind, key, "CUDA and CPU disagree in float32")


@pytest.mark.parametrize("kind", KINDS)
def test_bfloat16_greedy_speculation_equals_greedy_decoding_up_to_rounding_ties(folders, kind):
    """In bfloat16 a tree forward and a one-token forward round differently (``load_bundle``
    says so), so two greedy runs may part at a near-tie of the target. They must agree token
    for token up to the first such tie, and every token each one emits must be the argmax of a
    third computation (one causal forward over the whole sequence) up to rounding."""
    target, drafter = load_pair(folders, kind, "cuda", torch.bfloat16)
    exact = 0
    for key, (speculative, reference) in greedy_runs(target, drafter).items():
        prompt = prompts()[key[0]]
        assert len(speculative) == len(reference) == NEW_TOKENS
        for name, tokens in (("speculative", speculative), ("autoregressive", reference)):
            margin, scale = greedy_margins(target, prompt, tokens)
            tie = rounding_tie(torch.bfloat16, scale)
            worst = int(torch.argmax(margin - tie))
            assert (margin <= tie).all(), f"{kind} {key} {name}: token {worst} is {float(margin[worst]):.3f} below the argmax (tie {float(tie[worst]):.3f})"
        # where the two runs part they share a prefix, so both tokens are near-argmax of one row (checked above)
        exact += first_difference(speculative, reference) is None
    print(f"{kind}: {exact} of {len(prompts()) * len(BUDGETS)} bfloat16 runs equal token for token")


# ------------------------------------------------------------------ (b) exactness of the sampling verifiers
@pytest.fixture(scope="module")
def cuda_case(tmp_path_factory):
    """A partial random tree over a 4-token vocabulary and a bfloat16 target's rows on it,
    computed on CUDA as the engine computes them (tree attention, lazy head; T = 0.7).

    Returns (tree, rows, law): ``law`` is the exact block law from those same rows in float64.
    """
    folder = tmp_path_factory.mktemp("cuda-small") / "target"
    tiny_target(4, scale=0.5, eos_token_id=11).save_pretrained(folder)
    target = load_causal_lm(folder, device="cuda", dtype=torch.bfloat16)
    tree = random_tree(torch.Generator().manual_seed(5), vocab=4, budget=12, horizon=3, root_token=2)
    session = CausalLMSession(Target(target))
    session.extend([1, 3, 0])
    rows = session.forward_tree(tree).rows(0.7)
    assert rows.device.type == "cuda" and rows.hidden.dtype == torch.bfloat16
    return tree, rows, exact_block_law(tree, rows.all_rows().double().cpu())


@pytest.mark.parametrize("name", SAMPLING_VERIFIERS)
def test_output_block_matches_the_exact_target_law_on_cuda(cuda_case, name):
    tree, rows, law = cuda_case
    assert sum(law.values()) == pytest.approx(1.0)
    draws = draws_for_power(law)  # a 1-point mass shift between the two largest cells fails (power >= 0.9)
    generator = torch.Generator(device="cuda").manual_seed(SAMPLING_VERIFIERS.index(name))
    blocks = [tuple(verify_rows(name, tree, rows, generator).block_tokens(tree)) for _ in range(draws)]
    statistic, p_value, dof = chi_square_against(law, blocks)
    print(f"{name} on CUDA: draws={draws} chi2={statistic:.1f} dof={dof} p={p_value:.3f}")
    assert p_value > ALPHA, f"{name}: chi2={statistic:.1f}, dof={dof}, p={p_value:.2e}"


def test_sample_rows_never_draws_a_zero_weight_entry_on_cuda():
    """A residual removes child tokens by zeroing them; a CUDA cumulative sum adds in a
    different order than the CPU's, and must still not lift the CDF at a zero weight (nor
    lower it anywhere), or a removed token could be drawn."""
    generator = torch.Generator(device="cuda").manual_seed(0)
    weights = torch.rand(256, 49_152, device="cuda", generator=generator) ** 4  # uneven: a few large entries, many small
    weights[:, 1::2] = 0.0  # a zero after every entry: any rounding in the scan shows
    cdf = torch.cumsum(weights.float(), dim=-1)  # what sample_rows sums
    lifted = int(((cdf[:, 1:] > cdf[:, :-1]) & (weights[:, 1:] == 0)).sum())
    lowered = int((cdf[:, 1:] < cdf[:, :-1]).sum())
    print(f"CUDA cumsum: {lifted} zero weights lift the raw CDF, {lowered} places lower it (sample_rows holds it flat)")
    for _ in range(40):
        drawn = sample_rows(weights, generator)  # [256]
        assert (weights.gather(1, drawn[:, None]) > 0).all()


# ------------------------------------------------------------------ (c) host syncs
@pytest.fixture(scope="module")
def bf16_pair(folders):
    return load_pair(folders, "block", "cuda", torch.bfloat16)


def tree_forward(target, drafter):
    """(tree, forward output): a block-drafter tree on a fresh session and the target's forward
    over it; ``output.rows(T)`` gives a new ``TargetRows`` each time (nothing cached)."""
    prompt = prompts()[0]
    session = CausalLMSession(Target(target), feature_layers=drafter.feature_layers)
    state = drafter.new_state()
    prefill(session, prompt, state)
    tree = drafter.propose(DraftContext(prompt, max_depth=8), 16, state)
    return tree, session.forward_tree(tree)


@pytest.mark.parametrize("name,temperature", [("tev", 1.0), ("predraw", 1.0), ("greedy", 0.0)])
def test_a_verdict_crosses_to_the_host_as_documented(bf16_pair, name, temperature):
    """TEV and predraw: one transfer (tev/core/verify.py); greedy: one, plus one at a leaf exit."""
    tree, output = tree_forward(*bf16_pair)
    generator = torch.Generator(device="cuda").manual_seed(0)
    verify_rows(name, tree, output.rows(temperature), generator)  # warm-up: kernels, handles
    for _ in range(5):
        with count_host_syncs() as syncs:
            verdict = verify_rows(name, tree, output.rows(temperature), generator)
        limit = 1 + (name == "greedy" and bool(tree.is_leaf[verdict.exit_node]) and tree.num_nodes > 1)
        assert len(syncs) <= limit, f"{name}: {len(syncs)} host syncs, documented {limit}: {syncs}"


@pytest.mark.parametrize("verifier,temperature", [("tev", 1.0), ("greedy", 0.0)])
def test_a_speculation_round_crosses_to_the_host_as_documented(bf16_pair, verifier, temperature):
    """Draft marginals to the host (the tree is built there) + the verdict's transfers
    (tev/engine/round.py); the stage timer is the non-syncing one, so only the engine counts."""
    target, drafter = bf16_pair
    prompt = prompts()[1]
    session = CausalLMSession(Target(target), feature_layers=drafter.feature_layers)
    committed, state = list(prompt), drafter.new_state()
    prefill(session, prompt, state)
    generator = torch.Generator(device="cuda").manual_seed(1)
    for index in range(6):
        with count_host_syncs() as syncs:
            step = speculation_round(session, drafter, committed, 16, verifier, SamplingLaw(temperature), generator, state, StageTimer())
        committed += step.verdict.block_tokens(step.tree)
        if index == 0:
            continue  # warm-up
        leaf_exit = verifier == "greedy" and bool(step.tree.is_leaf[step.verdict.exit_node]) and step.tree.num_nodes > 1
        limit = 2 + leaf_exit
        assert len(syncs) <= limit, f"round {index} ({verifier}): {len(syncs)} host syncs, documented {limit}: {syncs}"
    assert session.length == len(committed) - 1  # the cache holds every committed token but the root


# ------------------------------------------------------------------ (d) ExitTrain
@pytest.mark.parametrize("dtype", DTYPES)
def test_an_exittrain_step_on_cuda_trains_the_drafter_and_leaves_the_target_unchanged(tmp_path, dtype):
    source = tiny_target(VOCAB, scale=10.0)
    stream = torch.randint(1, VOCAB, (4000,), generator=torch.Generator().manual_seed(1))
    sequences = regenerate_sequences(source, stream, 12, 12, 20, seed=2, progress=False, greedy_share=0.0)
    source.save_pretrained(tmp_path / "target")
    target = load_causal_lm(tmp_path / "target", device="cuda", dtype=DTYPES[dtype])
    drafter = tiny_block_drafter(target, horizon=4).model.float().to("cuda")  # float32 weights: the trained copy
    settings = dataclasses.replace(EXITTRAIN_SETTINGS, steps=2, budget=8, lr=5e-3, warmup=0, sequences_per_step=3, anchors_per_sequence=4, eval_every=0, save_every=0)
    target_before = {name: tensor.clone() for name, tensor in target.state_dict().items()}
    drafter_before = {name: tensor.clone() for name, tensor in drafter.state_dict().items()}
    data = TrainData.of(sequences, 12)
    experiment = Experiment.exittrain(target, drafter, data, data.select(range(4)), settings)
    change = experiment.run()
    assert next(drafter.parameters()).is_cuda
    assert len(experiment.history) == 2 and all(math.isfinite(r["loss"]) and r["loss_tree"] > 0 for r in experiment.history)
    assert all(torch.equal(tensor, target_before[name]) for name, tensor in target.state_dict().items())  # bit for bit
    assert all(p.grad is None for p in target.parameters())
    assert [n for n, t in drafter.state_dict().items() if not torch.equal(t, drafter_before[n])]  # it learned
    assert change["anchors"] == 4 * 3 * 4 and math.isfinite(change["change"])  # 4 held-out draws of 3 rows x 4 anchors


@pytest.mark.parametrize("arch", ["llama", "qwen3"])
def test_tree_attention_matches_sequential_forwards_on_cuda(folders, arch):
    """The CPU test of tree attention, in float32 on CUDA: every node's row equals a plain
    forward over context + path, and after commit the cache continues like a fresh forward."""
    target = load_causal_lm(folders["target" if arch == "llama" else "ar"], device="cuda", dtype=torch.float32)
    context = torch.randint(0, VOCAB, (9,), generator=torch.Generator().manual_seed(0))
    tree = DraftTree.from_paths(int(context[-1]), [[1, 2, 3, 4], [1, 2, 5], [1, 6], [7, 8], [9]])
    session = CausalLMSession(Target(target))
    session.extend(context[:-1])
    tree_logits = session.forward_tree(tree).logits
    with torch.no_grad():
        for v in range(tree.num_nodes):
            sequence = torch.cat([context, torch.tensor(tree.path_tokens(v), dtype=torch.long)]).cuda()
            assert (target(input_ids=sequence[None]).logits[0, -1] - tree_logits[v]).abs().max().item() < 1e-4, v
        session.commit(tree.path_to(3))
        assert session.length == context.numel() + 3 and session.cache.get_seq_length() == session.length
        continued = session.extend([11, 12]).logits
        fresh = target(input_ids=torch.cat([context, torch.tensor([1, 2, 3, 11, 12])]).cuda()[None]).logits[0, -2:]
    assert (continued - fresh).abs().max().item() < 1e-4
