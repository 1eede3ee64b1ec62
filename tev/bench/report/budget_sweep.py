"""Claim 6, the budget sweep (Table 5): ``tau`` and ``1 + C`` rise with the budget ``B``.

Measure: :func:`~tev.bench.e2e.bench_e2e` over the sweep budgets for each tree drafter with
TEV. Rule: for every drafter and T, both ``tau`` and mean ``1 + C`` at the largest budget
exceed their values at the smallest. Table: the e2e table, and the sweep plot.
"""

from __future__ import annotations

from tev.bench.e2e import bench_e2e
from tev.bench.report.common import ReportSettings, claim, decoding_lines, image, rows_of, yes

__all__ = ["sweep_drafters", "measure_sweep", "check_sweep", "sweep_section"]


def sweep_drafters(bundle, base: str) -> list[str]:
    """The drafters the sweep compares: the base tree drafter and ExitTrain's when shipped."""
    return [d for d in (base, "exittrain") if d in bundle.drafters]


def measure_sweep(bundle, base: str, prompts: list[dict], settings: ReportSettings, seed: int, progress: bool) -> dict:
    """One interleaved run over ``settings.sweep_budgets`` (a bench_e2e result)."""
    methods = tuple((d, "tev") for d in sweep_drafters(bundle, base))
    return bench_e2e(
        bundle, prompts, budgets=settings.sweep_budgets, methods=methods, temperatures=settings.temperatures,
        max_new_tokens=settings.max_new_tokens, repeats=settings.e2e_repeats, seed=seed, progress=progress,
    )


def check_sweep(sweep: dict, drafters: list[str]) -> dict:
    """Claim 6: tau and mean 1 + C grow from the smallest to the largest budget."""
    parts, margins = [], []
    for drafter in drafters:
        for temperature in sorted({r["temperature"] for r in rows_of(sweep, drafter)}):
            rows = sorted((r for r in rows_of(sweep, drafter) if r["temperature"] == temperature), key=lambda r: r["budget"])
            if len(rows) < 2:
                continue
            low, high = rows[0], rows[-1]
            margins.append(min(high["tau"] - low["tau"], high["tau_bound"] - low["tau_bound"]))
            best = max(rows, key=lambda r: r["speedup"])
            parts.append(
                f"{drafter} T={temperature:g}: tau {low['tau']:.2f}->{high['tau']:.2f}, 1+C {low['tau_bound']:.2f}->{high['tau_bound']:.2f} "
                f"(B {low['budget']}->{high['budget']}), best speedup {best['speedup']:.2f}x at B={best['budget']}"
            )
    rule = "yes if, for every drafter and T, both tau and mean 1 + C at the largest budget exceed their values at the smallest budget"
    if not margins:
        return claim(6, "Budget sweep (Table 5)", "tau, 1 + C and speedup vs B", "not run (fewer than two budgets or no drafter)", None, "n/a", rule)
    return claim(6, "Budget sweep (Table 5)", "tau and 1 + C rise with B; speedup vs B", "; ".join(parts), min(margins), yes(min(margins) > 0), rule, {"min_growth": min(margins)})


def sweep_section(report: dict) -> list[str]:
    """Markdown for claim 6: the sweep's table and plot."""
    return decoding_lines(report["measurements"]["sweep"]) + ["", image(report["plots"], "budget_sweep", "budget sweep")]
