"""``python -m tev exittrain --workload FILE.json``: adapt a pair's block drafter to a user's own
workload and measure the gain on held-out prompts of it.

The run, within ``--minutes`` (the target's answers included): split the prompts (a quarter held
out, never trained on), let the target answer the training prompts, add the answers' tokens the
draft vocabulary lacks, fine-tune a copy of the base drafter (the token loss on the answers plus
the tree term of :data:`DEFAULT_TREE_TERM`), then decode the held-out prompts with the base and
the adapted drafter at T = 0 (greedy) and T = 1 (TEV), budget 16, 64 new tokens. After the
budget, the token-only control (same data, steps and seed, no tree term) and any extra tree
terms asked for are trained and measured the same way.
"""

from __future__ import annotations

import copy
import json
import math
import time
from dataclasses import asdict, replace
from pathlib import Path

import torch

from tev.engine.block_drafter import BlockDrafter
from tev.engine.drafters import BlockTreeDrafter
from tev.engine.evaluation import evaluation_rounds
from tev.engine.models import load_bundle, shipped_drafter
from tev.train.exittrain_command import invoked_command
from tev.train.losses import TREE_TERMS
from tev.train.loop import TrainSettings, train
from tev.train.teacher import answer_prompts, with_features
from tev.train.trees import fixed_trees
from tev.train.workload_data import extend_draft_vocab, load_workload, split_workload
from tev.util.paths import REPO_ROOT

__all__ = ["DEFAULT_TREE_TERM", "EVAL_BUDGET", "EVAL_NEW_TOKENS", "EVAL_PROMPTS", "SOFT_TOP", "workload_settings", "workload_train_set",
           "adaptation", "heldout_mass", "relative_gain", "workload_command"]

DEFAULT_TREE_TERM = ("exit", 0.1)  # (tree term, lambda_tree) of the shipped recipe; see docs/exittrain.md
EVAL_BUDGET = 16
EVAL_NEW_TOKENS = 64
EVAL_PROMPTS = 10  # held-out prompts decoded (the first of the held-out split): a large workload's quarter would not fit the budget
SOFT_TOP = 16  # the target's top tokens kept as soft labels (train-drafter's default)
TREES_PER_ANSWER = 8
TEMPERATURES = {"T0": 0.0, "T1": 1.0}
# Shares of the time budget by which each phase must end: the answers, then the fine-tune; the
# held-out evaluation of base and adapted drafter takes the rest.
ANSWER_SHARE, TRAIN_SHARE = 0.2, 0.45


def workload_settings(tree_term: str = "exit", lambda_tree: float = 0.1, steps: int = 160, seed: int = 0) -> TrainSettings:
    """The workload fine-tune: 64 soft-labelled anchors and 16 fixed trees a step, lr 5e-4 (10
    warm-up steps, cosine to a tenth), no weight decay or short histories (a few minutes from a trained base)."""
    return TrainSettings(steps=steps, batch=64, lr=5e-4, warmup=10, seed=seed, weight_decay=0.0, short_history_share=0.0, soft_top=SOFT_TOP,
                         tree_term=tree_term, lambda_tree=lambda_tree, trees="fixed", tree_batch=16, budget=EVAL_BUDGET)


def workload_train_set(target, drafter: BlockDrafter, answers, seed: int = 0, progress: bool = True):
    """The target's features and laws on the answers, then at a few seeded anchors of each answer
    the tree ``drafter`` builds there, scored at T = 1: yields an int per piece of work, then
    ``(TrainData, ScoredTrees)``."""
    if not len(answers):
        raise ValueError("no answers to train on")
    data = with_features(target, answers.data(), list(drafter.config.feature_layers), drafter.draft_vocab, SOFT_TOP, progress)
    yield -1
    for trees in fixed_trees(target, drafter, data, EVAL_BUDGET, TREES_PER_ANSWER, seed, soft_top=SOFT_TOP):
        yield trees if isinstance(trees, int) else (data, trees)


def relative_gain(after: dict, before: dict) -> dict:
    """``after / before - 1`` of two ``{"tau", "se"}`` cells and its standard error (the two
    measured on the same prompts and seeds but in different rounds: errors combined as independent)."""
    ratio = after["tau"] / before["tau"]
    se = ratio * math.sqrt((after["se"] / after["tau"]) ** 2 + (before["se"] / before["tau"]) ** 2)
    return {"gain": ratio - 1, "se": se}


def _measure(bundle, model: BlockDrafter, name: str, prompts: list[dict], progress: bool):
    """Decodes the held-out prompts with one drafter: yields each round, then
    ``{"T0": {"tau", "se", "tau_bound", "rounds"}, "T1": {...}}``."""
    drafter = BlockTreeDrafter(copy.deepcopy(model).served(), name=name)
    for event in evaluation_rounds(bundle.target, bundle.tokenizer, drafter, prompts, budgets=(EVAL_BUDGET,), temperatures=tuple(TEMPERATURES.values()),
                                   max_new_tokens=EVAL_NEW_TOKENS, progress=progress, desc=f"held-out tau [{name}]"):
        if not isinstance(event, list):
            yield event
    by_temperature = {row["temperature"]: row for row in event}
    yield {key: {"tau": by_temperature[t]["tau"], "se": by_temperature[t]["tau_se"], "tau_bound": by_temperature[t]["tau_bound"], "rounds": by_temperature[t]["rounds"]}
           for key, t in TEMPERATURES.items()}


