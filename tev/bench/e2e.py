"""``python -m tev bench e2e``: end-to-end decoding speed against autoregressive decoding.

Every comparison interleaves its methods in one run (shuffled order per repeat) so the
machine's drift hits all alike, and reports medians with the interquartile range.
"""

from __future__ import annotations

import argparse
import contextlib
import random
import resource
import subprocess
import sys
from dataclasses import dataclass, replace

from tqdm import tqdm

from tev.data.prompts import load_prompt_set, spread_evenly
from tev.core.budget import Calibration, RoundRate
from tev.engine.auto_budget import AUTO_CAP, AutoBudget
from tev.engine.decode import DecodeConfig, autoregressive_generate, run_to_end, Request, speculative_generate
from tev.engine.round import STAGES
from tev.engine.evaluation import fit_prompt
from tev.bench.hf_peers import BF16_PEER, PEERS, hf_generate
from tev.engine.models import load_block_drafter, load_bundle, load_causal_lm
from tev.engine.target_precision import forced_target_forward
from tev.pipelines.arguments import add_budget_cap_argument, add_folder_argument, add_model_arguments, add_truncation_arguments, budget_value, named_folders
from tev.pipelines.exittrain import invoked_command
from tev.util.stats import spread
from tev.util.precision import figure_precision, precision_summary
from tev.util.stored import TAU, row_figure, write_result
from tev.util.timing import machine_info, machine_summary
from tev.util.weight_read import weight_read_reference

__all__ = ["E2E_METHODS", "bench_e2e", "parse_methods", "format_e2e_table", "format_tree_size_table", "format_auto_table", "weight_read_line", "format_domain_table", "format_paired_drafters_table", "peak_memory_of_generate", "add_arguments", "run"]

E2E_METHODS = (
    ("chain", "tev"),
    ("block", "predraw"),
    ("block", "tev"),
    ("path", "tev"),  # run where the pair ships a path drafter
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
    peers=PEERS,
    progress: bool = True,
    truncation: dict | None = None,
    budget_cap: int = AUTO_CAP,
    forwards: tuple[str | None, ...] = (None,),
    against: dict[str, str] | None = None,
) -> dict:
    """End-to-end decoding speed, all methods and budgets interleaved per (prompt, repeat).

    For each temperature every method runs at every budget on every prompt, in one shuffled
    order per prompt alongside the project's autoregressive loop and the ``peers`` (Hugging Face
    ``generate``, plain and with prompt lookup), which run once per prompt and serve every budget. ``speedup`` is the median over those
    runs of (method tokens/s) / (autoregressive tokens/s); ``speedup_vs_hf`` and
    ``speedup_vs_lookup`` divide by the two peers instead. ``weight_read`` is the physical
    reference: the time to read the target's weights once at the measured read bandwidth;
    each row's ``weight_reads_per_token`` is its median time per token over that. Prompts with a ``"domain"`` also
    get these medians per domain. At T = 0 every verifier is greedy, so methods that differ
    only in verifier are run once. ``truncation`` (``top_k``, ``top_p``, ``min_p``) applies at
    every T > 0, to the project's methods and the peers alike. A budget ``"auto"`` (with
    ``budget_cap``) lets each round choose its size, carrying its calibration and rate from
    prompt to prompt as one user's answers do on the page; ``auto_vs_fixed`` then compares it
    with each fixed budget (:func:`_auto_against_fixed`). Every speculative row gives its
    ``mean_tree_size`` and ``q_calibration`` (realised coverage over the drafter's estimate).
    ``forwards`` names the target forwards to run the project's methods and its autoregressive
    loop in (``"transformers"``, ``"float32"``, ``"bfloat16"``: see
    :func:`~tev.engine.target_precision.forced_target_forward`; None: the one chosen at load);
    with more than one, each method's name ends in ``@forward`` and its ``speedup`` is over the
    autoregressive loop in the same forward. The peer ``hf-generate-bf16`` runs ``generate`` on a
    bfloat16 copy of the target. ``against`` maps a drafter's name to another's (a drafter loaded from
    a folder to the pair's drafter of its kind): ``drafters_paired`` then compares their tokens/s prompt by
    prompt (:func:`_paired_drafters`).
    """
    plan = _Plan(bundle, tuple(budgets), [fit_prompt(bundle.tokenizer, p, bundle.context_length - max_new_tokens) for p in prompts],
                 [p.get("domain", "all") for p in prompts], repeats, seed, max_new_tokens, dict(truncation or {}), budget_cap, tuple(forwards),
                 tuple(peers), _peer_models(bundle, peers))
    reference = weight_read_reference(bundle.target)
    order_rng = random.Random(seed)
    results, comparisons, drafters_paired = [], [], []
    jobs = [(temperature, [(name + suffix, drafter, verifier) for suffix in plan.suffixes.values() for name, drafter, verifier in _method_names(bundle, methods, temperature)])
            for temperature in temperatures]
    total = sum(len(names) * len(budgets) + len(plan.baselines) for _, names in jobs) * len(plan.encoded) * repeats
    bar = tqdm(total=total, desc="bench e2e", disable=not progress)
    for temperature, names in jobs:
        runs, base_runs = _runs_at(plan, temperature, names, order_rng, bar)
        results += _rows(temperature, budgets, runs, base_runs, reference, plan.domains)
        comparisons += _auto_against_fixed(temperature, budgets, runs)
        drafters_paired += _paired_drafters(temperature, runs, names, against or {})
    bar.close()
    return {**_setting(plan), "weight_read": reference, "rows": results, "auto_vs_fixed": comparisons, "drafters_paired": drafters_paired}


