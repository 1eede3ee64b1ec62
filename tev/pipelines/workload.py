"""``python -m tev exittrain --workload FILE.json``: adapt a pair's block drafter to a user's own
workload and measure the gain on held-out prompts of it.

The run, within ``--minutes`` (every phase included, the controls too): split the prompts (a
quarter held out, never trained on), let the target answer the training prompts, add the answers'
tokens the draft vocabulary lacks, fine-tune a copy of the base drafter (the token loss on the
answers plus the tree term of :data:`DEFAULT_TREE_TERM`), train the token-only control (same data,
steps and seed) and any extra tree terms asked for, then decode held-out prompts with every
drafter at each law of :data:`LAWS` (T = 0, the page's T = 0.7 top-p 0.9, T = 1), budget 16, 64 new
tokens: the planned number of prompts, then more while the minutes allow.

The run measures its own pace first (:class:`Pace`: a first few answers, a held-out prompt, two
answers scored, two steps) and plans the rest against the time left (:func:`plan_phases`): on a
slow or busy machine it answers fewer prompts and decodes fewer held-out prompts before it trains
fewer steps. Below :data:`MIN_STEPS` steps it says so and compares nothing.
"""

from __future__ import annotations

import copy
import json
import math
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from tev.core.sampling import SamplingLaw
from tev.engine.block_drafter import BlockDrafter
from tev.engine.decode import DecodeConfig, GenerationSummary, Request, speculative_generate
from tev.engine.drafters import BlockTreeDrafter
from tev.engine.evaluation import fit_prompt
from tev.engine.models import load_bundle, shipped_drafter
from tev.engine.session import max_positions
from tev.pipelines.exittrain import invoked_command
from tev.pipelines.workload_data import extend_draft_vocab, load_workload, split_workload
from tev.pipelines.workload_report import LAWS, summary_lines
from tev.train.loop import TrainSettings, train
from tev.train.losses import TREE_TERMS
from tev.train.teacher import WorkloadAnswers, answer_prompts, with_features
from tev.train.trees import fixed_trees
from tev.util.paths import REPO_ROOT
from tev.util.stats import change_in_words, standard_error

__all__ = ["DEFAULT_ANSWER_LAW", "DEFAULT_TREE_TERM", "EVAL_BUDGET", "EVAL_NEW_TOKENS", "EVAL_PROMPTS", "LAWS", "MIN_STEPS", "SOFT_TOP", "Pace", "Plan", "plan_phases",
           "workload_settings", "workload_train_set", "adaptation", "heldout_mass", "relative_gain", "other_recipe", "workload_command"]

DEFAULT_TREE_TERM = ("exit", 0.1)  # (tree term, lambda_tree) of the command's recipe; see docs/exittrain.md
EVAL_BUDGET = 16
EVAL_NEW_TOKENS = 64
EVAL_PROMPTS = 10  # held-out prompts decoded at most (the first of the held-out split)
MIN_EVAL_PROMPTS = 1  # held-out prompts a comparison decodes at least (a busy 2-core machine took 196 s for one, per drafter)
SOFT_TOP = 16  # the target's top tokens kept as soft labels (train-drafter's default)
TREES_PER_ANSWER = 8
DEFAULT_ANSWER_LAW = "T0"  # the target's training answers: greedy (see docs/exittrain.md for sampled answers against greedy)
# Below this many fine-tune steps the run compares nothing: a token-only fine-tune of the shipped
# drafter gained +17% and +31% held-out tau at T = 0 after 30 steps on two workloads.
MIN_STEPS = 30
ANSWER_BATCH = 8  # training prompts the target answers at once
FIRST_ANSWERS = 4  # the first batch, whose pace plans the rest: small, as on a busy 2-core machine an answer took 19 s
PROBE_ANSWERS, PROBE_STEPS = 2, 2  # answers scored and steps trained (then thrown away) to measure their pace
PLAN_SHARE = 0.9  # the plan fills this share of the time left: a measured pace drifts on a shared machine
PROBE_HELDOUT_SHARE = 0.5  # the first held-out prompt (the base's, timed) may take this share of the time left, else it is cut
# Before the fine-tune has the steps asked for, the answers (with their scoring) may take at most
# this share of the time left, and the held-out decoding this share.
ANSWER_SHARE, HELDOUT_SHARE = 0.35, 0.3


