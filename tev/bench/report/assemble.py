"""The report as a whole: measure every claim, then write ``report.md``, ``report.json`` and
the plots; and the ``python -m tev bench report`` command."""

from __future__ import annotations

import argparse
import json
import shlex
import time
from dataclasses import asdict, replace
from pathlib import Path

from tev.bench.report.budget_sweep import check_sweep, measure_sweep, sweep_drafters, sweep_section
from tev.bench.report.common import FULL, QUICK, ReportSettings, clean
from tev.bench.report.coverage import check_coverage_bound, coverage_section
from tev.bench.report.e2e_speed import best_budget_rows, check_e2e, e2e_section, measure_e2e
from tev.bench.report.equivalence import check_equivalence, equivalence_section
from tev.bench.report.exit_law import check_exit_law, exit_law_section
from tev.bench.report.exittrain_gain import check_exittrain, exittrain_data, exittrain_section
from tev.bench.report.workload_gain import check_workload, workload_data, workload_section
from tev.bench.report.latency import latency_section, measure_latency
from tev.bench.report.plots import write_plots
from tev.bench.report.trees import depth_profile, real_trees, run_labs
from tev.data.prompts import load_prompt_set
from tev.engine.default_target import DEFAULT_TARGET_NAME, converted_folder
from tev.engine.evaluation import fit_prompt
from tev.engine.models import load_bundle
from tev.pipelines.arguments import add_model_arguments
from tev.util.paths import REPO_ROOT
from tev.util.precision import figure_precision, precision_summary
from tev.util.stored import read_result, stamped
from tev.util.timing import machine_info

__all__ = ["measure_trees", "claims_table", "render_markdown", "build_report", "add_arguments", "run"]

TITLE = "TEV Explorer: the paper's claims on this model pair"
SECTIONS = {  # claim id -> its markdown section
    1: exit_law_section, 2: coverage_section, 3: equivalence_section, 4: latency_section, 5: exittrain_section, "5b": workload_section,
    6: sweep_section, 7: e2e_section,
}


def measure_trees(bundle, drafter, encoded, settings: ReportSettings, seed: int, progress: bool) -> tuple[list[dict], dict]:
    """Claims 1-3 on the same real trees: returns (claim rows, measurements incl. the depth profile)."""
    trees = real_trees(bundle, drafter, encoded, settings, progress)
    results = run_labs(trees, settings.draws, seed, progress)
    exit_law_claim, exit_law = check_exit_law(trees, results)
    coverage_claim, coverage = check_coverage_bound(trees, results, settings.draws, seed)
    measurements = {"exit_law": exit_law, "coverage": coverage, "depth_profile": depth_profile(trees, results)}
    return [exit_law_claim, coverage_claim, check_equivalence(coverage)], measurements


def claims_table(claims: list[dict]) -> str:
    """The claims summary as a markdown table."""
    lines = ["| # | claim | paper's figure | this run's figure | holds? |", "|---|---|---|---|---|"]
    for c in claims:
        cells = [str(c["id"]), c["claim"], c["paper"], c["this_run"], f"**{c['holds']}**"]
        lines.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(lines)


def render_markdown(report: dict) -> str:
    """report.md: title, command, machine, the claims table, one section per claim."""
    info = report["machine"]
    machine = f"{info['cpu']}, {info['torch_threads']} torch threads ({info['cpu_count']} CPUs), torch {info['torch']}, device {info['device']}" + (f" ({info['gpu']})" if "gpu" in info else "")
    lines = [
        f"# {TITLE}", "",
        f"- command: `{report['command']}`", f"- machine: {machine}; {precision_summary(report['precision'])}", f"- target: `{report['target']}`; drafters: {', '.join(report['drafters'])}",
        f"- seed: {report['seed']}; mode: {'quick' if report['quick'] else 'full'}; prompts: {len(report['prompts'])}", f"- date: {report['date']}", "",
        "## Claims", "", claims_table(report["claims"]), "",
    ]
    for claim in report["claims"]:
        verdict = {"yes": "It holds in this run.", "no": f"It does not hold in this run: {claim['this_run']}.", "partly": f"It holds in direction, not in size: {claim['this_run']}.", "n/a": "Not decided in this run."}[claim["holds"]]
        lines += [f"## {claim['id']}. {claim['claim']}", "", f"Paper: {claim['paper']}. Rule: {claim['rule']}. {verdict}", "", *SECTIONS[claim["id"]](report), ""]
    lines += [
        "## How to run on a CUDA GPU", "",
        "Run the same command on a machine with CUDA (`--device auto` picks it; `--dtype` defaults to bfloat16 there). "
        "Verifier-stage timings then use CUDA events and end-to-end stage timings synchronise around each stage, as `tev.bench.verifiers_bench` and `tev.bench.e2e` do.", "",
    ]
    return "\n".join(lines)


