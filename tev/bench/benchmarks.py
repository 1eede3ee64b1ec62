"""Benchmarks (commands, never timed tests). ``python -m tev bench {verifiers,...}``.

Every comparison interleaves its methods in one run (shuffled order per repeat) so the
machine's drift hits all alike, and reports medians with the interquartile range.
"""

from __future__ import annotations

import argparse
import json
import random

import torch
from tqdm import tqdm

from tev.util.timing import cuda_event_time, machine_info, median, quantile, wall_time
from tev.core.tree import DraftTree
from tev.core.verify import TargetRows, verify_rows

__all__ = ["synthetic_case", "bench_verifiers", "verifiers_command", "e2e_command"]


def synthetic_case(budget: int, vocab: int, horizon: int = 8, seed: int = 0, device="cpu"):
    """A DDTree of ``budget`` nodes from peaked random draft marginals, and target logits.

    Returns ``(tree, logits)``, ``logits``: `Tensor[budget + 1, vocab]` on ``device``. The
    target rows are peaked like a language model's (a few likely tokens, a long tail), and the
    draft marginals put the tree's tokens among the target's likely ones.
    """
    generator = torch.Generator().manual_seed(seed)
    # Zipf-like marginals that flatten with depth, as a trained drafter's do.
    ranks = torch.arange(1, vocab + 1, dtype=torch.float32)
    exponents = torch.linspace(2.2, 1.4, horizon).unsqueeze(1)  # [K, 1]
    log_zipf = torch.log_softmax(-exponents * torch.log(ranks), dim=-1)  # [K, V]
    permutation = torch.stack([torch.randperm(vocab, generator=generator) for _ in range(horizon)])
    logq = torch.empty(horizon, vocab).scatter_(1, permutation, log_zipf)
    tree = DraftTree.from_marginals(logq, budget, root_token=0)
    logits = torch.randn(tree.num_nodes, vocab, generator=generator) * 3.0
    return tree, logits.to(device)


def _time_once(fn, device) -> float:
    if torch.device(device).type == "cuda":
        return cuda_event_time(fn, device)
    return wall_time(fn)


def bench_verifiers(
    budgets=(16, 32, 64, 128, 256),
    vocabs=(8192, 151936),
    verifiers=("tev", "predraw", "sequential"),
    repeats: int = 60,
    temperature: float = 1.0,
    device: str = "cpu",
    seed: int = 0,
    progress: bool = True,
) -> dict:
    """Time the verifier-decision stage from target logits, interleaved, on the same trees.

    The decision stage is everything after the target forward: normalising the rows it
    needs, drawing, walking the tree, one host sync. Returns per (budget, vocab) the
    median, q25 and q75 seconds per verifier and the TEV / predraw ratio of medians.
    """
    rows_out = []
    order_rng = random.Random(seed)
    cases = [(b, v) for v in vocabs for b in budgets]
    bar = tqdm(cases, desc="bench verifiers", disable=not progress)
    for budget, vocab in bar:
        bar.set_postfix(B=budget, V=vocab)
        tree, logits = synthetic_case(budget, vocab, seed=seed + budget, device=device)
        rows = TargetRows(logits=logits, temperature=temperature)
        generator = torch.Generator(device=device).manual_seed(seed)
        times: dict[str, list[float]] = {name: [] for name in verifiers}
        for name in verifiers:  # warm-up
            verify_rows(name, tree, rows, generator)
        for _ in range(repeats):
            order = list(verifiers)
            order_rng.shuffle(order)
            for name in order:
                times[name].append(_time_once(lambda: verify_rows(name, tree, rows, generator), device))
        row = {"budget": budget, "vocab": vocab, "nodes": tree.num_nodes, "internal_nodes": int((~tree.is_leaf).sum())}
        for name in verifiers:
            row[name] = {"median": median(times[name]), "q25": quantile(times[name], 0.25), "q75": quantile(times[name], 0.75)}
        if "tev" in verifiers and "predraw" in verifiers:
            row["tev_over_predraw"] = row["tev"]["median"] / row["predraw"]["median"]
        rows_out.append(row)
    return {"machine": machine_info(device), "temperature": temperature, "repeats": repeats, "seed": seed, "rows": rows_out}


