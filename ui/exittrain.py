"""The ExitTrain tab: a short live fine-tune of the pair's base drafter (one domain of the
default pair), or the shipped ExitTrain drafter, against the base on held-out rounds."""

from __future__ import annotations

import dataclasses
import math
import time
from typing import Any, NamedTuple

import gradio as gr

from tev.data.prompts import evaluation_prompts
from tev.engine.block_drafter import BlockDrafter
from tev.engine.drafters import BlockTreeDrafter
from tev.engine.evaluation import evaluation_rounds, fit_prompt
from tev.engine.lab import tree_from_prompt
from tev.service.live_exittrain import live_data, live_experiment, live_settings
from tev.service.service import LIMITS, UserInputError, check_number
from tev.train.data import DOMAINS
from tev.train.losses import TREE_TERMS
from tev.util.compute_thread import result_of
from tev.util.progress import Phase, Progress, relay
from tev.util.stats import change_in_words
from tev.util.stored import read_result
from ui import gpu, shared
from ui.components import checked_event
from ui.shared import BACKGROUND, _user_error, only
from visual import before_after_figure, exit_mass_change_figure, training_figure, tree_figure

RUN_SECONDS = 180  # the whole live run, both held-out scorings included: training stops in time to keep it
# The tab's default steps on the default pair: on the app's one thread a step takes about 5.5 s and
# each held-out scoring about 25 s, so 21 steps fit in the 3 minutes (measured: 167 s in all).
CHAT_TAB_STEPS = 20
TREES_SECONDS = 15  # the side-by-side trees at the end (two tree forwards and figures; measured 5-10 s)


class ExitTrainView(NamedTuple):
    """The live fine-tune's outputs."""

    curve: Any
    status: Any
    compare: Any
    table: Any
    mass: Any
    tree_base: Any
    tree_trained: Any


class ShippedView(NamedTuple):
    """The shipped ExitTrain drafter's comparison: the fine-tune's outputs but its curve and status."""

    compare: Any
    table: Any
    mass: Any
    tree_base: Any
    tree_trained: Any


def priority_note(held_seconds: float, seconds: float) -> str:
    """"; interactive runs had priority for 40% of the minutes": how much of a background run's
    time the compute thread gave interactive work first (Live, the walkthrough, the lab), so a run
    that trained fewer steps under load says why; "" when under 1%."""
    share = held_seconds / seconds if seconds > 0 else 0.0
    return f"; interactive runs (Live, walkthrough, lab) had priority for {min(share, 1.0):.0%} of the minutes" if share >= 0.01 else ""


def _cancelled(history, steps: int) -> ExitTrainView:
    return ExitTrainView(training_figure(history), f"cancelled after {steps} steps", None, "Cancelled: nothing was measured.", None, None, None)


class Cancel:
    """What the ExitTrain slot's Cancel sets for a run (checked between pieces of work)."""

    def __init__(self):
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


def _checked(domain, tree_term, steps, lambda_tree):
    """The run's bundle, settings, data and domain (None without domains); raises ``ValueError``
    (or ``FileNotFoundError``: the data is missing) saying what to change."""
    steps = check_number("steps", steps, LIMITS.min_exittrain_steps, LIMITS.max_exittrain_steps, integer=True)
    lambda_tree = check_number("lambda_tree", lambda_tree, 0, LIMITS.max_lambda_tree)
    bundle = shared.EXITTRAIN_SERVICE.bundle()
    if "block" not in bundle.drafters:
        raise UserInputError("ExitTrain needs the block drafter, which is not loaded")
    if bundle.has_domains and domain not in DOMAINS:
        raise UserInputError(f"choose a domain: {', '.join(DOMAINS)}")
    domain = domain if bundle.has_domains else None
    settings = dataclasses.replace(live_settings(bundle.has_domains), tree_term=tree_term, steps=steps, lambda_tree=lambda_tree)
    return bundle, settings, live_data(bundle, domain), domain


