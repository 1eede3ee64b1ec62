"""``python -m tev bench exittrain``: the ExitTrain ablation.

One drafter per weight mode (``none`` token-only, ``prefix`` reach-weighted, ``exit`` the
method), all from the same base, data, seed and steps; then decoding ``tau`` (TEV) and mean
``1 + C`` for the base and every variant. ``--install`` ships the measured exit drafter.
"""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import asdict
from pathlib import Path

import torch
from tqdm import tqdm

from tev.data.prompts import load_prompt_set
from tev.engine.drafters import BlockDrafter, BlockTreeDrafter
from tev.engine.evaluation import evaluate_drafter
from tev.engine.models import load_bundle
from tev.train.card import refresh_card
from tev.train.exittrain_command import SEQUENCE_CACHE, install_drafter, invoked_command, training_sequences
from tev.train.trainer import ExitTrainConfig, ExitTrainer
from tev.util.paths import REPO_ROOT, assets_dir, embedded

__all__ = ["run_ablation", "format_ablation", "install_from_ablation", "ablation_command", "evaluation_setup"]


def run_ablation(
    bundle,
    base: Path,
    modes=("none", "prefix", "exit"),
    config: ExitTrainConfig = ExitTrainConfig(),
    data_sequences: int = 1024,
    context_length: int = 128,
    new_tokens: int = 96,
    prompts: list[dict] | None = None,
    budgets=(16, 32, 64),
    temperatures=(0.0, 1.0),
    max_new_tokens: int = 64,
    out: Path | None = None,
    progress: bool = True,
    cache_dir: Path | None = SEQUENCE_CACHE,
) -> dict:
    """Train one drafter per weight mode from the same base, data, seed and steps; then
    measure decoding ``tau`` (TEV) and mean ``1 + C`` for the base and every variant.

    The training sequences are cached in ``cache_dir`` (None: no cache); with ``out`` each
    trained drafter is saved as ``out/drafter-<mode>``.
    """
    train = training_sequences(bundle.target, bundle.tokenizer, "train", data_sequences, context_length, new_tokens, seed=config.seed + 7, cache_dir=cache_dir, progress=progress)
    heldout = training_sequences(bundle.target, bundle.tokenizer, "heldout", 48, context_length, new_tokens, seed=config.seed + 8, cache_dir=cache_dir, progress=progress)
    drafters = {"base": BlockDrafter.from_pretrained(base, bundle.target)}
    training = {}
    base_heldout_tau = None
    for mode in modes:
        variant = dataclasses.replace(config, weights=mode, save_every=0)
        drafter = BlockDrafter.from_pretrained(base, bundle.target, dtype=torch.float32)
        trainer = ExitTrainer(variant, bundle.target, drafter, train, heldout=heldout, first_anchor=context_length - 1)
        if base_heldout_tau is None:  # same held-out anchors and temperature for every mode
            base_heldout_tau = trainer.heldout_expected_tau()
        start = time.time()
        bar = tqdm(total=variant.steps, desc=f"train [{mode}]", disable=not progress)
        for event in trainer.run():
            bar.set_postfix(loss=f"{event.loss:.3f}", tau_bound=f"{event.expected_tau:.3f}")
            bar.update(1)
        bar.close()
        trained = trainer.accelerator.unwrap_model(trainer.drafter).eval()
        training[mode] = {"seconds": time.time() - start, "heldout_expected_tau": trainer.heldout_expected_tau(), "history": trainer.history}
        if out is not None:
            trained.save_pretrained(Path(out) / f"drafter-{mode}")
        drafters[mode] = trained.to(torch.bfloat16)
    rows = []
    for name, model in drafters.items():
        measured = evaluate_drafter(bundle.target, bundle.tokenizer, BlockTreeDrafter(model, name=name), prompts, budgets=budgets, temperatures=temperatures, max_new_tokens=max_new_tokens, desc=f"tau [{name}]", progress=progress)
        rows += [{"drafter": name, **row} for row in measured]
    return {"config": asdict(config), "data_sequences": data_sequences, "prompts": len(prompts), "rows": rows, "training": training, "base_heldout_expected_tau": base_heldout_tau}


