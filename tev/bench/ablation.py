"""``python -m tev bench exittrain``: the ExitTrain ablation.

One drafter per tree term (``none`` token-only, ``prefix`` reach-weighted, ``exit`` the
method), all from the same base, data, seed and steps; then decoding ``tau`` (TEV) and mean
``1 + C`` for the base and every variant, per domain for a chat pair, and where each drafter's
trees lose the target's mass (exit mass by depth on the same held-out rounds).
``--install`` ships the measured exit drafter. With ``--live``: the app's live ExitTrain mode
(:mod:`tev.service.live_exittrain`) once per seed, and what it gains.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from dataclasses import asdict
from pathlib import Path

import torch

from tev.data.prompts import evaluation_prompts
from tev.engine.block_drafter import BlockDrafter
from tev.engine.drafters import BlockTreeDrafter
from tev.engine.evaluation import evaluate_drafter
from tev.engine.models import load_bundle, shipped_drafter
from tev.pipelines.card import refresh_card
from tev.train.data import TrainData
from tev.pipelines.arguments import add_data_arguments, add_model_arguments, add_training_arguments
from tev.pipelines.exittrain import EXITTRAIN_FLAGS, EXITTRAIN_SETTINGS, exittrain_sets, fine_tune_start, invoked_command, pair_of, settings_from_args
from tev.service.live_exittrain import live_data, live_experiment, live_settings
from tev.train.experiment import Experiment
from tev.train.loop import TrainSettings, install_drafter, with_progress
from tev.train.losses import TREE_TERMS
from tev.util.paths import REPO_ROOT, assets_dir
from tev.util.stored import result_text, write_result

__all__ = ["run_ablation", "format_ablation", "install_from_ablation", "ablation_command", "evaluation_setup", "pooled_rows", "run_live_check", "live_check_command", "add_arguments", "run"]


def pooled_rows(parts: list[list[dict]]) -> list[dict]:
    """One row per setting pooled over prompt groups (e.g. domains) evaluated apart: ``tau``,
    ``mean_block_length`` and ``tau_bound`` weighted by rounds (``tau`` so stays tokens over
    forwards), the groups' standard errors combined as independent."""
    pooled = []
    for rows in zip(*parts):
        rounds = sum(r["rounds"] for r in rows)
        row = {**rows[0], "rounds": rounds, "tokens": sum(r["tokens"] for r in rows)}
        row["tau"] = sum(r["tau"] * r["rounds"] for r in rows) / rounds
        row["mean_block_length"] = sum(r["mean_block_length"] * r["rounds"] for r in rows) / rounds
        row["tau_bound"] = sum(r["tau_bound"] * r["rounds"] for r in rows) / rounds
        row["prompts"] = sum(r["prompts"] for r in rows)
        row["tau_se"] = sum((r["tau_se"] * r["rounds"]) ** 2 for r in rows) ** 0.5 / rounds
        row.pop("domain", None)
        pooled.append(row)
    return pooled


def _measure(bundle, name: str, drafter, prompts: list[dict], budgets, temperatures, max_new_tokens: int, progress: bool) -> list[dict]:
    """Rows of ``drafter`` on ``prompts``: per domain (when the prompts have domains) and pooled."""
    tree_drafter = BlockTreeDrafter(drafter, name=name)
    domains = list(dict.fromkeys(p["domain"] for p in prompts)) if all("domain" in p for p in prompts) else []
    if len(domains) < 2:
        rows = evaluate_drafter(bundle.runner, bundle.tokenizer, tree_drafter, prompts, budgets=budgets, temperatures=temperatures, max_new_tokens=max_new_tokens, desc=f"tau [{name}]", progress=progress)
        return [{"drafter": name, **row} for row in rows]
    parts = []
    for domain in domains:
        rows = evaluate_drafter(bundle.runner, bundle.tokenizer, tree_drafter, [p for p in prompts if p["domain"] == domain], budgets=budgets,
                                temperatures=temperatures, max_new_tokens=max_new_tokens, desc=f"tau [{name}, {domain}]", progress=progress)
        parts.append([{"drafter": name, **row, "domain": domain} for row in rows])
    return [row for part in parts for row in part] + pooled_rows(parts)


