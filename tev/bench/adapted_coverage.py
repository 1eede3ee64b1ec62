"""``python -m tev bench adapted-coverage``: an adapted drafter against its base on the same contexts, per law.

``adapt`` calls its verdict from held-out decoding: each drafter decodes each held-out prompt, and at T > 0 TEV's
draws depend on the tree, so the two drafters' answers part after the first round that differs; their tau is then
measured on different text (often of different lengths, an answer that meets its end early costing more per token).
Here both drafters are scored on one context set instead: the target's own answer to each held-out prompt, sampled
once per law, and at every ``stride``-th token of it each drafter's tree of ``B`` nodes is scored by the target's
coverage ``C(T)``. With TEV the expected block length is ``1 + C(T)`` (the paper's identity), so the mean of
``1 + C`` is what tau estimates, without the draw's noise; the change is paired per anchor and its standard error
taken over prompts (the anchors of one answer are not independent). ``p`` is the target, ``q`` the drafter.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import torch
from tqdm import tqdm

from tev.bench.oracle_reach import anchor_coverages
from tev.bench.reach import LAWS
from tev.engine.block_drafter import read_drafter_config
from tev.engine.decode import DecodeConfig, autoregressive_generate
from tev.engine.evaluation import fit_prompt
from tev.engine.models import drafter_model_class, load_bundle, shipped_drafter, tree_drafter_of
from tev.pipelines.workload import adapted_kind
from tev.pipelines.workload_data import load_workload, split_workload
from tev.util.stored import check_result, write_result

__all__ = ["greedy_rounds", "paired_coverage", "format_paired_coverage", "add_arguments", "run"]


def _served(bundle, folder: Path):
    """The drafter in ``folder`` (block or path) as decoding serves it, on the bundle's target."""
    model = drafter_model_class(read_drafter_config(folder)).from_pretrained(folder, bundle.target, dtype=torch.float32)
    return tree_drafter_of(model.served())


def greedy_rounds(accepted: list[float]) -> int:
    """Rounds greedy speculation takes over a greedy answer of ``len(accepted)`` positions, ``accepted[k]`` the tokens
    a tree rooted at position ``k`` accepts (at T = 0 its coverage: the target's law is one token, so ``C`` counts
    the tree's nodes on the answer's path): a round at ``k`` emits ``1 + accepted[k]`` and the next starts there."""
    rounds, k = 0, 0
    while k < len(accepted):
        rounds, k = rounds + 1, k + 1 + round(accepted[k])
    return rounds


def _law_summary(per_prompt: list[dict]) -> dict:
    """Mean ``1 + C`` of both drafters over every anchor, the relative change and its standard error over prompts
    (each prompt's mean paired difference), and how many prompts the adapted drafter won. Where every position of
    greedy answers is an anchor (``rounds`` given), also tau as greedy speculation would reach it on the same text:
    the mean over positions weighs each token once, where decoding's rounds start after each block (so a drafter
    that carries easy stretches meets the hard positions more often), and the two can differ."""
    pairs = [pair for row in per_prompt for pair in row["pairs"]]
    if not pairs:
        return {}
    base, adapted = 1 + statistics.fmean(p[0] for p in pairs), 1 + statistics.fmean(p[1] for p in pairs)
    differences = [statistics.fmean(p[1] - p[0] for p in row["pairs"]) for row in per_prompt if row["pairs"]]
    se = statistics.stdev(differences) / len(differences) ** 0.5 / base if len(differences) > 1 else float("nan")
    found = {"anchors": len(pairs), "prompts": len(differences), "base": base, "adapted": adapted, "gain": adapted / base - 1, "se": se,
             "prompts_won": sum(d > 0 for d in differences)}
    if all("rounds" in row for row in per_prompt):
        tokens = sum(len(row["pairs"]) for row in per_prompt)
        tau = [tokens / sum(row["rounds"][i] for row in per_prompt) for i in (0, 1)]
        found["greedy_tau"] = {"base": tau[0], "adapted": tau[1], "gain": tau[1] / tau[0] - 1}
    return found


