"""Claim 5, the ExitTrain gain and ablation order (Tables 1-2).

Measure: per (budget, T) the ``tau`` of each ablation drafter, from ``python -m tev bench
exittrain`` results, or else base vs the shipped ``exittrain`` drafter in the budget sweep.
Rule: a positive mean gain of exit over base and, when all four are measured, the order
exit > none > base with prefix < exit; ``partly`` when the gain is under half the paper's.
Table: ``tau`` per drafter and the gain, per setting.
"""

from __future__ import annotations

from tev.bench.report.common import claim, finite, image, pct, rows_of
from tev.util.stored import TAU, rows_figure

__all__ = ["PAPER_EXITTRAIN_GAIN", "ABLATION", "exittrain_from_results", "exittrain_from_sweep", "exittrain_data", "check_exittrain", "exittrain_section"]

PAPER_EXITTRAIN_GAIN = 0.13  # Table 1, average relative tau gain
ABLATION = ("base", "none", "prefix", "exit")
NAME = "ExitTrain gain and ablation order, on the base drafter's own data (Tables 1-2)"


def exittrain_from_results(results: dict) -> dict:
    """Per (budget, T): tau per ablation drafter, the exit-vs-base gain, and the mean order;
    ``measure`` names the figure: rows measured before tau counted tokens per forward hold only
    the mean block length (``mean_block_length``, its error ``mean_block_length_se``) and name it
    (:func:`tev.util.stored.rows_figure`)."""
    settings: dict[tuple, dict] = {}
    errors: dict[tuple, dict] = {}
    key = rows_figure(results.get("rows", []))
    for row in results.get("rows", []):
        if row.get("drafter") in ABLATION and finite(row.get(key)) and "domain" not in row:  # pooled rows; per-domain rows below
            settings.setdefault((row["budget"], row["temperature"]), {})[row["drafter"]] = row[key]
            errors.setdefault((row["budget"], row["temperature"]), {})[row["drafter"]] = row.get(f"{key}_se", float("nan"))
    table = []
    for (budget, temperature), taus in sorted(settings.items()):
        gain = taus["exit"] / taus["base"] - 1 if "exit" in taus and "base" in taus else float("nan")
        table.append({"budget": budget, "temperature": temperature, **taus, "gain": gain, "se": errors[(budget, temperature)]})
    common = [r for r in table if all(k in r for k in ABLATION)]
    means = {k: sum(r[k] for r in common) / len(common) for k in ABLATION} if common else {}
    gains = [r["gain"] for r in table if finite(r["gain"])]
    domains: dict[str, list[float]] = {}
    by_key = {(r["drafter"], r["budget"], r["temperature"], r["domain"]): r[key] for r in results.get("rows", []) if "domain" in r}
    for (drafter, budget, temperature, domain), tau in by_key.items():
        if drafter == "exit" and ("base", budget, temperature, domain) in by_key:
            domains.setdefault(domain, []).append(tau / by_key[("base", budget, temperature, domain)] - 1)
    return {"source": "--exittrain-results", "measure": "tau" if key == TAU else "mean block length", "settings": table, "mean_gain": sum(gains) / len(gains) if gains else float("nan"), "mean_tau": means,
            "domain_gains": {d: sum(v) / len(v) for d, v in domains.items()}, "heldout_trees": results.get("heldout_trees", {}), "command": results.get("command")}


def exittrain_from_sweep(sweep: dict) -> dict:
    """Per (budget, T): base ("block") vs ExitTrain tau from the budget sweep."""
    base = {(r["budget"], r["temperature"]): r["tau"] for r in rows_of(sweep, "block")}
    table = []
    for r in rows_of(sweep, "exittrain"):
        key = (r["budget"], r["temperature"])
        if key in base:
            table.append({"budget": key[0], "temperature": key[1], "base": base[key], "exit": r["tau"], "gain": r["tau"] / base[key] - 1})
    gains = [r["gain"] for r in table]
    return {"source": "budget sweep (block vs exittrain drafter)", "settings": table, "mean_gain": sum(gains) / len(gains) if gains else float("nan"), "mean_tau": {}}


def exittrain_data(results: dict | None, sweep: dict, has_exittrain_drafter: bool) -> dict | None:
    """Claim 5's measurements: from the ablation ``results`` when given, else from the sweep
    when the bundle ships an ``exittrain`` drafter, else None (not run)."""
    if results is not None:
        return exittrain_from_results(results)
    return exittrain_from_sweep(sweep) if has_exittrain_drafter else None


