"""``python -m tev bench reach``: how deep a drafter's drafts are accepted, depth by depth.

Two views of the same drafters on held-out chat prompts (never among any drafter's training
requests):

- **teacher-forced**, on the target's own answers to the prompts (greedy, and sampled at T = 1):
  per depth ``d``, the top-1 accuracy of ``q_d`` against the written token, and the share of
  anchors whose top-1 chain is right through depth ``d`` (depths ``1 .. d`` all right; stored as
  ``chain_reach_by_depth``: the target's written path reaches the chain's depth-``d`` node). A
  block drafter's ``q_d`` is a marginal; a path drafter's ``q_d`` reads the written tokens above
  ``d``, which is what it reads while drafting whenever depth ``d`` can be accepted at all, so its
  chain depth is the greedy chain's.
- **decoding** (TEV; greedy at T = 0): per law and budget, the share of rounds that accept at
  least ``d`` draft tokens, the nodes a round keeps, ``tau`` as tokens emitted per target
  forward and as mean block length, and the draft stage's time a round.

``p`` is the target, ``q`` the drafter.
"""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

from tqdm import tqdm

from tev.engine.batch_generate import generate_batch
from tev.engine.decode import DecodeConfig, Request, run_to_end, speculative_generate
from tev.data.prompts import evaluation_prompts
from tev.engine.evaluation import fit_prompt
from tev.engine.models import PAIRS, load_block_drafter, load_bundle
from tev.engine.prompt_text import ChatTemplate
from tev.engine.target import Target
from tev.pipelines.arguments import add_folder_argument, named_folders
from tev.train.data import TrainData
from tev.train.loop import heldout_loss
from tev.train.teacher import target_features
from tev.util.stored import write_result

__all__ = ["LAWS", "answers_data", "teacher_forced", "decoding_depths", "depth_report", "format_depth_report", "add_arguments", "run"]

# (label, temperature, top-p): the laws a page visitor picks from
LAWS = (("T = 0", 0.0, 1.0), ("T = 0.7, top-p 0.9", 0.7, 0.9), ("T = 1", 1.0, 1.0))


def answers_data(target, tokenizer, prompts: list[dict], max_new_tokens: int, temperature: float, seed: int, layers: list[int]) -> TrainData:
    """The target's answers to ``prompts`` (greedy at ``temperature`` 0), with its features at ``layers``."""
    end = ChatTemplate.of(tokenizer).end_of_turn
    encoded = [fit_prompt(tokenizer, {**p, "chat": True}, 1024) for p in prompts]
    answers = generate_batch(target, encoded, max_new_tokens, temperature, end, seed)
    data = TrainData.from_lists([p + a for p, a in zip(encoded, answers)], [len(p) for p in encoded], pad_id=end)
    data.features = target_features(target, data.token_ids, data.lengths, layers, progress=False)
    return data


def teacher_forced(drafter_model, data: TrainData) -> dict:
    """Top-1 accuracy and the top-1 chain's share right through each depth of a block or path drafter model on ``data``."""
    measured = heldout_loss(drafter_model, data)
    return {"top1_by_depth": measured["top1_by_depth"], "chain_reach_by_depth": measured["chain_reach_by_depth"], "anchors": measured["anchors"]}


def decoding_depths(target: Target, tokenizer, drafter, prompts: list[dict], budget, temperature: float, top_p: float, max_new_tokens: int, seed: int) -> dict:
    """One drafter at one law and budget over ``prompts``: accepted-depth shares, kept nodes, tau, draft time."""
    horizon = 16
    accepted_at_least = [0] * (horizon + 1)
    rounds, emitted, blocks, kept, draft_ms, per_prompt = 0, 0, 0, [], [], []
    for i, prompt in enumerate(prompts):
        ids = fit_prompt(tokenizer, {**prompt, "chat": True}, 1024)
        config = DecodeConfig(budget=budget, temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens, seed=seed + i)
        records, summary = run_to_end(speculative_generate(Request(target, drafter, ids, config), tokenizer))
        for event in records:
            depth = len(event.verdict.path) - 1
            for d in range(1, min(depth, horizon) + 1):
                accepted_at_least[d] += 1
            kept.append(event.tree.num_nodes - 1)
            draft_ms.append(1000 * (event.timings.get("draft", 0.0) + event.timings.get("build", 0.0)))
            blocks += event.block_length
        rounds += summary.rounds
        emitted += len(summary.token_ids)
        per_prompt.append(len(summary.token_ids) / max(1, summary.rounds))
    deepest = max([d for d in range(1, horizon + 1) if accepted_at_least[d]] or [0])
    return {
        "budget": budget, "temperature": temperature, "top_p": top_p, "rounds": rounds,
        "tau_emitted": emitted / max(1, rounds), "tau_block": blocks / max(1, rounds),
        "tau_per_prompt": [round(t, 3) for t in per_prompt],
        "accepted_at_least": [round(accepted_at_least[d] / max(1, rounds), 4) for d in range(1, deepest + 1)],
        "kept_nodes_mean": statistics.fmean(kept) if kept else 0.0,
        "draft_ms_median": statistics.median(draft_ms) if draft_ms else 0.0,
    }


