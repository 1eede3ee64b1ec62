"""The Verifier lab tab: run each exact verifier many times on one fixed tree."""

from __future__ import annotations

from typing import Any, NamedTuple

import gradio as gr

from tev.core.verify import SAMPLING_VERIFIERS
from tev.engine.lab import SYNTHETIC_WORDS, run_lab, synthetic_tree, tree_from_prompt
from tev.service.service import LIMITS, UserInputError, as_text, check_number
from ui import gpu, shared
from ui.components import checked_event, once_per_click
from ui.shared import COMPUTE, _user_error
from visual import tree_figure, verifier_lab_figure

SYNTHETIC = "synthetic example"


class LabView(NamedTuple):
    plot: Any
    tree: Any
    table: Any


@once_per_click
def check_lab(source, prompt, drafter, budget, temperature, draws, seed):
    """The lab's settings (``draws``, ``seed``, and for a prompt's tree ``budget``, ``temperature``
    and the prompt's ids); raises ``ValueError`` saying what to change."""
    draws = check_number("draws", draws, 100, LIMITS.max_lab_draws, integer=True)
    seed = check_number("seed", seed, 0, LIMITS.max_seed, integer=True)
    if source == SYNTHETIC:
        return draws, seed, None, None, None
    bundle = shared.SERVICE.bundle()
    budget = check_number("budget", budget, 1, LIMITS.max_lab_budget, integer=True)
    temperature = check_number("temperature", temperature, LIMITS.min_lab_temperature, LIMITS.max_temperature)
    if drafter not in bundle.drafters:
        raise UserInputError(f"unknown drafter {drafter!r}")
    return draws, seed, budget, temperature, shared.SERVICE.encode(as_text(prompt), chat=bundle.is_chat)


def run_verifier_lab(source, prompt, drafter, budget, temperature, draws, seed, progress=gr.Progress()) -> LabView:
    try:
        draws, seed, budget, temperature, ids = check_lab(source, prompt, drafter, budget, temperature, draws, seed)
        if ids is None:
            lab = synthetic_tree()
            token_text = SYNTHETIC_WORDS.__getitem__
        else:
            bundle = shared.SERVICE.bundle()
            chosen = bundle.drafter(drafter)
            lab = shared.SERVICE.call_with(chosen, tree_from_prompt, bundle.runner, chosen, ids, budget, temperature)
            token_text = shared.SERVICE.token_text
    except ValueError as error:  # the validator refuses bad settings first; an API call that skips it lands here
        raise _user_error(error) from None
    verifiers = SAMPLING_VERIFIERS
    progress(0.05, desc=f"running each verifier {draws} times")
    result = shared.SERVICE.compute.call(run_lab, lab, verifiers, draws=draws, seed=seed,
                                         on_verifier=lambda name, i: progress(0.05 + 0.9 * i / len(verifiers), desc=f"{name}: {draws} draws ({i + 1} of {len(verifiers)})"))
    figure = verifier_lab_figure(lab.tree, lab.flow, result.frequencies, result.mean_lengths, token_text=token_text)
    tree = tree_figure(lab.tree, lab.flow, None, token_text=token_text, title=f"the fixed tree ({lab.source}), budget {lab.tree.size}")
    rows = [
        "| verifier | mean block length (± s.e.) | 1 + C | median decision time (full rows) |",
        "|---|---|---|---|",
    ]
    for name in result.mean_lengths:
        rows.append(f"| {name} | {result.mean_lengths[name]:.3f} ± {result.length_se[name]:.3f} | {lab.flow.tau_bound:.3f} | {1e6 * result.seconds[name]:.0f} µs |")
    note = (
        f"{draws} draws per verifier on the same tree. All three are exact and saturated: their exit frequencies follow the exit "
        "law w(v) and their mean block length is 1 + C(T) up to sampling error, whatever the verifier. The draws run on the rows "
        "folded to the tree's own tokens plus one 'any other token' entry: where a verifier exits depends on nothing else, so "
        "these frequencies have exactly the law they would have on the full rows, at a fraction of the cost; the decision "
        "time is measured on the full rows, as in decoding."
    )
    return LabView(figure, tree, "\n".join(rows) + "\n\n" + note)


def tab(prompt_text: str) -> None:
    """The Verifier lab tab's components and events."""
    gr.Markdown("Fix **one** tree and run each exact verifier many times: the exit-node frequencies follow the exit law w(v) and the mean block length is 1 + C(T), for TEV, predraw and sequential alike (fixed-tree equivalence).")
    with gr.Row():
        source = gr.Radio(["prompt", SYNTHETIC], value="prompt", label="tree from")
        kinds = [kind for kind in shared.SERVICE.drafter_kinds() if kind != "ar"]  # the kinds that draft a tree of their own
        default = shared.SERVICE.default_drafter_kind()
        drafter = gr.Radio(kinds, value=default if default in kinds else kinds[0], label="drafter")  # the page's default, as Live
        budget = gr.Slider(1, LIMITS.max_lab_budget, value=16, step=1, label="budget B")
        temperature = gr.Slider(LIMITS.min_lab_temperature, LIMITS.max_temperature, value=1.0, step=0.05, label="temperature T")
        draws = gr.Slider(100, LIMITS.max_lab_draws, value=3000, step=100, label="draws per verifier")
        seed = gr.Number(value=0, precision=0, minimum=0, maximum=LIMITS.max_seed, label="seed")
    prompt = gr.Textbox(label=f"prompt · at most {LIMITS.max_prompt_chars:,} characters", value=prompt_text, lines=4, elem_id="lab-prompt")
    run = gr.Button("Run the verifiers", variant="primary", elem_id="lab-run")
    gr.Markdown(gpu.quota_note("verifier_lab"), visible=gpu.ZERO_GPU)
    table = gr.Markdown(elem_id="lab-table")
    plot = gr.Plot(label="exit law vs empirical exit frequencies", elem_id="lab-plot")
    tree = gr.Plot(label="the fixed tree", elem_id="lab-tree")
    inputs = [source, prompt, drafter, budget, temperature, draws, seed]
    checked_event(run.click, gpu.gpu_task("verifier_lab")(run_verifier_lab), inputs, list(LabView(plot, tree, table)), check_lab, api_name="verifier_lab", **COMPUTE)