def paired_coverage(bundle, base, adapted, prompts: list[str], budget: int, max_new_tokens: int, stride: int, seed: int, laws=LAWS) -> dict:
    """Every law: for each held-out prompt the target's answer sampled at that law (seeded), and at each of its
    anchors the coverage of both drafters' trees of ``budget`` nodes; the summary per law (:func:`_law_summary`)."""
    drafters = {"base": base, "adapted": adapted}
    horizon = max(getattr(d, "horizon", 8) for d in drafters.values())
    report = {"prompts": len(prompts), "budget": budget, "max_new_tokens": max_new_tokens, "stride": stride, "seed": seed, "laws": {}}
    with tqdm(total=len(laws) * len(prompts), desc="paired coverage", unit="prompt") as bar:
        for label, temperature, top_p in laws:
            law = DecodeConfig(temperature=temperature, top_p=top_p).law
            per_prompt = []
            for i, text in enumerate(prompts):
                ids = fit_prompt(bundle.tokenizer, {"text": text, "chat": True}, 1024)
                config = DecodeConfig(temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens, seed=seed + i)
                answer = autoregressive_generate(bundle.target, ids, config, bundle.tokenizer).token_ids
                every = temperature == 0  # greedy: every position, so the rounds of greedy speculation can be counted on the same text
                anchors = list(range(0, len(answer), 1 if every else stride))
                rows = anchor_coverages(bundle, drafters, ids, answer, anchors, law, [budget], horizon, with_oracle=False)
                pairs = [(row["drafters"]["base"][str(budget)], row["drafters"]["adapted"][str(budget)]) for row in rows]
                row = {"prompt": i, "answer_tokens": len(answer), "pairs": pairs}
                if every:
                    row["rounds"] = [greedy_rounds([pair[j] for pair in pairs]) for j in (0, 1)]
                per_prompt.append(row)
                bar.update(1)
            report["laws"][label] = {"temperature": temperature, "top_p": top_p, "per_prompt": per_prompt, "summary": _law_summary(per_prompt)}
    return report


def format_paired_coverage(report: dict) -> str:
    """The summaries as one markdown table."""
    lines = [f"1 + C(T) at B = {report['budget']} (TEV's expected block length), mean over anchors every {report['stride']} tokens of the "
             f"target's own answers ({report['max_new_tokens']} new tokens) to {report['prompts']} held-out prompts; change +- one standard "
             "error over prompts", "", "| law | anchors | base | adapted | change | prompts won |", "|---|---|---|---|---|---|"]
    for label, law in report["laws"].items():
        s = law["summary"]
        if s:
            lines.append(f"| {label} | {s['anchors']} | {s['base']:.3f} | {s['adapted']:.3f} | {s['gain']:+.1%} +- {s['se']:.1%} | "
                         f"{s['prompts_won']} of {s['prompts']} |")
            if "greedy_tau" in s:
                g = s["greedy_tau"]
                lines.append(f"| {label}: tau of greedy speculation on the same text | | {g['base']:.3f} | {g['adapted']:.3f} | {g['gain']:+.1%} | |")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workload", help="the workload file the drafter was adapted on (its held-out quarter is scored)")
    parser.add_argument("--adapted", help="the adapted drafter's folder (adapt's --out, or its drafter/ folder)")
    parser.add_argument("--base", default=None, help="the base drafter's folder (default: the one adapt starts from)")
    parser.add_argument("--budget", type=int, default=16, help="tree size B (adapt's held-out decoding uses 16)")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="length of the target's answers the anchors lie on")
    parser.add_argument("--stride", type=int, default=4, help="tokens between anchors at T > 0 (at T = 0 every position is one)")
    parser.add_argument("--seed", type=int, default=0, help="the split's seed (adapt's --seed) and the answers' first seed")
    parser.add_argument("--json", default=None, help="write the report as JSON here")
    parser.add_argument("--from-json", default=None, help="print a report written by --json instead of measuring")


def run(args: argparse.Namespace) -> None:
    if args.from_json:
        report = check_result(json.loads(Path(args.from_json).read_text()), "adapted-coverage", args.from_json)
    else:
        if not (args.workload and args.adapted):
            raise SystemExit("give --workload and --adapted (or --from-json)")
        bundle = load_bundle()
        adapted_folder = Path(args.adapted)
        adapted_folder = adapted_folder / "drafter" if (adapted_folder / "drafter").is_dir() else adapted_folder
        base_folder = Path(args.base) if args.base else shipped_drafter(bundle.pair, adapted_kind(bundle))
        _, heldout = split_workload(load_workload(args.workload), args.seed)
        report = paired_coverage(bundle, _served(bundle, base_folder), _served(bundle, adapted_folder), heldout, args.budget,
                                 args.max_new_tokens, args.stride, args.seed)
        report.update(workload=str(args.workload), adapted=str(adapted_folder), base=str(base_folder))
    print(format_paired_coverage(report))
    if args.json and not args.from_json:
        write_result(args.json, "adapted-coverage", report)
