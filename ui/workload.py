"""The ExitTrain tab's workload mode: adapt the base drafter to a shipped workload pack or to the
user's own prompts, then show the held-out gain of the adapted drafter and of the token-only
control, in words and numbers, and both drafters' trees on the same held-out prompt."""

from __future__ import annotations

import time
from dataclasses import asdict
from typing import Any, NamedTuple

import gradio as gr

from tev.engine.models import shipped_drafter, tree_drafter_of
from tev.pipelines.workload import DEFAULT_ANSWER_LAW, DEFAULT_TREE_TERM, EVAL_BUDGET, EXIT_LAMBDA, EXIT_TERM, MIN_STEPS, adaptation, adapted_kind, answer_laws, workload_settings
from tev.pipelines.workload_report import LAWS, NO_VERDICT, has_verdict, progress_sentence, result_table
from tev.pipelines.workload_data import check_workload, load_workload, split_workload
from tev.service.adapted import ADAPTED_PREFIX, CAPACITY, MIN_ASKED, lost_laws
from tev.service.service import LIMITS, as_text
from tev.util.paths import assets_dir
from tev.util.progress import Phase, Progress, relay
from tev.util.stats import change_in_words
from ui import gpu, shared
from ui.components import checked_event
from ui.exittrain import Cancel, cancel_exittrain, check_free, priority_note, side_by_side
from ui.shared import BACKGROUND, _user_error, only
from visual import exit_mass_change_figure

__all__ = ["OWN", "ASKED", "MIN_MINUTES", "MAX_MINUTES", "RECIPES", "DEFAULT_RECIPE", "pack_names", "verdict", "result_table", "run_workload",
           "remember_asked", "use_asked", "offer_adapted", "tab"]

OWN = "my own prompts (below)"
ASKED = "what I have asked in Live"
MIN_MINUTES, MAX_MINUTES = 2.0, 10.0
# What the kept drafter is fine-tuned on (its tree term); the other is trained beside it as the control.
RECIPES = {"the target's answers (token loss only)": "none", f"the answers + ExitTrain's exit term (lambda {EXIT_LAMBDA:g})": EXIT_TERM}
DEFAULT_RECIPE = next(label for label, term in RECIPES.items() if term == DEFAULT_TREE_TERM)  # the command's default recipe too


def pack_names() -> list[str]:
    """The shipped workload packs (file stems of ``assets/workloads/*.json``)."""
    return sorted(p.stem for p in (assets_dir() / "workloads").glob("*.json"))


def _workload_name(pack: str) -> str:
    return {OWN: "my prompts", ASKED: "what I asked"}.get(pack, pack)


def _prompts(pack: str, own_text: str, session: str | None = None) -> list[str]:
    if pack == ASKED:
        asked = shared.ASKED.get(session) if session else []
        if len(asked) < MIN_ASKED:
            raise ValueError(f"this browser session has sent {len(asked)} chat prompt{'s' * (len(asked) != 1)} in the Live tab; "
                             f"adapting to them needs at least {MIN_ASKED}")
        return check_workload(asked, "your Live prompts", minimum=MIN_ASKED)
    if pack == OWN:
        lines = [line.strip() for line in (as_text(own_text) or "").splitlines() if line.strip()]
        return check_workload(lines, "your prompts (one per line)")
    if pack not in pack_names():
        raise ValueError(f"choose a workload pack ({', '.join(pack_names())}) or '{OWN}'")
    return load_workload(assets_dir() / "workloads" / f"{pack}.json")


def verdict(gain: dict) -> str:
    """A workload gain (``{"gain", "se"}``) in words (:func:`change_in_words`)."""
    return change_in_words(gain["gain"], gain["se"])


def _recipe(recipe: str) -> str:
    """The tree term a recipe choice names; ``ValueError`` naming the choices."""
    if recipe not in RECIPES:
        raise ValueError(f"fine-tune on: choose one of {', '.join(repr(r) for r in RECIPES)}")
    return RECIPES[recipe]


class WorkloadView(NamedTuple):
    """The workload run's outputs."""

    status: Any
    table: Any
    mass: Any
    tree_base: Any
    tree_adapted: Any


# The figure of where the mass leaves, hidden when a run has none to draw (its table or status says why).
NO_FIGURE = gr.update(value=None, visible=False)


