"""``python -m tev bench oracle-reach``: how far any drafter could reach, beside how far the shipped ones do.

At each of a law's anchors (positions along the target's own answer to a held-out chat prompt, sampled at
that law), the oracle tree of ``B`` nodes (:func:`~tev.engine.oracle_tree.oracle_tree`: the target drafting
for itself, best first by its own reach) and each drafter's tree of ``B`` nodes are scored by the target's
coverage ``C(T)``. With TEV the expected block length is ``1 + C(T)`` (the paper's identity, which the
verifier lab checks), so the oracle's ``1 + C`` is the most any drafter's tree of that size can give at that
context and law, and a drafter's share of it says how much of the gap is the drafter's and how much the law's.
Both trees have the drafter's depth limit. ``p`` is the target, ``q`` the drafter.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from matplotlib.figure import Figure
from tqdm import tqdm

from tev.bench.reach import LAWS
from tev.core.sampling import SamplingLaw
from tev.data.prompts import evaluation_prompts
from tev.engine.decode import DecodeConfig, autoregressive_generate
from tev.engine.evaluation import fit_prompt
from tev.engine.models import PAIRS, load_bundle
from tev.engine.oracle_tree import oracle_tree
from tev.engine.round import draft_and_forward, prefill
from tev.engine.session import CausalLMSession
from tev.util.precision import figure_precision
from tev.util.stored import check_result, write_result

__all__ = ["anchor_coverages", "matched_depth", "oracle_report", "format_oracle_report", "plot_oracle_report", "add_arguments", "run"]


def anchor_coverages(bundle, drafters: dict, prompt_ids: list[int], answer: list[int], anchors: list[int], law: SamplingLaw,
                     budgets: list[int], horizon: int, with_oracle: bool = True) -> list[dict]:
    """Per anchor ``k`` (the context is the prompt and the answer's first ``k`` tokens): the oracle's coverage at
    each budget and its reach by depth at the largest (unless not ``with_oracle``), and each drafter's coverage at
    each budget."""
    target = bundle.runner
    oracle_session = CausalLMSession(target) if with_oracle else None
    if with_oracle:
        oracle_session.extend(prompt_ids[:-1])
    sessions = {}
    for name, drafter in drafters.items():
        session, state = CausalLMSession(target, feature_layers=tuple(drafter.feature_layers)), drafter.new_state()
        prefill(session, prompt_ids, state)
        sessions[name] = (session, state)
    rows, held = [], len(prompt_ids)  # tokens of the context each session has taken in (its cache holds all but the root)
    for k in anchors:
        context = prompt_ids + answer[:k]
        new = context[held - 1:-1]  # committed since the last anchor, the old root first
        if new:
            if with_oracle:
                oracle_session.extend(new)
            for session, state in sessions.values():
                state.add_features(session.extend(new).features)
        held = len(context)
        row = {"anchor": k, "drafters": {}}
        if with_oracle:
            tree = oracle_tree(oracle_session, context, law, max(budgets), horizon)
            reach = tree.path_logprob.exp()
            row.update(oracle={str(b): float(reach[1:b + 1].sum()) for b in budgets},
                       oracle_reach_by_depth=[float(reach[tree.depths == d].sum()) for d in range(1, horizon + 1)])
        row["matched"] = {}
        for name, drafter in drafters.items():
            session, state = sessions[name]
            covered, matched = {}, {}
            for budget in budgets:
                drafted, output = draft_and_forward(session, drafter, context, budget, state)
                covered[str(budget)] = output.rows(law).flow(drafted).coverage
                matched[str(budget)] = matched_depth(drafted, answer[k:])
                session.rollback(session.length)  # the tree stays provisional until a commit: drop it
            row["drafters"][name], row["matched"][name] = covered, matched
        rows.append(row)
    return rows


def matched_depth(tree, continuation: list[int]) -> int:
    """How many of ``continuation``'s first tokens lie on one path of ``tree`` from its root: the tokens an exact
    saturated verifier (TEV, predraw-and-follow) accepts in a round whose draw from the target is that text."""
    node, depth = 0, 0
    for token in continuation:
        node = tree.child_by_token[node].get(token)
        if node is None:
            break
        depth += 1
    return depth


def oracle_report(bundle, drafters: dict, prompts: list[dict], budgets: list[int], max_new_tokens: int, stride: int, seed: int, laws=LAWS) -> dict:
    """Every law: each prompt's anchors (every ``stride`` tokens of the target's answer sampled at that law)."""
    horizon = max(getattr(d, "horizon", 8) for d in drafters.values())
    report = {"prompts": len(prompts), "budgets": budgets, "horizon": horizon, "max_new_tokens": max_new_tokens, "stride": stride,
              "seed": seed, "laws": {}}
    with tqdm(total=len(laws) * len(prompts), desc="oracle reach", unit="prompt") as bar:
        for label, temperature, top_p in laws:
            law = DecodeConfig(temperature=temperature, top_p=top_p).law
            anchors_of_law = []
            for i, prompt in enumerate(prompts):
                ids = fit_prompt(bundle.tokenizer, {**prompt, "chat": True}, 1024)
                config = DecodeConfig(temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens, seed=seed + i)
                answer = autoregressive_generate(bundle.runner, ids, config, bundle.tokenizer).token_ids
                anchors = list(range(0, max(0, len(answer) - 1), stride))
                for row in anchor_coverages(bundle, drafters, ids, answer, anchors, law, budgets, horizon):
                    anchors_of_law.append({"prompt": prompt["id"], **row})
                bar.update(1)
            report["laws"][label] = {"temperature": temperature, "top_p": top_p, "anchors": anchors_of_law, "summary": _summary(anchors_of_law, budgets)}
    return report


def _summary(anchors: list[dict], budgets: list[int]) -> dict:
    """Mean ``1 + C`` per budget for the oracle and each drafter, and each drafter's share of the oracle's."""
    if not anchors:
        return {}
    mean = lambda values: statistics.fmean(values)  # noqa: E731
    found = {"anchors": len(anchors), "oracle": {str(b): 1 + mean([a["oracle"][str(b)] for a in anchors]) for b in budgets},
             "oracle_reach_by_depth": [mean(depth) for depth in zip(*(a["oracle_reach_by_depth"] for a in anchors))], "drafters": {}}
    for name in anchors[0]["drafters"]:
        tau = {str(b): 1 + mean([a["drafters"][name][str(b)] for a in anchors]) for b in budgets}
        found["drafters"][name] = {"tau_bound": tau, "share_of_oracle": {b: tau[b] / found["oracle"][b] for b in tau}}
    return found


def format_oracle_report(report: dict) -> str:
    """The summaries as one markdown table: ``1 + C`` per law and budget, the oracle's and each drafter's."""
    budgets = [str(b) for b in report["budgets"]]
    lines = [f"1 + C(T) = TEV's expected block length, mean over anchors (depth <= {report['horizon']}); "
             "in brackets a drafter's share of the oracle's", "",
             "| law | anchors | tree | " + " | ".join(f"B = {b}" for b in budgets) + " |", "|---|---|---|" + "---|" * len(budgets)]
    for label, law in report["laws"].items():
        summary = law["summary"]
        if not summary:
            continue
        lines.append(f"| {label} | {summary['anchors']} | oracle | " + " | ".join(f"{summary['oracle'][b]:.2f}" for b in budgets) + " |")
        for name, row in summary["drafters"].items():
            lines.append(f"| {label} | | {name} | " + " | ".join(f"{row['tau_bound'][b]:.2f} ({row['share_of_oracle'][b]:.0%})" for b in budgets) + " |")
    lines += ["", "The oracle's reach by depth at the largest budget (mean over anchors): the target mass a tree of that size can hold per depth", ""]
    for label, law in report["laws"].items():
        if law["summary"]:
            lines.append(f"- {label}: " + ", ".join(f"d{d + 1} {r:.2f}" for d, r in enumerate(law["summary"]["oracle_reach_by_depth"])))
    return "\n".join(lines)


def plot_oracle_report(report: dict, path: str | Path) -> Path:
    """One panel per law: ``1 + C`` against ``B``, a line for the oracle and one per drafter (a PNG)."""
    laws = [(label, law["summary"]) for label, law in report["laws"].items() if law["summary"]]
    figure = Figure(figsize=(4.2 * len(laws), 3.6))
    budgets = report["budgets"]
    for index, (label, summary) in enumerate(laws):
        axes = figure.add_subplot(1, len(laws), index + 1)
        axes.plot(budgets, [summary["oracle"][str(b)] for b in budgets], "k-o", label="oracle (the target's own tree)")
        for name, row in summary["drafters"].items():
            axes.plot(budgets, [row["tau_bound"][str(b)] for b in budgets], "-o", label=f"{name} drafter")
        axes.set_xscale("log", base=2)
        axes.set_xticks(budgets, [str(b) for b in budgets])
        axes.set_title(label)
        axes.set_xlabel("tree size B")
        axes.set_ylabel("1 + C(T) (TEV's expected block)")
        axes.grid(alpha=0.3)
        if index == 0:
            axes.legend(fontsize=8)
    figure.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=110)
    return Path(path)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pair", choices=PAIRS, default=None, help="shipped pair (default: $TEV_PAIR or the first)")
    parser.add_argument("--drafters", nargs="*", default=["path"], help="the pair's drafter kinds to score beside the oracle")
    parser.add_argument("--num-prompts", type=int, default=6, help="held-out chat prompts, spread over the domains")
    parser.add_argument("--budgets", type=int, nargs="+", default=[4, 8, 16, 32], help="tree sizes B")
    parser.add_argument("--max-new-tokens", type=int, default=48, help="length of the target's answer the anchors lie on")
    parser.add_argument("--stride", type=int, default=8, help="tokens between anchors")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", default=None, help="write the report as JSON here")
    parser.add_argument("--plot", default=None, help="draw 1 + C against B per law into this PNG")
    parser.add_argument("--from-json", default=None, help="read a report written by --json instead of measuring (to draw or print it again)")


def run(args: argparse.Namespace) -> None:
    if args.from_json:
        report = check_result(json.loads(Path(args.from_json).read_text()), "oracle-reach", args.from_json)
    else:
        bundle = load_bundle(pair=args.pair)
        drafters = {kind: bundle.drafter(kind) for kind in args.drafters}
        prompts = evaluation_prompts(chat=True, count=args.num_prompts)
        report = oracle_report(bundle, drafters, prompts, sorted(args.budgets), args.max_new_tokens, args.stride, args.seed)
        report["precision"] = figure_precision("cpu", bundle.target, drafters, bundle.precision.label if bundle.precision else None)
    print(format_oracle_report(report))
    if args.json and not args.from_json:
        write_result(args.json, "oracle-reach", report)
    if args.plot:
        plot_oracle_report(report, args.plot)