@dataclass
class Pace:
    """Seconds per piece of work, measured by the run itself."""

    answer: float = 0.0  # a training prompt answered by the target (batched)
    score: float = 0.0  # an answer turned into training data (the target's features and laws, scored trees)
    step: float = 0.0  # one fine-tune step of one drafter
    heldout: float = 0.0  # one held-out prompt decoded by one drafter at every law of LAWS


@dataclass(frozen=True)
class Plan:
    """What fits in the time left: training prompts answered, steps per drafter, held-out prompts
    decoded (0: no comparison), and the control fine-tunes trained beside the adapted drafter."""

    answers: int
    steps: int
    heldout: int
    controls: int


def plan_phases(pace: Pace, seconds: float, answered: int, offered: int, steps: int, heldout: int, controls: int = 1, measured: int = 1) -> Plan:
    """The largest plan that fits in ``seconds`` at ``pace``.

    Args:
        answered: training prompts already answered (of ``offered``).
        steps: the steps asked for (a ceiling); ``heldout``: held-out prompts on hand (a ceiling).
        controls: control fine-tunes asked for; each trains the plan's steps and decodes the
            held-out prompts, as the adapted drafter does (and the base decodes them too).
        measured: held-out prompts the base has decoded already.

    First :data:`MIN_STEPS` steps and :data:`MIN_EVAL_PROMPTS` held-out prompts, with the controls
    if they fit, else without; then more answers (up to :data:`ANSWER_SHARE` of the time), more
    held-out prompts (up to :data:`HELDOUT_SHARE`), the steps asked for, and the time left to more
    answers and held-out prompts. When even the minimum does not fit, the plan decodes nothing
    more (``heldout == 0``: no comparison) and trains the adapted drafter for what fits.
    """
    answer_cost = lambda a: (a - answered) * pace.answer + a * pace.score  # noqa: E731
    for kept in sorted({controls, 0}, reverse=True):
        train_cost = lambda s: s * pace.step * (1 + kept)  # noqa: E731
        eval_cost = lambda h: (h * (2 + kept) - min(h, measured)) * pace.heldout  # noqa: E731
        total = lambda a, s, h: answer_cost(a) + train_cost(s) + eval_cost(h)  # noqa: E731
        a, s, h = answered, min(steps, MIN_STEPS), min(heldout, MIN_EVAL_PROMPTS)
        if total(a, s, h) <= seconds:
            break
    else:
        return Plan(answered, max(0, min(steps, int((seconds - answer_cost(answered)) / max(pace.step, 1e-9)))), 0, 0)
    while a < offered and total(a + 1, s, h) <= seconds and answer_cost(a + 1) <= ANSWER_SHARE * seconds:
        a += 1
    while h < heldout and total(a, s, h + 1) <= seconds and eval_cost(h + 1) <= HELDOUT_SHARE * seconds:
        h += 1
    s = min(steps, max(s, int((seconds - answer_cost(a) - eval_cost(h)) / max(pace.step * (1 + kept), 1e-9))))
    while a < offered and total(a + 1, s, h) <= seconds:
        a += 1
    while h < heldout and total(a, s, h + 1) <= seconds:
        h += 1
    return Plan(a, s, h, kept)


def workload_settings(tree_term: str = "exit", lambda_tree: float = 0.1, steps: int = 160, seed: int = 0) -> TrainSettings:
    """The workload fine-tune: 64 soft-labelled anchors and 16 fixed trees a step, lr 5e-4 (10
    warm-up steps, cosine to a tenth), no weight decay or short histories (a few minutes from a trained base)."""
    return TrainSettings(steps=steps, batch=64, lr=5e-4, warmup=10, seed=seed, weight_decay=0.0, short_history_share=0.0, soft_top=SOFT_TOP,
                         tree_term=tree_term, lambda_tree=lambda_tree, trees="fixed", tree_batch=16, budget=EVAL_BUDGET)