def run_workload(pack, own_text, minutes, recipe, request: gr.Request):
    """Adapt the base drafter to a workload, streaming its progress (:class:`WorkloadView`: one bar, one
    sentence and one clock in the status, :class:`RunProgress`); each piece of work runs under the
    server's compute thread, and Cancel stops between pieces. ``recipe`` (a key of :data:`RECIPES`)
    is what the kept drafter learns from; the other recipe trains beside it as the control."""
    owner = shared.session_of(request)
    try:
        minutes = float(minutes)
        if not MIN_MINUTES <= minutes <= MAX_MINUTES:
            raise ValueError(f"minutes must be from {MIN_MINUTES:g} to {MAX_MINUTES:g}, got {minutes:g}")
        term = _recipe(recipe)
        prompts = _prompts(pack, own_text, owner)
        bundle = shared.EXITTRAIN_SERVICE.bundle()
        kind = adapted_kind(bundle)
        if kind not in bundle.drafters or not bundle.is_chat:
            raise ValueError("workload adaptation needs a chat target and its shipped drafter (the default pair)")
    except (ValueError, FileNotFoundError) as error:
        raise _user_error(error) from None
    if not shared.TRAINING_SLOT.acquire(owner):
        raise gr.Error("another ExitTrain run is in progress on this server; wait for it to finish, then start again", print_exception=False)
    cancel = Cancel()
    shared.TRAINING_SLOT.trainer = cancel
    try:
        settings = workload_settings(term)
        run = adaptation(bundle, prompts, shipped_drafter(bundle.pair, kind), minutes, settings, progress=False)  # the control: the other recipe
        pieces = shared.SERVICE.compute.steps(run, background=True)  # a piece of work at a time; users' rounds go first
        shown = RunProgress(time.monotonic(), minutes * 60, asdict(settings), lambda: pieces.held_seconds)
        yield only(WorkloadView, status=shown.line("starting: the target writes the first answers…"))
        try:
            outcome = yield from relay(pieces, shown.view, stop=lambda: cancel.cancelled)
        except ValueError as error:
            raise _user_error(error) from None
        finally:
            pieces.close()  # the compute thread closes the run before its next piece of work
        if cancel.cancelled or outcome is None:
            yield WorkloadView("cancelled: nothing was measured (no comparison of an unfinished drafter is shown)", "", NO_FIGURE, None, None)
            return
        yield from _finished(bundle, kind, pack, prompts, outcome, owner, shown)
    finally:
        shared.TRAINING_SLOT.release()


def _finished(bundle, kind: str, pack: str, prompts: list[str], outcome: dict, owner: str, shown: "RunProgress"):
    """The finished run's views: its table and verdict, the adapted drafter kept, both drafters' trees."""
    result = outcome["result"]
    table = result_table(result)
    done = f"finished in {result['minutes']:.1f} min (trained {result['steps']} steps{priority_note(shown.held(), time.monotonic() - shown.start)})"
    if not result["compared"]:
        yield WorkloadView(f"{done}: nothing compared, no adapted drafter kept", table, NO_FIGURE, None, None)
        return
    gains = {key: {**result["gain"][key]["adapted"], "prompts": result["eval_prompts"]} for key in LAWS}
    label = shared.ADAPTED.keep(owner, _workload_name(pack), outcome["drafter"], gains)
    kept = (f"the adapted drafter is kept for this browser session as **{label}**: choose it in the Live tab or the walkthrough, or download it "
            f"below (loads with `--draft`); through the API (a script is a session of its own) name it `{shared.ADAPTED.api_name(owner, label)}` "
            f"(keep the key to yourself: it serves this drafter to whoever sends it); the server keeps the {CAPACITY} most recently used adapted "
            "drafters (15-30 MB each) and writes none to disk")
    kept += _served_laws(gains)
    if not has_verdict(result):
        kept = f"{NO_VERDICT} whether it gains (see the table); {kept}"
    mass = result.get("heldout_mass")
    if mass:
        mass_figure = gr.update(value=exit_mass_change_figure({"base": mass["base"], "adapted": mass["adapted"]}), visible=True)
    else:  # never a titled, empty figure: the table says why there is none
        mass_figure = NO_FIGURE
        table += f"\n\n*No figure of where the target's mass leaves the trees: {result.get('heldout_mass_note') or 'this run did not measure it'}.*"
    yield only(WorkloadView, status=shown.line(f"{done}; drawing both drafters' trees on a held-out prompt…"), table=table, mass=mass_figure)
    _, heldout = split_workload(prompts)
    adapted = tree_drafter_of(outcome["drafter"].served(), name="adapted")
    trees = side_by_side(bundle, {"base": bundle.drafter(kind), "adapted": adapted}, {"text": heldout[0], "chat": True}, EVAL_BUDGET)
    yield only(WorkloadView, status=f"{done}; {kept}", table=table, tree_base=trees[0], tree_adapted=trees[1])


# The status's sentence and clock are said again at least this often while a phase runs (a held-out decoding once
# showed one line for 133 s), so the clock reads the time gone to within about this.
STATUS_SECONDS = 1.0