def _setting(plan: "_Plan") -> dict:
    """What a result says it was measured on and with: the machine, the precision and forward, the run's settings."""
    bundle = plan.bundle
    device = next(bundle.target.parameters()).device
    return {"machine": machine_info(device), "precision": figure_precision(device, bundle.target, bundle.drafters, bundle.precision.label if bundle.precision else None),
            "target_forward": bundle.precision.to_dict() if bundle.precision else None, "forwards": [f or "chosen" for f in plan.forwards], "seed": plan.seed,
            "max_new_tokens": plan.max_new_tokens, "repeats": plan.repeats, "prompts": len(plan.encoded), "truncation": dict(plan.truncation)}


@dataclass(frozen=True, eq=False)
class _Plan:
    """What every run of :func:`bench_e2e` shares: the models, the budgets, the prompts (encoded) and their domains,
    the repeats and seed, the decoding settings, the forwards and the peers (with their models)."""

    bundle: object
    budgets: tuple
    encoded: list
    domains: list[str]
    repeats: int
    seed: int
    max_new_tokens: int
    truncation: dict
    budget_cap: int
    forwards: tuple
    peers: tuple
    peer_models: dict

    @property
    def suffixes(self) -> dict:
        """Each forward's suffix on a method's name: none with one forward, else ``@forward``."""
        return {forward: ("" if len(self.forwards) == 1 else f"@{forward or 'chosen'}") for forward in self.forwards}

    @property
    def baselines(self) -> list[tuple[str, None, None]]:
        """The autoregressive loop in each forward, then the peers: each runs once a prompt and serves every budget."""
        return [(f"autoregressive{suffix}", None, None) for suffix in self.suffixes.values()] + [(peer, None, None) for peer in self.peers]


