"""Claim 4, the verifier-stage latency (Table 3): TEV's decision + cache commit against predraw's.

Measure: on real trees per budget, each verifier's decision and commit timed, interleaved
(shuffled order per repeat), plus the synthetic large-vocabulary decision stage of
:func:`~tev.bench.verifiers_bench.bench_verifiers`. Rule: TEV's median decision + commit
below predraw's at every budget. Table: medians (IQR) per budget and stage.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import torch
from tqdm import tqdm

from tev.bench.report.common import ReportSettings, claim, ms, pct, yes
from tev.bench.verifiers_bench import bench_verifiers, format_verifier_table
from tev.core.sampling import SamplingLaw
from tev.core.tree import DraftTree
from tev.core.verify import TargetRows, verify_rows
from tev.engine.round import draft_and_forward, prefill
from tev.engine.session import CausalLMSession
from tev.engine.target import Target
from tev.util.stats import spread
from tev.util.timing import time_once

__all__ = ["PAPER_LATENCY", "CommitCase", "commit_case", "time_stage", "bench_verifier_stage", "check_latency", "measure_latency", "latency_section"]

PAPER_LATENCY = {32: -0.129, 64: -0.152, 128: -0.243}  # Table 3, TEV / predraw - 1 at T = 0.6


@dataclass(eq=False)
class CommitCase:
    """A real tree after its target forward, with a clone of the cache to restore before each
    timed commit."""

    session: CausalLMSession
    tree: DraftTree
    rows: TargetRows
    snapshot: list[tuple[torch.Tensor, torch.Tensor]]
    length: int

    def restore(self) -> None:
        """Put back the cache as it was right after ``forward_tree`` (not timed)."""
        for layer, (keys, values) in zip(self.session.cache.layers, self.snapshot):
            layer.keys, layer.values = keys, values  # commit never writes in place
        self.session.length = self.length


def commit_case(target: Target, drafter, ids: list[int], budget: int, temperature: float) -> CommitCase:
    """Prefill ``ids`` minus its last token, draft a ``budget`` tree, run the tree forward."""
    session = CausalLMSession(target, feature_layers=drafter.feature_layers)
    state = drafter.new_state()
    prefill(session, ids, state)
    tree, output = draft_and_forward(session, drafter, list(ids), budget, state)
    rows = output.rows(SamplingLaw(temperature))  # lazy: the head runs inside the timed decision (head + verify), the paper's verifier stage
    snapshot = [(layer.keys.clone(), layer.values.clone()) for layer in session.cache.layers]
    return CommitCase(session, tree, rows, snapshot, session.length)


def time_stage(case: CommitCase, name: str, generator: torch.Generator, device) -> tuple[float, float]:
    """(decision seconds, commit seconds) of one verifier on one case."""
    verdicts = []
    decision = time_once(lambda: verdicts.append(verify_rows(name, case.tree, case.rows, generator)), device)
    case.restore()
    commit = time_once(lambda: case.session.commit(verdicts[0].path), device)
    case.restore()
    return decision, commit


def bench_verifier_stage(bundle, drafter, encoded, settings: ReportSettings, seed: int, progress: bool) -> list[dict]:
    """Decision + commit time, TEV vs predraw, on the same real trees per budget, interleaved."""
    device = next(bundle.target.parameters()).device
    order_rng = random.Random(seed)
    names = ("tev", "predraw")
    rows = []
    prompts = [ids for _, ids in encoded[: settings.latency_prompts]]
    for budget in tqdm(settings.latency_budgets, desc="verifier stage", disable=not progress):
        cases = [commit_case(bundle.runner, drafter, ids, budget, settings.latency_temperature) for ids in prompts]
        generator = torch.Generator(device=device).manual_seed(seed)
        times = {n: {"decision": [], "commit": [], "total": []} for n in names}
        for case in cases:  # warm-up
            for name in names:
                time_stage(case, name, generator, device)
        for _ in range(settings.latency_repeats):
            for case in cases:
                order = list(names)
                order_rng.shuffle(order)
                for name in order:
                    decision, commit = time_stage(case, name, generator, device)
                    times[name]["decision"].append(decision)
                    times[name]["commit"].append(commit)
                    times[name]["total"].append(decision + commit)
        row = {"budget": budget, "nodes": [c.tree.num_nodes for c in cases], "samples": len(times["tev"]["total"])}
        for name in names:
            row[name] = {stage: spread(values) for stage, values in times[name].items()}
        row["relative_change"] = row["tev"]["total"]["median"] / row["predraw"]["total"]["median"] - 1
        row["decision_relative_change"] = row["tev"]["decision"]["median"] / row["predraw"]["decision"]["median"] - 1
        rows.append(row)
    return rows


def check_latency(stage_rows: list[dict], synthetic: dict | None) -> dict:
    """Claim 4: TEV's verifier stage (decision + commit) is faster than predraw's."""
    changes = {r["budget"]: r["relative_change"] for r in stage_rows}
    holds = all(c < 0 for c in changes.values())
    paper = " / ".join(pct(PAPER_LATENCY[b]) for b in sorted(PAPER_LATENCY)) + " at B = 32 / 64 / 128, T = 0.6"
    this_run = ", ".join(f"B={b}: {pct(c)}" for b, c in changes.items()) + " (real trees, decision + commit, medians)"
    if synthetic:
        this_run += "; synthetic decision stage: " + ", ".join(f"B={r['budget']} V={r['vocab']}: {pct(r['tev_over_predraw'] - 1)}" for r in synthetic["rows"])
    return claim(
        4, "TEV verifier-stage latency (Table 3)", paper, this_run, max(changes.values()), yes(holds),
        "yes if TEV's median decision + commit time is below predraw's (TEV / predraw - 1 < 0) at every measured budget; the paper's magnitudes are shown, not required",
        {f"relative_change_B{b}": c for b, c in changes.items()},
    )


def measure_latency(bundle, drafter, encoded, settings: ReportSettings, seed: int, progress: bool) -> tuple[dict, dict]:
    """Claim 4: the verifier stage on real trees, plus the synthetic large-vocabulary decision stage.
    Returns (claim row, measurements)."""
    stage_rows = bench_verifier_stage(bundle, drafter, encoded, settings, seed, progress)
    synthetic = None
    if settings.synthetic_repeats > 0:
        synthetic = bench_verifiers(
            budgets=settings.latency_budgets, vocabs=(settings.synthetic_vocab,), verifiers=("tev", "predraw"), repeats=settings.synthetic_repeats,
            temperature=settings.latency_temperature, device=str(next(bundle.target.parameters()).device), seed=seed, progress=progress,
        )
    return check_latency(stage_rows, synthetic), {"real_trees": stage_rows, "synthetic": synthetic}


def latency_section(report: dict) -> list[str]:
    """Markdown for claim 4: the real-tree stage table and the synthetic decision table."""
    m = report["measurements"]["latency"]
    lines = [
        f"Real trees at T = {report['settings']['latency_temperature']}, decision + cache commit, interleaved; ms, median (IQR).",
        "",
        "| B | samples | TEV decision | predraw decision | TEV commit | predraw commit | TEV total | predraw total | TEV / predraw - 1 | paper |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in m["real_trees"]:
        lines.append(
            f"| {r['budget']} | {r['samples']} | {ms(r['tev']['decision'])} | {ms(r['predraw']['decision'])} | {ms(r['tev']['commit'])} | "
            f"{ms(r['predraw']['commit'])} | {ms(r['tev']['total'])} | {ms(r['predraw']['total'])} | {pct(r['relative_change'])} | {pct(PAPER_LATENCY.get(r['budget'], float('nan')))} |"
        )
    if m["synthetic"]:
        lines += ["", f"Decision stage on synthetic trees at vocabulary {report['settings']['synthetic_vocab']} (tev.bench.verifiers_bench.bench_verifiers):", "", format_verifier_table(m["synthetic"])]
    else:
        lines += ["", "The synthetic large-vocabulary decision benchmark was skipped (--quick)."]
    return lines