def other_recipe(tree_term: str) -> str:
    """The control a run trains beside its recipe: the token loss alone beside a tree term, the
    default tree term beside the token loss alone."""
    return DEFAULT_TREE_TERM[0] if tree_term == "none" else "none"


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


def _decode_prompt(bundle, drafter, ids: list[int], seed: int, stop_by: float, clock):
    """One held-out prompt decoded by one drafter at every law of :data:`LAWS`: yields each round,
    then ``{law: (block lengths, 1 + C of each round)}``, or None when ``stop_by`` came first (a
    part of a prompt is not measured)."""
    out = {}
    for key, law in LAWS.items():
        config = DecodeConfig(budget=EVAL_BUDGET, temperature=law.temperature, top_k=law.top_k, top_p=law.top_p, max_new_tokens=EVAL_NEW_TOKENS, seed=seed)
        for event in speculative_generate(Request(bundle.target, drafter, ids, config), bundle.tokenizer, should_stop=lambda: clock() > stop_by):
            if not isinstance(event, GenerationSummary):
                yield event
            elif event.stop_reason == "cancelled":
                yield None
                return
            else:
                out[key] = (event.block_lengths, event.tau_bounds)
    yield out


def _cell(decoded: list[dict], key: str) -> dict:
    """``tau`` (mean block length over every round of the prompts decoded), its standard error over rounds, mean ``1 + C``."""
    lengths = [x for prompt in decoded for x in prompt[key][0]]
    bounds = [x for prompt in decoded for x in prompt[key][1]]
    return {"tau": sum(lengths) / len(lengths), "se": standard_error(lengths), "tau_bound": sum(bounds) / len(bounds), "rounds": len(lengths)}


def _last(pieces, into: list):
    """Yield ``("work", None)`` for every piece of ``pieces`` but the last, which goes into ``into``."""
    previous = None
    for piece in pieces:
        if previous is not None:
            yield "work", None
        previous = piece
    into.append(previous)


def _answer(bundle, prompts: list[str], answers: WorkloadAnswers, stop_by: float, clock, progress: bool, law: SamplingLaw, seed: int):
    """The target answers ``prompts`` a batch at a time into ``answers`` (greedy, or sampled from
    ``law``), stopping before a batch that would end after ``stop_by`` at the pace measured so far;
    returns the prompts answered."""
    start, done, written = clock(), 0, None
    for written in answer_prompts(bundle.target, bundle.tokenizer, prompts, batch=ANSWER_BATCH, progress=progress, law=law, seed=seed):
        done = min(len(prompts), done + ANSWER_BATCH)
        yield "work", None
        if done < len(prompts) and clock() + (clock() - start) / done * min(ANSWER_BATCH, len(prompts) - done) > stop_by:
            break
    if written is not None:
        answers.sequences += written.sequences
        answers.prompt_lengths += written.prompt_lengths
        answers.seconds += written.seconds
    return done


def _no_comparison(steps: int, pace: Pace, minutes: float) -> str:
    """Why the run compared nothing, in one sentence: too few steps, or no time to decode held-out prompts."""
    heldout = f"{pace.heldout:.0f} s a held-out prompt per drafter" if math.isfinite(pace.heldout) else "a held-out prompt took more than half the time left"
    measured = f"{pace.answer:.1f} s an answer, {pace.score:.1f} s to score one, {pace.step:.1f} s a step, {heldout}"
    if steps < MIN_STEPS:
        return (f"Only {steps} fine-tune step{'s' * (steps != 1)} fit in {minutes:g} minutes at this machine's measured pace ({measured}): "
                f"below the {MIN_STEPS} a comparison needs, so none is made; give it more minutes or a quieter machine.")
    return (f"{steps} fine-tune steps were made, but at this machine's measured pace ({measured}) decoding held-out prompts with both "
            f"drafters does not fit in {minutes:g} minutes, so no comparison is made; give it more minutes or a quieter machine.")


