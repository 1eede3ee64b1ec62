"""The app's live ExitTrain mode: a minute or two of fine-tuning the shipped base drafter on the
shipped live data (``assets/models/exittrain-data.safetensors``, written by ``build-assets``),
and ``python -m tev bench exittrain --live``, which measures what that mode gains."""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import asdict
from pathlib import Path

import torch
from safetensors.torch import load_file

from tev.bench.ablation import evaluation_setup
from tev.engine.drafters import BlockDrafter, BlockTreeDrafter
from tev.engine.evaluation import evaluate_drafter
from tev.train.trainer import ExitTrainConfig, ExitTrainer
from tev.util.paths import embedded, models_dir

__all__ = ["LIVE_CONFIG", "load_live_data", "live_trainer", "run_live_check", "live_check_command"]

# Calibrated on this 2-core CPU: 300 steps take about 70 s; lr 1e-3 (60 steps) lowered tau by 16%.
LIVE_CONFIG = ExitTrainConfig(steps=300, budget=32, lambda_exit=16.0, lr=2e-4, warmup=5, sequences_per_step=2, anchors_per_sequence=8, eval_every=20, save_every=0)


def load_live_data(path: Path | None = None) -> tuple[torch.Tensor, torch.Tensor, int]:
    """(train sequences `LongTensor[S, T]`, held-out sequences `LongTensor[S', T]`, first anchor)
    shipped for the live mode."""
    path = Path(path or models_dir() / "exittrain-data.safetensors")
    if not path.is_file():
        raise FileNotFoundError(f"the live ExitTrain data is missing ({path}); rebuild it with `python -m tev build-assets`")
    tensors = load_file(path)
    return tensors["train"].long(), tensors["heldout"].long(), int(tensors["first_anchor"].item())


def live_trainer(target, config: ExitTrainConfig = LIVE_CONFIG, data: tuple[torch.Tensor, torch.Tensor, int] | None = None) -> ExitTrainer:
    """A trainer of a fresh float32 copy of the shipped base drafter on the live data
    (``data`` as :func:`load_live_data` returns it; loaded when None)."""
    train, heldout, first_anchor = data or load_live_data()
    drafter = BlockDrafter.from_pretrained(embedded("block"), target, dtype=torch.float32)
    return ExitTrainer(config, target, drafter, train, heldout=heldout, first_anchor=first_anchor)


def run_live_check(bundle, seeds=(0, 1, 2), prompts: list[dict] | None = None, budget: int = 32, max_new_tokens: int = 64, progress: bool = True) -> dict:
    """The app's live mode (``LIVE_CONFIG`` on the shipped live data) from the base drafter,
    once per seed: wall time and the decoding ``tau`` change on held-out prompts."""
    data = load_live_data()
    base = BlockTreeDrafter(BlockDrafter.from_pretrained(embedded("block"), bundle.target), name="base")
    reference = evaluate_drafter(bundle.target, bundle.tokenizer, base, prompts, budgets=(budget,), max_new_tokens=max_new_tokens, desc="tau [base]", progress=progress)
    runs = []
    for seed in seeds:
        trainer = live_trainer(bundle.target, dataclasses.replace(LIVE_CONFIG, seed=seed), data)
        start = time.time()
        for _ in trainer.run():
            pass
        seconds = time.time() - start
        trained = BlockTreeDrafter(trainer.accelerator.unwrap_model(trainer.drafter).eval().to(torch.bfloat16), name=f"live-{seed}")
        rows = evaluate_drafter(bundle.target, bundle.tokenizer, trained, prompts, budgets=(budget,), max_new_tokens=max_new_tokens, desc=f"tau [live seed {seed}]", progress=progress)
        runs.append({"seed": seed, "train_seconds": seconds, "rows": rows})
    changes = {}
    for i, base_row in enumerate(reference):
        values = [run["rows"][i]["tau"] / base_row["tau"] - 1 for run in runs]
        changes[f"T={base_row['temperature']:g}"] = {"base_tau": base_row["tau"], "relative_changes": values, "mean": sum(values) / len(values), "min": min(values), "max": max(values)}
    return {"config": asdict(LIVE_CONFIG), "budget": budget, "prompts": len(prompts), "base": reference, "runs": runs, "tau_change": changes}


def live_check_command(args) -> None:
    """``python -m tev bench exittrain --live``: :func:`run_live_check` once per ``--live-seeds``."""
    out, bundle, prompts = evaluation_setup(args)
    result = run_live_check(bundle, args.live_seeds, prompts, max_new_tokens=args.max_new_tokens)
    (out / "exittrain-live.json").write_text(json.dumps(result, indent=1))
    for key, change in result["tau_change"].items():
        print(f"live mode ({result['config']['steps']} steps, {sum(r['train_seconds'] for r in result['runs']) / len(result['runs']):.0f}s of training): {key}: "
              f"tau {change['base_tau']:.3f} -> change mean {100 * change['mean']:+.1f}% (min {100 * change['min']:+.1f}%, max {100 * change['max']:+.1f}%) over seeds {args.live_seeds}")
    print(f"wrote {out / 'exittrain-live.json'}")