def check_exittrain(data: dict | None) -> dict:
    """Claim 5: ExitTrain's average tau gain, and the ablation order when measured."""
    paper = f"{pct(PAPER_EXITTRAIN_GAIN)} average tau (Table 1); exit > none > base, prefix < exit (Table 2)"
    if data is None or not data["settings"]:
        return claim(5, NAME, paper, "not run (pass --exittrain-results)", None, "n/a", "n/a: no ExitTrain results and no exittrain drafter")
    gain = data["mean_gain"]
    means = data["mean_tau"]
    size_rule = f"; partly when it does but the gain is under half the paper's ({pct(PAPER_EXITTRAIN_GAIN / 2)})"
    if means:
        order = means["exit"] > means["none"] > means["base"] and means["prefix"] < means["exit"]
        common = [r for r in data["settings"] if all(k in r for k in ABLATION)]
        beats = {k: sum(r["exit"] > r[k] for r in common) for k in ("none", "prefix")}
        order_text = (
            "; mean tau " + ", ".join(f"{k} {means[k]:.3f}" for k in ("exit", "none", "prefix", "base")) + f" (order {'holds' if order else 'fails'}); "
            f"exit beats none in {beats['none']} and prefix in {beats['prefix']} of {len(common)} settings"
        )
        rule = "yes if the mean relative tau gain of exit over base is > 0 and the mean tau (over settings with all four) orders exit > none > base and prefix < exit" + size_rule
    else:
        order, order_text = True, "; ablation order not measured (no setting has all of base, none, prefix, exit)"
        rule = "yes if the mean relative tau gain of exit (the ExitTrain drafter) over base is > 0; the ablation order is not measured here" + size_rule
    holds = finite(gain) and gain > 0 and order
    verdict = ("yes" if gain >= PAPER_EXITTRAIN_GAIN / 2 else "partly") if holds else "no"
    this_run = f"{pct(gain)} average tau over {len(data['settings'])} settings ({data['source']})" + order_text
    if means and verdict == "no":
        this_run += ("; the fine-tune reads the data the base drafter was distilled on, so there is no headroom: the token-only control "
                     "does no better (a new workload: claim 5b)")
    return claim(5, NAME, paper, this_run, gain, verdict, rule, {"mean_gain": gain, **{f"mean_tau_{k}": v for k, v in means.items()}})


def exittrain_section(report: dict) -> list[str]:
    """Markdown for claim 5: tau per ablation drafter and the gain, per setting."""
    data = report["measurements"]["exittrain"]
    if not data or not data["settings"]:
        return ["Not run: pass `--exittrain-results PATH` (written by `python -m tev bench exittrain`) or ship an `exittrain` drafter."]
    keys = [k for k in ABLATION if any(k in r for r in data["settings"])]
    source = f"`{data['command']}`" if data.get("command") else data["source"]
    measure = data.get("measure", "tau")
    lines = [f"Source: {source}.", "", "| B | T | " + " | ".join(f"{measure} {k}" for k in keys) + " | exit / base - 1 |", "|---|---|" + "---|" * (len(keys) + 1)]
    for r in data["settings"]:
        errors = r.get("se", {})
        cells = [(f"{r[k]:.3f} +- {errors[k]:.3f}" if finite(errors.get(k)) else f"{r[k]:.3f}") if k in r else "-" for k in keys]
        lines.append(f"| {r['budget']} | {r['temperature']:g} | " + " | ".join(cells) + f" | {pct(r['gain'])} |")
    if data.get("domain_gains"):
        lines += ["", f"Mean gain of exit over base in {measure}, by domain: " + ", ".join(f"{d} {pct(g)}" for d, g in data["domain_gains"].items()) + "."]
    trees = data.get("heldout_trees") or {}
    if trees:
        lines += ["", "Held-out `1 + C` at the training temperature on the same held-out rounds, and where the target's mass leaves the trees "
                  "(mean exit probability per tree at depths 0, 1, 2: missing mass + mass at a leaf):", "",
                  "| drafter | 1 + C | depth 0 | depth 1 | depth 2 |", "|---|---|---|---|---|"]
        for name, t in trees.items():
            lines.append(f"| {name} | {t['tau_bound']:.3f} | " + " | ".join(f"{t['internal'][d]:.3f} + {t['leaf'][d]:.3f}" for d in range(3)) + " |")
        if "exittrain_mass" in report.get("plots", {}):
            lines += ["", image(report["plots"], "exittrain_mass", "exit mass by depth, before and after ExitTrain")]
    return lines