def _runs_at(plan: _Plan, temperature: float, names: list, order_rng: random.Random, bar) -> tuple[dict, dict]:
    """Every method at every budget, and every baseline, on every prompt at ``temperature``, in a shuffled order per
    prompt and repeat; returns (runs by (method, budget), baseline runs by name), each a list of run records."""
    memory = {name: (Calibration(), RoundRate()) for name, _, _ in names}  # one user asking in turn: budget auto carries its state from prompt to prompt
    runs = {(name, budget): [] for name, _, _ in names for budget in plan.budgets}
    base_runs = {name: [] for name, _, _ in plan.baselines}
    suffixes = plan.suffixes
    for repeat in range(plan.repeats):
        for i, ids in enumerate(plan.encoded):
            config = DecodeConfig(budget_cap=plan.budget_cap, temperature=temperature, max_new_tokens=plan.max_new_tokens, seed=plan.seed + 1000 * repeat + i,
                                  **(plan.truncation if temperature > 0 else {}))
            order = [(name, None, None, None) for name, _, _ in plan.baselines] + [(name, drafter, verifier, budget) for name, drafter, verifier in names for budget in plan.budgets]
            order_rng.shuffle(order)
            paired = {}
            for name, drafter, verifier, budget in order:
                forward = next((f for f, suffix in suffixes.items() if suffix and name.endswith(suffix)), plan.forwards[0])
                with contextlib.nullcontext() if forward is None else forced_target_forward(plan.bundle.runner, forward):
                    sizing = AutoBudget.for_target(plan.bundle.runner, plan.budget_cap, *memory[name]) if budget == "auto" else None  # the curve of the forward in force
                    paired[(name, budget)] = _one_run(plan.bundle, name.split("@")[0], drafter, verifier, budget, ids, config, sizing, plan.peer_models)
                bar.update(1)
            for (name, budget), summary in paired.items():
                own_loop = "autoregressive" + (name[name.index("@"):] if "@" in name else suffixes[plan.forwards[0]])  # a peer: the first forward's loop
                (base_runs[name] if budget is None else runs[(name, budget)]).append(_run_record(summary, paired, plan.domains[i], own_loop))
    return runs, base_runs


def _method_names(bundle, methods, temperature: float) -> list[tuple[str, str, str]]:
    """(name, drafter, verifier) of each method the bundle can run at ``temperature``; at T = 0
    every verifier is greedy, so methods that differ only in verifier are one."""
    names = []
    for drafter, verifier in methods:
        if drafter not in bundle.drafters:
            continue
        name = f"{drafter}+{'greedy' if temperature == 0 else verifier}"
        if name not in [n for n, _, _ in names]:
            names.append((name, drafter, verifier))
    return names


def _peer_models(bundle, peers) -> dict:
    """The model each peer runs: the target, or for ``hf-generate-bf16`` a bfloat16 copy loaded
    from the same source (``dtype=`` at load keeps the rotary buffers in float32)."""
    models = {peer: bundle.target for peer in peers if peer != "hf-generate-bf16"}
    if "hf-generate-bf16" in peers:
        device = next(bundle.target.parameters()).device
        models["hf-generate-bf16"] = load_causal_lm(bundle.target_source, device=device, dtype="bfloat16").eval()
    return models


def _one_run(bundle, name: str, drafter, verifier, budget, ids, config: DecodeConfig, sizing, peer_models: dict):
    """One generation's summary: the project's autoregressive loop, a peer, or a speculative method."""
    if name == "autoregressive":
        return autoregressive_generate(bundle.runner, ids, config, bundle.tokenizer)
    if name in peer_models:
        return hf_generate(peer_models[name], ids, config, bundle.tokenizer, method=name)
    run_config = replace(config, verifier=verifier, budget=budget)
    return run_to_end(speculative_generate(Request(bundle.runner, bundle.drafter(drafter), ids, run_config), bundle.tokenizer, sizing=sizing))[1]


def _run_record(summary, paired: dict, domain: str, own_loop: str = "autoregressive") -> dict:
    """One run's figures, its speedups over the same prompt's baselines (``paired``; ``own_loop``
    the autoregressive loop in the run's own forward)."""
    def over(baseline: str) -> float:
        return summary.tokens_per_second / paired[(baseline, None)].tokens_per_second if (baseline, None) in paired else float("nan")

    return {
        "tokens_per_second": summary.tokens_per_second,
        "tau": summary.tau,
        "mean_block_length": summary.mean_block_length,
        "tau_bound": summary.tau_bound,
        "tokens": len(summary.token_ids),
        "rounds": summary.rounds,
        "tree_sizes": summary.tree_sizes,
        "draft_coverages": summary.draft_coverages,
        "tau_bounds": summary.tau_bounds,
        "stage_seconds": summary.stage_seconds,
        "seconds": summary.seconds,
        "speedup": summary.tokens_per_second / paired[(own_loop, None)].tokens_per_second,
        "speedup_vs_hf_bf16": over("hf-generate-bf16"),
        "speedup_vs_hf": over("hf-generate"),
        "speedup_vs_lookup": over("hf-prompt-lookup"),
        "domain": domain,
    }