def _trees_summary(trees, horizon: int) -> dict:
    return {"tau_bound": trees.tau_bound, "trees": len(trees.trees), **trees.exit_mass_by_depth(horizon)}


def run_ablation(
    bundle,
    base: Path,
    train: TrainData,
    heldout: TrainData,
    prompts: list[dict],
    modes=("none", "prefix", "exit"),
    config: TrainSettings = EXITTRAIN_SETTINGS,
    budgets=(16, 32, 64),
    temperatures=(0.0, 1.0),
    max_new_tokens: int = 64,
    out: Path | None = None,
    progress: bool = True,
) -> dict:
    """Train one drafter per weight mode from the same base, data, seed and steps; then
    measure decoding ``tau`` (TEV) and mean ``1 + C`` for the base and every variant (per
    domain and pooled when the prompts have domains), and each drafter's held-out ``1 + C``
    and exit mass by depth on the same held-out rounds. With ``out`` each trained drafter
    is saved as ``out/drafter-<mode>``."""
    drafters = {"base": BlockDrafter.from_pretrained(base, bundle.target)}
    training, trees = {}, {}
    for mode in modes:
        variant = dataclasses.replace(config, tree_term=mode, save_every=0, eval_every=0)
        drafter = BlockDrafter.from_pretrained(base, bundle.target, dtype=torch.float32)
        experiment = Experiment.exittrain(bundle.target, drafter, train, heldout, variant)
        for _ in experiment.measure_before():  # the same held-out anchors and temperature for every drafter
            pass
        trees.setdefault("base", _trees_summary(experiment.before, drafter.config.horizon))
        start = time.time()
        for _ in with_progress(experiment.train(), f"train [{mode}]", progress):
            pass
        for _ in experiment.measure_after():
            pass
        trained = experiment.drafter.eval()
        trees[mode] = _trees_summary(experiment.after, drafter.config.horizon)
        training[mode] = {"seconds": time.time() - start, "heldout_tau_bound": trees[mode]["tau_bound"], "heldout_change": experiment.change(),
                          "history": experiment.history}
        if out is not None:
            trained.save_pretrained(Path(out) / f"drafter-{mode}")
        drafters[mode] = trained.served()
    rows = []
    for name, model in drafters.items():
        rows += _measure(bundle, name, model, prompts, budgets, temperatures, max_new_tokens, progress)
    return {"settings": asdict(config), "train_sequences": len(train), "heldout_sequences": len(heldout), "prompts": len(prompts), "rows": rows,
            "training": training, "heldout_trees": trees, "base_heldout_tau_bound": trees.get("base", {}).get("tau_bound")}


def format_ablation(result: dict) -> str:
    """Markdown table of an ablation result: tau per (T, B, drafter), its change vs the base, the
    mean block length and the mean ``1 + C`` that bounds it."""
    rows = [r for r in result["rows"] if "domain" not in r]
    base = {(r["budget"], r["temperature"]): r["tau"] for r in rows if r["drafter"] == "base"}
    lines = ["| T | B | drafter | tau (+- s.e. over prompts) | vs base | mean block length | mean 1 + C |", "|---|---|---|---|---|---|---|"]
    order = ("base", "none", "prefix", "exit")  # the controls first, the method last
    for r in sorted(rows, key=lambda r: (r["temperature"], r["budget"], order.index(r["drafter"]) if r["drafter"] in order else len(order))):
        change = r["tau"] / base[(r["budget"], r["temperature"])] - 1
        lines.append(f"| {r['temperature']:g} | {r['budget']} | {r['drafter']} | {r['tau']:.3f} +- {r['tau_se']:.3f} | {100 * change:+.1f}% | {r['mean_block_length']:.3f} | {r['tau_bound']:.3f} |")
    return "\n".join(lines)


