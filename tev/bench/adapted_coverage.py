"""``python -m tev bench adapted-coverage``: an adapted drafter against its base on the same text, per law.

``adapt`` calls its verdict from held-out decoding: each drafter decodes each held-out prompt, and at T > 0 the
draws depend on the tree, so the two drafters' answers part after the first round that differs and each tau is
measured on its own sampled text (a handful of prompts then spreads the verdict by 15-30%). Here both drafters
are set on one text per prompt and law: the target's own answer, sampled once. At each position the drafter's
tree of ``B`` nodes is drafted; the tokens an exact saturated verifier accepts there, when the target's draw is
that text, are the tree's nodes along it (predraw-and-follow walks the draw; TEV shares its exit and bonus laws),
so the rounds speculation takes to emit the text are counted, and tau = tokens over rounds is paired per prompt.
Beside it, the mean of ``1 + C(T)`` (the target's coverage, TEV's expected block length) over every position.
``p`` is the target, ``q`` the drafter.
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
from tev.util.stats import paired_ratio_change
from tev.util.stored import check_result, write_result

__all__ = ["rounds_on_text", "paired_coverage", "format_paired_coverage", "add_arguments", "run"]


def _served(bundle, folder: Path):
    """The drafter in ``folder`` (block or path) as decoding serves it, on the bundle's target."""
    model = drafter_model_class(read_drafter_config(folder)).from_pretrained(folder, bundle.target, dtype=torch.float32)
    return tree_drafter_of(model.served())


def rounds_on_text(accepted: list[int]) -> int:
    """Rounds speculation takes to emit a text of ``len(accepted)`` tokens, ``accepted[k]`` the tokens the tree rooted
    at position ``k`` accepts when the target's draw is that text (:func:`~tev.bench.oracle_reach.matched_depth`): a
    round at ``k`` emits ``1 + accepted[k]`` and the next starts there. With an exact saturated verifier a round's
    exit and bonus follow the target's own draw along the tree (predraw-and-follow is that walk; TEV shares its
    exit law), so on the target's own sample the rounds counted here are drawn as decoding's are: the two drafters
    are set on the same text, without the noise of each decoding drawing its own."""
    rounds, k = 0, 0
    while k < len(accepted):
        rounds, k = rounds + 1, k + 1 + accepted[k]
    return rounds


def _law_summary(per_prompt: list[dict]) -> dict:
    """Per law: ``tau`` of both drafters on the same texts (tokens over the rounds :func:`rounds_on_text` counts,
    pooled over prompts), its paired change and standard error over prompts, and the prompts the adapted drafter
    won; beside it the mean ``1 + C`` over positions, which weighs every token once where decoding's rounds start
    after each block (a drafter that carries easy stretches meets the hard positions more often), so it reads
    higher than tau and its change is not tau's."""
    pairs = [pair for row in per_prompt for pair in row["pairs"]]
    if not pairs:
        return {}
    by_prompt = [[[row["answer_tokens"], row["rounds"][i]] for row in per_prompt] for i in (0, 1)]  # [drafter][prompt] = [tokens, rounds]
    tau = [sum(t for t, _ in rows) / sum(r for _, r in rows) for rows in by_prompt]
    gain, se = paired_ratio_change(by_prompt[1], by_prompt[0])
    coverage = [1 + statistics.fmean(p[i] for p in pairs) for i in (0, 1)]
    return {"anchors": len(pairs), "prompts": len(per_prompt), "tau": {"base": tau[0], "adapted": tau[1], "gain": gain, "se": se},
            "prompts_won": sum(a[0] / a[1] > b[0] / b[1] for a, b in zip(by_prompt[1], by_prompt[0])),
            "mean_1_plus_c": {"base": coverage[0], "adapted": coverage[1], "gain": coverage[1] / coverage[0] - 1}}


def paired_coverage(bundle, base, adapted, prompts: list[str], budget: int, max_new_tokens: int, seed: int, laws=LAWS) -> dict:
    """Every law: for each held-out prompt the target's answer sampled at that law (seeded), and at each of its
    anchors the coverage of both drafters' trees of ``budget`` nodes; the summary per law (:func:`_law_summary`)."""
    drafters = {"base": base, "adapted": adapted}
    horizon = max(getattr(d, "horizon", 8) for d in drafters.values())
    report = {"prompts": len(prompts), "budget": budget, "max_new_tokens": max_new_tokens, "seed": seed, "laws": {}}
    with tqdm(total=len(laws) * len(prompts), desc="paired coverage", unit="prompt") as bar:
        for label, temperature, top_p in laws:
            law = DecodeConfig(temperature=temperature, top_p=top_p).law
            per_prompt = []
            for i, text in enumerate(prompts):
                ids = fit_prompt(bundle.tokenizer, {"text": text, "chat": True}, 1024)
                config = DecodeConfig(temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens, seed=seed + i)
                answer = autoregressive_generate(bundle.runner, ids, config, bundle.tokenizer).token_ids
                rows = anchor_coverages(bundle, drafters, ids, answer, list(range(len(answer))), law, [budget], horizon, with_oracle=False)
                pairs = [(row["drafters"]["base"][str(budget)], row["drafters"]["adapted"][str(budget)]) for row in rows]
                accepted = [[row["matched"][name][str(budget)] for row in rows] for name in drafters]
                per_prompt.append({"prompt": i, "answer_tokens": len(answer), "pairs": pairs, "rounds": [rounds_on_text(a) for a in accepted]})
                bar.update(1)
            report["laws"][label] = {"temperature": temperature, "top_p": top_p, "per_prompt": per_prompt, "summary": _law_summary(per_prompt)}
    return report


def format_paired_coverage(report: dict) -> str:
    """The summaries as one markdown table."""
    lines = [f"B = {report['budget']}; the target's own answers ({report['max_new_tokens']} new tokens) to {report['prompts']} held-out prompts, "
             "one per law, both drafters on the same text; tau = tokens over the rounds speculation takes on that text, change +- one "
             "standard error over prompts; beside it the mean 1 + C(T) over every position", "",
             "| law | tau: base | adapted | change | prompts won | mean 1 + C: base | adapted | change |", "|---|---|---|---|---|---|---|---|"]
    for label, law in report["laws"].items():
        s = law["summary"]
        if s:
            t, c = s["tau"], s["mean_1_plus_c"]
            lines.append(f"| {label} | {t['base']:.3f} | {t['adapted']:.3f} | {t['gain']:+.1%} +- {t['se']:.1%} | {s['prompts_won']} of {s['prompts']} | "
                         f"{c['base']:.3f} | {c['adapted']:.3f} | {c['gain']:+.1%} |")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workload", help="the workload file the drafter was adapted on (its held-out quarter is scored)")
    parser.add_argument("--adapted", help="the adapted drafter's folder (adapt's --out, or its drafter/ folder)")
    parser.add_argument("--base", default=None, help="the base drafter's folder (default: the one adapt starts from)")
    parser.add_argument("--budget", type=int, default=16, help="tree size B (adapt's held-out decoding uses 16)")
    parser.add_argument("--max-new-tokens", type=int, default=64, help="length of the target's answers the anchors lie on")
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
                                 args.max_new_tokens, args.seed)
        report.update(workload=str(args.workload), adapted=str(adapted_folder), base=str(base_folder))
    print(format_paired_coverage(report))
    if args.json and not args.from_json:
        write_result(args.json, "adapted-coverage", report)