def _rows(temperature, budgets, runs: dict, base_runs: dict, reference: dict, domains: list[str]) -> list[dict]:
    """One row per (budget, method); the baselines ran once per prompt, beside every budget,
    so each budget's rows repeat the same baseline runs."""
    rows = []
    for budget in budgets:
        for name, items in [(name, base_runs[name]) for name in base_runs] + [(name, items) for (name, b), items in runs.items() if b == budget]:
            rounds = sum(x["rounds"] for x in items)
            stage_per_round = {stage: sum(x["stage_seconds"].get(stage, 0.0) for x in items) / max(1, rounds) for stage in STAGES}
            speed = spread(x["tokens_per_second"] for x in items)
            speedup = spread(x["speedup"] for x in items)
            rows.append({
                "temperature": temperature,
                "budget": budget,
                "method": name,
                "tau": sum(x["tokens"] for x in items) / max(1, rounds),  # tokens emitted per forward, pooled over prompts
                "mean_block_length": sum(x["mean_block_length"] * x["rounds"] for x in items) / max(1, rounds),
                "tau_bound": sum(x["tau_bound"] * x["rounds"] for x in items) / max(1, rounds),
                "tokens_per_second": speed["median"],
                "tokens_per_second_by_run": [x["tokens_per_second"] for x in items],  # prompt by prompt, repeat after repeat
                "tokens_per_second_q25": speed["q25"],
                "tokens_per_second_q75": speed["q75"],
                "ms_per_token": 1e3 / speed["median"],
                "weight_reads_per_token": 1e3 / speed["median"] / reference["ms"],
                "speedup": speedup["median"],
                "speedup_q25": speedup["q25"],
                "speedup_q75": speedup["q75"],
                "speedup_vs_hf": spread(x["speedup_vs_hf"] for x in items)["median"],
                "speedup_vs_hf_bf16": spread(x.get("speedup_vs_hf_bf16", float("nan")) for x in items)["median"],
                "speedup_vs_lookup": spread(x["speedup_vs_lookup"] for x in items)["median"],
                "by_domain": {
                    domain: {key: spread(x[key] for x in items if x["domain"] == domain)["median"] for key in ("tokens_per_second", "speedup_vs_hf", "speedup_vs_lookup")}
                    for domain in sorted(set(domains))
                },
                "stage_ms_per_round": {k: 1e3 * v for k, v in stage_per_round.items()},
                **_tree_sizes(items),
                "runs": len(items),
            })
    return rows


def _paired_drafters(temperature, runs: dict, names: list[tuple[str, str, str]], against: dict[str, str]) -> list[dict]:
    """Each drafter of ``against`` over the one it maps to, with the same verifier and budget on the same prompts
    and seeds (their runs were interleaved prompt by prompt): the median over prompts of the tokens/s ratio (with its
    IQR), how many prompts it won, and the ratio of the two medians."""
    rows = []
    for name, drafter, _ in names:
        if drafter not in against:
            continue
        other_name = against[drafter] + name[len(drafter):]  # the same verifier (and forward)
        for (run_name, budget), mine in runs.items():
            if run_name != name or (other_name, budget) not in runs:
                continue
            theirs = runs[(other_name, budget)]
            wins = sum(a["tokens_per_second"] > b["tokens_per_second"] for a, b in zip(mine, theirs))
            rows.append({"temperature": temperature, "budget": budget, "method": name, "against": other_name, **_paired_speed(mine, theirs), "wins": wins})
    return rows


def _paired_speed(mine: list[dict], theirs: list[dict]) -> dict:
    """Two methods' runs on the same prompts, in the same order: the median over prompts of the tokens/s
    ratio (``median_ratio``, with its IQR), the ratio of the two medians, and the runs paired."""
    ratios = spread(a["tokens_per_second"] / b["tokens_per_second"] for a, b in zip(mine, theirs))
    medians = spread(a["tokens_per_second"] for a in mine)["median"] / spread(b["tokens_per_second"] for b in theirs)["median"]
    return {"median_ratio": ratios["median"], "median_ratio_q25": ratios["q25"], "median_ratio_q75": ratios["q75"], "ratio_of_medians": medians, "runs": ratios["n"]}


