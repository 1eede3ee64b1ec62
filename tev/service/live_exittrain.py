"""The app's live ExitTrain mode: a few minutes of fine-tuning a pair's shipped base drafter on
its shipped ExitTrain data, measured on held-out rounds; and ``python -m tev bench exittrain
--live``, which measures what that mode gains.

The default (chat) pair fine-tunes on one domain's conversations (dialogue, code or math) and is
judged on that domain's held-out conversations: the same anchors before and after, so the
change in ``1 + C`` is a paired difference with its own standard error
(:class:`tev.train.experiment.Experiment`). The tiny pair fine-tunes on its corpus sequences
(``assets/models/exittrain-data.safetensors``, written by ``build-assets``).
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import asdict

import torch

from tev.bench.ablation import evaluation_setup
from tev.engine.block_drafter import BlockDrafter
from tev.engine.drafters import BlockTreeDrafter
from tev.engine.evaluation import evaluate_drafter
from tev.train.data import TrainData, load_train_data
from tev.pipelines.exittrain import EXITTRAIN_SETTINGS
from tev.pipelines.exittrain_data import load_chat_exittrain_data
from tev.train.experiment import Experiment
from tev.train.loop import TrainSettings
from tev.util.paths import models_dir
from tev.util.stored import write_result

__all__ = ["LIVE_SETTINGS", "CHAT_LIVE_SETTINGS", "live_settings", "live_data", "live_experiment", "run_live_check", "live_check_command"]

# Calibrated on a 2-core CPU: 300 steps of the tiny pair take about 70 s; lr 1e-3 (60 steps) lowered tau by 16%.
LIVE_SETTINGS = dataclasses.replace(EXITTRAIN_SETTINGS, steps=300, warmup=5, sequences_per_step=2, anchors_per_sequence=8, eval_every=0, save_every=0)
# The default pair: about 4 s a step on a 2-core CPU (two target forwards of two conversations and 32 trees), so
# 36 steps fit in the 3 minutes the tab allows.
CHAT_LIVE_SETTINGS = dataclasses.replace(LIVE_SETTINGS, steps=36, lr=1e-4, warmup=3, anchors_per_sequence=16)


def live_settings(chat: bool) -> TrainSettings:
    return CHAT_LIVE_SETTINGS if chat else LIVE_SETTINGS


def live_data(bundle, domain: str | None = None) -> tuple[TrainData, TrainData]:
    """(train, held-out) of a pair's live mode: the default pair's conversations of ``domain``
    (all when None), or the tiny pair's shipped sequences."""
    if bundle.has_domains:
        return load_chat_exittrain_data(domain)
    path = models_dir() / "exittrain-data.safetensors"
    if not path.is_file():
        raise FileNotFoundError(f"the live ExitTrain data is missing ({path}); rebuild it with `python -m tev build-assets`")
    parts = load_train_data(path)
    return parts["train"], parts["heldout"]


def live_experiment(bundle, settings: TrainSettings, data: tuple[TrainData, TrainData]) -> Experiment:
    """Before -> train -> after of a fresh float32 copy of the pair's shipped base drafter on ``data``."""
    drafter = BlockDrafter.from_pretrained(bundle.shipped_folder("block"), bundle.target, dtype=torch.float32)
    return Experiment.exittrain(bundle.target, drafter, data[0], data[1], settings)


def run_live_check(bundle, seeds=(0, 1, 2), prompts: list[dict] | None = None, budget: int = 32, max_new_tokens: int = 64,
                   domain: str | None = None, progress: bool = True) -> dict:
    """The app's live mode from the base drafter, once per seed: wall time, the held-out
    ``1 + C`` change on the same anchors, and the decoding ``tau`` change on held-out prompts."""
    settings = live_settings(bundle.has_domains)
    data = live_data(bundle, domain)
    base = BlockTreeDrafter(BlockDrafter.from_pretrained(bundle.shipped_folder("block"), bundle.target), name="base")
    reference = evaluate_drafter(bundle.target, bundle.tokenizer, base, prompts, budgets=(budget,), max_new_tokens=max_new_tokens, desc="tau [base]", progress=progress)
    runs = []
    for seed in seeds:
        experiment = live_experiment(bundle, dataclasses.replace(settings, seed=seed), data)
        start = time.time()
        heldout = experiment.run()
        seconds = time.time() - start
        trained = BlockTreeDrafter(experiment.drafter.served(), name=f"live-{seed}")
        rows = evaluate_drafter(bundle.target, bundle.tokenizer, trained, prompts, budgets=(budget,), max_new_tokens=max_new_tokens, desc=f"tau [live seed {seed}]", progress=progress)
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