def adaptation(bundle, prompts: list[str], base: Path, minutes: float = 5.0, settings: TrainSettings | None = None, controls: tuple[str, ...] = ("none",),
               seed: int = 0, progress: bool = True, with_mass: bool = True, clock=time.monotonic, answer_law: str = DEFAULT_ANSWER_LAW):
    """The whole adaptation as a generator of ``(phase, info)`` events, one after every piece of
    work (a batch of answers, an answer's scored trees, a training step, a decoding round: ``work``
    or ``step``), so a server's compute thread takes a piece at a time and a cancel stops between pieces.
    Phases ``answers``, ``pace``, ``plan``, ``answers done``, ``train``, ``control``, ``evaluate``,
    ``evaluated``, ``mass`` say what starts; the last event is ``("done", {"result": ..., "drafter": ...})``
    with the adapted drafter in float32.

    The run first measures its pace (:class:`Pace`), then plans the rest within ``minutes``
    (:func:`plan_phases`) and keeps to it: each phase stops before a piece of work that would end
    past the time left for what follows. ``controls`` are tree terms trained on the same data, steps
    and seed (``none`` is the token-only control; the result names it ``token_only``). With
    ``with_mass``, where the target's mass leaves the base's and the adapted drafter's trees on the
    held-out answers, when the time left allows. When it compares nothing (below :data:`MIN_STEPS`
    steps, or no held-out prompt fits for both drafters) the result says why in one sentence
    (``note``) and holds only what the base measured. ``answer_law`` (a key of :data:`LAWS`) is the
    law the target's training answers are drawn from: ``T0`` greedy, else sampled (seeded), so the
    drafter learns the law it will meet. ``clock`` (seconds) is for tests.
    """
    if answer_law not in LAWS:
        raise ValueError(f"answer law {answer_law!r}: choose from {', '.join(LAWS)}")
    settings = replace(settings or workload_settings(*DEFAULT_TREE_TERM), seed=seed)
    start = clock()
    deadline = start + minutes * 60.0
    train_prompts, heldout_prompts = split_workload(prompts, seed)
    context = max_positions(bundle.target)
    held = [fit_prompt(bundle.tokenizer, {"text": p, "chat": True}, context - EVAL_NEW_TOKENS) for p in heldout_prompts[:EVAL_PROMPTS]]
    base_model = BlockDrafter.from_pretrained(base, bundle.target, dtype=torch.float32)
    decoded = {"base": []}  # per drafter, per held-out prompt: {law: (block lengths, 1 + C)}

    # the pace: the first answers, the base on a held-out prompt, two answers scored and two steps on a copy
    yield "answers", {"prompts": len(train_prompts)}
    answers, now = WorkloadAnswers(), clock()
    law = LAWS[answer_law]  # T0 is greedy: the batched writer takes the argmax
    offered = yield from _answer(bundle, train_prompts[:FIRST_ANSWERS], answers, deadline, clock, progress, law, seed)
    pace = Pace(answer=(clock() - now) / max(1, offered))
    if not len(answers):
        raise ValueError("the target wrote no answer to the first training prompts; shorten them or raise --minutes")
    yield "pace", {"answer": pace.answer}
    now = clock()
    probe = []
    yield from _last(_decode_prompt(bundle, BlockTreeDrafter(copy.deepcopy(base_model).served(), name="base"), held[0], seed,
                                    now + PROBE_HELDOUT_SHARE * (deadline - now), clock), probe)
    decoded["base"] += [row for row in probe if row is not None]
    pace.heldout = clock() - now if decoded["base"] else math.inf  # cut: no held-out prompt fits here
    probe, now = copy.deepcopy(base_model), clock()
    built = []
    yield from _last(workload_train_set(bundle.target, probe, WorkloadAnswers(answers.sequences[:PROBE_ANSWERS], answers.prompt_lengths[:PROBE_ANSWERS]),
                                        seed, False), built)
    pace.score = (clock() - now) / min(PROBE_ANSWERS, len(answers))
    now = clock()
    for _ in zip(range(PROBE_STEPS), train(probe, built[0][0], replace(settings, steps=PROBE_STEPS), trees=built[0][1])):
        yield "work", None
    pace.step = (clock() - now) / PROBE_STEPS
    del probe, built
    plan = plan_phases(pace, PLAN_SHARE * (deadline - clock()), offered, len(train_prompts), settings.steps, len(held), len(controls), len(decoded["base"]))
    skipped, controls, trained = controls[plan.controls :], controls[: plan.controls], 1 + plan.controls
    yield "plan", {"pace": asdict(pace), "plan": asdict(plan)}

    # the rest of the answers, then the training data
    if plan.answers > offered:
        # answers in batches of 8 can run slower per answer than the probe's 4: they may take the plan's share of the
        # time for answers (ANSWER_SHARE) before the run gives up on the rest (the answers are what the drafter learns)
        now = clock()
        stop_by = now + max((plan.answers - offered) * pace.answer / PLAN_SHARE, ANSWER_SHARE * (deadline - now))
        offered += yield from _answer(bundle, train_prompts[offered:plan.answers], answers, stop_by, clock, progress, law, seed + offered)
    yield "answers done", {"answers": len(answers), "tokens": answers.answer_tokens, "seconds": answers.seconds}
    work = copy.deepcopy(base_model)
    added = extend_draft_vocab(work, answers)
    history, compare = [], plan.heldout > 0
    if plan.steps:  # the training data, when a step fits after it
        built, now = [], clock()
        yield from _last(workload_train_set(bundle.target, work, answers, seed, progress), built)
        pace.score = (clock() - now) / len(answers)
        data, trees = built[0]
        initial = copy.deepcopy(work.state_dict())
        # the steps that fit now, at the pace measured
        eval_seconds = lambda prompts: (prompts * (trained + 1) - 1) * pace.heldout  # noqa: E731
        left = PLAN_SHARE * (deadline - clock())
        steps = min(plan.steps, int((left - eval_seconds(plan.heldout)) / (pace.step * trained))) if compare else 0
        if steps < MIN_STEPS:
            compare, steps = False, max(0, min(settings.steps, int(left / pace.step)))
        yield "train", {"anchors": data.num_anchors, "trees": len(trees), "vocab_added": len(added), "steps": steps}
        run_settings, now = replace(settings, steps=max(1, steps)), clock()
        for record in train(work, data, run_settings, trees=trees) if steps else ():
            history.append(record)
            yield "step", record
            pace.step = (clock() - now) / len(history)
            after = (len(history) * (trained - 1) * pace.step + eval_seconds(plan.heldout)) if compare else 0.0
            if clock() + pace.step * (trained if compare else 1) + after > deadline:
                break
    compare = compare and len(history) >= MIN_STEPS
    models = {"exittrain": work}
    if compare:
        for term in controls:
            control = copy.deepcopy(work)
            control.load_state_dict(initial)
            yield "control", {"tree_term": term}
            for _ in zip(range(len(history)), train(control, data, replace(run_settings, tree_term=term), trees=trees)):
                yield "work", None
            models["token_only" if term == "none" else term] = control

    # the held-out prompts, every drafter on each, while the time lasts
    if compare:
        served = {"base": BlockTreeDrafter(copy.deepcopy(base_model).served(), name="base"),
                  **{name: BlockTreeDrafter(copy.deepcopy(model).served(), name=name) for name, model in models.items()}}
        yield "evaluate", {"prompts": plan.heldout, "drafters": list(served)}
        decoded.update({name: [] for name in models})
        measured_seconds, prompts_measured = 0.0, 0
        # the planned prompts, then more while the minutes allow (the plan used the probe's pace, often slower
        # than the run's): past the plan a prompt starts only when it and the mass figure's work still fit
        mass_cost = lambda prompts: prompts * (pace.answer + 2 * pace.score) if with_mass else 0.0  # noqa: E731
        for i, ids in enumerate(held):
            names = [name for name in served if len(decoded[name]) <= i]
            if i and clock() + pace.heldout * len(names) + (mass_cost(i + 1) if i >= plan.heldout else 0.0) > deadline:
                break
            now = clock()
            for name in names:
                yield from _last(_decode_prompt(bundle, served[name], ids, seed, deadline, clock), decoded[name])
                if decoded[name][-1] is None:  # the minutes ended inside this prompt: it is not measured
                    decoded[name].pop()
                    break
            else:
                measured_seconds += clock() - now
                prompts_measured += len(names)
                pace.heldout = measured_seconds / prompts_measured
                continue
            break
        compare = min(len(rows) for rows in decoded.values()) > 0
    count = min(len(rows) for rows in decoded.values()) if compare else len(decoded["base"])
    cells = {name: {key: _cell(rows[:count], key) for key in LAWS} for name, rows in decoded.items() if (compare or name == "base") and count}
    if compare:
        yield "evaluated", {"base": cells["base"], "exittrain": cells["exittrain"]}
    mass, mass_note = None, None
    if with_mass and compare:
        cost = count * (pace.answer + 2 * pace.score)
        if clock() + cost <= deadline:
            yield "mass", {}
            found = []
            yield from _last(heldout_mass(bundle, {"base": base_model, "exittrain": work}, [heldout_prompts[i] for i in range(count)], seed, progress), found)
            mass = found[0]
        else:
            mass_note = f"where the mass leaves the trees was not measured: about {cost:.0f} s more than the minutes left"
    seconds = clock() - start
    result = {key: {name: {"tau": row[key]["tau"], "se": row[key]["se"]} for name, row in cells.items()} for key in LAWS}
    result.update({
        "compared": compare,
        "note": None if compare else _no_comparison(len(history), pace, minutes),
        "laws": {key: law.describe() for key, law in LAWS.items()},
        "answer_law": answer_law,
        "gain": {key: {name: relative_gain(cells[name][key], cells["base"][key]) for name in cells if name != "base"} for key in LAWS} if compare else {},
        "minutes": seconds / 60.0,
        "minutes_budget": minutes,
        "pace": asdict(pace),
        "plan": asdict(plan),
        "train_prompts": len(answers),
        "train_prompts_offered": len(train_prompts),
        "train_prompts_answered": offered,
        "heldout_prompts": len(heldout_prompts),
        "eval_prompts": count,
        "answer_tokens": answers.answer_tokens,
        "answer_seconds": answers.seconds,
        "vocab_added": len(added),
        "steps": len(history),
        "settings": asdict(replace(settings, steps=len(history) or settings.steps)),
        "budget": EVAL_BUDGET,
        "max_new_tokens": EVAL_NEW_TOKENS,
        "tau_bound": {key: {name: row[key]["tau_bound"] for name, row in cells.items()} for key in LAWS},
        "history": history,
        "heldout_mass": mass,
        "heldout_mass_note": mass_note,
        "controls_skipped": list(skipped),  # asked for, but only the adapted drafter's minimum fit in the minutes
    })
    work.config.notes = {**work.config.notes, "workload_adaptation": {"steps": len(history), "settings": result["settings"], "train_prompts": len(answers), "vocab_added": len(added)}}
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
        summaries[name] = {**trees.scored.exit_mass_by_depth(drafter.config.horizon), "tau_bound": trees.scored.tau_bound}
    yield summaries


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
    start = time.monotonic()
    for phase, info in adaptation(bundle, prompts, base, args.minutes, settings, tuple(args.controls), seed=settings.seed, answer_law=args.answer_law):
        if phase == "done":
            result, drafter = info["result"], info["drafter"]
        elif phase not in ("work", "step"):  # where the minutes go, as they go
            print(f"[{time.monotonic() - start:4.0f} s] {phase}" + (f": {json.dumps(info)}" if phase in ("pace", "plan", "train") else ""), file=sys.stderr, flush=True)
    result["workload"] = str(args.workload)
    result["command"] = invoked_command()
    drafter.save_pretrained(out / "drafter")
    json_path.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(result, indent=1))
    print("\n".join(summary_lines(result)))
    print(f"adapted drafter: {out / 'drafter'}; result: {json_path}")