def run_exittrain(domain, tree_term, steps, lambda_tree, request: gr.Request, progress=gr.Progress()):
    """A short live fine-tune of the base drafter, within :data:`RUN_SECONDS` (:class:`ExitTrainView`);
    then base and trained drafter on the same held-out rounds (a paired change in words) and side by
    side. Cancel stops every phase (scoring, training, scoring again) and measures nothing. Each piece
    of work (a held-out batch, a step) is a background step of the server's compute thread: users' rounds go first."""
    owner = shared.session_of(request)
    try:
        bundle, settings, data, domain = _checked(domain, tree_term, steps, lambda_tree)
    except (ValueError, FileNotFoundError) as error:
        raise _user_error(error) from None
    if not shared.TRAINING_SLOT.acquire(owner):
        raise gr.Error("another ExitTrain run is in progress on this server; wait for it to finish, then start again", print_exception=False)
    try:
        started = time.monotonic()
        experiment = live_experiment(bundle, settings, data)
        cancel = shared.TRAINING_SLOT.trainer = Cancel()
        # training stops in time for the 'after' scoring, which costs what the 'before' did, and the trees
        out_of_time = lambda: time.monotonic() >= started + RUN_SECONDS - experiment.seconds.get("before", 0.0) - TREES_SECONDS  # noqa: E731
        run = shared.SERVICE.compute.steps(experiment.phases(stop_training=lambda: cancel.cancelled or out_of_time()), background=True)  # users' rounds go first
        shown = _LiveProgress(experiment, settings, bundle.has_domains, progress, started, run)
        try:
            yield from relay(run, shown.view, stop=lambda: cancel.cancelled)
        finally:
            run.close()  # the compute thread closes the run before its next piece of work
        steps = len(shown.history) - 1  # the 'before' is its first point
        if cancel.cancelled:
            yield _cancelled(shown.history, max(0, steps))
            return
        if steps <= 0 or experiment.after is None:
            yield ExitTrainView(training_figure(shown.history), "no training step fit in the time", None, "Nothing was measured: the server was too busy to train within the run's time; try again.", None, None, None)
            return
        yield _measured(bundle, experiment, settings, shown.history, tree_term, domain)._replace(status=f"{shown.trained()}; {time.monotonic() - started:.0f} s in all")
    finally:
        shared.TRAINING_SLOT.release()


class _LiveProgress:
    """What the live fine-tune shows as its events come (:meth:`view`, for :func:`relay`): the
    'before' scoring, the curve at every step (or every fifth when ``every_step`` is false) with the
    time of training left, the 'after' scoring; ``history`` is the curve's points, the 'before' first."""

    def __init__(self, experiment, settings, every_step: bool, progress, started: float, run):
        self.experiment, self.settings, self.every_step, self.progress, self.started, self.run = experiment, settings, every_step, progress, started, run
        self.history: list[dict] = []

    def trained(self) -> str:
        """The steps trained, why fewer than asked, and the share of the minutes interactive work had first."""
        steps, asked = len(self.history) - 1, self.settings.steps
        cut = f" (stopped at {steps} of {asked} steps to keep within {RUN_SECONDS // 60} minutes)" if steps < asked else ""
        return f"trained {steps} steps{cut}" + priority_note(self.run.held_seconds, time.monotonic() - self.started)

    def view(self, event: Progress):
        before = "scoring the base drafter's held-out trees (the 'before')…"
        if event.starts and event.phase is Phase.BEFORE:
            self.progress(0, desc=before)
            return only(ExitTrainView, curve=training_figure(self.history), status=before)
        if event.starts and event.phase is Phase.TRAIN:
            tau = self.experiment.before.tau_bound
            self.history.append({"step": 0, "loss": float("nan"), "loss_tok": float("nan"), "loss_tree": float("nan"), "tau_bound": tau, "heldout_tau_bound": tau})
        elif event.phase is Phase.TRAIN:
            return self._step(event.info)
        elif event.starts and event.phase is Phase.AFTER:
            return only(ExitTrainView, curve=training_figure(self.history), status=f"{self.trained()}; scoring the held-out trees again…")
        return None

    def _step(self, record: dict):
        """A training step's record kept on the curve, on the bar, and (every step or every fifth) in view."""
        self.history.append(record)
        step, steps = record["step"], self.settings.steps
        left = max(0.0, self.started + RUN_SECONDS - self.experiment.seconds.get("before", 0.0) - TREES_SECONDS - time.monotonic())
        self.progress(step / steps, desc=f"step {step}/{steps} · loss {record['loss']:.3f} · {left:.0f} s of training left")
        if self.every_step or step % 5 == 0 or step == steps:
            return only(ExitTrainView, curve=training_figure(self.history), status=f"step {step}/{steps} · batch 1 + C {record['tau_bound']:.3f} · at most {left:.0f} s of training left")
        return None