def install_from_ablation(result: dict, out: Path, target) -> None:
    """Ship the ablation's exit-weighted drafter, so the shipped drafter is the one the
    evaluation measured; its card entry has the same fields ``exittrain --install`` writes."""
    config = {**result["settings"], "tree_term": "exit"}
    training = result["training"]["exit"]
    entry = {
        "settings": config,
        "steps_done": config["steps"],
        "seconds": training["seconds"],
        "heldout_tau_bound_before": result["base_heldout_tau_bound"],
        "heldout_tau_bound_after": training["heldout_tau_bound"],
        "history": training["history"],
        "tau": {name: [row for row in result["rows"] if row["drafter"] == drafter] for name, drafter in (("before", "base"), ("after", "exit"))},
        "ablation": format_ablation(result),
        "heldout_trees": result.get("heldout_trees", {}),
        "domain_rows": [row for row in result["rows"] if "domain" in row],
        "command": result["command"],
    }
    trained = BlockDrafter.from_pretrained(out / "drafter-exit", target)
    trained.config.notes = {**trained.config.notes, "exittrain": config, "trained_by": result["command"]}
    destination = shipped_drafter(result["pair"], "exittrain")
    install_drafter(trained, destination, extra_files={"exittrain.json": result_text("exittrain", entry)})
    refresh_card(assets_dir())
    print(f"installed the exit-weighted drafter as {destination}; model card updated")


def evaluation_setup(args, bundle=None) -> tuple[Path, object, list[dict]]:
    """(output folder, created; the models in float32, unless given; the held-out prompts) of a ``bench exittrain`` run."""
    out = Path(args.out) if args.out else REPO_ROOT / "runs" / f"exittrain-eval-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)
    bundle = bundle or load_bundle(args.target, None, device=args.device, dtype="float32", allow_download=args.allow_download, pair=pair_of(args))
    prompts = evaluation_prompts(bundle.is_chat, args.num_prompts, getattr(args, "domain", None))
    return out, bundle, prompts


def ablation_command(args) -> None:
    if args.install and "exit" not in args.tree_terms:
        raise ValueError("--install ships the exit-term drafter: keep exit in --tree-terms")
    pair, bundle, base = fine_tune_start(args)
    out, _, prompts = evaluation_setup(args, bundle)
    config = dataclasses.replace(settings_from_args(args), eval_every=0, save_every=0)
    train, heldout = exittrain_sets(bundle, args, config.seed)
    result = run_ablation(bundle, base, train, heldout, prompts, args.tree_terms, config, budgets=args.budgets, temperatures=args.temperatures, max_new_tokens=args.max_new_tokens, out=out)
    result["command"] = invoked_command()
    result["pair"] = pair
    result["domain"] = getattr(args, "domain", None)
    write_result(out / "exittrain-eval.json", "ablation", result)
    print(format_ablation(result))
    print(f"wrote {out / 'exittrain-eval.json'}")
    if args.install:
        install_from_ablation(result, out, bundle.target)