def _last(pieces, into: list):
    """Yield ``("work", None)`` for every piece of ``pieces`` but the last, which goes into ``into``."""
    previous = None
    for piece in pieces:
        if previous is not None:
            yield "work", None
        previous = piece
    into.append(previous)


def adaptation(bundle, prompts: list[str], base: Path, minutes: float = 5.0, settings: TrainSettings | None = None, controls: tuple[str, ...] = ("none",),
               seed: int = 0, progress: bool = True, with_mass: bool = True):
    """The whole adaptation as a generator of ``(phase, info)`` events, one after every piece of
    work (a batch of answers, an answer's scored trees, a training step, a decoding round: ``work``
    or ``step``), so a server's compute thread takes a piece at a time and a cancel stops between pieces.
    Phases ``answers``, ``answers done``, ``train``, ``evaluate``, ``evaluated``, ``mass``,
    ``control`` say what starts; the last event is ``("done", {"result": ..., "drafter": ...})``
    with the adapted drafter in float32.

    The run plans its phases within ``minutes``: the answers by :data:`ANSWER_SHARE` of it, the
    fine-tune by :data:`TRAIN_SHARE`, the held-out decoding of base and adapted drafter after.
    ``controls`` are tree terms trained after the budget on the same data, steps and seed
    (``none`` is the token-only control; the result names it ``token_only``). With ``with_mass``,
    after the budget, where the target's mass leaves each drafter's trees on the held-out answers."""
    settings = replace(settings or workload_settings(*DEFAULT_TREE_TERM), seed=seed)
    start = time.monotonic()
    budget = minutes * 60.0
    train_prompts, heldout_prompts = split_workload(prompts, seed)
    yield "answers", {"prompts": len(train_prompts)}
    answers = None
    for answers in answer_prompts(bundle.target, bundle.tokenizer, train_prompts, progress=progress):
        if time.monotonic() > start + ANSWER_SHARE * budget:
            break
        yield "work", None
    if answers is None or not len(answers):
        raise ValueError("the target wrote no answer in the time given; raise --minutes or shorten the prompts")
    yield "answers done", {"answers": len(answers), "tokens": answers.answer_tokens, "seconds": answers.seconds}
    base_model = BlockDrafter.from_pretrained(base, bundle.target, dtype=torch.float32)
    work = copy.deepcopy(base_model)
    added = extend_draft_vocab(work, answers)
    built = []
    yield from _last(workload_train_set(bundle.target, work, answers, seed, progress), built)
    data, trees = built[0]
    initial = copy.deepcopy(work.state_dict())
    yield "train", {"anchors": data.num_anchors, "trees": len(trees), "vocab_added": len(added)}
    held = [{"text": p, "chat": True} for p in heldout_prompts[:EVAL_PROMPTS]]
    history = []
    for record in train(work, data, settings, trees=trees):
        history.append(record)
        yield "step", record
        if time.monotonic() > start + TRAIN_SHARE * budget:
            break
    yield "evaluate", {"prompts": len(held)}
    cells = {}
    for name, model in (("base", base_model), ("exittrain", work)):
        measured = []
        yield from _last(_measure(bundle, model, name, held, progress), measured)
        cells[name] = measured[0]
    yield "evaluated", {"base": cells["base"], "exittrain": cells["exittrain"]}
    seconds = time.monotonic() - start
    mass = None
    if with_mass:
        yield "mass", {}
        found = []
        yield from _last(heldout_mass(bundle, {"base": base_model, "exittrain": work}, [p["text"] for p in held], seed, progress), found)
        mass = found[0]
    for term in controls:
        control = copy.deepcopy(work)
        control.load_state_dict(initial)
        yield "control", {"tree_term": term}
        for _ in train(control, data, replace(settings, tree_term=term, steps=max(1, len(history))), trees=trees):
            yield "work", None
        measured = []
        yield from _last(_measure(bundle, control, term, held, progress), measured)
        cells["token_only" if term == "none" else term] = measured[0]
    result = {key: {name: {"tau": row[key]["tau"], "se": row[key]["se"]} for name, row in cells.items()} for key in TEMPERATURES}
    result.update({
        "gain": {key: {name: relative_gain(cells[name][key], cells["base"][key]) for name in cells if name != "base"} for key in TEMPERATURES},
        "minutes": seconds / 60.0,
        "minutes_budget": minutes,
        "train_prompts": len(answers),
        "train_prompts_offered": len(train_prompts),
        "heldout_prompts": len(heldout_prompts),
        "eval_prompts": len(held),
        "answer_tokens": answers.answer_tokens,
        "answer_seconds": answers.seconds,
        "vocab_added": len(added),
        "steps": len(history),
        "settings": asdict(settings),
        "budget": EVAL_BUDGET,
        "max_new_tokens": EVAL_NEW_TOKENS,
        "tau_bound": {key: {name: row[key]["tau_bound"] for name, row in cells.items()} for key in TEMPERATURES},
        "history": history,
        "heldout_mass": mass,
    })
    work.config.notes = {**work.config.notes, "workload_adaptation": {"steps": len(history), "settings": asdict(settings), "train_prompts": len(answers), "vocab_added": len(added)}}
    yield "done", {"result": result, "drafter": work}