def _measured(bundle, experiment, settings, history: list, tree_term: str, domain: str | None) -> ExitTrainView:
    """The finished run's view: the paired held-out change, where the mass leaves, and the two drafters' trees."""
    before, after, change = experiment.before, experiment.after, experiment.change()
    horizon = experiment.drafter.config.horizon
    label = f"ExitTrain ({tree_term}, live)"
    mass = exit_mass_change_figure({"base": {**before.exit_mass_by_depth(horizon), "tau_bound": change["before"]},
                                    label: {**after.exit_mass_by_depth(horizon), "tau_bound": change["after"]}})
    bars = before_after_figure(
        [{"drafter": "base", "temperature": settings.temperature, "tau": change["before"]}, {"drafter": label, "temperature": settings.temperature, "tau": change["after"]}],
        title="Held-out 1 + C (the expected tau) of the same rounds, before and after", yaxis="1 + C",
    )
    table = (f"**Held-out 1 + C**, the same {change['anchors']} rounds{' of ' + domain if domain else ''} for both drafters (B = {settings.budget}, "
             f"T = {settings.temperature:g}): base {change['before']:.3f} -> {change['after']:.3f}: "
             f"{change_in_words(change['change'], change['change_se'])} (paired standard error)."
             + _control_note(bundle, domain) + _NO_HEADROOM)
    trained = experiment.drafter.served()  # in the precision the shipped drafters are served in
    base = BlockTreeDrafter(BlockDrafter.from_pretrained(bundle.shipped_folder("block"), bundle.target), name="base")
    trees = side_by_side(bundle, {"base": base, "ExitTrain (live)": BlockTreeDrafter(trained, name="live")}, evaluation_prompts(bundle.is_chat, 1, domain)[0])
    return ExitTrainView(training_figure(with_heldout_after(history, after.tau_bound)), "", bars, table, mass, *trees)


def with_heldout_after(history: list, after: float) -> list:
    """``history`` with the held-out 'after' (scored once training ended) at its last step, so the
    curve's held-out line runs from the 'before' at step 0 to it."""
    return history[:-1] + [{**history[-1], "heldout_tau_bound": after}]


_NO_HEADROOM = ("\n\nWhy so little: the base drafter was distilled on these very conversations, so a fine-tune on them has no headroom "
                "(docs/exittrain.md). The workload mode below adapts it to text it has not seen, where the gain is large.")


def cancel_exittrain(request: gr.Request):
    owner = shared.session_of(request)
    return "cancelling after this step…" if shared.TRAINING_SLOT.cancel(owner) else "no ExitTrain run of yours is in progress"


