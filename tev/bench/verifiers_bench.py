"""``python -m tev bench verifiers``: the verifier-decision stage timed from target logits.

Every comparison interleaves its verifiers in one run (shuffled order per repeat) so the
machine's drift hits all alike, and reports medians with the interquartile range.
"""

from __future__ import annotations

import argparse
import random

import torch
from tqdm import tqdm

from tev.core.tree import DraftTree
from tev.core.verify import SAMPLING_VERIFIERS, LogitRows as TargetRows, verify_rows  # the rows it builds are logits
from tev.util.stats import spread
from tev.util.stored import write_result
from tev.util.timing import machine_info, machine_summary, time_once

__all__ = ["synthetic_case", "bench_verifiers", "format_verifier_table", "add_arguments", "run"]


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


def bench_verifiers(
    budgets=(16, 32, 64, 128, 256),
    vocabs=(8192, 151936),
    verifiers=SAMPLING_VERIFIERS,
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
                times[name].append(time_once(lambda: verify_rows(name, tree, rows, generator), device))
        row = {"budget": budget, "vocab": vocab, "nodes": tree.num_nodes, "internal_nodes": int((~tree.is_leaf).sum())}
        for name in verifiers:
            summary = spread(times[name])
            row[name] = {key: summary[key] for key in ("median", "q25", "q75")}
        if "tev" in verifiers and "predraw" in verifiers:
            row["tev_over_predraw"] = row["tev"]["median"] / row["predraw"]["median"]
        rows_out.append(row)
    return {"machine": machine_info(device), "temperature": temperature, "repeats": repeats, "seed": seed, "rows": rows_out}


def format_verifier_table(result: dict) -> str:
    """The rows of :func:`bench_verifiers` as a markdown table (ms, median and IQR)."""
    names = [k for k in SAMPLING_VERIFIERS if k in result["rows"][0]]
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


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--budgets", type=int, nargs="+", default=[16, 32, 64, 128, 256])
    parser.add_argument("--vocabs", type=int, nargs="+", default=[8192, 151936])
    parser.add_argument("--repeats", type=int, default=60)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="also write the full result to this JSON file")


def run(args: argparse.Namespace) -> None:
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: --device cuda was asked but no CUDA device is available")
    result = bench_verifiers(
        budgets=args.budgets, vocabs=args.vocabs, repeats=args.repeats, temperature=args.temperature, device=args.device, seed=args.seed
    )
    print(f"verifier decision stage, T={args.temperature}, {args.repeats} interleaved repeats, median (IQR)")
    print(f"machine: {machine_summary(result['machine'])}")
    print(format_verifier_table(result))
    if args.json:
        write_result(args.json, "verifiers", result, indent=2)