def _clock(seconds: float) -> str:
    return f"{int(seconds) // 60}:{int(seconds) % 60:02d}"


class RunProgress:
    """A workload run's progress as the page shows it: one bar (the share of its minutes gone), one
    clock that only goes forward, and one sentence (:func:`progress_sentence`: what the phase
    under way does), all in the status; Gradio's own progress is hidden, as it drew a bar and a
    timer (reset at every update) over every output.

    Args:
        start: ``time.monotonic()`` at the press; ``seconds_allowed``: the run's time limit.
        settings: the run's training settings (the drafters' names, as the result table gives them).
        held: the seconds interactive work has had priority so far (:attr:`Steps.held_seconds`)."""

    def __init__(self, start: float, seconds_allowed: float, settings: dict, held=lambda: 0.0):
        self.start, self.seconds_allowed, self.settings, self.held = start, seconds_allowed, settings, held
        self._sentence, self._said = None, None

    def line(self, sentence: str, now: float | None = None) -> str:
        """The status at ``now`` (default: the time now): the bar, then the clock and ``sentence`` (and the share
        of the minutes interactive runs had first)."""
        elapsed = (time.monotonic() if now is None else now) - self.start
        bar = f'<progress value="{min(0.99, elapsed / self.seconds_allowed):.3f}" max="1"></progress>'
        return f"{bar}\n\n{_clock(elapsed)} of about {_clock(self.seconds_allowed)} · {sentence}{priority_note(self.held(), elapsed)}"

    def view(self, event: Progress) -> WorkloadView | None:
        """The status to show after ``event`` (:func:`tev.util.progress.relay`'s ``view``), or None: a
        phase's sentence when it starts (and a training step's, one in ten), else again with the
        clock once :data:`STATUS_SECONDS` have passed since it was last said."""
        now = time.monotonic()
        if event.starts or (event.phase is Phase.TRAIN and event.info.get("step", 1) % 10 == 0):
            self._sentence = progress_sentence(event, self.settings)
        elif self._sentence is not None and self._said is not None and now - self._said < STATUS_SECONDS:
            return None
        self._said = now
        return only(WorkloadView, status=self.line(self._sentence or progress_sentence(event, self.settings), now))


# ------------------------------------------------------------------------------ the tab
def check_prompts(pack, prompts, minutes, recipe):
    """Refuses a workload without enough prompts (naming the prompts), an unknown recipe, or while another ExitTrain
    run holds the slot (the session's Live prompts are counted by the run itself: a validator does not know the session)."""
    _recipe(recipe)
    if pack != ASKED:
        _prompts(pack, prompts)
    check_free()


# ------------------------------------------------------------------------------ the session's adapted drafters and Live prompts
def _served_laws(gains: dict) -> str:
    """Where Live serves the kept drafter, from its held-out gains per law."""
    losses = lost_laws(gains)
    if not losses:
        return "; Live serves it at every law (on its held-out prompts it got no fewer tokens per forward than the shipped drafter at any)"
    served = [LAWS[key].describe() for key in gains if key not in losses]
    lost = ", ".join(f"{LAWS[key].describe()} ({100 * gains[key]['gain']:+.0f}%)" for key in losses)
    unmeasurable = any(gains[key]["gain"] >= -2 * gains[key]["se"] for key in losses)  # the table calls these no measurable change
    return (f"; on its held-out prompts it got fewer tokens per forward than the shipped drafter at {lost}, so Live runs the shipped drafter at the laws nearest to "
            f"{'that' if len(losses) == 1 else 'those'} and serves the adapted one " + (f"at {', '.join(served)}" if served else "at none")
            + (" (Live plays safe: a figure below zero withholds it, whether or not it lies outside two standard errors)" if unmeasurable else ""))


def remember_asked(prompt: str, chat, request) -> None:
    """Keep a chat prompt this session sent in Live (a workload of its own to adapt to)."""
    if chat:
        shared.ASKED.add(shared.session_of(request), prompt)


def use_asked(request: gr.Request):
    """The "adapt to what I have asked" button: the workload becomes this session's Live prompts
    (at least :data:`MIN_ASKED`), with a seeded share of them held out, as for packs."""
    try:
        prompts = _prompts(ASKED, "", shared.session_of(request))
    except ValueError as error:
        raise _user_error(error) from None
    train, heldout = split_workload(prompts)
    return gr.update(value=ASKED), (f"workload: the {len(prompts)} chat prompts this browser session sent in Live ({len(train)} to train on, "
                                    f"{len(heldout)} held out); press **Adapt to this workload**")