def compare_shipped(progress=gr.Progress()):
    try:
        bundle = shared.EXITTRAIN_SERVICE.bundle()
    except ValueError as error:  # the models could not be loaded: say why
        raise _user_error(error) from None
    if "exittrain" not in bundle.drafters:
        gr.Warning("this pair ships no ExitTrain drafter; build one with `python -m tev bench exittrain --install`")
        return only(ShippedView)  # a refusal, not a failure: every output stays as it was
    drafters = {"base": bundle.drafter("block"), "ExitTrain (shipped)": bundle.drafter("exittrain")}
    prompts = evaluation_prompts(bundle.is_chat, 6)
    rows, table = _compare(bundle, drafters, prompts, 48)
    verdicts = []
    for temperature in sorted({r["temperature"] for r in rows}):
        base, shipped = (next(r for r in rows if r["drafter"] == name and r["temperature"] == temperature) for name in drafters)
        se = math.hypot(base["tau_se"], shipped["tau_se"]) / base["tau"]  # combined as independent: the two drafters decode differently
        verdicts.append(f"T = {temperature:g}: {change_in_words(shipped['tau'] / base['tau'] - 1, se)}")
    table = "**Shipped ExitTrain drafter against the base, decoding tau:** " + "; ".join(verdicts) + ".\n\n" + table
    mass = _shipped_mass(bundle)
    return ShippedView(before_after_figure(rows), table + _control_note(bundle, None), mass, *side_by_side(bundle, drafters, prompts[0]))


def _compare(bundle, drafters: dict, prompts: list[dict], max_new_tokens: int):
    rows, lines = [], ["| drafter | T | tau | mean block length | 1 + C | per-prompt tau q25-q75 |", "|---|---|---|---|---|---|"]
    for name, drafter in drafters.items():
        events = evaluation_rounds(bundle.runner, bundle.tokenizer, drafter, prompts, budgets=(32,), temperatures=(0.0, 1.0), max_new_tokens=max_new_tokens, progress=False)
        measured = result_of(shared.SERVICE.compute.steps(events, background=True))  # a step per round; users' rounds go first
        for row in measured:
            rows.append({"drafter": name, "temperature": row["temperature"], "tau": row["tau"], "tau_se": row["tau_se"], "tau_q25": row["prompt_tau_q25"], "tau_q75": row["prompt_tau_q75"]})
            lines.append(f"| {name} | {row['temperature']:g} | {row['tau']:.3f} +- {row['tau_se']:.3f} | {row['mean_block_length']:.3f} | {row['tau_bound']:.3f} | {row['prompt_tau_q25']:.2f}-{row['prompt_tau_q75']:.2f} |")
    return rows, "\n".join(lines) + f"\n\nDecoding: B = 32, {len(prompts)} held-out prompt(s), {max_new_tokens} new tokens each, TEV (greedy at T = 0); tau = tokens emitted per target forward, +- its standard error over prompts."


def side_by_side(bundle, drafters: dict, prompt: dict, budget: int = 32) -> list:
    """Each drafter's first tree of ``budget`` nodes on the same held-out prompt, with the target's reach and missing mass."""
    ids = fit_prompt(bundle.tokenizer, prompt, bundle.context_length - 8)
    figures = []
    for name, drafter in drafters.items():
        lab = shared.EXITTRAIN_SERVICE.call_with(drafter, tree_from_prompt, bundle.runner, drafter, ids, budget, 1.0)
        figures.append(tree_figure(lab.tree, lab.flow, None, token_text=shared.EXITTRAIN_SERVICE.token_text,
                                   title=name))  # the figure adds B, C(T) and 1 + C: a longer title was cut off in half the page's width
    return figures


def _shipped_result(bundle) -> dict | None:
    path = bundle.shipped_folder("exittrain") / "exittrain.json"
    return read_result(path, "exittrain") if path.is_file() else None


def _shipped_mass(bundle):
    result = _shipped_result(bundle)
    trees = (result or {}).get("heldout_trees")
    return exit_mass_change_figure(trees) if trees else exit_mass_change_figure({})


def _control_note(bundle, domain: str | None) -> str:
    """The token-only control's stored result from the shipped ablation, labelled as such."""
    result = _shipped_result(bundle)
    trees = (result or {}).get("heldout_trees", {})
    if "none" not in trees or "base" not in trees:
        return ""
    parts = [f"{name} {100 * (trees[name]['tau_bound'] / trees['base']['tau_bound'] - 1):+.1f}%" for name in ("none", "prefix", "exit") if name in trees]
    where = "all domains" if not domain else "all domains, not only " + domain
    return (f"\n\nStored result of the shipped ablation (equal data, steps and seed; {where}), held-out 1 + C change against the base: "
            + ", ".join(parts) + " (none = token-only control).")


