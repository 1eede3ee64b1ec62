"""The ExitTrain tab's workload mode: adapt the base drafter to a shipped workload pack or to the
user's own prompts, then show the held-out gain of the adapted drafter and of the token-only
control, in words and numbers, and both drafters' trees on the same held-out prompt."""

from __future__ import annotations

import time

import gradio as gr

from tev.engine.drafters import BlockTreeDrafter
from tev.engine.models import shipped_drafter
from tev.engine.decode import rounds_in_turn
from tev.train.workload_command import DEFAULT_TREE_TERM, EVAL_BUDGET, LAWS, MIN_STEPS, adaptation, verdict_lines, workload_settings
from tev.train.workload_data import check_workload, load_workload, split_workload
from tev.service.service import LIMITS
from tev.util.paths import assets_dir
from tev.util.stats import change_in_words
from ui import gpu, shared
from ui.components import Radio, Slider, validator
from ui.exittrain import Cancel, cancel_exittrain, check_free, side_by_side
from ui.shared import COMPUTE, _user_error
from visual import exit_mass_change_figure

__all__ = ["OWN", "MIN_MINUTES", "MAX_MINUTES", "pack_names", "verdict", "result_table", "run_workload", "tab"]

OWN = "my own prompts (below)"
MIN_MINUTES, MAX_MINUTES = 2.0, 10.0


def pack_names() -> list[str]:
    """The shipped workload packs (file stems of ``assets/workloads/*.json``)."""
    return sorted(p.stem for p in (assets_dir() / "workloads").glob("*.json"))


def _prompts(pack: str, own_text: str) -> list[str]:
    if pack == OWN:
        lines = [line.strip() for line in (own_text or "").splitlines() if line.strip()]
        return check_workload(lines, "your prompts (one per line)")
    if pack not in pack_names():
        raise ValueError(f"choose a workload pack ({', '.join(pack_names())}) or '{OWN}'")
    return load_workload(assets_dir() / "workloads" / f"{pack}.json")


def verdict(gain: dict) -> str:
    """A workload gain (``{"gain", "se"}``) in words (:func:`change_in_words`)."""
    return change_in_words(gain["gain"], gain["se"])


def result_table(result: dict) -> str:
    """The held-out comparison as markdown, each change with its verdict in words, then the run's
    verdict sentences (:func:`verdict_lines`: they follow the numbers)."""
    measured = result.get("eval_prompts", result["heldout_prompts"])
    lines = [f"Held-out: {result['heldout_prompts']} prompts never trained on ({measured} of them decoded); B = {result['budget']}, {result['max_new_tokens']} new tokens, "
             f"TEV when sampling, greedy at T = 0; +- is one standard error over rounds.", "",
             "| law | drafter | tau | change against the base |", "|---|---|---|---|"]
    for key in LAWS:
        for name, cell in result[key].items():
            change = "" if name == "base" else verdict(result["gain"][key][name])
            label = {"exittrain": f"adapted (ExitTrain, {result['settings']['tree_term']} term)", "token_only": "token-only control"}.get(name, name)
            lines.append(f"| {result['laws'][key]} | {label} | {cell['tau']:.3f} +- {cell['se']:.3f} | {change} |")
    lines += ["", f"The target answered {result['train_prompts']} training prompts ({result['answer_tokens']} tokens); {result['vocab_added']} of their "
              f"tokens joined the draft vocabulary; {result['steps']} fine-tune steps; {result['minutes']:.1f} min in all (of {result['minutes_budget']:g}).", ""]
    return "\n".join(lines + verdict_lines(result))


def run_workload(pack, own_text, minutes, request: gr.Request, progress=gr.Progress()):
    """Adapt the base drafter to a workload, streaming its phases; each piece of work runs under
    the server's compute lock, and Cancel stops between pieces."""
    owner = getattr(request, "session_hash", None) or "anonymous"
    try:
        minutes = float(minutes)
        if not MIN_MINUTES <= minutes <= MAX_MINUTES:
            raise ValueError(f"minutes must be from {MIN_MINUTES:g} to {MAX_MINUTES:g}, got {minutes:g}")
        prompts = _prompts(pack, own_text)
        bundle = shared.EXITTRAIN_SERVICE.bundle()
        if "block" not in bundle.drafters or not bundle.is_chat:
            raise ValueError("workload adaptation needs a chat target and its block drafter (the default pair)")
    except (ValueError, FileNotFoundError) as error:
        raise _user_error(error) from None
    if not shared.EXITTRAIN_SLOT.acquire(owner):
        raise gr.Error("another ExitTrain run is in progress on this server; wait for it to finish, then start again", print_exception=False)
    cancel = Cancel()
    shared.EXITTRAIN_SLOT.trainer = cancel
    try:
        start = time.monotonic()
        budget = minutes * 60
        run = adaptation(bundle, prompts, shipped_drafter(bundle.pair, "block"), minutes, workload_settings(*DEFAULT_TREE_TERM), controls=("none",), progress=False)
        outcome = None
        try:
            for name, info in rounds_in_turn(run, shared.SERVICE.compute):  # a piece of work at a time: other users take turns
                if cancel.cancelled:
                    break
                if name == "done":
                    outcome = info
                    break
                elapsed = time.monotonic() - start
                progress(min(0.99, elapsed / budget), desc=f"{name} · {elapsed:.0f} s of about {budget:.0f} s")
                if name == "work" or (name == "step" and info["step"] % 10):
                    continue
                yield _status(name, info, elapsed), gr.skip(), gr.skip(), gr.skip(), gr.skip()
        except ValueError as error:
            raise _user_error(error) from None
        finally:
            run.close()
        if cancel.cancelled or outcome is None:
            yield "cancelled: nothing was measured (no comparison of an unfinished drafter is shown)", "", None, None, None
            return
        result = outcome["result"]
        table = result_table(result)
        mass = result.get("heldout_mass")
        mass_figure = exit_mass_change_figure({"base": mass["base"], "adapted": mass["exittrain"]}) if mass else None
        yield f"finished in {result['minutes']:.1f} min; drawing both drafters' trees on a held-out prompt…", table, mass_figure, gr.skip(), gr.skip()
        _, heldout = split_workload(prompts)
        adapted = BlockTreeDrafter(outcome["drafter"].served(), name="adapted")
        trees = side_by_side(bundle, {"base": bundle.drafter("block"), "adapted": adapted}, {"text": heldout[0], "chat": True}, EVAL_BUDGET)
        yield f"finished in {result['minutes']:.1f} min", table, gr.skip(), *trees
    finally:
        shared.EXITTRAIN_SLOT.release()


