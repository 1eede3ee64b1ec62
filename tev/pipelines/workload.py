"""``python -m tev adapt --workload FILE.json``: adapt the drafter a pair's page starts with (the
default pair's path drafter; else its block drafter) to a user's own workload and measure the gain
on held-out prompts of it.

The run, within ``--minutes`` (every phase included, the controls too): split the prompts (a
quarter held out, never trained on), let the target answer the training prompts (at each law of
:data:`DEFAULT_ANSWER_LAW`: greedily, then sampled at T = 1), add the answers'
tokens the draft vocabulary lacks, fine-tune a copy of the base drafter (the token loss on the
answers, by default the token loss alone: :data:`DEFAULT_TREE_TERM`, the same recipe as the
ExitTrain tab's), train the other recipe as the control (same data, steps and seed) and any extra
tree terms asked for, then decode held-out prompts with every drafter at each law of :data:`LAWS`
(T = 0, the page's T = 0.7 top-p 0.9, T = 1), budget 16, 64 new tokens: the planned number of
prompts, then more while the minutes allow. The result (a stored ``workload`` result:
:mod:`tev.util.stored`) names the kept drafter ``adapted``; its held-out ``tau`` is tokens emitted
per target forward, with its standard error over prompts.

The run measures its own pace first (:class:`Pace`: a first few answers, a held-out prompt, two
answers scored, two steps) and plans the rest against the time left (:func:`plan_phases`): on a
slow or busy machine it answers fewer prompts and decodes fewer held-out prompts before it trains
fewer steps. Below :data:`MIN_STEPS` steps it says so and compares nothing.
"""

from __future__ import annotations

import copy
import itertools
import math
import sys
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable

import torch

from tev.engine.block_drafter import BlockDrafter, read_drafter_config
from tev.engine.decode import DecodeConfig
from tev.engine.evaluation import decode_rounds, fit_prompt
from tev.engine.models import drafter_model_class, load_bundle, shipped_drafter, tree_drafter_of
from tev.engine.session import max_positions
from tev.pipelines.exittrain import invoked_command
from tev.pipelines.workload_data import extend_draft_vocab, load_workload, split_workload
from tev.pipelines.workload_report import LAWS, MIN_VERDICT_PROMPTS, progress_sentence, summary_lines
from tev.train.data import TrainData
from tev.train.loop import TrainSettings, train
from tev.train.losses import TREE_TERMS
from tev.train.teacher import answer_prompts, with_features_steps
from tev.train.trees import ScoredTrees, fixed_trees
from tev.util.compute_thread import result_of
from tev.util.paths import REPO_ROOT
from tev.util.progress import Phase, Progress, within
from tev.util.stats import paired_ratio_change, ratio_standard_error
from tev.util.stored import write_result

__all__ = ["adapted_kind", "answer_laws", "DEFAULT_ANSWER_LAW", "DEFAULT_TREE_TERM", "EXIT_TERM", "EXIT_LAMBDA", "EVAL_BUDGET", "EVAL_NEW_TOKENS", "EVAL_PROMPTS", "LAWS", "MIN_STEPS", "SOFT_TOP", "Pace", "Plan", "plan_phases",
           "workload_settings", "workload_train_set", "adaptation", "heldout_mass", "relative_gain", "other_recipe", "workload_command"]

