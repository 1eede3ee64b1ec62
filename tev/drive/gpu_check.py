"""One prepared check for a lent CUDA machine: ``bash scripts/gpu-check.sh`` runs this module.

``python3 -m tev.drive.gpu_check --out DIR`` (or ``python -m tev bench gpu-check``) runs the steps below in order, each in its own
process with its own timeout, inside one overall time limit; a failing step is recorded and
the next one runs. After every step it rewrites ``DIR/gpu-check.json`` (every result) and
``DIR/gpu-check.md`` (the summary), so a run cut short still leaves what it measured; pytest
output goes to ``DIR/pytest.log``. The exit status is 0 only when every step passed.

Steps (``--only`` picks some; ``--device cpu --quick`` shrinks them, for the CPU test suite):

- environment: versions, the device, bfloat16; transformers >= 5.24 (older ones do not know
  the ``cache=`` argument the engine passes, and silently run every forward without the cache).
- pytest-cuda: ``tests/test_cuda.py`` (greedy equivalence, chi-square per verifier, host
  syncs, ExitTrain on CUDA); none of its tests may skip on a CUDA device.
- greedy: the embedded tiny pair; greedy speculation equals greedy decoding on the device
  (float32: token for token, and equal to the CPU's tokens; bfloat16: up to rounding ties).
- chi-square: a real tree of the embedded tiny pair, rows in bfloat16 on the device; each
  sampling verifier's output blocks against the exact block law, and mean ``L`` against ``1 + C``.
- host-syncs: host syncs per verdict and per round, with the lines that make them.
- bench-verifiers, bench-e2e: ``python -m tev bench verifiers`` and ``bench e2e --pair tiny``.
- smollm2-shape: a random ``LlamaForCausalLM`` of SmolLM2-135M's shape in bfloat16: one-token
  forward vs 32- and 64-node tree forwards with a KV cache (CUDA events), and verdicts on its rows.
- pytest-other: the rest of the suite that runs without gradio, plotly, hypothesis or the real
  SmolLM2 weights; last, as the least GPU-specific (on CUDA the loaders pick the GPU there too).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import inspect
import json
import math
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections import Counter
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path

import torch
import transformers
from packaging.version import Version
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.models.llama.modeling_llama import LlamaModel

from tev.bench.exactness import ALPHA, chi_square_against, count_host_syncs, exact_block_law, first_difference, greedy_margins, power_against_shift, rounding_tie
from tev.bench.verifiers_bench import synthetic_case
from tev.core.sampling import SamplingLaw
from tev.core.tree import DraftTree
from tev.core.verify import SAMPLING_VERIFIERS, verify_rows
from tev.data.prompts import load_prompt_set
from tev.engine.decode import DecodeConfig, autoregressive_generate, run_to_end, Request, speculative_generate
from tev.engine.drafters import DraftContext
from tev.engine.evaluation import fit_prompt
from tev.engine.models import load_bundle, load_causal_lm
from tev.engine.round import prefill, room_left, speculation_round
from tev.engine.session import CausalLMSession
from tev.engine.target import Target
from tev.util.stats import spread
from tev.util.paths import REPO_ROOT as REPO
from tev.util.stored import write_result
from tev.util.timing import StageTimer, machine_info, time_once

MODULE = "tev.drive.gpu_check"  # each in-process step runs as `python -m MODULE --run-step NAME`
MIN_TRANSFORMERS = Version("5.24")  # requirements.txt; the engine passes forward(cache=...)
# The suite's files that need none of gradio, plotly, hypothesis, a browser or the real SmolLM2
# weights, most GPU-relevant first, and the tests in them that are slow CPU-only statistics.
OTHER_TESTS = (
    "tests/test_engine.py", "tests/test_exittrain.py", "tests/test_report.py", "tests/test_distill.py",
    "tests/test_gpu_check.py", "tests/test_tree.py", "tests/test_layers.py", "tests/test_verify.py",
)
OTHER_TESTS_DESELECT = "not sampling_is_lossless and not ablation and not output_block_matches_exact_target_law and not exit_law_and_coverage_bound"


@dataclass(frozen=True)
class Options:
    """What every in-process step reads: the device, the size, and a scratch folder."""

    device: str = "cuda"
    quick: bool = False  # small sizes (the CPU test suite runs the steps this way)
    work: Path = Path(tempfile.gettempdir())


def ok_result(summary: str, problems: list[str], **data) -> dict:
    """A step's result: ``ok`` when there are no problems; ``summary`` is one line for the table."""
    return {"ok": not problems, "summary": summary, "problems": problems, **data}