# ------------------------------------------------------------------------------ the tab
def check_free(*inputs):
    """Refuses a start while any ExitTrain run (live or workload) holds the server's one slot."""
    if shared.TRAINING_SLOT.owner is not None:
        raise UserInputError("another ExitTrain run is in progress on this server; wait for it to finish, then start again")


def tab() -> None:
    """The ExitTrain tab's live fine-tune: its components and events (the workload mode follows, :func:`ui.workload.tab`)."""
    live = live_settings(shared.EXITTRAIN_CHAT)
    gr.Markdown(
        "Fine-tune the base block drafter with **ExitTrain** (a run takes at most 3 minutes, scoring included; Cancel stops it at any point): the frozen target scores the trees the drafter "
        "actually builds, and the loss pushes draft probability toward nodes where target mass exits. Before and after, the same "
        "held-out rounds are scored, so the change in `1 + C` is paired, with its standard error; the bars below show at which "
        "depth the target's mass leaves each drafter's trees. One run at a time per server; users' generations go first, and the run keeps about a quarter of the machine's time while they run. "
        "ExitTrain builds its training trees from the block drafter's per-depth marginals, so it fine-tunes the block drafter "
        "(the paper's setting); the path drafter, which drafts each depth from the path above it, is not fine-tuned here. "
        + ("Pick a domain: the drafter fine-tunes on that domain's conversations (written by the target itself) and is judged on "
           "its held-out ones." if shared.EXITTRAIN_CHAT else "This tab runs on the **tiny code pair**, whose training data ships with the app.")
    )
    with gr.Row():
        domain = gr.Radio(list(DOMAINS), value="dialogue", label="domain (train and judge on it; the base drafter does worst on dialogue)", visible=shared.EXITTRAIN_CHAT)
        tree_term = gr.Radio(list(TREE_TERMS), value="exit", label="tree term (exit: the method; prefix, none: controls)")
        steps = gr.Slider(LIMITS.min_exittrain_steps, LIMITS.max_exittrain_steps, value=CHAT_TAB_STEPS if shared.EXITTRAIN_CHAT else live.steps, step=1, label="steps (training stops early if the 3 minutes run out)")
        lambda_tree = gr.Slider(0, LIMITS.max_lambda_tree, value=live.lambda_tree, step=1, label="lambda_tree (weight of L_tree)")
    with gr.Row():
        start = gr.Button("Start fine-tune", variant="primary", elem_id="exittrain-start")
        cancel = gr.Button("Cancel", elem_id="exittrain-cancel")
        shipped = gr.Button("Compare the shipped ExitTrain drafter instead")
    gr.Markdown(gpu.quota_note("exittrain"), visible=gpu.ZERO_GPU)
    ui = {"status": gr.Markdown(elem_id="exittrain-status"), "curve": gr.Plot(label="training"), "compare": gr.Plot(label="tau before / after"),
          "table": gr.Markdown(elem_id="exittrain-table"), "mass": gr.Plot(label="where the target's mass leaves the trees, before / after")}
    with gr.Row():
        ui["tree_base"] = gr.Plot(label="base drafter's tree")
        ui["tree_trained"] = gr.Plot(label="ExitTrain drafter's tree")
    inputs = [domain, tree_term, steps, lambda_tree]
    checked_event(start.click, gpu.gpu_task("exittrain")(run_exittrain), inputs, [ui[name] for name in ExitTrainView._fields], check_free, api_name="exittrain", **BACKGROUND)
    cancel.click(cancel_exittrain, None, ui["status"], api_name="exittrain_cancel")
    shipped.click(gpu.gpu_task("compare_shipped")(compare_shipped), None, [ui[name] for name in ShippedView._fields], api_name="compare_shipped", **BACKGROUND)
