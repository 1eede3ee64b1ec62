"""The model card of the shipped models (``assets/README.md``), rendered from ``card.md.j2``
beside this file. Every section comes from a file a command writes: the tiny pair's build report
(``build-assets``: ``assets/models/build.json``), the default pair's ``training.json``
(``train-drafter``), each pair's ``exittrain.json`` (``exittrain --install`` or ``bench exittrain
--install``) and ``models/smollm2/workload-results.json`` (``python -m tev bench workload-table --install``)."""

from __future__ import annotations

from pathlib import Path

import jinja2

from tev.engine.evaluation import format_tau_table
from tev.engine.models import DEFAULT_PAIR
from tev.pipelines.workload_report import CARD_NAMES, card_rows
from tev.util.files import write_text_atomic
from tev.util.stored import TAU, read_result, row_figure, rows_figure

__all__ = ["render_card", "refresh_card"]

_ENVIRONMENT = jinja2.Environment(loader=jinja2.FileSystemLoader(Path(__file__).parent), trim_blocks=True, lstrip_blocks=True,
                                  keep_trailing_newline=True, undefined=jinja2.StrictUndefined, autoescape=False)
_ENVIRONMENT.filters["f"] = format  # {{ x|f('.3f') }}
_ENVIRONMENT.filters["tau_table"] = format_tau_table
_ENVIRONMENT.filters["figure"] = row_figure  # {% if row|figure == "tau" %}: what a stored row measured


def _exittrain(entry: dict, data: str) -> dict:
    """The ExitTrain section's values; ``data`` names what a training sequence is. Rows measured
    before ``tau`` counted tokens per forward hold only the mean block length (``measure``;
    :func:`tev.util.stored.rows_figure`)."""
    gains = {}
    rows = entry.get("domain_rows", []) + [r for part in entry.get("tau", {}).values() for r in part]
    figure = rows_figure(rows)
    taus = {(r["drafter"], r["domain"], r["budget"], r["temperature"]): r[figure] for r in entry.get("domain_rows", [])}
    for (drafter, domain, budget, temperature), tau in taus.items():
        if drafter != "base" and ("base", domain, budget, temperature) in taus:
            gains.setdefault((drafter, domain), []).append(tau / taus[("base", domain, budget, temperature)] - 1)
    domains = list(dict.fromkeys(domain for _, domain in gains))
    domain_gains = [(drafter, [(d, sum(gains[(drafter, d)]) / len(gains[(drafter, d)])) for d in domains if (drafter, d) in gains])
                    for drafter in ("none", "prefix", "exit") if any((drafter, d) in gains for d in domains)]
    trees = entry.get("heldout_trees", {})
    depths = 1 + max((d for t in trees.values() for d in range(len(t["internal"])) if t["internal"][d] + t["leaf"][d] >= 5e-4), default=-1)
    return {"command": entry["command"], "s": entry["settings"], "data": data, "steps_done": entry["steps_done"], "seconds": entry["seconds"],
            "before": entry["heldout_tau_bound_before"], "after": entry["heldout_tau_bound_after"], "ablation": entry.get("ablation"),
            "measure": "`tau`" if figure == TAU else "mean block length", "tau": entry.get("tau", {}), "domain_gains": domain_gains, "trees": trees, "depths": depths,
            "base_note": entry.get("base_note")}  # written by hand, by no command: which base it was fine-tuned from, when not the shipped one


def _after_best(best: dict, checks: list[dict], data: dict) -> str:
    """What the held-out loss did after the kept step: still falling, level, or rising."""
    if best["step"] == checks[-1]["step"]:
        return " (the last: the held-out loss was still falling)."
    rise = checks[-1]["heldout_loss"] - best["heldout_loss"]
    if rise < 0.02:
        return (f"; after it the held-out loss stays level (within {rise:.2f}): more steps on these {data['response_tokens'] // 1000}k response "
                "tokens buy nothing, more self-written conversations are the lever.")
    return (": past it the held-out loss rises while the training loss keeps falling, i.e. the drafter starts to memorise its data. "
            f"With about {data['response_tokens'] // 1000}k response tokens the drafter is data-limited; more self-written conversations "
            "are the next lever.")


def _resumed(entry: dict) -> str:
    """What the run that installed the drafter read from its work folder rather than did itself, as a clause
    (empty when it did everything, or when the report does not know: ``resumed`` null, written before runs said)."""
    resumed = entry["resumed"]
    if resumed is None:
        return ""
    shards = entry["recipe"]["shards"]
    read = [f"{resumed['shards_read']} of its {shards} shards" if resumed["shards_read"] else "",
            f"{resumed['feature_parts_read']} of its {resumed['feature_parts']} feature parts" if resumed["feature_parts_read"] else ""]
    said = " and ".join(part for part in read if part)
    clauses = [f"it read {said} from the work folder, written by earlier runs of the same command that were stopped"] if said else []
    steps = entry["recipe"]["train"]["steps"]
    if resumed["from_step"]:
        done = "its training had finished in an earlier run" if resumed["from_step"] >= steps else f"its training resumed at step {resumed['from_step']:,}"
        clauses.append(f"{done}; all {steps:,} steps took {resumed['steps_s'] / 60:.0f} min of their own")
    return "; " + "; ".join(clauses) if clauses else ""