def _shown_source(source: str) -> str:
    """A model folder inside this repository as a relative path, the default target's cache
    folder as its name (the report is committed; a machine's own paths mean nothing there)."""
    path = Path(source)
    if path.resolve() == converted_folder().resolve():
        return DEFAULT_TARGET_NAME
    if path.is_dir() and REPO_ROOT in path.resolve().parents:
        return str(path.resolve().relative_to(REPO_ROOT))
    return source


def build_report(
    bundle,
    out_dir: Path,
    quick: bool,
    prompts: list[dict],
    seed: int,
    exittrain_results: dict | None,
    progress: bool = True,
    command: str | None = None,
    settings: ReportSettings | None = None,
    workload_results: dict[str, dict] | None = None,
    e2e_results: dict | None = None,
) -> dict:
    """Measure every claim on ``bundle`` and write ``report.md``, ``report.json`` and the plots
    (``plots/*.png``) into ``out_dir``. Returns the report dict (as in report.json).

    ``prompts``: ``[{"id", "text"}]`` (or ``"ids"``); all of them are used (cut the list first).
    ``settings`` overrides the ``QUICK`` / ``FULL`` preset chosen by ``quick``.
    ``workload_results``: ``{pack: result}`` of ``adapt`` runs, for claim 5b.
    ``e2e_results``: a ``bench e2e --json`` result for claim 7 instead of the report's own
    (shorter) run; its best budget for TEV at T = 1 is shown.
    """
    settings = settings or (QUICK if quick else FULL)
    if not prompts:
        raise ValueError("the report needs at least one prompt")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    base = "block" if "block" in bundle.drafters else "ar"  # the drafter of the real trees
    drafter = bundle.drafter(base)
    limit = bundle.context_length - settings.max_new_tokens
    encoded = [(str(p.get("id", i)), fit_prompt(bundle.tokenizer, p, limit)) for i, p in enumerate(prompts)]

    tree_claims, measurements = measure_trees(bundle, drafter, encoded, settings, seed, progress)
    latency_claim, measurements["latency"] = measure_latency(bundle, drafter, encoded, settings, seed, progress)
    drafters = sweep_drafters(bundle, base)
    measurements["sweep"] = measure_sweep(bundle, base, prompts, settings, seed, progress)
    measurements["e2e"] = best_budget_rows(e2e_results, base) if e2e_results else measure_e2e(bundle, base, prompts, settings, seed, progress)
    measurements["exittrain"] = exittrain_data(exittrain_results, measurements["sweep"], "exittrain" in bundle.drafters)
    measurements["workload"] = workload_data(workload_results)
    decoding_claims = [check_exittrain(measurements["exittrain"]), check_workload(measurements["workload"]), check_sweep(measurements["sweep"], drafters),
                       check_e2e(measurements["e2e"], base)]
    report = {
        "title": TITLE,
        "command": command or "build_report(...) (library call)",
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "seed": seed,
        "quick": quick,
        "machine": machine_info(next(bundle.target.parameters()).device),
        "precision": figure_precision(next(bundle.target.parameters()).device, bundle.target, bundle.drafters, bundle.precision.label if bundle.precision else None),
        "target": _shown_source(bundle.target_source),
        "drafters": list(bundle.drafters),
        "tree_drafter": base,
        "settings": asdict(settings),
        "prompts": [{"id": pid, "tokens": len(ids)} for pid, ids in encoded],
        "claims": tree_claims + [latency_claim] + decoding_claims,
        "measurements": measurements,
        "plots": write_plots(measurements, drafters, out_dir / "plots"),
    }
    (out_dir / "report.md").write_text(render_markdown(report))
    report = clean(report)
    (out_dir / "report.json").write_text(json.dumps(stamped("report", report), indent=1, allow_nan=False))
    return report