def depth_report(bundle, drafters: dict, prompts: list[dict], budgets: list, max_new_tokens: int, seed: int,
                 teacher_tokens: int = 96, laws=LAWS) -> dict:
    """Both views for each of ``drafters`` (name -> tree drafter of ``bundle``'s target)."""
    target, tokenizer = bundle.target, bundle.tokenizer
    layers = sorted({tuple(d.feature_layers) for d in drafters.values()})
    if len(layers) != 1:
        raise ValueError("the drafters compared read different target layers; compare them in separate runs")
    report = {"prompts": len(prompts), "max_new_tokens": max_new_tokens, "seed": seed, "teacher_forced": {}, "decoding": {}}
    for label, temperature in (("greedy answers", 0.0), ("answers sampled at T = 1", 1.0)):
        data = answers_data(target, tokenizer, prompts, teacher_tokens, temperature, seed, list(layers[0]))
        report["teacher_forced"][label] = {kind: teacher_forced(d.model, data) for kind, d in drafters.items()}
    settings = [(law, budget) for law in laws for budget in budgets]
    with tqdm(total=len(settings) * len(drafters), desc="decoding", unit="setting") as bar:
        for (label, temperature, top_p), budget in settings:
            for kind, drafter in drafters.items():  # interleaved: every drafter at one setting before the next
                row = decoding_depths(bundle.runner, tokenizer, drafter, prompts, budget, temperature, top_p, max_new_tokens, seed)
                report["decoding"].setdefault(kind, []).append({"law": label, **row})
                bar.update(1)
    return report


def format_depth_report(report: dict) -> str:
    """The report as markdown tables."""
    lines = []
    for label, by_kind in report["teacher_forced"].items():
        lines += [f"Teacher-forced on the target's {label} ({next(iter(by_kind.values()))['anchors']} anchors): top-1 accuracy / top-1 chain right through depth d", "",
                  "| drafter | " + " | ".join(f"d={d}" for d in range(1, 9)) + " | greedy chain: 1 + sum |", "|---|" + "---|" * 9]
        for kind, row in by_kind.items():
            cells = [f"{a:.2f} / {c:.2f}" for a, c in zip(row["top1_by_depth"], row["chain_reach_by_depth"])]
            lines.append(f"| {kind} | " + " | ".join(cells) + f" | {1 + sum(row['chain_reach_by_depth']):.2f} |")
        lines.append("")
    lines += ["Decoding (TEV; greedy at T = 0): share of rounds accepting at least d draft tokens", "",
              "| drafter | law | B | tau (emitted / forward) | mean block | nodes kept | draft ms | accepted >= 1, 2, 3, 4, 5, 6 |", "|---|---|---|---|---|---|---|---|"]
    for kind, rows in report["decoding"].items():
        for r in rows:
            shares = ", ".join(f"{s:.2f}" for s in r["accepted_at_least"][:6])
            lines.append(f"| {kind} | {r['law']} | {r['budget']} | {r['tau_emitted']:.2f} | {r['tau_block']:.2f} | {r['kept_nodes_mean']:.1f} | "
                         f"{r['draft_ms_median']:.1f} | {shares} |")
    return "\n".join(lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pair", choices=PAIRS, default=None, help="shipped pair (default: $TEV_PAIR or the first)")
    parser.add_argument("--drafters", nargs="*", default=["block"], help="the pair's drafter kinds to compare (default: block)")
    add_folder_argument(parser)
    parser.add_argument("--num-prompts", type=int, default=8, help="held-out chat prompts, spread over the domains")
    parser.add_argument("--budgets", nargs="+", default=["auto", "16"], help="budgets to decode at (auto or node counts)")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None, help="write the report as JSON here")


def run(args: argparse.Namespace) -> None:
    bundle = load_bundle(pair=args.pair)
    drafters = {kind: bundle.drafter(kind) for kind in args.drafters}
    for name, folder in named_folders(args.folder).items():
        drafters[name] = load_block_drafter(folder, bundle.target, name=name)
    prompts = evaluation_prompts(chat=True, count=args.num_prompts)
    budgets = [b if b == "auto" else int(b) for b in args.budgets]
    report = depth_report(bundle, drafters, prompts, budgets, args.max_new_tokens, args.seed)
    text = format_depth_report(report)
    print(text)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        write_result(args.json, "reach", report)