def _read_whole(entry: dict) -> set[str]:
    """The stages (``timings_s`` keys) the installing run read whole from its work folder: their time says nothing."""
    resumed = entry["resumed"]
    if resumed is None:  # the report does not say what the run read
        return set()
    read = {"conversations_s": resumed["shards_read"] == entry["recipe"]["shards"],
            "features_s": resumed["feature_parts"] and resumed["feature_parts_read"] == resumed["feature_parts"],
            "training_s": resumed["from_step"] >= entry["recipe"]["train"]["steps"]}
    return {name for name, whole in read.items() if whole}


def _trained_drafter(entry: dict, title: str) -> dict:
    """One trained drafter's section values from its ``training.json`` (``title``: its heading)."""
    data = entry["data"]
    checks = [h for h in entry["history"] if "heldout_loss" in h]
    best = min(checks, key=lambda h: h["heldout_loss"]) if checks else None
    recipe = entry["recipe"]
    shape = recipe["drafter"]
    read_whole = _read_whole(entry)
    return {"entry": entry, "title": title, "recipe": recipe, "data": data, "heldout": entry["heldout"], "shape": shape,
            "path": shape.get("conditioning", "marginal") == "path", "train": recipe["train"],
            "timings": [f"{name.removesuffix('_s')} {seconds / 60:.1f} min" for name, seconds in entry["timings_s"].items() if seconds >= 1 and name not in read_whole],
            "resumed": _resumed(entry), "checks": checks, "best": best,
            "after_best": _after_best(best, checks, data) if checks else "",
            "top1": ", ".join(f"{100 * a:.0f}%" for a in entry["heldout"]["top1_by_depth"])}


def render_card(report: dict, default_pair: dict | None = None, default_exittrain: dict | None = None, workloads: dict | None = None,
                default_path: dict | None = None) -> str:
    """The model card: the default pair's sections from its drafters' ``training.json`` (block
    ``default_pair``, path ``default_path``; each when present), its ExitTrain drafter, the
    workload packs' measured adaptation, then the tiny pair's from its build report
    (``report["exittrain"]``: its ExitTrain drafter, when installed)."""
    cfg = report["config"]
    default = DEFAULT_PAIR.default_drafter
    trained = [_trained_drafter(entry, f"{title} drafter `q`" + (" (the page's default)" if kind == default else ""))
               for entry, kind, title in ((default_pair, "block", "Block"), (default_path, "path", "Path")) if entry]
    values = {"report": report, "cfg": cfg, "tiny_shape": cfg["drafter"], "target": report["target"], "drafter": report["drafter"], "evaluation": report["evaluation"],
              "tiny_training": cfg["drafter_training"], "final_loss": report["drafter"]["history"][-1]["running_loss"],
              "default_pair": default_pair or default_path, "trained": trained, "workload_names": CARD_NAMES, "workloads": card_rows(workloads) if workloads else None,
              "workload_commands": sorted({entry["command"] for entry in (workloads or {}).values()}),
              "default_exittrain": _exittrain(default_exittrain, "conversations the target wrote itself") if default_exittrain else None,
              "tiny_exittrain": _exittrain(report["exittrain"], "target-regenerated sequences") if report.get("exittrain") else None}
    return _ENVIRONMENT.get_template("card.md.j2").render(**values)


def refresh_card(assets: Path) -> None:
    """Re-render ``assets/README.md`` from ``models/build.json``, the installed ExitTrain
    drafter's ``exittrain.json``, the default pair's drafters' ``training.json`` and the workload packs'
    ``models/smollm2/workload-results.json``, each when present."""
    load = lambda path, kind: read_result(path, kind) if path.is_file() else None  # noqa: E731
    report = load(assets / "models" / "build.json", "build")
    exittrain = load(assets / "models" / "drafter-exittrain" / "exittrain.json", "exittrain")
    if exittrain:
        report["exittrain"] = exittrain
    default = assets / "models" / DEFAULT_PAIR.home
    card = render_card(report, load(default / "drafter-block" / "training.json", "training"), load(default / "drafter-exittrain" / "exittrain.json", "exittrain"),
                       (load(default / "workload-results.json", "workload-table") or {}).get("packs"),
                       load(default / "drafter-path" / "training.json", "training"))
    write_text_atomic(Path(assets) / "README.md", card)  # readers see the old or the new card, never half
