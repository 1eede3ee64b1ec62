"""``python -m tev exittrain``: fine-tune a pair's block drafter with ExitTrain, optionally ship it.

The training data: for the default (chat) pair, its shipped conversations
(:mod:`tev.pipelines.exittrain_data`, optionally one domain); for the tiny pair, target-regenerated
corpus sequences, cached under ``runs/exittrain-data`` by their settings and the target's weights.
"""

from __future__ import annotations

import shlex
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch
from tqdm import tqdm

from tev.data.prompts import evaluation_prompts
from tev.engine.block_drafter import BlockDrafter
from tev.engine.drafters import BlockTreeDrafter
from tev.engine.evaluation import evaluate_drafter, format_tau_table
from tev.engine.models import default_pair, load_bundle, shipped_drafter
from tev.pipelines.card import refresh_card
from tev.pipelines.exittrain_data import load_chat_exittrain_data
from tev.train.data import TrainData
from tev.train.experiment import Experiment, heldout_trees
from tev.train.loop import TrainSettings, install_drafter, train
from tev.train.teacher import corpus_sequences
from tev.util.compute_thread import result_of
from tev.util.paths import REPO_ROOT, assets_dir
from tev.util.progress import Phase
from tev.util.stored import result_text, write_result

__all__ = ["EXITTRAIN_SETTINGS", "EXITTRAIN_FLAGS", "settings_from_args", "exittrain_command", "exittrain_sets", "pair_of", "fine_tune_start", "invoked_command", "SEQUENCE_CACHE"]

SEQUENCE_CACHE = REPO_ROOT / "runs" / "exittrain-data"
# Same-distribution ExitTrain: on-policy trees of B = 32 at T = 1, the exit term at lambda_tree 16,
# soft labels (the target's top-16 laws, as the shipped drafters learn), 4 rows x 8 anchors a step.
EXITTRAIN_SETTINGS = TrainSettings(steps=400, lr=2e-4, warmup=20, weight_decay=0.0, short_history_share=0.0, soft_top=16, tree_term="exit",
                                   lambda_tree=16.0, trees="on-policy", budget=32, temperature=1.0, sequences_per_step=4, anchors_per_sequence=8,
                                   eval_every=50, save_every=100)
EXITTRAIN_FLAGS = ("tree_term", "steps", "budget", "lambda_tree", "temperature", "lr", "warmup", "sequences_per_step", "anchors_per_sequence",
                   "soft_top", "eval_every", "save_every", "seed")


def settings_from_args(args, preset: TrainSettings = EXITTRAIN_SETTINGS) -> TrainSettings:
    """``preset`` with the command line's values of its flags."""
    return replace(preset, **{name: getattr(args, name) for name in EXITTRAIN_FLAGS if getattr(args, name, None) is not None})


def pair_of(args) -> str | None:
    """The shipped pair a command works on (None with ``--target``)."""
    return None if getattr(args, "target", None) else (args.pair or default_pair())


def fine_tune_start(args) -> tuple[str | None, object, Path]:
    """(the shipped pair, None with ``--target``; the models in float32; the base drafter's folder)
    of a fine-tuning command: ``--install`` needs a shipped pair, ``--target`` a ``--base``."""
    pair = pair_of(args)
    if pair is None and args.install:
        raise ValueError("--install ships a drafter for a shipped pair; drop --target")
    bundle = load_bundle(args.target, None, device=args.device, dtype="float32", allow_download=args.allow_download, pair=pair)
    if pair is None and not args.base:  # after loading: a target that does not load is the first thing to fix
        raise ValueError("with --target, pass --base: the block drafter to fine-tune")
    return pair, bundle, Path(args.base) if args.base else shipped_drafter(pair, "block")


def exittrain_sets(bundle, args, seed: int, progress: bool = True) -> tuple[TrainData, TrainData]:
    """(train, held-out) ExitTrain data of a command: the default pair's shipped conversations
    (of ``args.domain`` when set; their token ids are SmolLM2's), else corpus sequences the
    target regenerates itself (any target)."""
    domain = getattr(args, "domain", None)
    if bundle.has_domains:
        return load_chat_exittrain_data(domain)
    if domain:
        raise ValueError("--domain needs the default pair (its conversations have domains); other data has none")
    train = corpus_sequences(bundle.target, bundle.tokenizer, "train", args.data_sequences, args.context_length, args.new_tokens, seed=seed + 7, cache_dir=SEQUENCE_CACHE, progress=progress)
    heldout = corpus_sequences(bundle.target, bundle.tokenizer, "heldout", args.heldout_sequences, args.context_length, args.new_tokens, seed=seed + 8, cache_dir=SEQUENCE_CACHE, progress=progress)
    return TrainData.of(train, args.context_length), TrainData.of(heldout, args.context_length)


