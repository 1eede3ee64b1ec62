"""The Verifier lab tab: run each exact verifier many times on one fixed tree."""

from __future__ import annotations

import gradio as gr

from tev.bench.lab import SYNTHETIC_WORDS, run_lab, synthetic_tree, tree_from_prompt
from tev.service.service import LIMITS, UserInputError, check_number
from ui import shared
from ui.shared import _user_error
from visual import tree_figure, verifier_lab_figure


def run_verifier_lab(source, prompt, drafter, budget, temperature, draws, seed, progress=gr.Progress()):
    try:
        draws = check_number("draws", draws, 100, LIMITS.max_lab_draws, integer=True)
        seed = check_number("seed", seed, 0, LIMITS.max_seed, integer=True)
        if source == "synthetic example":
            lab = synthetic_tree()
            token_text = SYNTHETIC_WORDS.__getitem__
        else:
            bundle = shared.SERVICE.bundle()
            budget = check_number("budget", budget, 1, LIMITS.max_lab_budget, integer=True)
            temperature = check_number("temperature", temperature, LIMITS.min_lab_temperature, LIMITS.max_temperature)
            if drafter not in bundle.drafters:
                raise UserInputError(f"unknown drafter {drafter!r}")
            ids = shared.SERVICE.encode(prompt, chat=bundle.is_chat)
            with shared.SERVICE.compute:
                lab = tree_from_prompt(bundle.target, bundle.drafter(drafter), ids, budget, temperature)
            token_text = shared.SERVICE.token_text
    except ValueError as error:
        raise _user_error(error) from None
    verifiers = ("tev", "predraw", "sequential")
    progress(0.05, desc=f"running each verifier {draws} times")
    with shared.SERVICE.compute:
        result = run_lab(lab, verifiers, draws=draws, seed=seed,
                         on_verifier=lambda name, i: progress(0.05 + 0.9 * i / len(verifiers), desc=f"{name}: {draws} draws ({i + 1} of {len(verifiers)})"))
    figure = verifier_lab_figure(lab.tree, lab.flow, result.frequencies, result.mean_lengths, token_text=token_text)
    tree = tree_figure(lab.tree, lab.flow, None, token_text=token_text, title=f"the fixed tree ({lab.source}), budget {lab.tree.budget}")
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
    return figure, tree, "\n".join(rows) + "\n\n" + note