def heldout_mass(bundle, drafters: dict[str, BlockDrafter], prompts: list[str], seed: int = 0, progress: bool = True):
    """Where the target's mass leaves each drafter's trees on the held-out prompts: the target's
    greedy answers to them (for measurement only), each drafter's trees at the same anchors of
    those answers (B = 16), scored at T = 1; per drafter the mean exit mass by depth (missing /
    tree ended, :meth:`TreeBatch.exit_mass_by_depth`) and the mean ``1 + C``. Yields after each
    piece of work, then the summaries (None when the target wrote no answer)."""
    answers = None
    for answers in answer_prompts(bundle.target, bundle.tokenizer, prompts, progress=progress):
        yield answers
    if answers is None or not len(answers):
        yield None
        return
    summaries = {}
    for name, drafter in drafters.items():
        built = []
        for piece in _last(workload_train_set(bundle.target, drafter, answers, seed, progress), built):
            yield piece
        trees = built[0][1]
        summaries[name] = {**trees.scored.exit_mass_by_depth(drafter.config.horizon), "expected_tau": trees.scored.expected_tau}
    yield summaries


def _summary_lines(result: dict) -> list[str]:
    lines = [f"{result['train_prompts']} training prompts answered ({result['answer_tokens']} tokens), {result['heldout_prompts']} held out; "
             f"{result['steps']} steps; {result['minutes']:.1f} min (budget {result['minutes_budget']:g})"]
    for key in TEMPERATURES:
        base = result[key]["base"]
        parts = [f"base {base['tau']:.3f} +- {base['se']:.3f}"]
        for name, cell in result[key].items():
            if name != "base":
                gain = result["gain"][key][name]
                parts.append(f"{name} {cell['tau']:.3f} +- {cell['se']:.3f} ({100 * gain['gain']:+.1f}% +- {100 * gain['se']:.1f}%)")
        lines.append(f"{key} (B = {EVAL_BUDGET}, {EVAL_NEW_TOKENS} new tokens): " + "; ".join(parts))
    return lines


def workload_command(args) -> None:
    """The command line's workload adaptation (``exittrain --workload``)."""
    if args.minutes is None or not math.isfinite(args.minutes) or args.minutes <= 0:
        raise ValueError(f"--minutes must be a positive number, got {args.minutes}")
    for term in args.controls:
        if term not in TREE_TERMS:
            raise ValueError(f"--controls: unknown tree term {term!r}; choose from {', '.join(TREE_TERMS)}")
    prompts = load_workload(args.workload)
    out = Path(args.out) if args.out else REPO_ROOT / "runs" / "workload" / f"{Path(args.workload).stem}-{time.strftime('%Y%m%d-%H%M%S')}"
    assets = (REPO_ROOT / "assets").resolve()
    if out.resolve() == assets or assets in out.resolve().parents:
        raise ValueError(f"--out {out} is inside assets/; write the adapted drafter elsewhere")
    json_path = Path(args.json) if args.json else out / "result.json"
    if json_path.resolve() == assets or assets in json_path.resolve().parents:
        raise ValueError(f"--json {json_path} is inside assets/; write it elsewhere")
    bundle = load_bundle(args.target, None, device=args.device, dtype="float32", allow_download=args.allow_download, pair=None if args.target else (args.pair or None))
    if args.target and not args.base:
        raise ValueError("with --target, pass --base: the block drafter to adapt")
    base = Path(args.base) if args.base else shipped_drafter(bundle.pair, "block")
    term = args.tree_term or DEFAULT_TREE_TERM[0]
    lam = DEFAULT_TREE_TERM[1] if args.lambda_tree is None else args.lambda_tree
    settings = workload_settings(term, lam, args.workload_steps, args.seed or 0)
    for phase, info in adaptation(bundle, prompts, base, args.minutes, settings, tuple(args.controls), seed=settings.seed):
        if phase == "done":
            result, drafter = info["result"], info["drafter"]
    result["workload"] = str(args.workload)
    result["command"] = invoked_command()
    drafter.save_pretrained(out / "drafter")
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(result, indent=1))
    print("\n".join(_summary_lines(result)))
    print(f"adapted drafter: {out / 'drafter'}; result: {json_path}")