PHASES = {  # what each phase of the run says while it runs
    "answers": lambda i: f"the target answers {i['prompts']} training prompts…",
    "pace": lambda i: f"{i['answer']:.1f} s an answer; timing a held-out prompt, scoring and two training steps to plan the rest…",
    "plan": lambda i: (f"plan: {i['plan']['answers']} training prompts answered, {i['plan']['steps']} steps, {i['plan']['heldout']} held-out prompts decoded"
                       + ("" if i["plan"]["heldout"] else f" (fewer than {MIN_STEPS} steps fit: no comparison)")),
    "answers done": lambda i: f"{i['answers']} answers ({i['tokens']} tokens); scoring the base drafter's trees on them…",
    "train": lambda i: f"fine-tuning {i['steps']} steps on {i['anchors']} anchors and {i['trees']} scored trees ({i['vocab_added']} new draft tokens)…",
    "step": lambda i: f"step {i['step']} · token loss {i['loss_tok']:.3f}",
    "evaluate": lambda i: f"decoding up to {i['prompts']} held-out prompts with {', '.join(i['drafters'])} (T = 0, T = 0.7 top-p 0.9, T = 1)…",
    "evaluated": lambda i: f"held-out tau at T = 0.7, top-p 0.9: base {i['base']['T0.7']['tau']:.3f}, adapted {i['exittrain']['T0.7']['tau']:.3f}",
    "mass": lambda i: "where the target's mass leaves each drafter's trees on the held-out answers…",
    "control": lambda i: f"control: tree term {i['tree_term']} (same data, steps and seed)…",
}


def _status(name: str, info: dict, elapsed: float) -> str:
    return f"{elapsed:.0f} s · " + (PHASES[name](info) if name in PHASES else name)


# ------------------------------------------------------------------------------ the tab
RUN_OUTPUTS = ("status", "table", "mass", "tree_base", "tree_adapted")  # run_workload yields its outputs in this order


def check_prompts(pack, prompts, minutes):
    """Refuses a workload without enough prompts (naming the prompts), or while another ExitTrain run holds the slot."""
    _prompts(pack, prompts)
    check_free()


def tab() -> None:
    """The ExitTrain tab's workload mode (default pair only): its components and events."""
    shown = shared.EXITTRAIN_CHAT
    gr.Markdown(
        "### Adapt the drafter to your workload\n"
        "A drafter gains most where it meets text it has not learned: pick a workload pack or paste your own prompts (one per "
        "line, at least 16). The target answers three quarters of them, the drafter is fine-tuned on those answers (the token "
        "loss plus ExitTrain's tree term on the trees it builds there), and the last quarter, never trained on, measures "
        "`tau` before and after, with the token-only control beside it. Cancel stops it at once; nothing is saved to the server.",
        visible=shown,
    )
    with gr.Row(visible=shown):
        pack = Radio(pack_names() + [OWN], value=(pack_names() or [OWN])[0], label="workload")
        minutes = Slider(MIN_MINUTES, MAX_MINUTES, value=5, step=0.5, label="minutes (answers, fine-tune and held-out measurement)")
    text = gr.Textbox(label=f"your prompts, one per line (at least 16; each at most {LIMITS.max_prompt_chars} characters)", lines=6,
                      max_lines=30, max_length=200_000, visible=shown)
    with gr.Row(visible=shown):
        start = gr.Button("Adapt to this workload", variant="primary", elem_id="workload-start")
        cancel = gr.Button("Cancel")
    ui = {"status": gr.Markdown(visible=shown, elem_id="workload-status"), "table": gr.Markdown(visible=shown, elem_id="workload-table"),
          "mass": gr.Plot(label="where the target's mass leaves the trees on the held-out answers: base / adapted", visible=shown)}
    with gr.Row(visible=shown, elem_id="workload-trees"):
        ui["tree_base"] = gr.Plot(label="base drafter's tree (held-out prompt)")
        ui["tree_adapted"] = gr.Plot(label="adapted drafter's tree (same prompt)")
    inputs = [pack, text, minutes]
    start.click(gpu.gpu_task("exittrain")(run_workload), inputs, [ui[name] for name in RUN_OUTPUTS], validator=validator(inputs, check_prompts), api_name="exittrain_workload", **COMPUTE)
    cancel.click(cancel_exittrain, None, ui["status"], api_name="exittrain_workload_cancel")
