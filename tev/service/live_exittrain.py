"""The app's live ExitTrain mode: a few minutes of fine-tuning a pair's shipped base drafter on
its shipped ExitTrain data, measured on held-out rounds; and ``python -m tev bench exittrain
--live``, which measures what that mode gains.

The default (chat) pair fine-tunes on one domain's conversations (dialogue, code or math) and is
judged on that domain's held-out conversations: the same anchors before and after, so the
change in ``1 + C`` is a paired difference with its own standard error. The tiny pair fine-tunes
on its corpus sequences (``assets/models/exittrain-data.safetensors``, written by ``build-assets``).
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from dataclasses import asdict
from pathlib import Path

import torch
from safetensors.torch import load_file

from tev.bench.ablation import evaluation_setup
from tev.engine.block_drafter import BlockDrafter
from tev.engine.drafters import BlockTreeDrafter
from tev.engine.evaluation import evaluate_drafter
from tev.engine.models import shipped_drafter
from tev.train.anchor_data import AnchorData
from tev.train.exit_loss import TreeBatch
from tev.train.exittrain_data import load_chat_exittrain_data
from tev.train.trainer import ExitTrainConfig, ExitTrainer
from tev.util.paths import models_dir

__all__ = ["LIVE_CONFIG", "CHAT_LIVE_CONFIG", "LIVE_HELDOUT_BATCHES", "live_config", "has_domains", "load_live_data", "live_data", "live_trainer",
           "coverage_change", "run_live_check", "live_check_command"]

# Calibrated on a 2-core CPU: 300 steps of the tiny pair take about 70 s; lr 1e-3 (60 steps) lowered tau by 16%.
LIVE_CONFIG = ExitTrainConfig(steps=300, budget=32, lambda_exit=16.0, lr=2e-4, warmup=5, sequences_per_step=2, anchors_per_sequence=8, eval_every=20, save_every=0)
# The default pair: about 4 s a step on a 2-core CPU (two target forwards of two conversations and 32 trees), so
# 36 steps and two held-out checks fit in the 3 minutes the tab allows (45 steps with three checks took 228 s).
CHAT_LIVE_CONFIG = ExitTrainConfig(steps=36, budget=32, lambda_exit=16.0, lr=1e-4, warmup=3, sequences_per_step=2, anchors_per_sequence=16, eval_every=18, save_every=0)
LIVE_HELDOUT_BATCHES = 4  # held-out rounds for the live before/after: 4 x 2 conversations x 16 anchors


def live_config(chat: bool) -> ExitTrainConfig:
    return CHAT_LIVE_CONFIG if chat else LIVE_CONFIG


def has_domains(bundle) -> bool:
    """Whether the bundle's live data comes by domain (the default pair's conversations)."""
    return bundle.pair == "smollm2"


def load_live_data(path: Path | None = None) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(train sequences `LongTensor[S, T]`, held-out sequences `LongTensor[S', T]`, first anchor)
    shipped for the tiny pair's live mode."""
    path = Path(path or models_dir() / "exittrain-data.safetensors")
    if not path.is_file():
        raise FileNotFoundError(f"the live ExitTrain data is missing ({path}); rebuild it with `python -m tev build-assets`")
    tensors = load_file(path)
    return tensors["train"].long(), tensors["heldout"].long(), int(tensors["first_anchor"].item())


def live_data(bundle, domain: str | None = None) -> tuple[AnchorData, AnchorData]:
    """(train, held-out) of a pair's live mode: the default pair's conversations of ``domain``
    (all when None), or the tiny pair's shipped sequences."""
    if has_domains(bundle):
        return load_chat_exittrain_data(domain)
    train, heldout, first_anchor = load_live_data()
    return AnchorData.of(train, first_anchor), AnchorData.of(heldout, first_anchor)


def live_trainer(bundle, config: ExitTrainConfig, data: tuple[AnchorData, AnchorData]) -> ExitTrainer:
    """A trainer of a fresh float32 copy of the pair's shipped base drafter on ``data``."""
    drafter = BlockDrafter.from_pretrained(shipped_drafter(bundle.pair or "tiny", "block"), bundle.target, dtype=torch.float32)
    return ExitTrainer(config, bundle.target, drafter, data[0], heldout=data[1])