def format_verifier_table(result: dict) -> str:
    names = [k for k in ("tev", "predraw", "sequential") if k in result["rows"][0]]
    header = "| B | V | internal nodes | " + " | ".join(f"{n} ms (IQR)" for n in names) + " | TEV / predraw |"
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    for row in result["rows"]:
        cells = [str(row["budget"]), str(row["vocab"]), str(row["internal_nodes"])]
        for name in names:
            t = row[name]
            cells.append(f"{1e3 * t['median']:.3f} ({1e3 * t['q25']:.3f}-{1e3 * t['q75']:.3f})")
        cells.append(f"{row.get('tev_over_predraw', float('nan')):.2f}x")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def verifiers_command(args) -> None:
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: --device cuda was asked but no CUDA device is available")
    result = bench_verifiers(
        budgets=args.budgets, vocabs=args.vocabs, repeats=args.repeats, temperature=args.temperature, device=args.device, seed=args.seed
    )
    info = result["machine"]
    print(f"verifier decision stage, T={args.temperature}, {args.repeats} interleaved repeats, median (IQR)")
    print(f"machine: {info['cpu']}, {info['torch_threads']} threads, torch {info['torch']}, device {info['device']}" + (f" ({info['gpu']})" if "gpu" in info else ""))
    print(format_verifier_table(result))
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(result, handle, indent=2)


# --------------------------------------------------------------------------- decoding benchmarks
def fit_prompt(tokenizer, prompt: dict, limit: int) -> list[int]:
    """A prompt's ids (``prompt["ids"]`` or its encoded ``"text"``), left-truncated to ``limit``
    tokens so that generation has room; BOS, when present, is kept first."""
    from tev.engine.models import encode_prompt

    ids = list(prompt["ids"]) if "ids" in prompt else encode_prompt(tokenizer, prompt["text"])
    if len(ids) <= limit:
        return ids
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is not None and ids[0] == bos:
        return [bos] + ids[len(ids) - limit + 1 :]
    return ids[len(ids) - limit :]


def evaluate_drafter(
    target,
    tokenizer,
    drafter,
    prompts: list[dict],
    budgets=(8, 16, 32, 64),
    temperatures=(0.0, 1.0),
    max_new_tokens: int = 64,
    seed: int = 0,
    verifier: str = "tev",
    progress: bool = True,
    desc: str = "evaluate",
) -> list[dict]:
    """Measured ``tau`` (mean block length over all rounds) and mean ``1 + C`` per setting.

    Returns one row per (budget, temperature): ``tau``, its standard error over rounds,
    ``tau_bound``, the spread of per-prompt ``tau`` (q25/q75), rounds and tokens.
    """
    from tev.engine.decode import GenerationConfig, run_to_end, speculative_generate

    context = int(getattr(target.config, "max_position_embeddings", 1 << 30))
    encoded = [fit_prompt(tokenizer, p, context - max_new_tokens) for p in prompts]
    rows = []
    settings = [(b, t) for t in temperatures for b in budgets]
    bar = tqdm(total=len(settings) * len(encoded), desc=desc, disable=not progress)
    for budget, temperature in settings:
        lengths, bounds, per_prompt, tokens, seconds = [], [], [], 0, 0.0
        for i, ids in enumerate(encoded):
            config = GenerationConfig(budget=budget, temperature=temperature, verifier=verifier, max_new_tokens=max_new_tokens, seed=seed + i)
            _, summary = run_to_end(speculative_generate(target, drafter, ids, config, tokenizer))
            lengths += summary.block_lengths
            bounds += summary.tau_bounds
            per_prompt.append(summary.tau)
            tokens += len(summary.token_ids)
            seconds += summary.seconds
            bar.update(1)
        n = len(lengths)
        mean = sum(lengths) / n
        variance = sum((x - mean) ** 2 for x in lengths) / max(1, n - 1)
        rows.append(
            {
                "budget": budget,
                "temperature": temperature,
                "tau": mean,
                "tau_se": (variance / n) ** 0.5,
                "tau_bound": sum(bounds) / n,
                "prompt_tau_q25": quantile(per_prompt, 0.25),
                "prompt_tau_q75": quantile(per_prompt, 0.75),
                "rounds": n,
                "tokens": tokens,
                "tokens_per_second": tokens / seconds if seconds else float("nan"),
            }
        )
    bar.close()
    return rows