# ====================================================================== the steps
def step_environment(options: Options) -> dict:
    """Versions and the device; fails when transformers predates the engine's ``cache=``."""
    problems = []
    versions = {}
    for name in ("torch", "transformers", "huggingface_hub", "tokenizers", "accelerate", "safetensors", "numpy", "scipy"):
        try:
            versions[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            versions[name] = None
    cuda = options.device.startswith("cuda")
    info = {"python": platform.python_version(), "versions": versions, "transformers_file": transformers.__file__, **machine_info(options.device if not cuda or torch.cuda.is_available() else "cpu")}
    knows_cache = "cache" in inspect.signature(LlamaModel.forward).parameters
    info["llama_forward_knows_cache"] = knows_cache
    if Version(transformers.__version__) < MIN_TRANSFORMERS or not knows_cache:
        problems.append(
            f"transformers {transformers.__version__} < {MIN_TRANSFORMERS} (forward knows cache=: {knows_cache}): the engine's "
            "KV cache would be ignored; carry a newer wheel in .whl/ (see scripts/gpu-check.sh)"
        )
    if cuda:
        if not torch.cuda.is_available():
            problems.append("CUDA was asked for but torch sees no CUDA device")
        else:
            properties = torch.cuda.get_device_properties(0)
            info.update(
                cuda=torch.version.cuda, capability=list(torch.cuda.get_device_capability(0)), memory_gib=round(properties.total_memory / 2**30, 1),
                bf16_supported=torch.cuda.is_bf16_supported(), tf32_matmul=torch.backends.cuda.matmul.allow_tf32,
            )
    summary = f"torch {versions['torch']}, transformers {versions['transformers']}, {info.get('gpu', options.device)}"
    return ok_result(summary, problems, info=info)


def _greedy_pair_runs(bundle, drafters, budgets, prompts, new_tokens) -> dict:
    """{(drafter, budget, prompt index): speculative tokens} and {prompt index: autoregressive tokens}."""
    speculative, reference = {}, {}
    for i, ids in enumerate(prompts):
        config = DecodeConfig(temperature=0.0, max_new_tokens=new_tokens, stop_at_eos=False)
        reference[i] = autoregressive_generate(bundle.runner, ids, config).token_ids
        for name in drafters:
            for budget in budgets:
                _, summary = run_to_end(speculative_generate(Request(bundle.runner, bundle.drafter(name), ids, replace(config, budget=budget))))
                speculative[name, budget, i] = summary.token_ids
    return {"speculative": speculative, "reference": reference}


def step_greedy(options: Options) -> dict:
    """Greedy speculation = greedy decoding on the embedded tiny pair, on ``options.device``.

    float32: token for token, and (on a GPU) the same tokens as the CPU's float32 run;
    bfloat16: every emitted token is the argmax of one causal forward up to rounding ties
    (``tev.bench.exactness.rounding_tie``), which also bounds where the two runs may part.
    """
    drafters = ("block",) if options.quick else ("block", "chain")
    budgets = (8,) if options.quick else (8, 32)
    new_tokens = 12 if options.quick else 48
    count = 1 if options.quick else 3
    problems, rows = [], []
    cpu = load_bundle(pair="tiny", device="cpu", dtype="float32")
    prompt_set = load_prompt_set("heldout")
    prompts = [fit_prompt(cpu.tokenizer, p, cpu.context_length - new_tokens) for p in prompt_set[:: max(1, len(prompt_set) // count)][:count]]
    on_cpu = _greedy_pair_runs(cpu, drafters, budgets, prompts, new_tokens) if options.device != "cpu" else None
    for dtype in ("float32", "bfloat16"):
        bundle = load_bundle(pair="tiny", device=options.device, dtype=dtype)
        runs = _greedy_pair_runs(bundle, drafters, budgets, prompts, new_tokens)
        equal, worst_ratio = 0, 0.0
        labelled = [(f"{dtype} autoregressive prompt {i}", i, tokens, None) for i, tokens in runs["reference"].items()]
        labelled += [(f"{dtype} {name} B={budget} prompt {i}", i, tokens, (name, budget, i)) for (name, budget, i), tokens in runs["speculative"].items()]
        for label, i, tokens, key in labelled:
            reference = runs["reference"][i]
            if key is not None:
                differ = first_difference(tokens, reference)
                equal += differ is None
                if dtype == "float32" and differ is not None:
                    problems.append(f"{label}: speculation parts from greedy decoding at token {differ}")
            if dtype == "float32" and on_cpu is not None and tokens != (on_cpu["reference"][i] if key is None else on_cpu["speculative"][key]):
                problems.append(f"{label}: {options.device} and CPU tokens differ in float32")
            if dtype == "bfloat16":  # rounding may part two runs at a near-tie; every token stays a near-argmax
                margin, scale = greedy_margins(bundle.target, prompts[i], tokens)
                ratio = float((margin / rounding_tie(torch.bfloat16, scale)).max())
                worst_ratio = max(worst_ratio, ratio)
                if ratio > 1:
                    problems.append(f"{label}: a token lies {ratio:.1f} rounding ties below the argmax")
        rows.append({"dtype": dtype, "runs": len(runs["speculative"]), "equal_token_for_token": equal, "worst_margin_over_tie": worst_ratio})
    summary = "; ".join(f"{r['dtype']}: {r['equal_token_for_token']}/{r['runs']} equal" for r in rows)
    markdown = ["| dtype | runs | equal token for token | worst margin / rounding tie |", "|---|---|---|---|"]
    markdown += [f"| {r['dtype']} | {r['runs']} | {r['equal_token_for_token']} | {r['worst_margin_over_tie']:.2f} |" for r in rows]
    return ok_result(summary, problems, rows=rows, cpu_compared=on_cpu is not None, markdown=markdown)


def _real_tree(options: Options, budget: int, temperature: float):
    """(tree, rows): a block-drafter tree of the embedded tiny pair on a held-out prompt
    and the target's rows on it (dtype "auto": bfloat16 on a GPU, float32 on a CPU)."""
    bundle = load_bundle(pair="tiny", device=options.device, dtype="auto")
    drafter = bundle.drafter("block")
    ids = fit_prompt(bundle.tokenizer, load_prompt_set("heldout")[0], 200)
    session = CausalLMSession(bundle.runner, feature_layers=drafter.feature_layers)
    state = drafter.new_state()
    prefill(session, ids, state)
    tree = drafter.propose(DraftContext(ids, max_depth=room_left(session)), budget, state)
    return tree, session.forward_tree(tree).rows(SamplingLaw(temperature))


def step_chi_square(options: Options) -> dict:
    """Each sampling verifier's output blocks against the exact block law of a real tree."""
    temperature = 1.0
    tree, rows = _real_tree(options, 8 if options.quick else 32, temperature)
    law = exact_block_law(tree, rows.all_rows().double().cpu())
    bound = sum(probability * len(block) for block, probability in law.items())  # E[L] = 1 + C(T) under the exact law
    draws = 500 if options.quick else 40_000
    problems, results = [], []
    for index, name in enumerate(SAMPLING_VERIFIERS):
        generator = torch.Generator(device=options.device).manual_seed(index)
        start = time.perf_counter()
        verdicts = [verify_rows(name, tree, rows, generator) for _ in range(draws)]
        seconds = time.perf_counter() - start
        try:
            statistic, p_value, dof = chi_square_against(law, [tuple(v.block_tokens(tree)) for v in verdicts])
        except AssertionError as error:  # a block the exact law gives probability 0
            statistic, p_value, dof = math.inf, 0.0, 0
            problems.append(f"{name}: {error}")
        lengths = torch.tensor([v.block_length for v in verdicts], dtype=torch.float64)
        results.append({
            "verifier": name, "draws": draws, "chi2": statistic, "dof": dof, "p_value": p_value,
            "mean_block_length": float(lengths.mean()), "standard_error": float(lengths.std() / math.sqrt(draws)), "ms_per_verdict": 1e3 * seconds / draws,
        })
        if p_value <= ALPHA and math.isfinite(statistic):
            problems.append(f"{name}: chi2={statistic:.1f}, dof={dof}, p={p_value:.2e} against the exact block law")
    for r in results:
        if abs(r["mean_block_length"] - bound) > 4 * r["standard_error"] + 1e-9:
            problems.append(f"{r['verifier']}: mean L {r['mean_block_length']:.3f} vs 1 + C = {bound:.3f} (4 standard errors: {4 * r['standard_error']:.3f})")
    power = power_against_shift(law, draws) if sum(q * draws >= 5 for q in law.values()) >= 2 else 0.0
    summary = f"{tree.num_nodes} nodes, V={rows.vocab_size}, {draws} draws each (power {power:.2f}); p = " + ", ".join(f"{r['verifier']} {r['p_value']:.3g}" for r in results)
    markdown = [f"Tree of {tree.num_nodes} nodes, {rows.hidden.dtype if rows.hidden is not None else rows.logits.dtype} rows, T = {temperature}, 1 + C = {bound:.3f}.", "",
                "| verifier | draws | chi2 | dof | p | mean L | ms per verdict |", "|---|---|---|---|---|---|---|"]
    markdown += [f"| {r['verifier']} | {r['draws']} | {r['chi2']:.1f} | {r['dof']} | {r['p_value']:.3g} | {r['mean_block_length']:.3f} | {r['ms_per_verdict']:.3f} |" for r in results]
    return ok_result(summary, problems, results=results, tau_bound=bound, power=power, markdown=markdown)


# what the code documents (tev/core/verify.py, tev/engine/round.py); sequential has no promise
VERDICT_SYNCS = {"tev": 1, "predraw": 1, "greedy": 1}
DRAFT_SYNCS = 1  # the block drafter's marginals come to the host, where the tree is built


def _count_round_syncs(bundle, drafter_name: str, verifier: str, temperature: float, rounds: int) -> dict:
    """Host syncs of ``rounds`` speculation rounds (after one warm-up), with a non-syncing timer."""
    drafter = bundle.drafter(drafter_name)
    ids = fit_prompt(bundle.tokenizer, load_prompt_set("heldout")[1], 200)
    session = CausalLMSession(bundle.runner, feature_layers=drafter.feature_layers)
    committed, state = list(ids), drafter.new_state()
    prefill(session, ids, state)
    generator = torch.Generator(device=session.device).manual_seed(0)
    counts, over, sites = [], [], Counter()
    for index in range(rounds + 1):
        with count_host_syncs() as syncs:
            step = speculation_round(session, drafter, committed, 32, verifier, SamplingLaw(temperature), generator, state, StageTimer())
        committed += step.verdict.block_tokens(step.tree)
        if index == 0:
            continue
        counts.append(len(syncs))
        sites.update(syncs)
        if verifier in VERDICT_SYNCS:
            leaf_exit = verifier == "greedy" and bool(step.tree.is_leaf[step.verdict.exit_node]) and step.tree.num_nodes > 1
            limit = DRAFT_SYNCS + VERDICT_SYNCS[verifier] + leaf_exit
            if len(syncs) > limit:
                over.append(f"round {index}: {len(syncs)} > {limit}")
    return {"drafter": drafter_name, "verifier": verifier, "temperature": temperature, "per_round": counts, "sites": dict(sites.most_common()), "over_limit": over}


def step_host_syncs(options: Options) -> dict:
    """Host syncs per round (CUDA's sync debug mode), against what the code documents."""
    if not options.device.startswith("cuda"):
        return ok_result("skipped: counting syncs needs CUDA", [], skipped=True)
    bundle = load_bundle(pair="tiny", device=options.device, dtype="bfloat16")
    rounds = 8
    cases = [("block", "tev", 1.0), ("block", "predraw", 1.0), ("block", "greedy", 0.0), ("chain", "tev", 1.0), ("block", "sequential", 1.0)]
    results = [_count_round_syncs(bundle, *case, rounds) for case in cases]
    # the decode loop as users run it (its StageTimer synchronises around each stage on CUDA)
    ids = fit_prompt(bundle.tokenizer, load_prompt_set("heldout")[2], 200)
    with count_host_syncs() as syncs:
        _, summary = run_to_end(speculative_generate(Request(bundle.runner, bundle.drafter("block"), ids, DecodeConfig(budget=32, temperature=1.0, max_new_tokens=48, stop_at_eos=False))))
    loop = {"rounds": summary.rounds, "syncs": len(syncs), "per_round": len(syncs) / max(1, summary.rounds), "sites": dict(Counter(syncs).most_common())}
    problems = [f"{r['drafter']}+{r['verifier']}: {item}; sites {r['sites']}" for r in results for item in r["over_limit"]]
    summary_line = "; ".join(f"{r['drafter']}+{r['verifier']} max {max(r['per_round'])}/round" for r in results) + f"; decode loop {loop['per_round']:.1f}/round"
    markdown = ["| drafter + verifier | syncs per round (after warm-up) | sites (count over all rounds) |", "|---|---|---|"]
    markdown += [f"| {r['drafter']}+{r['verifier']} | {r['per_round']} | {', '.join(f'{k} x{v}' for k, v in r['sites'].items())} |" for r in results]
    markdown += ["", f"Decode loop (speculative_generate, B=32, T=1, its own StageTimer): {loop['syncs']} syncs over {loop['rounds']} rounds; sites: "
                 + ", ".join(f"{k} x{v}" for k, v in loop["sites"].items())]
    return ok_result(summary_line, problems, cases=results, decode_loop=loop, markdown=markdown)


def _run_cli(argv: list[str], work: Path, name: str) -> dict:
    """``python -m tev ARGV --json FILE`` (already its own process: a step's child runs it); returns the JSON it wrote."""
    target = work / f"{name}.json"
    code = subprocess.run([sys.executable, "-m", "tev", *argv, "--json", str(target)], cwd=REPO).returncode
    if code != 0:
        raise RuntimeError(f"python -m tev {' '.join(argv)} exited with {code}")
    return json.loads(target.read_text())


def step_bench_verifiers(options: Options) -> dict:
    """``python -m tev bench verifiers`` on the device: the verdict stage from target logits."""
    sizes = ["--budgets", "8", "--vocabs", "512", "--repeats", "2"] if options.quick else ["--budgets", "32", "64", "128", "--vocabs", "49152", "151936", "--repeats", "20"]
    result = _run_cli(["bench", "verifiers", "--device", options.device, *sizes], options.work, "bench-verifiers")
    problems = [f"B={r['budget']} V={r['vocab']} {name}: no finite time" for r in result["rows"] for name in SAMPLING_VERIFIERS if not math.isfinite(r[name]["median"])]
    markdown = ["| B | V | TEV ms | predraw ms | sequential ms | TEV / predraw |", "|---|---|---|---|---|---|"]
    markdown += [f"| {r['budget']} | {r['vocab']} | {1e3 * r['tev']['median']:.3f} | {1e3 * r['predraw']['median']:.3f} | {1e3 * r['sequential']['median']:.3f} | {r['tev_over_predraw']:.2f}x |" for r in result["rows"]]
    summary = ", ".join(f"B={r['budget']} V={r['vocab']}: TEV {1e3 * r['tev']['median']:.2f} ms" for r in result["rows"][:3])
    return ok_result(summary, problems, result=result, markdown=markdown)


def step_bench_e2e(options: Options) -> dict:
    """``python -m tev bench e2e --pair tiny`` on the device (dtype auto: bfloat16 on a GPU)."""
    sizes = ["--budgets", "8", "--num-prompts", "1", "--max-new-tokens", "8"] if options.quick else ["--budgets", "16", "32", "64", "--num-prompts", "3", "--max-new-tokens", "64"]
    result = _run_cli(["bench", "e2e", "--pair", "tiny", "--device", options.device, "--temperatures", "0", "1", "--skip-memory", *sizes], options.work, "bench-e2e")
    problems = [f"T={r['temperature']} B={r['budget']} {r['method']}: {r['tokens_per_second']} tok/s" for r in result["rows"] if not r["tokens_per_second"] > 0]
    # every round's block holds at least the bonus token (tau, the tokens emitted, may fall below 1 where a round ends at EOS)
    problems += [f"T={r['temperature']} B={r['budget']} {r['method']}: mean block length {r['mean_block_length']}" for r in result["rows"]
                 if "+" in r["method"] and not r["mean_block_length"] >= 1.0]
    markdown = ["| T | B | method | tau | 1 + C | tok/s | vs own AR | vs HF generate | draft / build / verify / decision / commit ms |", "|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        stages = " / ".join(f"{v:.2f}" for v in r["stage_ms_per_round"].values()) if "+" in r["method"] else ""
        markdown.append(f"| {r['temperature']:g} | {r['budget']} | {r['method']} | {r['tau']:.2f} | {r['tau_bound']:.2f} | {r['tokens_per_second']:.1f} | {r['speedup']:.2f}x | {r['speedup_vs_hf']:.2f}x | {stages} |")
    best = max((r for r in result["rows"] if "+" in r["method"]), key=lambda r: r["speedup"], default=None)
    summary = f"best {best['method']} T={best['temperature']:g} B={best['budget']}: {best['tokens_per_second']:.0f} tok/s, {best['speedup']:.2f}x own AR" if best else "no speculative rows"
    return ok_result(summary, problems, result=result, markdown=markdown)


def smollm2_shape_config(quick: bool) -> LlamaConfig:
    """SmolLM2-135M's shape (random weights), or a miniature of it for the CPU test."""
    if quick:
        shape = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=1024, max_position_embeddings=2048)
    else:
        shape = dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30, num_attention_heads=9, num_key_value_heads=3, head_dim=64, vocab_size=49152, max_position_embeddings=8192)
    return LlamaConfig(**shape, tie_word_embeddings=True, rope_parameters={"rope_type": "default", "rope_theta": 100000.0}, rms_norm_eps=1e-5, bos_token_id=1, eos_token_id=2)


def _median_ms(fn, device: str, repeats: int) -> float:
    for _ in range(2):
        fn()  # warm-up: kernels, cuBLAS handles, the allocator
    return 1e3 * spread(time_once(fn, device) for _ in range(repeats))["median"]


def step_smollm2_shape(options: Options) -> dict:
    """Forward costs that decide speculation on SmolLM2-135M's shape, in bfloat16 on the device:
    one-token forward vs a 32- and a 64-node tree forward over a KV cache (CUDA events), and the
    verdict stage on the tree's rows (the lazy head projects only what each verifier reads)."""
    config = smollm2_shape_config(options.quick)
    folder = options.work / "smollm2-shape"
    torch.manual_seed(0)
    LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(folder)  # the loader rebuilds the rotary buffers in float32
    dtype = "bfloat16" if options.device.startswith("cuda") else "float32"
    model = load_causal_lm(folder, device=options.device, dtype=dtype)
    contexts = (32,) if options.quick else (256, 1024)
    sizes = (32, 64)
    repeats = 3 if options.quick else 20
    problems, rows = [], []
    generator = torch.Generator(device=options.device).manual_seed(0)
    trees = {size: synthetic_case(size, config.vocab_size, seed=size)[0] for size in sizes}
    for context in contexts:
        session = CausalLMSession(Target(model))  # transformers' forward on the device
        ids = torch.randint(3, config.vocab_size, (context,), generator=torch.Generator().manual_seed(context)).tolist()
        session.extend(ids[:-1])
        base = session.length

        def one_token():
            session.extend(ids[-1:])
            session.rollback(base)

        row = {"context": context, "one_token_ms": _median_ms(one_token, options.device, repeats)}
        for size, tree in trees.items():
            tree = DraftTree.from_parents([ids[-1]] + tree.tokens_list[1:], tree.parents_list)  # rooted at the context's last token

            def tree_forward(tree=tree):
                session.forward_tree(tree)
                session.rollback(base)

            row[f"tree{size}_ms"] = _median_ms(tree_forward, options.device, repeats)
            row[f"tree{size}_over_one"] = row[f"tree{size}_ms"] / row["one_token_ms"]
            output = session.forward_tree(tree)
            session.rollback(base)
            for name, temperature in (("tev", 1.0), ("predraw", 1.0), ("greedy", 0.0)):
                row[f"{name}{size}_ms"] = _median_ms(lambda: verify_rows(name, tree, output.rows(temperature), generator), options.device, repeats)
            # the root's row of a tree forward is the one-token forward of the root token
            one = session.extend(ids[-1:]).last_logits()
            session.rollback(base)
            root = output.rows(1.0).logits_at(torch.zeros(1, dtype=torch.long, device=one.device))[0]
            difference = float((root - one).abs().max())
            row[f"tree{size}_root_vs_one_token_max_abs"] = difference
            if difference > 0.05 * float(one.abs().max()) + 1e-3:
                problems.append(f"context {context}, tree {size}: the root row differs from a one-token forward by {difference:.3g}")
        rows.append(row)
    memory = torch.cuda.max_memory_allocated() / 2**20 if options.device.startswith("cuda") else None
    problems += [f"context {r['context']}: {k} = {v}" for r in rows for k, v in r.items() if isinstance(v, float) and not math.isfinite(v)]
    markdown = ["| context | one token ms | tree 32 ms (x one) | tree 64 ms (x one) | TEV 32 / 64 ms | predraw 32 / 64 ms | greedy 32 / 64 ms |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        markdown.append(
            f"| {r['context']} | {r['one_token_ms']:.2f} | {r['tree32_ms']:.2f} ({r['tree32_over_one']:.2f}x) | {r['tree64_ms']:.2f} ({r['tree64_over_one']:.2f}x) | "
            f"{r['tev32_ms']:.2f} / {r['tev64_ms']:.2f} | {r['predraw32_ms']:.2f} / {r['predraw64_ms']:.2f} | {r['greedy32_ms']:.2f} / {r['greedy64_ms']:.2f} |"
        )
    summary = "; ".join(f"ctx {r['context']}: 1 tok {r['one_token_ms']:.2f} ms, tree64 {r['tree64_over_one']:.2f}x" for r in rows)
    return ok_result(summary, problems, rows=rows, dtype=dtype, peak_memory_mib=memory, layers=config.num_hidden_layers, markdown=markdown)


STEPS = {
    "environment": step_environment,
    "greedy": step_greedy,
    "chi-square": step_chi_square,
    "host-syncs": step_host_syncs,
    "bench-verifiers": step_bench_verifiers,
    "bench-e2e": step_bench_e2e,
    "smollm2-shape": step_smollm2_shape,
}


# ====================================================================== running them
@dataclass(frozen=True)
class Step:
    """One process to run: ``command`` with at most ``timeout`` seconds; its output goes to
    ``log`` (appended) or, when None, to this process's output."""

    name: str
    what: str
    timeout: float
    command: tuple[str, ...]
    log: Path | None = None
    result: Path | None = None  # the JSON an in-process step writes
    no_skips: bool = False  # a pytest step whose tests must all run (none skipped)


def plan(options: Options, out: Path, only: tuple[str, ...] = ()) -> list[Step]:
    """The steps in order; ``only`` keeps the named ones."""
    python = sys.executable
    pytest = (python, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--durations=8")
    quick = ("--quick",) if options.quick else ()

    def inside(name: str, what: str, timeout: float) -> Step:
        result = options.work / f"step-{name}.json"
        return Step(name, what, timeout, (python, "-m", MODULE, "--run-step", name, "--device", options.device, "--work", str(options.work), "--result", str(result), *quick), result=result)

    steps = [
        inside("environment", "versions, device, transformers >= 5.24", 60),
        Step("pytest-cuda", "pytest tests/test_cuda.py", 200, (*pytest, "tests/test_cuda.py"), log=out / "pytest.log", no_skips=options.device.startswith("cuda")),
        inside("greedy", "embedded tiny pair: greedy speculation = greedy decoding (float32 exact, = CPU; bfloat16 up to ties)", 120),
        inside("chi-square", "each verifier's blocks vs the exact block law, real tree, device rows", 150),
        inside("host-syncs", "host syncs per verdict and per round, with their sites", 60),
        inside("bench-verifiers", "python -m tev bench verifiers", 90),
        inside("bench-e2e", "python -m tev bench e2e --pair tiny", 120),
        inside("smollm2-shape", "SmolLM2-135M-shaped random model: one-token vs 32/64-node tree forwards, verdicts", 150),
        Step("pytest-other", "the rest of the suite that runs there", 150, (*pytest, *OTHER_TESTS, "-k", OTHER_TESTS_DESELECT), log=out / "pytest.log"),
    ]
    return [s for s in steps if not only or s.name in only]


def _pytest_counts(text: str) -> dict:
    """{"passed": 3, "failed": 1, ...} from pytest's last summary line."""
    lines = [line for line in text.splitlines() if re.search(r"\d+ (passed|failed|error|skipped|deselected)", line)]
    return {word: int(count) for count, word in re.findall(r"(\d+) (passed|failed|errors?|skipped|deselected|xfailed|xpassed)", lines[-1])} if lines else {}


def run_step(step: Step, seconds: float) -> dict:
    """Run one step for at most ``seconds``; a timeout kills its whole process group."""
    started = time.perf_counter()
    record = {"name": step.name, "what": step.what, "timeout": round(seconds), "command": " ".join(step.command)}
    if step.result is not None:
        step.result.unlink(missing_ok=True)
    with contextlib.ExitStack() as stack:
        if step.log is not None:
            handle = stack.enter_context(open(step.log, "a"))
            handle.write(f"\n===== {step.name}: {record['command']}\n")
            handle.flush()
            output = {"stdout": handle, "stderr": subprocess.STDOUT}
        else:
            output = {}
        process = subprocess.Popen(step.command, cwd=REPO, start_new_session=True, **output)
        try:
            record["returncode"] = process.wait(timeout=seconds)
            timed_out = False
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            record["returncode"], timed_out = None, True
    record["seconds"] = round(time.perf_counter() - started, 1)
    details = json.loads(step.result.read_text()) if step.result is not None and step.result.is_file() else {}
    if step.log is not None:
        text = step.log.read_text()
        counts = _pytest_counts(text[text.rfind(f"===== {step.name}:"):])
        details = {"ok": record["returncode"] == 0, "summary": ", ".join(f"{v} {k}" for k, v in counts.items()), "counts": counts, "problems": []}
        if step.no_skips and counts.get("skipped"):
            details["ok"] = False
            details["problems"].append(f"{counts['skipped']} tests skipped on a CUDA machine (see pytest.log)")
    record["details"] = details
    record["ok"] = not timed_out and record["returncode"] == 0 and bool(details.get("ok", step.result is None))
    if timed_out:
        record["error"] = f"timed out after {seconds:.0f} s"
    elif not record["ok"]:
        record["error"] = details.get("error") or "; ".join(details.get("problems", [])) or f"exit status {record['returncode']}"
    return record


def write_summary(out: Path, meta: dict, records: list[dict]) -> None:
    """``gpu-check.json`` (everything) and ``gpu-check.md`` (the summary), rewritten whole."""
    payload = {**meta, "ok": all(r["ok"] for r in records), "steps": records}
    write_result(out / "gpu-check.json", "gpu-check", payload, default=str)
    lines = [f"# GPU check, {meta['started']}", "", f"Device {meta['device']}; {meta['seconds_allowed']} s allowed; "
             f"{sum(r['ok'] for r in records)} of {len(records)} steps passed.", "",
             "| step | result | seconds | summary |", "|---|---|---|---|"]
    for r in records:
        result = "pass" if r["ok"] else ("skipped" if r.get("skipped") else "FAIL")
        summary = r["details"].get("summary", "") if isinstance(r.get("details"), dict) else ""
        lines.append(f"| {r['name']} | {result} | {r.get('seconds', 0)} | {str(summary).replace('|', '/')} |")
    problems = [(r["name"], r["error"]) for r in records if not r["ok"]]
    if problems:
        lines += ["", "## Problems", ""] + [f"- **{name}**: {error}" for name, error in problems]
    for r in records:
        if r.get("details", {}).get("markdown"):
            lines += ["", f"## {r['name']}", "", *r["details"]["markdown"]]
    (out / "gpu-check.md").write_text("\n".join(lines) + "\n")


def run_all(steps: list[Step], out: Path, seconds: float, meta: dict) -> list[dict]:
    """Every step in order within ``seconds``; the summary is rewritten after each."""
    deadline = time.monotonic() + seconds
    records = []
    for step in steps:
        left = deadline - time.monotonic() - 5  # room to write the summary
        if left < 20:
            records.append({"name": step.name, "what": step.what, "ok": False, "skipped": True, "seconds": 0, "details": {}, "error": "not run: the time allowed was spent"})
        else:
            print(f"\n##### {step.name} (at most {min(step.timeout, left):.0f} s): {step.what}", flush=True)
            records.append(run_step(step, min(step.timeout, left)))
            print(f"##### {step.name}: {'pass' if records[-1]['ok'] else 'FAIL'} in {records[-1]['seconds']} s {records[-1].get('error', '')}", flush=True)
        write_summary(out, meta, records)
    return records


def run_one_step(name: str, options: Options, result: Path) -> int:
    """The child side of an in-process step: run it and write its result JSON."""
    try:
        details = STEPS[name](options)
    except Exception as error:  # recorded, not raised: the parent reads the file
        details = {"ok": False, "error": f"{type(error).__name__}: {error}", "traceback": traceback.format_exc()[-4000:], "problems": []}
        print(details["traceback"], file=sys.stderr)
    result.write_text(json.dumps(details, indent=1, default=str))
    print(f"[{name}] {'ok' if details['ok'] else 'problems'}: {details.get('summary', '')}", flush=True)
    for problem in details.get("problems", []):
        print(f"[{name}]   {problem}", flush=True)
    return 0 if details["ok"] else 1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--out", default=os.environ.get("OUT") or "runs/gpu-check", help="folder for gpu-check.json, gpu-check.md, pytest.log (default: $OUT)")
    parser.add_argument("--device", default="cuda", help="cuda (the point of it) or cpu (with --quick, to try the check)")
    parser.add_argument("--quick", action="store_true", help="small sizes everywhere (seconds on a CPU)")
    parser.add_argument("--seconds", type=float, default=420.0, help="seconds allowed for all steps together (gpu-check.sh kills at 480)")
    parser.add_argument("--only", nargs="+", default=(), choices=[*STEPS, "pytest-cuda", "pytest-other"], help="run only these steps")
    parser.add_argument("--work", default=None, help="scratch folder (default: a new temporary one)")
    parser.add_argument("--run-step", choices=STEPS, help=argparse.SUPPRESS)  # the child side of one step
    parser.add_argument("--result", help=argparse.SUPPRESS)


def run(args: argparse.Namespace) -> int:
    """Every step (or ``--only`` some) into ``--out``; 0 when all passed."""
    work = Path(args.work) if args.work else Path(tempfile.mkdtemp(prefix="gpu-check-"))
    work.mkdir(parents=True, exist_ok=True)
    options = Options(device=args.device, quick=args.quick, work=work)
    if args.run_step:
        return run_one_step(args.run_step, options, Path(args.result))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    meta = {"started": datetime.now(timezone.utc).isoformat(timespec="seconds"), "device": args.device, "quick": args.quick, "seconds_allowed": args.seconds}
    records = run_all(plan(options, out, tuple(args.only)), out, args.seconds, meta)
    print(f"\nsummary: {out / 'gpu-check.md'}; {sum(r['ok'] for r in records)} of {len(records)} steps passed", flush=True)
    return 0 if all(r["ok"] for r in records) else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=f"python -m {MODULE}", description=__doc__.split("\n\n")[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