def invoked_command() -> str:
    """This process's ``python -m tev ...`` command line, shell-quoted (for reports and the card)."""
    return shlex.join(["python", "-m", "tev", *sys.argv[1:]])


def _check_data_flags(args) -> None:
    for flag in ("data_sequences", "heldout_sequences", "context_length", "new_tokens"):
        if getattr(args, flag) < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be at least 1, got {getattr(args, flag)}")
    if args.eval_prompts < 0:
        raise ValueError(f"--eval-prompts must be 0 (skip) or more, got {args.eval_prompts}")


def exittrain_command(args) -> None:
    _check_data_flags(args)
    settings = settings_from_args(args)
    out = Path(args.out) if args.out else REPO_ROOT / "runs" / "exittrain" / f"{settings.tree_term}-{time.strftime('%Y%m%d-%H%M%S')}"
    assets = (REPO_ROOT / "assets").resolve()
    if out.resolve() == assets or assets in out.resolve().parents:
        raise ValueError(f"--out {out} is inside assets/; write elsewhere and use --install to ship a result")
    if args.resume and not (out / "checkpoint").is_dir():
        raise FileNotFoundError(f"--resume: no checkpoint in {out}")
    pair, bundle, base = fine_tune_start(args)
    drafter = BlockDrafter.from_pretrained(base, bundle.target, dtype=torch.float32)
    train_data, heldout = exittrain_sets(bundle, args, settings.seed)
    experiment = Experiment(drafter, lambda d: train(d, train_data, settings, target=bundle.target, checkpoint=out / "checkpoint"),
                            lambda d: heldout_trees(bundle.target, d, heldout, settings))
    bar = tqdm(desc=f"exittrain[{settings.tree_term}]", unit="step", total=settings.steps)
    change = result_of(experiment.phases(), lambda event: bar.update(event.info["step"] - bar.n) if event.phase is Phase.TRAIN and event.info else None)
    bar.close()
    seconds = experiment.seconds["train"]
    trained = experiment.drafter
    trained.config.notes = {**trained.config.notes, "exittrain": asdict(settings), "trained_by": "python -m tev exittrain"}
    trained.save_pretrained(out / "drafter")
    steps_done = experiment.history[-1]["step"] if experiment.history else 0
    report = {"settings": asdict(settings), "steps_done": steps_done, "seconds": seconds, "heldout_tau_bound_before": change["before"],
              "heldout_tau_bound_after": change["after"], "heldout_change": change, "history": experiment.history}
    if args.eval_prompts:
        prompts = evaluation_prompts(bundle.is_chat, args.eval_prompts, getattr(args, "domain", None))
        original = BlockDrafter.from_pretrained(base, bundle.target)
        rows = {}
        for name, model in (("before", original), ("after", trained.served())):
            rows[name] = evaluate_drafter(bundle.runner, bundle.tokenizer, BlockTreeDrafter(model, name=name), prompts, budgets=(32,), temperatures=(0.0, 1.0), desc=f"tau {name}")
            print(f"{name}:\n" + format_tau_table(rows[name]))
        report["tau"] = rows
    write_result(out / "report.json", "exittrain", report)
    print(f"held-out expected 1 + C: before {change['before']:.3f}, after {change['after']:.3f} ({100 * change['change']:+.1f}% +- {100 * change['change_se']:.1f}%); "
          f"{seconds / 60:.1f} min; saved {out / 'drafter'}")
    if args.install:
        if steps_done < settings.steps:
            raise ValueError("the run did not finish; not installing a partial drafter")
        report["command"] = invoked_command()
        install_drafter(trained, shipped_drafter(pair, "exittrain"), extra_files={"exittrain.json": result_text("exittrain", report)})
        refresh_card(assets_dir())
        print(f"installed as {shipped_drafter(pair, 'exittrain')}; model card updated")