def format_tau_table(rows: list[dict]) -> str:
    lines = ["| T | B | tau (+- s.e.) | mean 1 + C | per-prompt tau q25-q75 | rounds |", "|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['temperature']:g} | {r['budget']} | {r['tau']:.3f} +- {r['tau_se']:.3f} | {r['tau_bound']:.3f} | "
            f"{r['prompt_tau_q25']:.2f}-{r['prompt_tau_q75']:.2f} | {r['rounds']} |"
        )
    return "\n".join(lines)


E2E_METHODS = (
    ("chain", "tev"),
    ("block", "predraw"),
    ("block", "tev"),
)


def bench_e2e(
    bundle,
    prompts: list[dict],
    budgets=(8, 16, 32, 64),
    temperatures=(0.0, 1.0),
    methods=E2E_METHODS,
    max_new_tokens: int = 64,
    repeats: int = 1,
    seed: int = 0,
    progress: bool = True,
) -> dict:
    """End-to-end decoding speed, all methods interleaved per (prompt, repeat).

    For each temperature and budget every method runs on every prompt, in a shuffled order
    alongside an autoregressive run of the same prompt; the speedup is the median over
    those runs of (method tokens/s) / (autoregressive tokens/s). At T = 0 every verifier is
    greedy, so methods that differ only in verifier are run once.
    """
    from tev.engine.decode import GenerationConfig, autoregressive_generate, run_to_end, speculative_generate

    device = next(bundle.target.parameters()).device
    encoded = [fit_prompt(bundle.tokenizer, p, bundle.context_length - max_new_tokens) for p in prompts]
    order_rng = random.Random(seed)
    results = []
    jobs = []
    for temperature in temperatures:
        names = []
        for drafter, verifier in methods:
            if drafter not in bundle.drafters:
                continue
            name = f"{drafter}+{'greedy' if temperature == 0 else verifier}"
            if name not in [n for n, _, _ in names]:
                names.append((name, drafter, verifier))
        for budget in budgets:
            jobs.append((temperature, budget, names))
    total = sum(len(names) + 1 for _, _, names in jobs) * len(encoded) * repeats
    bar = tqdm(total=total, desc="bench e2e", disable=not progress)
    for temperature, budget, names in jobs:
        runs = {name: [] for name, _, _ in names}
        runs["autoregressive"] = []
        for repeat in range(repeats):
            for i, ids in enumerate(encoded):
                config = GenerationConfig(budget=budget, temperature=temperature, max_new_tokens=max_new_tokens, seed=seed + 1000 * repeat + i)
                order = [("autoregressive", None, None)] + list(names)
                order_rng.shuffle(order)
                paired = {}
                for name, drafter, verifier in order:
                    if name == "autoregressive":
                        summary = autoregressive_generate(bundle.target, ids, config, bundle.tokenizer)
                    else:
                        run_config = GenerationConfig(**{**config.__dict__, "verifier": verifier})
                        _, summary = run_to_end(speculative_generate(bundle.target, bundle.drafter(drafter), ids, run_config, bundle.tokenizer))
                    paired[name] = summary
                    bar.update(1)
                for name, summary in paired.items():
                    runs[name].append({
                        "tokens_per_second": summary.tokens_per_second,
                        "tau": summary.tau,
                        "tau_bound": summary.mean_tau_bound,
                        "tokens": len(summary.token_ids),
                        "rounds": summary.rounds,
                        "stage_seconds": summary.stage_seconds,
                        "seconds": summary.seconds,
                        "speedup": summary.tokens_per_second / paired["autoregressive"].tokens_per_second,
                    })
        for name, items in runs.items():
            rounds = sum(x["rounds"] for x in items)
            stage_per_round = {}
            for stage in ("draft", "tree_build", "verify", "verify_decision", "commit"):
                stage_per_round[stage] = sum(x["stage_seconds"].get(stage, 0.0) for x in items) / max(1, rounds)
            results.append({
                "temperature": temperature,
                "budget": budget,
                "method": name,
                "tau": sum(x["tau"] * x["rounds"] for x in items) / max(1, rounds),
                "tau_bound": sum(x["tau_bound"] * x["rounds"] for x in items) / max(1, rounds),
                "tokens_per_second": median([x["tokens_per_second"] for x in items]),
                "tokens_per_second_q25": quantile([x["tokens_per_second"] for x in items], 0.25),
                "tokens_per_second_q75": quantile([x["tokens_per_second"] for x in items], 0.75),
                "speedup": median([x["speedup"] for x in items]),
                "speedup_q25": quantile([x["speedup"] for x in items], 0.25),
                "speedup_q75": quantile([x["speedup"] for x in items], 0.75),
                "stage_ms_per_round": {k: 1e3 * v for k, v in stage_per_round.items()},
                "runs": len(items),
            })
    bar.close()
    return {"machine": machine_info(device), "seed": seed, "max_new_tokens": max_new_tokens, "repeats": repeats, "prompts": len(encoded), "rows": results}