def run_live_check(bundle, seeds=(0, 1, 2), prompts: list[dict] | None = None, budget: int = 32, max_new_tokens: int = 64,
                   domain: str | None = None, progress: bool = True) -> dict:
    """The app's live mode from the base drafter, once per seed: wall time, the held-out
    ``1 + C`` change on the same anchors, and the decoding ``tau`` change on held-out prompts."""
    settings = live_settings(bundle.has_domains)
    data = live_data(bundle, domain)
    base = BlockTreeDrafter(BlockDrafter.from_pretrained(bundle.shipped_folder("block"), bundle.target), name="base")
    reference = evaluate_drafter(bundle.runner, bundle.tokenizer, base, prompts, budgets=(budget,), max_new_tokens=max_new_tokens, desc="tau [base]", progress=progress)
    runs = []
    for seed in seeds:
        experiment = live_experiment(bundle, dataclasses.replace(settings, seed=seed), data)
        start = time.time()
        heldout = experiment.run()
        seconds = time.time() - start
        trained = BlockTreeDrafter(experiment.drafter.served(), name=f"live-{seed}")
        rows = evaluate_drafter(bundle.runner, bundle.tokenizer, trained, prompts, budgets=(budget,), max_new_tokens=max_new_tokens, desc=f"tau [live seed {seed}]", progress=progress)
        runs.append({"seed": seed, "seconds": seconds, "heldout_change": heldout, "rows": rows})
    changes = {}
    for i, base_row in enumerate(reference):
        values = [run["rows"][i]["tau"] / base_row["tau"] - 1 for run in runs]
        changes[f"T={base_row['temperature']:g}"] = {"base_tau": base_row["tau"], "relative_changes": values, "mean": sum(values) / len(values), "min": min(values), "max": max(values)}
    return {"settings": asdict(settings), "domain": domain, "budget": budget, "prompts": len(prompts), "base": reference, "runs": runs, "tau_change": changes}


def live_check_command(args) -> None:
    """``python -m tev bench exittrain --live``: :func:`run_live_check` once per ``--live-seeds``."""
    out, bundle, prompts = evaluation_setup(args)
    result = run_live_check(bundle, args.live_seeds, prompts, max_new_tokens=args.max_new_tokens, domain=getattr(args, "domain", None))
    write_result(out / "exittrain-live.json", "live-exittrain", result)
    seconds = sum(r["seconds"] for r in result["runs"]) / len(result["runs"])
    for run in result["runs"]:
        change = run["heldout_change"]
        print(f"seed {run['seed']}: held-out 1 + C {change['before']:.3f} -> {change['after']:.3f} ({100 * change['change']:+.1f}% +- {100 * change['change_se']:.1f}%, "
              f"{change['anchors']} anchors) in {run['seconds']:.0f} s")
    for key, change in result["tau_change"].items():
        print(f"live mode ({result['settings']['steps']} steps, {seconds:.0f}s{', ' + result['domain'] if result['domain'] else ''}): {key}: "
              f"tau {change['base_tau']:.3f} -> change mean {100 * change['mean']:+.1f}% (min {100 * change['min']:+.1f}%, max {100 * change['max']:+.1f}%) over seeds {args.live_seeds}")
    print(f"wrote {out / 'exittrain-live.json'}")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tree-terms", nargs="+", choices=TREE_TERMS, default=["none", "prefix", "exit"], help="one trained drafter per tree term")
    add_training_arguments(parser, tuple(f for f in EXITTRAIN_FLAGS if f not in ("tree_term", "eval_every", "save_every")))
    add_data_arguments(parser)
    parser.add_argument("--budgets", type=int, nargs="+", default=[16, 32, 64])
    parser.add_argument("--temperatures", type=float, nargs="+", default=[0.0, 1.0])
    parser.add_argument("--num-prompts", type=int, default=16)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--base", help="drafter folder to start from (default: the pair's block drafter)")
    parser.add_argument("--out", help="folder for the trained drafters and exittrain-eval.json (default: runs/exittrain-eval-<time>)")
    parser.add_argument("--live", action="store_true", help="instead: the app's 1-2 minute live mode, once per --live-seeds, tau change at B=32")
    parser.add_argument("--live-seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--install", action="store_true", help="ship the exit-weighted drafter of this run as the pair's ExitTrain drafter (with its evaluation)")
    add_model_arguments(parser)


def run(args: argparse.Namespace) -> None:
    """The ablation, or with ``--live`` the check of the app's live mode."""
    (live_check_command if args.live else ablation_command)(args)