def coverage_change(before: TreeBatch, after: TreeBatch) -> dict:
    """Mean ``1 + C`` of two drafters' trees on the same held-out anchors, the relative change
    and its standard error (paired over anchors: both drafters met the same contexts)."""
    if len(before.coverage) != len(after.coverage) or not before.coverage:
        raise ValueError("compare trees of the same held-out anchors")
    n = len(before.coverage)
    mean_before, mean_after = before.expected_tau, after.expected_tau
    differences = [a - b for a, b in zip(after.coverage, before.coverage)]
    mean_difference = sum(differences) / n
    spread = math.sqrt(sum((d - mean_difference) ** 2 for d in differences) / max(1, n - 1))
    return {"before": mean_before, "after": mean_after, "change": mean_after / mean_before - 1,
            "change_se": spread / math.sqrt(n) / mean_before, "anchors": n}


def run_live_check(bundle, seeds=(0, 1, 2), prompts: list[dict] | None = None, budget: int = 32, max_new_tokens: int = 64,
                   domain: str | None = None, progress: bool = True) -> dict:
    """The app's live mode from the base drafter, once per seed: wall time, the held-out
    ``1 + C`` change on the same anchors, and the decoding ``tau`` change on held-out prompts."""
    config = live_config(has_domains(bundle))
    data = live_data(bundle, domain)
    base = BlockTreeDrafter(BlockDrafter.from_pretrained(shipped_drafter(bundle.pair or "tiny", "block"), bundle.target), name="base")
    reference = evaluate_drafter(bundle.target, bundle.tokenizer, base, prompts, budgets=(budget,), max_new_tokens=max_new_tokens, desc="tau [base]", progress=progress)
    runs = []
    for seed in seeds:
        trainer = live_trainer(bundle, dataclasses.replace(config, seed=seed), data)
        before = trainer.heldout_trees(LIVE_HELDOUT_BATCHES)
        start = time.time()
        for _ in trainer.run():
            pass
        seconds = time.time() - start
        heldout = coverage_change(before, trainer.heldout_trees(LIVE_HELDOUT_BATCHES))
        trained = BlockTreeDrafter(trainer.accelerator.unwrap_model(trainer.drafter).eval().to(torch.bfloat16), name=f"live-{seed}")
        rows = evaluate_drafter(bundle.target, bundle.tokenizer, trained, prompts, budgets=(budget,), max_new_tokens=max_new_tokens, desc=f"tau [live seed {seed}]", progress=progress)
        runs.append({"seed": seed, "train_seconds": seconds, "heldout_expected_tau": heldout, "rows": rows})
    changes = {}
    for i, base_row in enumerate(reference):
        values = [run["rows"][i]["tau"] / base_row["tau"] - 1 for run in runs]
        changes[f"T={base_row['temperature']:g}"] = {"base_tau": base_row["tau"], "relative_changes": values, "mean": sum(values) / len(values), "min": min(values), "max": max(values)}
    return {"config": asdict(config), "domain": domain, "budget": budget, "prompts": len(prompts), "base": reference, "runs": runs, "tau_change": changes}


def live_check_command(args) -> None:
    """``python -m tev bench exittrain --live``: :func:`run_live_check` once per ``--live-seeds``."""
    out, bundle, prompts = evaluation_setup(args)
    result = run_live_check(bundle, args.live_seeds, prompts, max_new_tokens=args.max_new_tokens, domain=getattr(args, "domain", None))
    (out / "exittrain-live.json").write_text(json.dumps(result, indent=1))
    seconds = sum(r["train_seconds"] for r in result["runs"]) / len(result["runs"])
    for run in result["runs"]:
        change = run["heldout_expected_tau"]
        print(f"seed {run['seed']}: held-out 1 + C {change['before']:.3f} -> {change['after']:.3f} ({100 * change['change']:+.1f}% +- {100 * change['change_se']:.1f}%, "
              f"{change['anchors']} anchors) in {run['train_seconds']:.0f} s")
    for key, change in result["tau_change"].items():
        print(f"live mode ({result['config']['steps']} steps, {seconds:.0f}s of training{', ' + result['domain'] if result['domain'] else ''}): {key}: "
              f"tau {change['base_tau']:.3f} -> change mean {100 * change['mean']:+.1f}% (min {100 * change['min']:+.1f}%, max {100 * change['max']:+.1f}%) over seeds {args.live_seeds}")
    print(f"wrote {out / 'exittrain-live.json'}")
