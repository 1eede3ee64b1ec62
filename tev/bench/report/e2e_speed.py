"""Claim 7, end-to-end speed: DDTree + TEV against autoregressive decoding and predraw.

Measure: :func:`~tev.bench.e2e.bench_e2e` at ``settings.e2e_budget`` for the chain, the base
tree drafter with predraw and with TEV, and ExitTrain's drafter, each interleaved with an
autoregressive run. Rule: at T = 1 TEV's median speedup is > 1 and its tokens/s at least
predraw's. Table: the e2e table, tau by method and the stage times.
"""

from __future__ import annotations

from tev.bench.e2e import bench_e2e
from tev.bench.report.common import ReportSettings, claim, decoding_lines, image, yes

__all__ = ["measure_e2e", "check_e2e", "e2e_section"]


def measure_e2e(bundle, base: str, prompts: list[dict], settings: ReportSettings, seed: int, progress: bool) -> dict:
    """One interleaved run at ``settings.e2e_budget`` (a bench_e2e result)."""
    methods = (("chain", "tev"), (base, "predraw"), (base, "tev"), ("exittrain", "tev"))
    return bench_e2e(
        bundle, prompts, budgets=(settings.e2e_budget,), methods=methods, temperatures=settings.temperatures,
        max_new_tokens=settings.max_new_tokens, repeats=settings.e2e_repeats, seed=seed, progress=progress,
    )


def check_e2e(e2e: dict, base: str) -> dict:
    """Claim 7: DDTree + TEV beats autoregressive decoding and is at least as fast as predraw."""
    rows = {(r["temperature"], r["method"]): r for r in e2e["rows"]}
    tev, predraw = rows.get((1.0, f"{base}+tev")), rows.get((1.0, f"{base}+predraw"))
    rule = "yes if at T = 1 DDTree+TEV's median speedup over autoregressive is > 1 and its median tokens/s is >= DDTree+predraw's"
    paper = "speedup over AR > 1; TEV at least as fast as predraw end to end"
    if tev is None or predraw is None:
        return claim(7, "End-to-end speed", paper, "not run (no tree drafter at T = 1)", None, "n/a", rule)
    parts = [f"T={t:g} {m}: {r['tokens_per_second']:.1f} tok/s, {r['speedup']:.2f}x" for (t, m), r in rows.items() if m != "autoregressive"]
    holds = tev["speedup"] > 1 and tev["tokens_per_second"] >= predraw["tokens_per_second"]
    return claim(
        7, "End-to-end speed", paper, f"B={e2e['rows'][0]['budget']}: " + "; ".join(parts) + " (T = 0: every verifier is greedy)", tev["speedup"], yes(holds), rule,
        {"tev_speedup": tev["speedup"], "predraw_speedup": predraw["speedup"], "tev_tokens_per_second": tev["tokens_per_second"], "predraw_tokens_per_second": predraw["tokens_per_second"]},
    )


def e2e_section(report: dict) -> list[str]:
    """Markdown for claim 7: the e2e table, tau by method and the stage times."""
    return decoding_lines(report["measurements"]["e2e"]) + [
        "", image(report["plots"], "tau_by_method", "tau by method"), "", image(report["plots"], "stage_times", "stage times"),
    ]