# --------------------------------------------------------------------------- command line
def _load_prompts(args) -> list[dict]:
    """Prompts from ``--prompts-file`` (a JSON list, or a dict with ``"prompts"``) or the named set."""
    if args.prompts_file:
        data = json.loads(Path(args.prompts_file).read_text())
        prompts = data["prompts"] if isinstance(data, dict) else data
        if not isinstance(prompts, list) or not all(isinstance(p, dict) and ("text" in p or "ids" in p) for p in prompts):
            raise ValueError(f"{args.prompts_file}: expected a list of {{'id', 'text'}} objects (or a dict with 'prompts')")
    else:
        prompts = load_prompt_set(args.prompts)
    return prompts


def _command_line(args) -> str:
    """The command that reproduces this run, rebuilt from the parsed options."""
    parts = ["python", "-m", "tev", "bench", "report"]
    for flag, value in (("--target", args.target), ("--draft", args.draft), ("--device", args.device), ("--dtype", args.dtype), ("--device-map", args.device_map)):
        if value is not None and value != "auto":
            parts += [flag, str(value)]
    parts += ["--quick"] if args.quick else []
    parts += ["--prompts-file", args.prompts_file] if args.prompts_file else ["--prompts", args.prompts]
    parts += ["--num-prompts", str(args.num_prompts)] if args.num_prompts is not None else []
    parts += ["--seed", str(args.seed)]
    parts += ["--exittrain-results", args.exittrain_results] if args.exittrain_results else []
    parts += ["--workload-results", *args.workload_results] if args.workload_results else []
    parts += ["--e2e-results", args.e2e_results] if args.e2e_results else []
    parts += ["--out", str(args.out)]
    return shlex.join(parts)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--quick", action="store_true", help="a couple of minutes: few prompts, trees, draws and budgets")
    parser.add_argument("--prompts", default="heldout", help="prompt set in assets/prompts (heldout, humaneval)")
    parser.add_argument("--prompts-file", help="JSON prompts instead of a named set: a list of {id, text} (or a dict with 'prompts')")
    parser.add_argument("--num-prompts", type=int, default=None, help=f"prompts used (default {FULL.num_prompts}, {QUICK.num_prompts} with --quick)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--exittrain-results", help="JSON from `python -m tev bench exittrain` (rows of base/none/prefix/exit tau) for claim 5")
    parser.add_argument("--e2e-results", help="JSON from `python -m tev bench e2e --json OUT.json` for claim 7 (instead of the report's own shorter run)")
    parser.add_argument("--workload-results", nargs="+", help="JSON files from `python -m tev adapt --workload PACK.json --json OUT.json` (one per pack) for claim 5b")
    parser.add_argument("--out", help="output folder (default: runs/report-<YYYYmmdd-HHMMSS>)")
    add_model_arguments(parser)


def run(args: argparse.Namespace) -> None:
    settings = QUICK if args.quick else FULL
    if args.num_prompts is not None:
        if args.num_prompts < 1:
            raise ValueError("--num-prompts must be at least 1")
        settings = replace(settings, num_prompts=args.num_prompts)
    args.out = Path(args.out) if args.out else REPO_ROOT / "runs" / f"report-{time.strftime('%Y%m%d-%H%M%S')}"
    exittrain_results = read_result(args.exittrain_results, "ablation") if args.exittrain_results else None  # from `python -m tev bench exittrain`
    workload_results = {}
    for path in args.workload_results or []:  # from `python -m tev adapt --workload PACK.json --json OUT.json`
        result = read_result(path, "workload")
        workload_results[Path(result.get("workload", path)).stem] = result
    e2e_results = read_result(args.e2e_results, "e2e") if args.e2e_results else None  # from `python -m tev bench e2e --json OUT.json`
    if e2e_results is not None and not e2e_results["rows"]:
        raise ValueError(f"{args.e2e_results}: an e2e result with no rows")
    prompts = _load_prompts(args)[: settings.num_prompts]
    bundle = load_bundle(args.target, args.draft, device=args.device, dtype=args.dtype, device_map=args.device_map, allow_download=args.allow_download, pair=args.pair)
    report = build_report(bundle, args.out, args.quick, prompts, args.seed, exittrain_results, progress=True, command=_command_line(args), settings=settings,
                          workload_results=workload_results or None, e2e_results=e2e_results)
    print(claims_table(report["claims"]))
    print(f"\nreport written to {args.out / 'report.md'} (and report.json, plots/)")