def format_ablation(result: dict) -> str:
    """Markdown table of an ablation result: tau per (T, B, drafter), its change vs the base."""
    rows = result["rows"]
    base = {(r["budget"], r["temperature"]): r["tau"] for r in rows if r["drafter"] == "base"}
    lines = ["| T | B | drafter | tau (+- s.e.) | vs base | mean 1 + C |", "|---|---|---|---|---|---|"]
    order = ("base", "none", "prefix", "exit")  # the controls first, the method last
    for r in sorted(rows, key=lambda r: (r["temperature"], r["budget"], order.index(r["drafter"]) if r["drafter"] in order else len(order))):
        change = r["tau"] / base[(r["budget"], r["temperature"])] - 1
        lines.append(f"| {r['temperature']:g} | {r['budget']} | {r['drafter']} | {r['tau']:.3f} +- {r['tau_se']:.3f} | {100 * change:+.1f}% | {r['tau_bound']:.3f} |")
    return "\n".join(lines)


def install_from_ablation(result: dict, out: Path, target) -> None:
    """Ship the ablation's exit-weighted drafter, so the shipped drafter is the one the
    evaluation measured; its card entry has the same fields ``exittrain --install`` writes."""
    config = {**result["config"], "weights": "exit"}
    training = result["training"]["exit"]
    entry = {
        "config": config,
        "steps_done": config["steps"],
        "seconds": training["seconds"],
        "heldout_expected_tau_before": result["base_heldout_expected_tau"],
        "heldout_expected_tau_after": training["heldout_expected_tau"],
        "history": training["history"],
        "tau": {name: [row for row in result["rows"] if row["drafter"] == drafter] for name, drafter in (("before", "base"), ("after", "exit"))},
        "ablation": format_ablation(result),
        "command": result["command"],
    }
    trained = BlockDrafter.from_pretrained(out / "drafter-exit", target)
    trained.config.notes = {**trained.config.notes, "exittrain": config, "trained_by": result["command"]}
    install_drafter(trained, embedded("exittrain"), extra_files={"exittrain.json": json.dumps(entry, indent=1)})
    refresh_card(assets_dir())
    print(f"installed the exit-weighted drafter as {embedded('exittrain')}; model card updated")


def evaluation_setup(args) -> tuple[Path, object, list[dict]]:
    """(output folder, created; the models in float32; the held-out prompts) of a ``bench exittrain`` run."""
    out = Path(args.out) if args.out else REPO_ROOT / "runs" / f"exittrain-eval-{time.strftime('%Y%m%d-%H%M%S')}"
    out.mkdir(parents=True, exist_ok=True)
    bundle = load_bundle(args.target, None, device=args.device, dtype="float32", allow_download=args.allow_download, pair=args.pair or "tiny")
    prompts = load_prompt_set("heldout")[:: max(1, 64 // args.num_prompts)][: args.num_prompts]
    return out, bundle, prompts


def ablation_command(args) -> None:
    if args.install and "exit" not in args.modes:
        raise ValueError("--install ships the exit-weighted drafter: keep exit in --modes")
    out, bundle, prompts = evaluation_setup(args)
    config = dataclasses.replace(ExitTrainConfig.from_args(args), eval_every=0, save_every=0)
    result = run_ablation(bundle, Path(args.base) if args.base else embedded("block"), args.modes, config, args.data_sequences, prompts=prompts, budgets=args.budgets, temperatures=args.temperatures, max_new_tokens=args.max_new_tokens, out=out)
    result["command"] = invoked_command()
    (out / "exittrain-eval.json").write_text(json.dumps(result, indent=1))
    print(format_ablation(result))
    print(f"wrote {out / 'exittrain-eval.json'}")
    if args.install:
        install_from_ablation(result, out, bundle.target)
