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
from tev.pipelines.workload_report import LAWS, PAGE_LAW, model_label, result_table
from tev.pipelines.workload_data import check_workload, load_workload, split_workload
from tev.service.adapted import ADAPTED_PREFIX, CAPACITY, MIN_ASKED, is_adapted, lost_laws
from tev.service.service import LIMITS
from tev.util.paths import assets_dir
from tev.util.stats import change_in_words
from ui import gpu, shared
from ui.components import as_text, checked_event
from ui.exittrain import Cancel, cancel_exittrain, check_free, priority_note, side_by_side
from ui.shared import BACKGROUND, _user_error, only
from visual import exit_mass_change_figure

__all__ = ["OWN", "ASKED", "MIN_MINUTES", "MAX_MINUTES", "RECIPES", "DEFAULT_RECIPE", "pack_names", "verdict", "result_table", "run_workload", "adapted_drafter", "chosen_drafter", "live_drafter",
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


def run_workload(pack, own_text, minutes, recipe, request: gr.Request, progress=gr.Progress()):
    """Adapt the base drafter to a workload, streaming its phases (:class:`WorkloadView`); each piece of work runs under
    the server's compute thread, and Cancel stops between pieces. ``recipe`` (a key of
    :data:`RECIPES`) is what the kept drafter learns from; the other recipe trains beside it as the control."""
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
    if not shared.EXITTRAIN_SLOT.acquire(owner):
        raise gr.Error("another ExitTrain run is in progress on this server; wait for it to finish, then start again", print_exception=False)
    cancel = Cancel()
    shared.EXITTRAIN_SLOT.trainer = cancel
    try:
        start = time.monotonic()
        budget = minutes * 60
        settings = workload_settings(term)
        run = adaptation(bundle, prompts, shipped_drafter(bundle.pair, kind), minutes, settings, progress=False)  # the control: the other recipe
        pieces = shared.SERVICE.compute.steps(run, background=True)  # a piece of work at a time; users' rounds go first
        try:
            outcome = yield from _phases(pieces, cancel, start, budget, progress, asdict(settings))
        except ValueError as error:
            raise _user_error(error) from None
        finally:
            pieces.close()  # the compute thread closes the run before its next piece of work
        if cancel.cancelled or outcome is None:
            yield WorkloadView("cancelled: nothing was measured (no comparison of an unfinished drafter is shown)", "", None, None, None)
            return
        result = outcome["result"]
        table = result_table(result)
        done = f"finished in {result['minutes']:.1f} min (trained {result['steps']} steps{priority_note(pieces.held_seconds, time.monotonic() - start)})"
        if not result["compared"]:
            yield WorkloadView(f"{done}: nothing compared, no adapted drafter kept", table, None, None, None)
            return
        gains = {key: result["gain"][key]["adapted"] for key in LAWS}
        label = shared.ADAPTED.keep(owner, _workload_name(pack), outcome["drafter"], gains)
        kept = (f"the adapted drafter is kept for this browser session as **{label}**: choose it in the Live tab or the walkthrough, or download it "
                f"below (loads with `--draft`); through the API (a script is a session of its own) name it `{shared.ADAPTED.api_name(owner, label)}` "
                f"(keep the key to yourself: it serves this drafter to whoever sends it); the server keeps the {CAPACITY} most recently used adapted "
                "drafters (15-30 MB each) and writes none to disk")
        kept += _served_laws(gains)
        mass = result.get("heldout_mass")
        mass_figure = exit_mass_change_figure({"base": mass["base"], "adapted": mass["adapted"]}) if mass else None
        yield only(WorkloadView, status=f"{done}; drawing both drafters' trees on a held-out prompt…", table=table, mass=mass_figure)
        progress(0.99, desc="drawing both drafters' trees on a held-out prompt")  # the yield took the bar down: it stays until the trees
        _, heldout = split_workload(prompts)
        adapted = tree_drafter_of(outcome["drafter"].served(), name="adapted")
        trees = side_by_side(bundle, {"base": bundle.drafter(kind), "adapted": adapted}, {"text": heldout[0], "chat": True}, EVAL_BUDGET)
        yield only(WorkloadView, status=f"{done}; {kept}", table=table, tree_base=trees[0], tree_adapted=trees[1])
    finally:
        shared.EXITTRAIN_SLOT.release()


def _phases(pieces, cancel: Cancel, start: float, budget: float, progress, settings: dict):
    """A status view as each phase of the run ``pieces`` starts (a piece of work, and nine steps in
    ten, show only on the progress bar), and the phase's status again every :data:`STATUS_SECONDS`
    with its time; returns what the run returned (PEP 380), or None once Cancel is pressed.
    ``settings``: the run's training settings (the drafters' names, as the result table gives them).

    The page takes the progress bar down at every status view: it is reported again right after each."""
    shown, said = None, start
    while True:
        try:
            name, info = next(pieces)
        except StopIteration as end:
            return end.value
        if cancel.cancelled:
            return None
        now = time.monotonic()
        elapsed = now - start
        fraction, desc = min(0.99, elapsed / budget), f"{name} · {elapsed:.0f} s of about {budget:.0f} s{priority_note(pieces.held_seconds, elapsed)}"
        progress(fraction, desc=desc)
        if not (name == "work" or (name == "step" and info["step"] % 10)):
            shown = (name, info)
        elif shown is None or now - said < STATUS_SECONDS:
            continue
        said = now
        yield only(WorkloadView, status=_status(*shown, elapsed, settings))
        progress(fraction, desc=desc)


# A phase's status line is said again with its time at least this often (a held-out decoding once showed one line for 133 s).
STATUS_SECONDS = 5.0


def _drafters(names, settings: dict) -> str:
    """The run's drafters as the result table names them."""
    return ", ".join(model_label(name, settings) for name in names)


PHASES = {  # what each phase of the run says while it runs (``i`` its info, ``s`` the run's settings, for the drafters' names)
    "answers": lambda i, s: f"the target writes {i.get('answers', i['prompts'])} answers to {i['prompts']} training prompts…",
    "pace": lambda i, s: f"{i['answer']:.1f} s an answer; timing a held-out prompt, scoring and two training steps to plan the rest…",
    "plan": lambda i, s: (f"plan: {i['plan']['answers']} answers written, {i['plan']['steps']} steps, {i['plan']['heldout']} held-out prompts decoded"
                       + ("" if i["plan"]["heldout"] else f" (no comparison fits at this pace: {MIN_STEPS} steps and a held-out prompt for both drafters)")),
    "answers done": lambda i, s: f"{i['answers']} answers ({i['tokens']} tokens); scoring the base drafter's trees on them…",
    "train": lambda i, s: f"fine-tuning {i['steps']} steps on {i['anchors']} anchors and {i['trees']} scored trees ({i['vocab_added']} new draft tokens)…",
    "step": lambda i, s: f"step {i['step']} · token loss {i['loss_tok']:.3f}",
    "evaluate": lambda i, s: (f"decoding held-out prompts with {_drafters(i['drafters'], s)} (T = 0, T = 0.7 top-p 0.9, T = 1): {i['prompts']} planned"
                           + (f", up to {i['most']} while the minutes allow…" if i["most"] > i["prompts"] else "…")),
    "evaluated": lambda i, s: (f"held-out tau at {LAWS[PAGE_LAW].describe()}: {model_label('base', s)} {i['base'][PAGE_LAW]['tau']:.3f}, "
                               f"{model_label('adapted', s)} {i['adapted'][PAGE_LAW]['tau']:.3f} (tokens per target forward)"),
    "mass": lambda i, s: "where the target's mass leaves each drafter's trees on the held-out answers…",
    "control": lambda i, s: f"training {model_label('token_only' if i['tree_term'] == 'none' else i['tree_term'], s)} (same data, steps and seed)…",
}


def _status(name: str, info: dict, elapsed: float, settings: dict) -> str:
    return f"{elapsed:.0f} s · " + (PHASES[name](info, settings) if name in PHASES else name)


# ------------------------------------------------------------------------------ the tab
def check_prompts(pack, prompts, minutes, recipe):
    """Refuses a workload without enough prompts (naming the prompts), an unknown recipe, or while another ExitTrain
    run holds the slot (the session's Live prompts are counted by the run itself: a validator does not know the session)."""
    _recipe(recipe)
    if pack != ASKED:
        _prompts(pack, prompts)
    check_free()


# ------------------------------------------------------------------------------ the session's adapted drafters and Live prompts
def _adapted_store():
    """The server's adapted drafters, for the Live tab's target; ``ValueError`` when that target is another one."""
    if not shared.SHARES_EXITTRAIN:
        raise ValueError("adapted drafters are made for the default pair's target; this server's Live tab runs another target")
    return shared.ADAPTED


def adapted_drafter(label: str, request):
    """This browser session's adapted drafter ``label`` for the Live tab's target; ``ValueError`` saying why not."""
    return _adapted_store().drafter(shared.session_of(request), label)


def chosen_drafter(bundle, name: str, request):
    """The drafter a Live or walkthrough choice names: a kind of the bundle, or this session's adapted drafter."""
    return adapted_drafter(name, request) if is_adapted(name) else bundle.drafter(name)


def live_drafter(bundle, name: str, request, law) -> tuple[object, str | None]:
    """The drafter Live runs for a choice at ``law`` (a :class:`~tev.core.sampling.SamplingLaw`), and a
    sentence when it is not the one chosen: an adapted drafter only where it measured no worse than
    the shipped one (:meth:`~tev.service.adapted.AdaptedDrafters.serving`)."""
    if not is_adapted(name):
        return bundle.drafter(name), None
    return _adapted_store().serving(shared.session_of(request), name, law, bundle.drafter(adapted_kind(bundle)))


def _served_laws(gains: dict) -> str:
    """Where Live serves the kept drafter, from its held-out gains per law."""
    losses = lost_laws(gains)
    if not losses:
        return "; Live serves it at every law (it measured no worse than the shipped drafter at any)"
    served = [LAWS[key].describe() for key in gains if key not in losses]
    lost = ", ".join(f"{LAWS[key].describe()} ({100 * gains[key]['gain']:+.0f}%)" for key in losses)
    return (f"; it measured a loss at {lost}, so Live runs the shipped drafter at the laws nearest to "
            f"{'that' if len(losses) == 1 else 'those'} and serves the adapted one " + (f"at {', '.join(served)}" if served else "at none"))


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
          "mass": gr.Plot(label="where the target's mass leaves the trees on the held-out answers: base / adapted", visible=shown)}
    with gr.Row(visible=shown, elem_id="workload-trees"):
        ui["tree_base"] = gr.Plot(label="base drafter's tree (held-out prompt)")
        ui["tree_adapted"] = gr.Plot(label="adapted drafter's tree (same prompt)")
    download = gr.File(label="adapted drafter (drafter_config.json + drafter.safetensors; unzip, then --draft FOLDER)", interactive=False, visible=shown)

    def offered(pack, request: gr.Request):
        choices, weights = offer_adapted(pack, request)
        return [choices] * len(drafters) + [weights]

    inputs = [pack, text, minutes, recipe]
    started = checked_event(start.click, gpu.gpu_task("exittrain")(run_workload), inputs, [ui[name] for name in WorkloadView._fields], check_prompts,
                            api_name="exittrain_workload", **BACKGROUND)
    started.then(offered, pack, [*drafters, download], api_name="exittrain_workload_offer")
    asked.click(use_asked, None, [pack, ui["status"]], api_name="exittrain_workload_asked")
    cancel.click(cancel_exittrain, None, ui["status"], api_name="exittrain_workload_cancel")