# The kept drafter's recipe by default, for the command and the tab alike: the token loss alone. Over the four packs
# and an unseen workload the exit term did not beat it outside two standard errors at any law (docs/exittrain.md).
DEFAULT_TREE_TERM = "none"
EXIT_TERM, EXIT_LAMBDA = "exit", 0.1  # ExitTrain's exit term and its weight: the default recipe's control (or the recipe, when asked)
EVAL_BUDGET = 16
EVAL_NEW_TOKENS = 64
EVAL_PROMPTS = 10  # held-out prompts decoded at most (the first of the held-out split)
# Held-out prompts a comparison decodes at least: the plan makes room for the prompts a verdict needs
# (MIN_VERDICT_PROMPTS), and where they do not fit it decodes at least this many and calls no gain or loss
# (a busy 2-core machine took 196 s for one prompt, per drafter).
MIN_EVAL_PROMPTS = 1
SOFT_TOP = 16  # the target's top tokens kept as soft labels (train-drafter's default)
TREES_PER_ANSWER = 8
# The target's training answers: each training prompt answered greedily and sampled at T = 1. Against greedy answers
# alone, on three workloads with the path drafter, it turned a T = 1 loss into a gain (shell -1.6% -> +5.6%, commit
# messages -6.9% -> +0.8%; SQL +19% -> +22%) and kept T = 0 within the error (docs/exittrain.md).
DEFAULT_ANSWER_LAW = "T0+T1"
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

    First :data:`MIN_STEPS` steps and the held-out prompts a verdict needs
    (:data:`~tev.pipelines.workload_report.MIN_VERDICT_PROMPTS`, or all there are), with the controls if
    they fit, else without; else :data:`MIN_EVAL_PROMPTS` (too few for a verdict, which the result then
    says), with the controls if they fit; then more answers (up to :data:`ANSWER_SHARE` of the time), more
    held-out prompts (up to :data:`HELDOUT_SHARE`), the steps asked for, and the time left to more
    answers and held-out prompts. When even the minimum does not fit, the plan decodes nothing
    more (``heldout == 0``: no comparison) and trains the adapted drafter for what fits.
    """
    answer_cost = lambda a: (a - answered) * pace.answer + a * pace.score  # noqa: E731
    for kept, least in dict.fromkeys([(controls, MIN_VERDICT_PROMPTS), (0, MIN_VERDICT_PROMPTS), (controls, MIN_EVAL_PROMPTS), (0, MIN_EVAL_PROMPTS)]):
        train_cost = lambda s: s * pace.step * (1 + kept)  # noqa: E731
        eval_cost = lambda h: (h * (2 + kept) - min(h, measured)) * pace.heldout  # noqa: E731
        total = lambda a, s, h: answer_cost(a) + train_cost(s) + eval_cost(h)  # noqa: E731
        a, s, h = answered, min(steps, MIN_STEPS), min(heldout, least)
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


def adapted_kind(bundle) -> str:
    """The drafter kind a workload run adapts and measures against: the one the page starts with
    (the default pair's path drafter) where the pair ships it, else its block drafter."""
    kind = bundle.default_drafter
    return kind if kind in ("block", "path") and bundle.pair is not None and shipped_drafter(bundle.pair, kind).is_dir() else "block"


def workload_settings(tree_term: str = DEFAULT_TREE_TERM, lambda_tree: float = EXIT_LAMBDA, steps: int = 160, seed: int = 0) -> TrainSettings:
    """The workload fine-tune: 64 soft-labelled anchors and 16 fixed trees a step, lr 5e-4 (10
    warm-up steps, cosine to a tenth), no weight decay or short histories (a few minutes from a trained base)."""
    return TrainSettings(steps=steps, batch=64, lr=5e-4, warmup=10, seed=seed, weight_decay=0.0, short_history_share=0.0, soft_top=SOFT_TOP,
                         tree_term=tree_term, lambda_tree=lambda_tree, trees="fixed", tree_batch=16, budget=EVAL_BUDGET)


def other_recipe(tree_term: str) -> str:
    """The control a run trains beside its recipe: the token loss alone beside a tree term, the
    exit term beside the token loss alone."""
    return EXIT_TERM if tree_term == "none" else "none"


def workload_train_set(target, drafter: BlockDrafter, answers, seed: int = 0, progress: bool = True):
    """The target's features and laws on the answers, then at a few seeded anchors of each answer
    the tree ``drafter`` builds there, scored at T = 1: yields after each batch of the features and
    after each answer's trees, and returns ``(TrainData, ScoredTrees)``."""
    if answers is None:
        raise ValueError("no answers to train on")
    data = yield from with_features_steps(target, answers, list(drafter.config.feature_layers), drafter.draft_vocab, SOFT_TOP, progress)
    trees = yield from fixed_trees(target, drafter, data, EVAL_BUDGET, TREES_PER_ANSWER, seed, soft_top=SOFT_TOP)
    return data, trees


def relative_gain(after: dict, before: dict) -> dict:
    """``after / before - 1`` of two ``{"tau", "se"}`` cells and its standard error: paired over
    prompts when both cells hold each prompt's tokens and forwards (``per_prompt``: the same
    prompts and seeds, so what makes a prompt easy for both cancels), else the two errors over
    prompts combined as independent (result files written before cells kept their prompts)."""
    if len(after.get("per_prompt") or ()) == len(before.get("per_prompt") or ()) > 1:
        gain, se = paired_ratio_change(after["per_prompt"], before["per_prompt"])
        return {"gain": gain, "se": se}
    ratio = after["tau"] / before["tau"]
    se = ratio * math.sqrt((after["se"] / after["tau"]) ** 2 + (before["se"] / before["tau"]) ** 2)
    return {"gain": ratio - 1, "se": se}


def _decode_prompt(bundle, drafter, ids: list[int], seed: int, stop_by: float, clock):
    """One held-out prompt decoded by one drafter at every law of :data:`LAWS`: yields each round
    and returns ``{law: {"tokens", "rounds", "lengths", "bounds"}}`` (tokens emitted, target
    forwards, each round's block length and ``1 + C``), or None when ``stop_by`` came first (a part
    of a prompt is not measured)."""
    out = {}
    for key, law in LAWS.items():
        config = DecodeConfig(budget=EVAL_BUDGET, temperature=law.temperature, top_k=law.top_k, top_p=law.top_p, max_new_tokens=EVAL_NEW_TOKENS, seed=seed)
        summary = yield from decode_rounds(bundle.runner, bundle.tokenizer, drafter, ids, config, should_stop=lambda: clock() > stop_by)
        if summary is None:
            return None
        out[key] = {"tokens": len(summary.token_ids), "rounds": summary.rounds, "lengths": summary.block_lengths, "bounds": summary.tau_bounds}
    return out


def _cell(decoded: list[dict], key: str) -> dict:
    """One drafter at law ``key`` over the prompts decoded: ``tau`` (tokens emitted over target
    forwards, all prompts pooled) and ``se``, its standard error over prompts; the mean block
    length and mean ``1 + C`` (which bounds it) over every round; prompts and rounds."""
    tokens, rounds = [prompt[key]["tokens"] for prompt in decoded], [prompt[key]["rounds"] for prompt in decoded]
    lengths = [x for prompt in decoded for x in prompt[key]["lengths"]]
    bounds = [x for prompt in decoded for x in prompt[key]["bounds"]]
    return {"tau": sum(tokens) / sum(rounds), "se": ratio_standard_error(tokens, rounds), "mean_block_length": sum(lengths) / len(lengths),
            "tau_bound": sum(bounds) / len(bounds), "prompts": len(decoded), "rounds": sum(rounds), "per_prompt": [list(pair) for pair in zip(tokens, rounds)]}


def _served(drafter: BlockDrafter, name: str):
    """A copy of ``drafter`` (block or path) served for decoding (the original keeps training or stays the base)."""
    return tree_drafter_of(copy.deepcopy(drafter).served(), name=name)


def _no_comparison(steps: int, pace: Pace, minutes: float) -> str:
    """Why the run compared nothing, in one sentence: too few steps, or no time to decode held-out prompts."""
    heldout = f"{pace.heldout:.0f} s a held-out prompt per drafter" if math.isfinite(pace.heldout) else "a held-out prompt took more than half the time left"
    measured = f"{pace.answer:.1f} s an answer, {pace.score:.1f} s to score one, {pace.step:.1f} s a step, {heldout}"
    if steps < MIN_STEPS:
        return (f"Only {steps} fine-tune step{'s' * (steps != 1)} fit in {minutes:g} minutes at this machine's measured pace ({measured}): "
                f"below the {MIN_STEPS} a comparison needs, so none is made; give it more minutes or a quieter machine.")
    return (f"{steps} fine-tune steps were made, but at this machine's measured pace ({measured}) decoding held-out prompts with both "
            f"drafters does not fit in {minutes:g} minutes, so no comparison is made; give it more minutes or a quieter machine.")


@dataclass
class FineTune:
    """What every fine-tune of a run shares: the training data, its scored trees, the adapted
    drafter's starting weights (its vocabulary widened) and the settings with the steps that fit."""

    data: TrainData
    trees: ScoredTrees
    initial: dict
    settings: TrainSettings


@dataclass
class WorkloadRun:
    """One adaptation: its settings, then what each phase leaves for the next."""

    bundle: object
    base: BlockDrafter  # the shipped drafter in float32, never trained
    settings: TrainSettings
    controls: tuple[str, ...]  # the control tree terms asked for; the plan keeps those that fit
    seed: int
    progress: bool
    with_mass: bool
    clock: Callable[[], float]
    answer_law: str  # the laws the training answers are drawn from: keys of LAWS joined by "+", each prompt answered at each
    minutes_allowed: float  # the run's time limit; its result's "minutes" are the minutes it took
    start: float
    train_prompts: list[str]
    heldout_prompts: list[str]
    held: list[list[int]]  # the ids of the held-out prompts that may be decoded (at most EVAL_PROMPTS)
    answers: TrainData | None = None  # the target's answers to the training prompts (prompt, then answer)
    answer_seconds: float = 0.0  # the time the target took to write them
    offered: int = 0  # jobs (training prompt, answer law) offered to the target so far
    pace: Pace = field(default_factory=Pace)
    plan: Plan | None = None
    skipped: tuple[str, ...] = ()  # controls asked for that did not fit
    work: BlockDrafter | None = None  # the adapted drafter
    added: list[int] = field(default_factory=list)  # tokens the draft vocabulary gained
    fine_tune: FineTune | None = None
    history: list[dict] = field(default_factory=list)  # the adapted drafter's step records
    compare: bool = False  # whether the run still makes its comparison
    models: dict[str, BlockDrafter] = field(default_factory=dict)  # the adapted drafter and the controls, by result name
    decoded: dict[str, list] = field(default_factory=lambda: {"base": []})  # per drafter, per held-out prompt: {law: what _decode_prompt measured}
    mass: dict | None = None
    mass_note: str | None = None

    @property
    def jobs(self) -> list[tuple[str, str]]:
        """What the target answers: every training prompt at the first answer law, then at the next."""
        return [(prompt, key) for key in answer_laws(self.answer_law) for prompt in self.train_prompts]

    @property
    def deadline(self) -> float:
        return self.start + self.minutes_allowed * 60.0

    @property
    def trained(self) -> int:
        """Drafters the plan fine-tunes: the adapted one and its controls."""
        return 1 + self.plan.controls

    def eval_seconds(self, prompts: int) -> float:
        """The held-out decoding still to come for ``prompts`` prompts at the pace measured (the base has one)."""
        return (prompts * (self.trained + 1) - 1) * self.pace.heldout

    def mass_seconds(self, prompts: int) -> float:
        """Where the mass leaves the trees, measured on ``prompts`` held-out answers (when asked for)."""
        return prompts * (self.pace.answer + 2 * self.pace.score) if self.with_mass else 0.0


def answer_laws(answer_law: str) -> list[str]:
    """The keys of :data:`LAWS` in ``answer_law`` (one key, or several joined by ``+``: ``T0+T0.7``); ValueError names the choices."""
    keys = answer_law.split("+")
    unknown = [key for key in keys if key not in LAWS]
    if unknown or len(set(keys)) != len(keys):
        raise ValueError(f"answer law {answer_law!r}: choose from {', '.join(LAWS)}, or several joined by '+' (each once)")
    return keys


def _start(bundle, prompts, base, minutes, settings, controls, seed, progress, with_mass, clock, answer_law) -> WorkloadRun:
    """The run's settings checked, its prompts split and the held-out ones encoded, the base loaded."""
    answer_laws(answer_law)
    settings, start = replace(settings, seed=seed), clock()
    train_prompts, heldout_prompts = split_workload(prompts, seed)
    context = max_positions(bundle.target)
    held = [fit_prompt(bundle.tokenizer, {"text": p, "chat": True}, context - EVAL_NEW_TOKENS) for p in heldout_prompts[:EVAL_PROMPTS]]
    return WorkloadRun(bundle=bundle, base=drafter_model_class(read_drafter_config(base)).from_pretrained(base, bundle.target, dtype=torch.float32), settings=settings,
                       controls=tuple(controls), seed=seed, progress=progress, with_mass=with_mass, clock=clock, answer_law=answer_law,
                       minutes_allowed=minutes, start=start, train_prompts=train_prompts, heldout_prompts=heldout_prompts, held=held)


def _answer(run: WorkloadRun, jobs: list[tuple[str, str]], stop_by: float, seed: int):
    """The target answers ``jobs`` (training prompt, answer law) a batch at a time into
    ``run.answers`` (greedy, or sampled from the job's law; consecutive jobs of one law batched
    together), stopping before a batch that would end after ``stop_by`` at the pace measured so
    far; yields a piece of :attr:`Phase.ANSWERS` after each forward (a server's compute thread
    steps users' rounds between them) and returns the jobs answered."""
    start, begun, done = run.clock(), time.perf_counter(), 0
    so_far = {"answered": 0, "seconds": 0.0, "stopped": False}

    def enough(answered: int) -> bool:  # after each batch: would the next one end after stop_by?
        so_far.update(answered=answered, seconds=time.perf_counter() - begun)
        left = len(jobs) - done - answered
        so_far["stopped"] = bool(left) and run.clock() + (run.clock() - start) / (done + answered) * min(ANSWER_BATCH, left) > stop_by
        return so_far["stopped"]

    for key, group in itertools.groupby(jobs, key=lambda job: job[1]):
        prompts = [prompt for prompt, _ in group]
        so_far["answered"] = 0
        written = yield from within(answer_prompts(run.bundle.target, run.bundle.tokenizer, prompts, batch=ANSWER_BATCH, progress=run.progress, law=LAWS[key],
                                                   seed=seed + done, enough=enough), Phase.ANSWERS)
        if written is not None:
            run.answers = written if run.answers is None else TrainData.concat([run.answers, written])
        done += so_far["answered"]
        if so_far["stopped"]:
            break
    run.answer_seconds += so_far["seconds"]
    return done


def _first_answers(run: WorkloadRun):
    """The first few answers, which time an answer."""
    yield Progress.start(Phase.ANSWERS, prompts=len(run.train_prompts), answers=len(run.jobs))
    now = run.clock()
    run.offered = yield from _answer(run, run.jobs[:FIRST_ANSWERS], run.deadline, run.seed)
    run.pace.answer = (run.clock() - now) / max(1, run.offered)
    if run.answers is None:
        raise ValueError("the target wrote no answer to the first training prompts; shorten them or raise --minutes")
    yield Progress.start(Phase.PACE, answer=run.pace.answer)


def _probe_heldout(run: WorkloadRun):
    """The base on the first held-out prompt (kept as its first measurement), which times a
    held-out prompt; cut when it takes more than its share of the time left."""
    now = run.clock()
    row = yield from within(_decode_prompt(run.bundle, _served(run.base, "base"), run.held[0], run.seed, now + PROBE_HELDOUT_SHARE * (run.deadline - now), run.clock),
                            Phase.PACE)
    if row is not None:
        run.decoded["base"].append(row)
    run.pace.heldout = run.clock() - now if run.decoded["base"] else math.inf  # cut: no held-out prompt fits here


def _probe_training(run: WorkloadRun):
    """Two answers scored and two steps trained on a copy of the base (then thrown away), which time both."""
    probe, now = copy.deepcopy(run.base), run.clock()
    first = run.answers.select(range(min(PROBE_ANSWERS, len(run.answers))))
    data, trees = yield from within(workload_train_set(run.bundle.target, probe, first, run.seed, False), Phase.PACE)
    run.pace.score = (run.clock() - now) / min(PROBE_ANSWERS, len(run.answers))
    now = run.clock()
    for _ in zip(range(PROBE_STEPS), train(probe, data, replace(run.settings, steps=PROBE_STEPS), trees=trees)):
        yield Progress(Phase.PACE)
    run.pace.step = (run.clock() - now) / PROBE_STEPS


def _plan(run: WorkloadRun):
    """The plan for the time left at the pace measured; the controls that do not fit are skipped."""
    run.plan = plan_phases(run.pace, PLAN_SHARE * (run.deadline - run.clock()), run.offered, len(run.jobs), run.settings.steps, len(run.held),
                           len(run.controls), len(run.decoded["base"]))
    run.skipped, run.controls = run.controls[run.plan.controls :], run.controls[: run.plan.controls]
    yield Progress.start(Phase.PLAN, pace=asdict(run.pace), plan=asdict(run.plan))


def _more_answers(run: WorkloadRun):
    """The rest of the answers the plan holds."""
    if run.plan.answers > run.offered:
        # answers in batches of 8 can run slower per answer than the probe's 4: they may take the plan's share of the
        # time for answers (ANSWER_SHARE) before the run gives up on the rest (the answers are what the drafter learns)
        now = run.clock()
        stop_by = now + max((run.plan.answers - run.offered) * run.pace.answer / PLAN_SHARE, ANSWER_SHARE * (run.deadline - now))
        run.offered += yield from _answer(run, run.jobs[run.offered : run.plan.answers], stop_by, run.seed + run.offered)
    yield Progress.start(Phase.SCORE, answers=len(run.answers), tokens=run.answers.response_tokens, seconds=run.answer_seconds)


def _fine_tune(run: WorkloadRun):
    """The adapted drafter: its vocabulary widened, the training data (when a step fits after it),
    then the steps that fit at the pace measured, stopping before one that would leave too little
    time for the controls and the held-out decoding."""
    run.work = copy.deepcopy(run.base)
    run.added = extend_draft_vocab(run.work, run.answers)
    run.compare = run.plan.heldout > 0
    if not run.plan.steps:
        return
    now = run.clock()
    data, trees = yield from within(workload_train_set(run.bundle.target, run.work, run.answers, run.seed, run.progress), Phase.SCORE)
    run.pace.score = (run.clock() - now) / len(run.answers)
    initial = copy.deepcopy(run.work.state_dict())
    left = PLAN_SHARE * (run.deadline - run.clock())
    steps = min(run.plan.steps, int((left - run.eval_seconds(run.plan.heldout)) / (run.pace.step * run.trained))) if run.compare else 0
    if steps < MIN_STEPS:
        run.compare, steps = False, max(0, min(run.settings.steps, int(left / run.pace.step)))
    yield Progress.start(Phase.TRAIN, anchors=data.num_anchors, trees=len(trees), vocab_added=len(run.added), steps=steps)
    run.fine_tune, now = FineTune(data, trees, initial, replace(run.settings, steps=max(1, steps))), run.clock()
    for record in train(run.work, data, run.fine_tune.settings, trees=trees) if steps else ():
        run.history.append(record)
        yield Progress(Phase.TRAIN, record)
        run.pace.step = (run.clock() - now) / len(run.history)
        after = (len(run.history) * (run.trained - 1) * run.pace.step + run.eval_seconds(run.plan.heldout)) if run.compare else 0.0
        if run.clock() + run.pace.step * (run.trained if run.compare else 1) + after > run.deadline:
            break


def _train_controls(run: WorkloadRun):
    """Each control: the same data, steps and seed from the same start, another tree term."""
    run.compare = run.compare and len(run.history) >= MIN_STEPS
    run.models = {"adapted": run.work}
    if not run.compare:
        return
    for term in run.controls:
        control = copy.deepcopy(run.work)
        control.load_state_dict(run.fine_tune.initial)
        yield Progress.start(Phase.CONTROL, tree_term=term)
        for _ in zip(range(len(run.history)), train(control, run.fine_tune.data, replace(run.fine_tune.settings, tree_term=term), trees=run.fine_tune.trees)):
            yield Progress(Phase.CONTROL)
        run.models["token_only" if term == "none" else term] = control


def _decode_each(run: WorkloadRun, served: dict, names: list[str], ids: list[int]):
    """One held-out prompt decoded by each of ``names``; returns False when the minutes ended
    inside it (that prompt is not measured)."""
    for name in names:
        row = yield from within(_decode_prompt(run.bundle, served[name], ids, run.seed, run.deadline, run.clock), Phase.EVALUATE)
        if row is None:
            return False
        run.decoded[name].append(row)
    return True


def _evaluate(run: WorkloadRun):
    """The held-out prompts, every drafter on each, while the time lasts: the planned prompts,
    then more while the minutes allow (the plan used the probe's pace, often slower than the
    run's); past the plan a prompt starts only when it and the mass figure's work still fit."""
    if not run.compare:
        return
    served = {"base": _served(run.base, "base"), **{name: _served(model, name) for name, model in run.models.items()}}
    # the plan's prompts, and at most ``most`` while the minutes allow (the page said "up to" the plan, then decoded more)
    yield Progress.start(Phase.EVALUATE, prompts=run.plan.heldout, most=len(run.held), drafters=list(served), least=MIN_VERDICT_PROMPTS)
    run.decoded.update({name: [] for name in run.models})
    measured_seconds, prompts_measured = 0.0, 0
    for i, ids in enumerate(run.held):
        names = [name for name in served if len(run.decoded[name]) <= i]
        if i and run.clock() + run.pace.heldout * len(names) + (run.mass_seconds(i + 1) if i >= run.plan.heldout else 0.0) > run.deadline:
            break
        now = run.clock()
        if not (yield from _decode_each(run, served, names, ids)):
            break
        measured_seconds += run.clock() - now
        prompts_measured += len(names)
        run.pace.heldout = measured_seconds / prompts_measured
    run.compare = min(len(rows) for rows in run.decoded.values()) > 0


def _measure_mass(run: WorkloadRun, count: int):
    """Where the target's mass leaves the base's and the adapted drafter's trees on ``count``
    held-out answers, when the time left allows."""
    if not (run.with_mass and run.compare):
        return
    cost = run.mass_seconds(count)
    if run.clock() + cost > run.deadline:
        run.mass_note = f"measuring it needed about {cost:.0f} s more than the minutes left"
        return
    yield Progress.start(Phase.MASS)
    run.mass = yield from within(heldout_mass(run.bundle, {"base": run.base, "adapted": run.work}, run.heldout_prompts[:count], run.seed, run.progress), Phase.MASS)


def _result(run: WorkloadRun, count: int, cells: dict) -> dict:
    """The run's result (JSON): per law each drafter's held-out tau and its gain, what the run did and measured."""
    result = {key: {name: {k: row[key][k] for k in ("tau", "se", "mean_block_length", "prompts", "per_prompt")} for name, row in cells.items()} for key in LAWS}
    result.update({
        "compared": run.compare,
        "note": None if run.compare else _no_comparison(len(run.history), run.pace, run.minutes_allowed),
        "laws": {key: law.describe() for key, law in LAWS.items()},
        "answer_law": run.answer_law,
        "gain": {key: {name: relative_gain(cells[name][key], cells["base"][key]) for name in cells if name != "base"} for key in LAWS} if run.compare else {},
        "minutes": (run.clock() - run.start) / 60.0,
        "minutes_allowed": run.minutes_allowed,
        "pace": asdict(run.pace),
        "plan": asdict(run.plan),
        "train_prompts": len(run.answers),  # the answers kept (over two tokens): a prompt answered at each answer law counts once per law
        "train_prompts_offered": len(run.train_prompts),
        "train_prompts_answered": min(run.offered, len(run.train_prompts)),
        "answers_asked": run.offered,  # jobs: a training prompt at one answer law
        "heldout_prompts": len(run.heldout_prompts),
        "eval_prompts": count,
        "answer_tokens": run.answers.response_tokens,
        "answer_seconds": run.answer_seconds,
        "vocab_added": len(run.added),
        "steps": len(run.history),
        "settings": asdict(replace(run.settings, steps=len(run.history) or run.settings.steps)),
        "budget": EVAL_BUDGET,
        "max_new_tokens": EVAL_NEW_TOKENS,
        "tau_bound": {key: {name: row[key]["tau_bound"] for name, row in cells.items()} for key in LAWS},
        "history": run.history,
        "heldout_mass": run.mass,
        "heldout_mass_note": run.mass_note,
        "controls_skipped": list(run.skipped),  # asked for, but only the adapted drafter's minimum fit in the minutes
    })
    return result


def adaptation(bundle, prompts: list[str], base: Path, minutes: float = 5.0, settings: TrainSettings | None = None, controls: tuple[str, ...] | None = None,
               seed: int = 0, progress: bool = True, with_mass: bool = True, clock=time.monotonic, answer_law: str = DEFAULT_ANSWER_LAW):
    """The whole adaptation as a generator of :class:`~tev.util.progress.Progress` events, one after
    every piece of work (a forward of the target's answers, an answer's scored trees, a training step
    with its record, a decoding round), so a server's compute thread takes a piece at a time and a
    cancel stops between pieces; each phase starts with an event saying what it does (read in words
    by :func:`~tev.pipelines.workload_report.progress_sentence`). It returns ``{"result": ..., "drafter": ...}`` with the
    adapted drafter in float32 (PEP 380: the server's compute thread passes the return value through).

    The run first measures its pace (:class:`Pace`), then plans the rest within ``minutes``
    (:func:`plan_phases`) and keeps to it: each phase stops before a piece of work that would end
    past the time left for what follows. ``controls`` are tree terms trained on the same data, steps
    and seed (``none`` is the token-only control; the result names it ``token_only``); by default
    the other recipe (:func:`other_recipe`). With
    ``with_mass``, where the target's mass leaves the base's and the adapted drafter's trees on the
    held-out answers, when the time left allows. When it compares nothing (below :data:`MIN_STEPS`
    steps, or no held-out prompt fits for both drafters) the result says why in one sentence
    (``note``) and holds only what the base measured. The kept drafter is ``adapted`` in the result. ``answer_law`` (a key of :data:`LAWS`, or
    several joined by ``+``) is the law the target's training answers are drawn from: ``T0`` greedy,
    else sampled (seeded), so the drafter learns the law it will meet; with several, each training
    prompt is answered at each (all at the first law before any at the next). ``clock`` (seconds) is for tests.
    """
    settings = settings or workload_settings()
    controls = (other_recipe(settings.tree_term),) if controls is None else controls
    run = _start(bundle, prompts, base, minutes, settings, controls, seed, progress, with_mass, clock, answer_law)
    # the pace: the first answers, the base on a held-out prompt, two answers scored and two steps on a copy
    for phase in (_first_answers, _probe_heldout, _probe_training, _plan, _more_answers, _fine_tune, _train_controls, _evaluate):
        yield from phase(run)
    count = min(len(rows) for rows in run.decoded.values()) if run.compare else len(run.decoded["base"])
    cells = {name: {key: _cell(rows[:count], key) for key in LAWS} for name, rows in run.decoded.items() if (run.compare or name == "base") and count}
    if run.compare:
        yield Progress.start(Phase.EVALUATED, base=cells["base"], adapted=cells["adapted"], prompts=count)
    yield from _measure_mass(run, count)
    result = _result(run, count, cells)
    run.work.config.notes = {**run.work.config.notes, "workload_adaptation": {"steps": len(run.history), "settings": result["settings"],
                                                                              "train_prompts": min(run.offered, len(run.train_prompts)),
                                                                              "train_answers": len(run.answers), "vocab_added": len(run.added)}}
    return {"result": result, "drafter": run.work}


def heldout_mass(bundle, drafters: dict[str, BlockDrafter], prompts: list[str], seed: int = 0, progress: bool = True):
    """Where the target's mass leaves each drafter's trees on the held-out prompts: the target's
    greedy answers to them (for measurement only), each drafter's trees at the same anchors of
    those answers (B = 16), scored at T = 1; per drafter the mean exit mass by depth (missing /
    tree ended, :meth:`TreeBatch.exit_mass_by_depth`) and the mean ``1 + C``. Yields after each
    piece of work and returns the summaries (None when the target wrote no answer)."""
    answers = yield from answer_prompts(bundle.target, bundle.tokenizer, prompts, progress=progress)
    if answers is None:
        return None
    summaries = {}
    for name, drafter in drafters.items():
        _, trees = yield from workload_train_set(bundle.target, drafter, answers, seed, progress)
        summaries[name] = {**trees.scored.exit_mass_by_depth(drafter.config.horizon), "tau_bound": trees.scored.tau_bound}
    return summaries


def workload_command(args) -> None:
    """The command line's workload adaptation (``python -m tev adapt``)."""
    if args.minutes is None or not math.isfinite(args.minutes) or args.minutes <= 0:
        raise ValueError(f"--minutes must be a positive number, got {args.minutes}")
    for term in args.controls or ():
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
        raise ValueError("with --target, pass --base: the block or path drafter to adapt")
    base = Path(args.base) if args.base else shipped_drafter(bundle.pair, adapted_kind(bundle))
    term = args.tree_term or DEFAULT_TREE_TERM
    lam = EXIT_LAMBDA if args.lambda_tree is None else args.lambda_tree
    settings = workload_settings(term, lam, args.workload_steps, args.seed or 0)
    controls = [other_recipe(term)] if args.controls is None else args.controls
    start = time.monotonic()

    def shown(event) -> None:  # where the minutes go, as they go
        if event.starts:
            print(f"[{time.monotonic() - start:4.0f} s] {progress_sentence(event, asdict(settings))}", file=sys.stderr, flush=True)

    outcome = result_of(adaptation(bundle, prompts, base, args.minutes, settings, tuple(controls), seed=settings.seed, answer_law=args.answer_law), shown)
    result, drafter = outcome["result"], outcome["drafter"]
    result["workload"] = str(args.workload)
    result["command"] = invoked_command()
    drafter.save_pretrained(out / "drafter")
    json_path.parent.mkdir(parents=True, exist_ok=True)
    write_result(json_path, "workload", result)
    print("\n".join(summary_lines(result)))
    print(f"adapted drafter: {out / 'drafter'}; result: {json_path}")