def format_paired_drafters_table(result: dict) -> str:
    """Each compared drafter over the one it was paired with, prompt by prompt."""
    lines = ["| T | B | method | against | tok/s ratio, median over prompts (IQR) | prompts won | ratio of medians |", "|---|---|---|---|---|---|---|"]
    for r in result["drafters_paired"]:
        lines.append(f"| {r['temperature']:g} | {r['budget']} | {r['method']} | {r['against']} | {r['median_ratio']:.3f}x ({r['median_ratio_q25']:.3f}-{r['median_ratio_q75']:.3f}) "
                     f"| {r['wins']} of {r['runs']} | {r['ratio_of_medians']:.3f}x |")
    return "\n".join(lines)


def _auto_against_fixed(temperature, budgets, runs: dict) -> list[dict]:
    """Budget auto against each fixed budget of the same method on the same prompts (their runs
    were interleaved prompt by prompt): the median over prompts of auto's tokens/s over the fixed
    budget's (``median_ratio``, with its IQR), and the ratio of the two medians."""
    rows = []
    if "auto" not in budgets:
        return rows
    for (name, budget), fixed in runs.items():
        if budget == "auto":
            continue
        rows.append({"temperature": temperature, "method": name, "budget": budget, **_paired_speed(runs[(name, "auto")], fixed)})
    return rows


def format_auto_table(result: dict) -> str:
    """Budget auto against each fixed budget, per temperature and method."""
    lines = ["| T | method | auto vs B | median of per-prompt ratios (IQR) | ratio of median tok/s |", "|---|---|---|---|---|"]
    for r in result.get("auto_vs_fixed", []):
        lines.append(f"| {r['temperature']:g} | {r['method']} | B = {r['budget']} | {r['median_ratio']:.2f}x ({r['median_ratio_q25']:.2f}-{r['median_ratio_q75']:.2f}) | {r['ratio_of_medians']:.2f}x |")
    return "\n".join(lines)


def stage_names(result: dict) -> list[str]:
    """The stage names of a :func:`bench_e2e` result as it was written: :data:`STAGES`, or in a
    file written before the stages were named so, ``draft``, ``tree_build``, ``verify`` (the
    tree forward), ``verify_decision`` (head and verify together), ``commit``."""
    timed = [r["stage_ms_per_round"] for r in result["rows"] if r.get("stage_ms_per_round")]
    return list(timed[0]) if timed else list(STAGES)


def _tree_sizes(items: list[dict]) -> dict:
    """Mean kept tree size and ``sum C / sum q`` over the rounds of speculative runs (those that kept a node)."""
    sizes = [n for x in items for n in x.get("tree_sizes", [])]
    if not sizes:
        return {}
    kept = [(b - 1.0, q) for x in items for b, q, n in zip(x["tau_bounds"], x["draft_coverages"], x["tree_sizes"]) if n]
    estimated = sum(q for _, q in kept)
    return {"mean_tree_size": sum(sizes) / len(sizes), "q_calibration": sum(c for c, _ in kept) / estimated if estimated > 0 else float("nan")}


def format_tree_size_table(result: dict) -> str:
    """Per speculative row: the mean kept tree size and how calibrated the drafter's ``q`` was."""
    lines = ["| T | B | method | mean tree size | realised C / drafter's sum q |", "|---|---|---|---|---|"]
    for r in result["rows"]:
        if "mean_tree_size" in r:
            lines.append(f"| {r['temperature']:g} | {r['budget']} | {r['method']} | {r['mean_tree_size']:.1f} | {r['q_calibration']:.2f} |")
    return "\n".join(lines)