def offer_adapted(pack, request) -> tuple:
    """After a run: the drafter choices of the page with this session's adapted drafters, and the
    zipped drafter this run made (when it kept one) to download, else ``gr.skip()``."""
    session = shared.session_of(request)
    labels = shared.ADAPTED.labels(session) if shared.SHARES_EXITTRAIN else []
    label = ADAPTED_PREFIX + _workload_name(pack)
    return gr.update(choices=shared.SERVICE.drafter_kinds() + labels), str(shared.ADAPTED.export(session, label)) if label in labels else gr.skip()


def tab(drafters: list = ()) -> None:
    """The ExitTrain tab's workload mode (default pair only): its components and events.
    ``drafters``: the page's drafter choices, which list this session's adapted drafters after a run."""
    shown = shared.EXITTRAIN_CHAT
    gr.Markdown(
        "### Adapt the drafter to your workload\n"
        "A drafter gains most where it meets text it has not learned: pick a workload pack, paste your own prompts (one per "
        f"line, at least 16), or take the chat prompts you sent in the Live tab (at least {MIN_ASKED}). The run first times this machine, "
        "then plans within the minutes: the target answers three quarters of the prompts (each at "
        f"{' and at '.join(LAWS[key].describe() for key in answer_laws(DEFAULT_ANSWER_LAW))}), the drafter the page starts with (the path "
        "drafter) is fine-tuned on those answers "
        "(the token loss alone, or with ExitTrain's exit term on the trees it builds there: the other is trained beside it as the "
        "control), and the last quarter, never trained on, measures `tau` before and after at T = 0, at the page's T = 0.7 top-p 0.9 "
        "and at T = 1. The token loss alone is the default: the exit term did not beat it on the measured workloads. "
        f"Below {MIN_STEPS} steps it says so and compares nothing. Cancel stops it at once. The adapted drafter is kept in the "
        "server's memory for this browser session only (Live and walkthrough: \"adapted: …\"), with its weights to download. "
        "The exit term and the figure of where the target's mass leaves the trees are written for trees of per-depth marginals "
        "(the block drafter): for the path drafter their trees are built from each depth's law given the target's own tokens "
        "above it, not the tree it grows while decoding.",
        visible=shown,
    )
    with gr.Row(visible=shown):
        pack = gr.Radio(pack_names() + [OWN, ASKED], value=(pack_names() or [OWN])[0], label="workload")
        minutes = gr.Slider(MIN_MINUTES, MAX_MINUTES, value=5, step=0.5, label="minutes (the whole run: answers, fine-tunes, held-out measurement)")
    recipe = gr.Radio(list(RECIPES), value=DEFAULT_RECIPE, label="fine-tune the kept drafter on (the other is the control)", visible=shown)
    text = gr.Textbox(label=f"your prompts, one per line (at least 16; each at most {LIMITS.max_prompt_chars} characters)", lines=6,
                      max_lines=30, max_length=200_000, visible=shown)
    with gr.Row(visible=shown):
        start = gr.Button("Adapt to this workload", variant="primary", elem_id="workload-start")
        asked = gr.Button("Adapt to what I have asked (Live)", elem_id="workload-asked")
        cancel = gr.Button("Cancel")
    ui = {"status": gr.Markdown(visible=shown, elem_id="workload-status"), "table": gr.Markdown(visible=shown, elem_id="workload-table"),
          "mass": gr.Plot(label="where the target's mass leaves the trees on the held-out answers: base / adapted", visible=False,  # shown once drawn
                          elem_id="workload-mass")}
    with gr.Row(visible=shown, elem_id="workload-trees"):
        ui["tree_base"] = gr.Plot(label="base drafter's tree (held-out prompt)")
        ui["tree_adapted"] = gr.Plot(label="adapted drafter's tree (same prompt)")
    download = gr.File(label="adapted drafter (drafter_config.json + drafter.safetensors; unzip, then --draft FOLDER)", interactive=False, visible=shown)

    def offered(pack, request: gr.Request):
        choices, weights = offer_adapted(pack, request)
        return [choices] * len(drafters) + [weights]

    inputs = [pack, text, minutes, recipe]
    started = checked_event(start.click, gpu.gpu_task("exittrain")(run_workload), inputs, [ui[name] for name in WorkloadView._fields], check_prompts,
                            api_name="adapt_workload", show_progress="hidden", **BACKGROUND)  # the status holds the run's one bar
    started.then(offered, pack, [*drafters, download], api_name="adapt_workload_offer")
    asked.click(use_asked, None, [pack, ui["status"]], api_name="adapt_workload_asked")
    cancel.click(cancel_exittrain, None, ui["status"], api_name="adapt_workload_cancel")
