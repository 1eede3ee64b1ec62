"""Why budget "auto" wins or loses: auto and fixed budgets interleaved per prompt, with every round's
prediction next to what happened.

For each temperature and prompt, plain decoding, budget auto and each fixed budget run in a shuffled
order on the same prompt and seed. Per auto round it records the chosen size, the calibration, the
predicted block length ``1 + c sum q`` against the realised ``1 + C``, and the predicted round cost
against the round's measured time. The largest fixed budget's rounds give, for every best-first
prefix ``k`` of the same tree, the realised ``C(k)`` (a node's reach does not depend on the other
nodes) and the drafter's ``sum q``: the calibration by size, and the size a perfect rule would keep.

    python scripts/auto_budget_diagnosis.py --threads 1 --num-prompts 3 --json /tmp/auto_diag.json
    python scripts/auto_budget_diagnosis.py --replay /tmp/auto_diag.json

``--replay`` needs no model: it replays the largest fixed budget's rounds of a saved run through the
rule (each prefix's realised coverage is known exactly) on that run's measured cost curve, and
prints the expected tokens per second of each rule against every fixed size, free of timing noise.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time

import torch

from tev.data.prompts import load_prompt_set, spread_evenly
from tev.core.budget import Calibration, RoundRate, choose_prefix
from tev.engine.auto_budget import AutoBudget
from tev.engine.cost_curve import CostCurve, machine_cost_curve
from tev.engine.decode import DecodeConfig, Request, autoregressive_generate, run_to_end, speculative_generate
from tev.engine.evaluation import fit_prompt
from tev.engine.models import load_bundle


def auto_rounds(records) -> list[dict]:
    rows = []
    for r in records:
        c = r.choice
        rows.append({
            "size": c.size, "calibration": c.calibration, "going_rate": c.going_rate, "estimate": c.estimate,
            "predicted_length": float(c.expected[c.size]), "realised_length": r.flow.tau_bound, "block_length": r.block_length,
            "predicted_seconds": float(c.cost[c.size]), "seconds": sum(r.timings.values()), "timings": dict(r.timings),
        })
    return rows


def prefix_rows(records) -> list[dict]:
    """Per round of a fixed-budget run: realised C and drafter sum q of every best-first prefix."""
    rows = []
    for r in records:
        order = r.tree.best_first_order()
        q = r.tree.path_logprob[order].exp()
        reach = r.flow.reach.detach().cpu()[order]
        rows.append({"q_cum": q.cumsum(0).tolist(), "c_cum": reach.cumsum(0).tolist(), "seconds": sum(r.timings.values()), "size": r.tree.budget,
                     "timings": dict(r.timings)})
    return rows


def replay(path: str, fixed_seconds: float = 0.007, drift: float = 1.25) -> None:
    """Expected tokens per second of the rule (each round's own best ratio, or the past rounds'
    rate) and of fixed sizes, replayed on the saved largest-budget rounds of ``path``."""
    run = json.load(open(path))
    curve = CostCurve({int(n): t for n, t in run["measured"].items()}, frozen=True)
    costs = curve.costs(curve_size(run)) * drift + fixed_seconds  # the rounds' head and verdict (drift), draft and commit (fixed)
    for temperature in sorted({c["temperature"] for c in run["cells"]}):
        largest = max((m for m in run["cells"][0]["runs"] if m.startswith("B=")), key=lambda m: int(m[2:]))
        rounds = [r for c in run["cells"] if c["temperature"] == temperature for r in c["runs"][largest]["rounds_detail"]]
        results = {}
        for rule in ("own ratio", "past rate"):
            calibration, rate, tokens, seconds = Calibration(), RoundRate(), 0.0, 0.0
            for r in rounds:
                q = torch.diff(torch.tensor(r["q_cum"]), prepend=torch.zeros(1)).clamp(0, 1)
                k = choose_prefix(q, costs[: len(q) + 1], calibration.factor, None, rate.rate if rule == "past rate" else None).size
                length, cost = 1.0 + (r["c_cum"][k - 1] if k else 0.0), float(costs[k])
                calibration.observe(length - 1.0, r["q_cum"][k - 1] if k else 0.0)
                rate.observe(length, cost)
                tokens, seconds = tokens + length, seconds + cost
            results[rule] = tokens / seconds
        for k in (0, 3, 4, 7, 8, 16, 32):
            results[f"k = {k}"] = sum(1.0 + (r["c_cum"][min(k, len(r["c_cum"])) - 1] if k else 0.0) for r in rounds) / sum(float(costs[min(k, len(r["c_cum"]))]) for r in rounds)
        print(f"T={temperature} replay of {len(rounds)} {largest} rounds, expected tokens/s: " + ", ".join(f"{name} {value:.2f}" for name, value in results.items()))


def curve_size(run: dict) -> int:
    return max(len(r["q_cum"]) for c in run["cells"] for m, x in c["runs"].items() if m.startswith("B=") for r in x["rounds_detail"]) + 1


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--replay", default=None, help="a saved --json run: replay its rounds through the rule (no model)")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--num-prompts", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--budgets", type=int, nargs="+", default=[4, 8, 16, 32])
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 0.7])
    parser.add_argument("--top-p", type=float, default=0.9)
    parser.add_argument("--cap", type=int, default=32)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if args.replay:
        replay(args.replay)
        return
    torch.set_num_threads(args.threads)
    bundle = load_bundle()
    prompts = spread_evenly(load_prompt_set("chat"), args.num_prompts)
    encoded = [fit_prompt(bundle.tokenizer, p, bundle.context_length - args.max_new_tokens) for p in prompts]
    started = time.perf_counter()
    curve = machine_cost_curve(bundle.target)
    print(f"cost curve measured in {time.perf_counter() - started:.1f} s: " + ", ".join(f"{n}: {1e3 * t:.1f} ms" for n, t in sorted(curve.measured.items())))
    print(f"load average {os.getloadavg()}")
    rng = random.Random(0)
    out = {"threads": args.threads, "measured": curve.measured, "load_start": os.getloadavg(), "cells": []}
    drafter = bundle.drafter("block")
    for temperature in args.temperatures:
        memory = (Calibration(), RoundRate())  # one user asking in turn: auto carries what it learned
        truncation = {"top_p": args.top_p} if temperature > 0 else {}
        for i, ids in enumerate(encoded):
            methods = ["ar", "auto"] + [f"B={b}" for b in args.budgets]
            rng.shuffle(methods)
            cell = {"temperature": temperature, "prompt": prompts[i].get("id"), "domain": prompts[i].get("domain"), "runs": {}}
            for method in methods:
                budget = "auto" if method == "auto" else (int(method[2:]) if method != "ar" else 0)
                config = DecodeConfig(budget=budget, budget_cap=args.cap, temperature=temperature, max_new_tokens=args.max_new_tokens, seed=i, **truncation)
                if method == "ar":
                    s = autoregressive_generate(bundle.target, ids, config, bundle.tokenizer)
                    cell["runs"][method] = {"tps": s.tokens_per_second, "tokens": len(s.token_ids), "step": (s.seconds - s.prefill_seconds) / max(1, len(s.token_ids))}
                    continue
                auto = AutoBudget(curve, args.cap, *memory) if method == "auto" else None
                records, s = run_to_end(speculative_generate(Request(bundle.target, drafter, ids, config), bundle.tokenizer, auto=auto))
                run = {"tps": s.tokens_per_second, "tokens": len(s.token_ids), "tau": s.tau, "rounds": s.rounds, "mean_size": statistics.mean(s.tree_sizes)}
                run["rounds_detail"] = auto_rounds(records) if method == "auto" else prefix_rows(records)
                cell["runs"][method] = run
            ar = cell["runs"]["ar"]["tps"]
            line = " ".join(f"{m} {cell['runs'][m]['tps'] / ar:.2f}x" + (f"(k {cell['runs'][m]['mean_size']:.1f})" if m == "auto" else "") for m in ["auto"] + [f"B={b}" for b in args.budgets])
            print(f"T={temperature} {cell['domain']} {cell['prompt']}: AR {ar:.1f} tok/s; {line}; load {os.getloadavg()[0]:.2f}", flush=True)
            out["cells"].append(cell)
    out["load_end"] = os.getloadavg()
    out["curve_end"] = curve.to_dict(args.cap + 1)
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(out, handle)


if __name__ == "__main__":
    main()
