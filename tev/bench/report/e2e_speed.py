"""Claim 7, end-to-end speed: DDTree + TEV against autoregressive decoding and predraw.

Measure: :func:`~tev.bench.e2e.bench_e2e` at ``settings.e2e_budget`` for the chain, the base
tree drafter with predraw and with TEV, and ExitTrain's drafter, each interleaved with an
autoregressive run; or a whole ``python -m tev bench e2e --json`` result given to the report
(``--e2e-results``: more prompts and tokens than the report's own run), at its best budget for
TEV. Rule: at T = 1 TEV's median speedup is > 1 and its tokens/s at least predraw's. The
figure also gives the speed-up over Hugging Face ``generate`` and each method's time per token
in reads of the target's weights (the physical reference). Table: the e2e table, tau by method
and the stage times.
"""

from __future__ import annotations

from tev.bench.e2e import bench_e2e, weight_read_line
from tev.bench.report.common import ReportSettings, claim, decoding_lines, image, yes

__all__ = ["measure_e2e", "best_budget_rows", "check_e2e", "e2e_section"]


def measure_e2e(bundle, base: str, prompts: list[dict], settings: ReportSettings, seed: int, progress: bool) -> dict:
    """One interleaved run at ``settings.e2e_budget`` (a bench_e2e result)."""
    methods = (("chain", "tev"), (base, "predraw"), (base, "tev"), ("exittrain", "tev"))
    return bench_e2e(
        bundle, prompts, budgets=(settings.e2e_budget,), methods=methods, temperatures=settings.temperatures,
        max_new_tokens=settings.max_new_tokens, repeats=settings.e2e_repeats, seed=seed, progress=progress,
    )


def best_budget_rows(e2e: dict, base: str) -> dict:
    """``e2e`` with only the rows of one budget: the one where ``base``+TEV's median speed-up at
    T = 1 is largest (the first budget when there is no such row)."""
    budgets = list(dict.fromkeys(r["budget"] for r in e2e["rows"]))
    tev = {r["budget"]: r["speedup"] for r in e2e["rows"] if r["temperature"] == 1.0 and r["method"] == f"{base}+tev"}
    chosen = max(tev, key=tev.get) if tev else budgets[0]
    return {**e2e, "rows": [r for r in e2e["rows"] if r["budget"] == chosen]}


def _figure(row: dict) -> str:
    """One method's figure: tokens/s, speed-up over the own loop and over HF generate, weight reads."""
    text = f"{row['tokens_per_second']:.1f} tok/s, {row['speedup']:.2f}x"
    if row.get("speedup_vs_hf") == row.get("speedup_vs_hf"):  # not NaN: the peer ran
        text += f" ({row['speedup_vs_hf']:.2f}x HF generate)"
    if "weight_reads_per_token" in row:
        text += f", {row['weight_reads_per_token']:.1f} weight reads/token"
    return text


def check_e2e(e2e: dict, base: str) -> dict:
    """Claim 7: DDTree + TEV beats autoregressive decoding and is at least as fast as predraw."""
    rows = {(r["temperature"], r["method"]): r for r in e2e["rows"]}
    tev, predraw = rows.get((1.0, f"{base}+tev")), rows.get((1.0, f"{base}+predraw"))
    rule = "yes if at T = 1 DDTree+TEV's median speedup over autoregressive is > 1 and its median tokens/s is >= DDTree+predraw's"
    paper = "speedup over AR > 1; TEV at least as fast as predraw end to end"
    if tev is None or predraw is None:
        return claim(7, "End-to-end speed", paper, "not run (no tree drafter at T = 1)", None, "n/a", rule)
    parts = [f"T={t:g} {m}: {_figure(r)}" for (t, m), r in rows.items() if m != "autoregressive"]
    holds = tev["speedup"] > 1 and tev["tokens_per_second"] >= predraw["tokens_per_second"]
    return claim(
        7, "End-to-end speed", paper, f"B={e2e['rows'][0]['budget']}: " + "; ".join(parts) + " (T = 0: every verifier is greedy)", tev["speedup"], yes(holds), rule,
        {"tev_speedup": tev["speedup"], "predraw_speedup": predraw["speedup"], "tev_tokens_per_second": tev["tokens_per_second"], "predraw_tokens_per_second": predraw["tokens_per_second"]},
    )


def e2e_section(report: dict) -> list[str]:
    """Markdown for claim 7: the e2e table, tau by method and the stage times."""
    e2e = report["measurements"]["e2e"]
    source = [f"Measured by `{e2e['command']}` (given to the report with `--e2e-results`).", ""] if e2e.get("command") else []
    return source + decoding_lines(e2e) + ["", weight_read_line(e2e) + ".", "",
        image(report["plots"], "tau_by_method", "tau by method"), "", image(report["plots"], "stage_times", "stage times"),
    ]