def format_e2e_table(result: dict) -> str:
    """The rows of :func:`bench_e2e` as a markdown table."""
    names = stage_names(result)
    lines = [
        "| T | B | method | tau | mean L | 1 + C | tok/s (IQR) | ms/token (weight reads) | vs own AR (IQR) | vs HF generate | vs HF generate bf16 | vs HF prompt lookup | " + " / ".join(names) + " ms per round |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["rows"]:
        speculative = _speculative(r["method"])
        stages = " / ".join(f"{r['stage_ms_per_round'][k]:.2f}" for k in names) if speculative else ""
        tau = _tau_cells(r) if speculative else "1.00 | 1.00 | 1.00"
        lines.append(
            f"| {r['temperature']:g} | {r['budget']} | {r['method']} | {tau} | "
            f"{r['tokens_per_second']:.1f} ({r['tokens_per_second_q25']:.1f}-{r['tokens_per_second_q75']:.1f}) | {_per_token(r)} | "
            f"{r['speedup']:.2f}x ({r['speedup_q25']:.2f}-{r['speedup_q75']:.2f}) | {r['speedup_vs_hf']:.2f}x | {r.get('speedup_vs_hf_bf16', float('nan')):.2f}x | "
            f"{r['speedup_vs_lookup']:.2f}x | {stages} |"
        )
    return "\n".join(lines)


def _speculative(method: str) -> bool:
    return not method.startswith("autoregressive") and method not in (*PEERS, BF16_PEER)


def _tau_cells(row: dict) -> str:
    """``tau | mean L | 1 + C`` of a speculative row; a row measured before ``tau`` counted tokens
    per forward holds only the mean block length (and names it): its tau is shown as not known."""
    if row_figure(row) != TAU:
        return f"- | {row['mean_block_length']:.2f} | {row['tau_bound']:.2f}"
    return f"{row['tau']:.2f} | {row['mean_block_length']:.2f} | {row['tau_bound']:.2f}"


def _per_token(row: dict) -> str:
    """``ms (x reads)``: time per token and how many reads of the weights it equals."""
    if "ms_per_token" not in row:  # a result written before the reference was measured
        return f"{1e3 / row['tokens_per_second']:.1f}"
    return f"{row['ms_per_token']:.1f} ({row['weight_reads_per_token']:.1f}x)"


def weight_read_line(result: dict) -> str:
    """One sentence: the target's weight bytes, the read bandwidth and one read's time."""
    reference = result.get("weight_read")
    if not reference:
        return "weight read: not measured in this result"
    return (f"physical reference: the target's weights are {reference['bytes'] / 1e6:.0f} MB; read at the measured "
            f"{reference['gb_per_s']:.1f} GB/s once they take {reference['ms']:.1f} ms (a method at 1.0x reads the weights once per token)")


def format_domain_table(result: dict) -> str:
    """Median speedups of each speculative method over the peers, per prompt domain."""
    lines = ["| T | B | method | domain | tok/s | vs HF generate | vs HF prompt lookup |", "|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        if not _speculative(r["method"]):
            continue
        for domain, m in r["by_domain"].items():
            lines.append(f"| {r['temperature']:g} | {r['budget']} | {r['method']} | {domain} | {m['tokens_per_second']:.1f} | {m['speedup_vs_hf']:.2f}x | {m['speedup_vs_lookup']:.2f}x |")
    return "\n".join(lines)


def peak_memory_of_generate(extra_args: list[str] | None = None) -> float:
    """Peak resident memory (MB) of one ``python -m tev generate`` process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    command = [sys.executable, "-m", "tev", "generate", "--prompt", "def fib(n):", "--max-new-tokens", "64", "--json"] + (extra_args or [])
    subprocess.run(command, check=True, capture_output=True)
    after = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return max(before, after) / 1024.0  # ru_maxrss is in KiB on Linux


def parse_methods(names: list[str]) -> tuple[tuple[str, str], ...]:
    """``["block+tev", ...]`` -> ``(("block", "tev"), ...)``; an unknown name fails with the known ones."""
    known = {f"{drafter}+{verifier}": (drafter, verifier) for drafter, verifier in E2E_METHODS}
    unknown = [name for name in names if name not in known]
    if unknown:
        raise SystemExit(f"unknown method {', '.join(unknown)}: choose from {', '.join(known)}")
    return tuple(known[name] for name in names)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--budgets", type=budget_value, nargs="+", default=[8, 16, 32, 64], help="node counts and/or auto")
    add_budget_cap_argument(parser)
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    parser.add_argument("--methods", nargs="+", default=None, metavar="DRAFTER+VERIFIER", help="the project's methods to run (default: chain+tev block+predraw block+tev path+tev, each where the pair has its drafter; at T = 0 each runs greedy)")
    add_folder_argument(parser)
    add_truncation_arguments(parser)
    parser.add_argument("--prompts", default=None, help="prompt set in assets/prompts: chat (dialogue, code, math; the default for a chat target), heldout, humaneval")
    parser.add_argument("--num-prompts", type=int, default=12, help="prompts used, spread evenly over the set (and so over its domains)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip-memory", action="store_true", help="skip the peak-memory measurement")
    parser.add_argument("--forwards", nargs="+", default=["chosen"], choices=["chosen", "transformers", "float32", "bfloat16"],
                        help="target forwards to run the methods and the autoregressive loop in, interleaved (chosen: the one chosen at load; float32/bfloat16: row-invariant)")
    parser.add_argument("--peers", nargs="+", default=["hf-generate", "hf-prompt-lookup"], choices=["hf-generate", "hf-prompt-lookup", "hf-generate-bf16"],
                        help="Hugging Face generate peers (hf-generate-bf16: on a bfloat16 copy of the target)")
    parser.add_argument("--json", help="also write the full result to this JSON file")
    add_model_arguments(parser)


def run(args: argparse.Namespace) -> None:
    truncation = {"top_k": args.top_k, "top_p": args.top_p, "min_p": args.min_p}
    law = DecodeConfig(temperature=1.0, **truncation).law  # a bad flag fails before the models load
    methods = parse_methods(args.methods) if args.methods else E2E_METHODS
    folders = named_folders(args.folder)
    bundle = load_bundle(args.target, args.draft, device=args.device, dtype=args.dtype, device_map=args.device_map, allow_download=args.allow_download, pair=args.pair)
    against = {}  # a folder's drafter against the pair's drafter of its kind, where that one runs too
    for name, folder in folders.items():  # run with TEV beside the methods, interleaved with them
        if name in bundle.drafters:
            raise SystemExit(f"--folder {name}=...: {name!r} already names one of the pair's drafters; pick another name")
        bundle.drafters[name] = load_block_drafter(folder, bundle.target, name=name)
        kind = "path" if bundle.drafters[name].model.config.conditioning == "path" else "block"
        if kind in bundle.drafters and (kind, "tev") in methods:
            against[name] = kind
        methods = (*methods, (name, "tev"))
    prompts = load_prompt_set(args.prompts or ("chat" if bundle.is_chat else "heldout"))
    prompts = spread_evenly(prompts, args.num_prompts)  # each domain its share
    forwards = tuple(None if f == "chosen" else f for f in args.forwards)
    result = bench_e2e(bundle, prompts, budgets=args.budgets, methods=methods, temperatures=args.temperatures, max_new_tokens=args.max_new_tokens, repeats=args.repeats, seed=args.seed,
                       truncation=truncation, budget_cap=args.budget_cap, peers=tuple(args.peers), forwards=forwards, against=against)
    print(f"end-to-end decoding, {len(prompts)} prompts x {args.repeats} repeats, {args.max_new_tokens} new tokens, methods interleaved; median (IQR)")
    print(f"machine: {machine_summary(result['machine'])}")
    print(f"precision: {precision_summary(result['precision'])}")
    if result["target_forward"]:
        print(f"target forward chosen at load: {result['target_forward']['label']} ({result['target_forward']['reason']})")
    print(weight_read_line(result))
    if law.truncates:
        print(f"at T > 0 every method and peer samples with {law.describe().split(', ', 1)[1]}")
    print(format_e2e_table(result))
    print()
    print(format_tree_size_table(result))
    if result["auto_vs_fixed"]:
        print()
        print(format_auto_table(result))
    if any("domain" in p for p in prompts):
        print()
        print(format_domain_table(result))
    if result["drafters_paired"]:
        print()
        print(format_paired_drafters_table(result))
    if args.target is None and args.draft is None and not args.skip_memory:
        result["peak_memory_mb"] = peak_memory_of_generate(["--pair", bundle.pair])
        print(f"peak resident memory of one `python -m tev generate` (64 tokens, {bundle.pair} pair): {result['peak_memory_mb']:.0f} MB")
    if args.json:
        result["command"] = invoked_command()
        write_result(args.json, "e2e", result, indent=2)