def format_e2e_table(result: dict) -> str:
    lines = [
        "| T | B | method | tau | 1 + C | tok/s (IQR) | speedup (IQR) | draft / build / verify / decision / commit ms per round |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        stages = " / ".join(f"{r['stage_ms_per_round'][k]:.2f}" for k in ("draft", "tree_build", "verify", "verify_decision", "commit"))
        lines.append(
            f"| {r['temperature']:g} | {r['budget']} | {r['method']} | {r['tau']:.2f} | {r['tau_bound']:.2f} | "
            f"{r['tokens_per_second']:.1f} ({r['tokens_per_second_q25']:.1f}-{r['tokens_per_second_q75']:.1f}) | "
            f"{r['speedup']:.2f}x ({r['speedup_q25']:.2f}-{r['speedup_q75']:.2f}) | {stages} |"
        )
    return "\n".join(lines)


def peak_memory_of_generate(extra_args: list[str] | None = None) -> float:
    """Peak resident memory (MB) of one ``python -m tev generate`` process."""
    import resource
    import subprocess
    import sys

    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    command = [sys.executable, "-m", "tev", "generate", "--prompt", "def fib(n):", "--max-new-tokens", "64", "--json"] + (extra_args or [])
    subprocess.run(command, check=True, capture_output=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return max(before, after) / 1024.0  # ru_maxrss is in KiB on Linux


def e2e_command(args) -> None:
    from tev.engine.models import load_bundle
    from tev.data.prompts import load_prompt_set

    bundle = load_bundle(args.target, args.draft, device=args.device, dtype=args.dtype, device_map=args.device_map, allow_download=args.allow_download)
    prompts = load_prompt_set(args.prompts)[: args.num_prompts]
    result = bench_e2e(bundle, prompts, budgets=args.budgets, temperatures=args.temperatures, max_new_tokens=args.max_new_tokens, repeats=args.repeats, seed=args.seed)
    info = result["machine"]
    print(f"end-to-end decoding, {len(prompts)} prompts x {args.repeats} repeats, {args.max_new_tokens} new tokens, methods interleaved; median (IQR)")
    print(f"machine: {info['cpu']}, {info['torch_threads']} threads, torch {info['torch']}, device {info['device']}" + (f" ({info['gpu']})" if "gpu" in info else ""))
    print(format_e2e_table(result))
    if args.target is None and args.draft is None and not args.skip_memory:
        result["peak_memory_mb"] = peak_memory_of_generate()
        print(f"peak resident memory of one `python -m tev generate` (64 tokens, embedded pair): {result['peak_memory_mb']:.0f} MB")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(result, handle, indent=2)
