"""A workload adaptation's result in words and tables, written once: the laws it is measured at and
their titles, each drafter's label, the verdict sentences, the command's summary, the ExitTrain tab's
table, the model card's rows and the claims report's section.

A result (:func:`tev.pipelines.workload.adaptation`) holds, per law key of :data:`LAWS`, a cell
``{"tau", "se", "mean_block_length", "prompts"}`` per drafter (``base``, ``adapted``: the kept
drafter, trained by the run's recipe, and its controls named by tree term, ``token_only`` for
none) and under ``gain`` each drafter's change against the base. ``tau`` is tokens emitted per
target forward and ``se`` its standard error over prompts; cells of newer results also hold
``per_prompt`` (each prompt's tokens and forwards), and their gains are paired over prompts (the
same prompts and seeds for every drafter). Cells measured before ``tau`` counted tokens per
forward hold no ``tau``: only ``mean_block_length`` with its error over rounds,
``mean_block_length_se``, and name it (``"figure": "mean_block_length"``; :func:`tev.util.stored.row_figure`):
:func:`measured` says which a result holds, :func:`figure` reads it.
A result file is read by :func:`tev.util.stored.read_result` (kind ``workload``).
"""

from __future__ import annotations

import math

from tev.core.sampling import SamplingLaw
from tev.util.progress import Phase, Progress
from tev.util.stats import change_in_words
from tev.util.stored import TAU, row_figure, rows_figure

__all__ = ["LAWS", "PAGE_LAW", "MIN_VERDICT_PROMPTS", "has_verdict", "gain_in_words", "NO_VERDICT", "progress_sentence", "LAW_TITLES", "LAW_COLUMNS", "CARD_NAMES", "measured", "figure", "model_label", "verdict_lines", "summary_lines",
           "result_table", "card_rows", "packs_section"]

# The held-out laws: greedy, the law the page opens at, and plain sampling.
LAWS = {"T0": SamplingLaw(0.0), "T0.7": SamplingLaw(0.7, top_p=0.9), "T1": SamplingLaw(1.0)}
PAGE_LAW = "T0.7"  # the law the page opens at: the one the Workload tab reports as it runs
LAW_TITLES = {"T0": "T = 0 (greedy)", "T0.7": "T = 0.7, top-p 0.9 (TEV; the page's law)", "T1": "T = 1 (TEV)"}  # the claims report's headings
LAW_COLUMNS = {"T0": "0", "T0.7": "0.7, top-p 0.9", "T1": "1"}  # the model card's T column
# No gain or loss is called from fewer held-out prompts than this. The spread between prompts decides it: in the
# eleven stored runs (docs/workload-adapted/, the default pair's packs) one prompt's paired change against the base
# spread 7-62% (standard deviation over prompts, median about 20%), so five prompts give an error of about 9%, and
# the gains those runs called (+20% and more) lie outside two errors; with fewer the error is itself a guess (from
# two prompts a run once reported +20.6% +- 1.6%, where one of them lost in Live).
MIN_VERDICT_PROMPTS = 5
NO_VERDICT = "not enough held-out prompts decoded to tell"
CARD_NAMES = {"adapted": "adapted (the pack's recipe, in its command)", "token_only": "token-only control"}  # the card's own columns


def measured(result: dict) -> tuple[str, str]:
    """(what a result's cells measure, what their ``+-`` is over): ``("tau", "prompts")``, or for
    cells measured before tau counted tokens per forward ``("mean block length", "rounds")``."""
    cells = [cell for key in LAWS for cell in (result.get(key) or {}).values()]
    return ("tau", "prompts") if cells and rows_figure(cells) == TAU else ("mean block length", "rounds")


def figure(cell: dict) -> tuple[float, float]:
    """(a cell's figure, its standard error): ``tau`` and ``se``, or the mean block length and its
    error over rounds in a cell measured before tau counted tokens per forward."""
    key = row_figure(cell)
    return (cell[key], cell["se" if key == TAU else f"{key}_se"])


def _cell(cell: dict) -> str:
    """``figure +- se`` of a cell."""
    value, se = figure(cell)
    return f"{value:.3f} +- {se:.3f}"


def _pct(x: float) -> str:
    return f"{100 * x:+.1f}%" if math.isfinite(x) else "n/a"


def _change(cell: dict, gain: dict) -> str:
    """``tau (+g% +- s%)``: a drafter's cell with its change against the base."""
    return f"{figure(cell)[0]:.3f} ({_pct(gain['gain'])} +- {100 * gain['se']:.1f}%)"


def model_label(name: str, settings: dict) -> str:
    """What a drafter of a workload result is, in words: ``adapted`` is the kept drafter, trained by
    the run's recipe (its tree term in ``settings``, possibly none), the others are controls named by their tree term."""
    lam = f"lambda {settings['lambda_tree']:g}"
    if name == "base":
        return "base (the shipped drafter)"
    if name == "adapted":
        return "adapted (token loss only)" if settings["tree_term"] == "none" else f"adapted (token loss + {settings['tree_term']} term, {lam})"
    return "token-only control" if name == "token_only" else f"control: token loss + {name} term ({lam})"


def has_verdict(result: dict) -> bool:
    """Whether a result decoded the held-out prompts a verdict needs (:data:`MIN_VERDICT_PROMPTS`)."""
    return result["compared"] and result.get("eval_prompts", 0) >= MIN_VERDICT_PROMPTS


def _too_few(result: dict) -> str:
    """Why a result calls no gain or loss: how many held-out prompts it decoded, and how many a verdict needs."""
    decoded, held = result.get("eval_prompts", 0), result["heldout_prompts"]
    more = "" if held >= MIN_VERDICT_PROMPTS else f"; a workload of at least {4 * MIN_VERDICT_PROMPTS} prompts holds that many out"
    return (f"{NO_VERDICT}: {decoded} of {held} decoded, and a gain or a loss is called from at least {MIN_VERDICT_PROMPTS} "
            f"(one prompt's change spreads about 20% around the mean, so fewer cannot tell a change from the prompts drawn){more}")


def gain_in_words(result: dict, gain: dict) -> str:
    """A drafter's change against the base (``{"gain", "se"}``) in words where the result has a
    verdict (:func:`has_verdict`), else the figures alone, saying they are no verdict."""
    if has_verdict(result):
        return change_in_words(gain["gain"], gain["se"])
    return f"{_pct(gain['gain'])} +- {100 * gain['se']:.1f}% (too few prompts to tell)"


def _tree_against_token(result: dict, key: str):
    """(the tree-term drafter's name, its gain, the token-only drafter's gain) at law ``key``, or
    None when the run did not train both (the recipe may be either of the two)."""
    gains = result["gain"][key]
    if result["settings"]["tree_term"] == "none":
        tree = next((name for name in gains if name not in ("adapted", "token_only")), None)
        return (tree, gains[tree], gains["adapted"]) if tree else None
    return ("adapted", gains["adapted"], gains["token_only"]) if "token_only" in gains else None


def _tree_term_words(result: dict, key: str) -> str:
    """Whether the tree term adds to the token loss at law ``key`` (empty when the run did not train both)."""
    pair = _tree_against_token(result, key)
    if pair is None:
        return ""
    tree_name, tree, token = pair
    difference, se = tree["gain"] - token["gain"], math.hypot(tree["se"], token["se"])
    other = "the token-only control" if tree_name == "adapted" else f"the {tree_name}-term control"
    if abs(difference) <= 2 * se:
        return (f"; {other} gained as much (within two standard errors): the gain comes from the target's own answers "
                "(the token loss), and the tree term adds no measurable gain here")
    return (f"; the tree term {'adds' if difference > 0 else 'costs'} {100 * abs(difference):.1f}% +- {100 * se:.1f}% against "
            "the token loss alone (outside two standard errors)")


def verdict_lines(result: dict) -> list[str]:
    """The run's verdict in sentences that follow its numbers: the sentence saying why when it
    compared nothing; else the adapted drafter's change at each law and, only where that is a gain
    outside two standard errors, whether the tree term adds to the token loss there (the recipe and
    its control are the two: token loss only, and token loss + a tree term)."""
    if not result["compared"]:
        return [result["note"]]
    if not has_verdict(result):
        why = _too_few(result)
        return [why[0].upper() + why[1:] + "; give the run more minutes, or more prompts."]
    lines, measure = [], measured(result)[0]
    for key in LAWS:
        ours = result["gain"][key]["adapted"]
        line = f"At {result['laws'][key]} the adapted drafter's held-out {measure}: {change_in_words(ours['gain'], ours['se'])}"
        if ours["gain"] > 2 * ours["se"]:
            line += _tree_term_words(result, key)
        lines.append(line + ".")
    if not any(result["gain"][key]["adapted"]["gain"] > 2 * result["gain"][key]["adapted"]["se"] for key in LAWS):
        lines.append("No gain outside two standard errors at any law, so nothing here says where one would come from.")
    return lines


def _answered(result: dict) -> str:
    """What the target wrote to train on, in words: answers (over two tokens), to how many of the
    training prompts, at which laws."""
    laws = [key for key in result.get("answer_law", "T0").split("+") if key in result.get("laws", {})]
    offered = result.get("train_prompts_offered", result["train_prompts"])
    asked = result.get("answers_asked")
    if asked is None or not laws:  # a result from before the run counted what it asked for
        at = " and ".join(result["laws"][key] for key in laws) or "T = 0 (greedy)"
        return f"{result['train_prompts']} answers to {result.get('train_prompts_answered', offered)} of {offered} training prompts, at {at}"
    # every training prompt at the first law, then at the next: how far the asking reached at each
    reached = [(result["laws"][key], min(max(asked - i * offered, 0), offered)) for i, key in enumerate(laws)]
    at = ", ".join(f"{count} of the {offered} training prompts at {law}" if count else f"none at {law} (the minutes ended first)" for law, count in reached)
    kept = result["train_prompts"]
    dropped = f"; {asked - kept} of two tokens or fewer dropped" if kept < asked else ""
    return f"{kept} answers to train on, of {asked} asked for ({at}{dropped})"


def summary_lines(result: dict) -> list[str]:
    """The command line's summary of a run: what it answered, decoded and trained, its pace, each
    measured law's cells with their changes, then :func:`verdict_lines`."""
    lines = [f"{_answered(result)} ({result['answer_tokens']} tokens), "
             f"{result['heldout_prompts']} held out ({result['eval_prompts']} decoded); {result['steps']} steps; "
             f"{result['minutes']:.1f} min (of {result['minutes_allowed']:g} allowed)",
             "pace: " + ", ".join(f"{name} {seconds:.2f} s" for name, seconds in result["pace"].items())]
    for key in (key for key in LAWS if result[key]):  # nothing at all is measured when the first held-out prompt did not fit
        base = result[key]["base"]
        parts = [f"base {_cell(base)}"]
        parts += [f"{name} {_cell(cell)} ({_pct(result['gain'][key][name]['gain'])} +- {100 * result['gain'][key][name]['se']:.1f}%)"
                  for name, cell in result[key].items() if name != "base"]
        lines.append(f"{result['laws'][key]} (B = {result['budget']}, {result['max_new_tokens']} new tokens): " + "; ".join(parts))
    measure, unit = measured(result)
    return lines + [f"(held-out {measure}, +- one standard error over {unit}; the kept drafter is 'adapted')"] + verdict_lines(result)


def result_table(result: dict) -> str:
    """The held-out comparison as markdown (the ExitTrain tab's), each change with its verdict in
    words, then the run's verdict sentences (:func:`verdict_lines`: they follow the numbers)."""
    decoded = result.get("eval_prompts", result["heldout_prompts"])
    measure, unit = measured(result)
    meaning = "tau = tokens the answers got per target forward" if measure == "tau" else "the mean block length (accepted + bonus)"
    lines = [f"Held-out: {result['heldout_prompts']} prompts never trained on ({decoded} of them decoded); B = {result['budget']}, {result['max_new_tokens']} new tokens, "
             f"TEV when sampling, greedy at T = 0; {meaning}, +- one standard error over {unit}"
             + ("; each change is paired prompt by prompt (the same prompts and seeds for every drafter)." if _paired(result) else "."), "",
             f"| law | drafter | {measure} | change against the base |", "|---|---|---|---|"]
    for key in LAWS:
        for name, cell in result[key].items():
            change = "" if name == "base" else gain_in_words(result, result["gain"][key][name])
            lines.append(f"| {result['laws'][key]} | {model_label(name, result['settings'])} | {_cell(cell)} | {change} |")
    lines += ["", f"The target wrote {_answered(result)} ({result['answer_tokens']} tokens); {result['vocab_added']} of their "
              f"tokens joined the draft vocabulary; {result['steps']} fine-tune steps; {result['minutes']:.1f} min in all (of {result['minutes_allowed']:g}).", ""]
    return "\n".join(lines + verdict_lines(result))


def _paired(result: dict) -> bool:
    """Whether a result's gains were paired over prompts (its cells keep each prompt's figures)."""
    return all("per_prompt" in cell for key in LAWS for cell in (result.get(key) or {}).values())


def card_rows(workloads: dict) -> list[list[str]]:
    """The model card's table: one row per pack and law, what was measured (tau, or the mean block
    length in results written before; :func:`measured`), the base's and each of :data:`CARD_NAMES`' figure with its change."""
    rows = []
    for pack, entry in sorted(workloads.items()):
        result = entry["result"]
        measure, unit = measured(result)
        for key in (key for key in LAWS if key in result):  # runs before 2026-12-05 measured T = 0 and T = 1 only
            base, gain = result[key]["base"], result["gain"][key]
            cells = [_change(result[key][name], gain[name]) if name in gain else "-" for name in CARD_NAMES]
            others = ", ".join(f"{name} {_pct(g['gain'])}" for name, g in gain.items() if name not in CARD_NAMES) or "-"
            first = key == "T0"
            rows.append([pack if first else "", entry["task"] if first else "", f"{measure} (+- over {unit})" if first else "", LAW_COLUMNS[key],
                         _cell(base), *cells,
                         others, f"{result['minutes']:.1f}" if first else ""])
    return rows


def packs_section(data: dict) -> list[str]:
    """The claims report's markdown over packs (``{"packs", "mean_gain"}``): per law, tau of every
    drafter on each pack with its change, then the mean change over packs."""
    lines = ["Held-out prompts (a quarter of each pack, never trained on), B = 16, 64 new tokens; tau = tokens emitted per target forward, "
             "+- one standard error over prompts; a pack marked *(mean block length)* was measured before tau counted only the tokens "
             "emitted: its figures are mean block lengths, +- over rounds. The change is against the base. `adapted` is the kept drafter, "
             "trained by the run's recipe (its tree term, possibly none); the others train on the same answers and steps with another "
             "tree term (`token_only`: none).", ""]
    for key, title in ((key, title) for key, title in LAW_TITLES.items() if key in data["mean_gain"]):
        present = set.union(*(set(p[key]["cells"]) for p in data["packs"].values())) - {"base"}
        names = [n for n in ("adapted", "token_only") if n in present] + sorted(present - {"adapted", "token_only"})
        lines += [f"**{title}**", "", "| pack | base | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
        for pack, p in data["packs"].items():
            cells = [_change(p[key]["cells"][n], p[key]["gain"][n]) if n in p[key]["cells"] else "-" for n in names]
            base = p[key]["cells"]["base"]
            label = pack if p.get("measured", "tau") == "tau" else f"{pack} *({p['measured']})*"
            lines.append(f"| {label} | {_cell(base)} | " + " | ".join(cells) + " |")
        lines += ["", "Mean change over packs: " + ", ".join(f"{n} {_pct(g)}" for n, g in data["mean_gain"][key].items()) + ".", ""]
    return lines


_SAYS = {  # what each phase of a workload run says as it starts (``i``: its info, ``s``: the run's settings, for the drafters' names)
    Phase.ANSWERS: lambda i, s: f"the target writes {i.get('answers', i.get('prompts'))} answers to {i.get('prompts')} training prompts…",
    Phase.PACE: lambda i, s: f"{i['answer']:.1f} s an answer; timing a held-out prompt, scoring and two training steps to plan the rest…",
    Phase.PLAN: lambda i, s: (f"plan: {i['plan']['answers']} answers written, {i['plan']['steps']} steps, {i['plan']['heldout']} held-out prompts decoded"
                              + ("" if i["plan"]["heldout"] else " (no comparison fits at this pace)")),
    Phase.SCORE: lambda i, s: f"{i['answers']} answers ({i['tokens']} tokens); scoring the base drafter's trees on them…",
    Phase.TRAIN: lambda i, s: f"fine-tuning {i['steps']} steps on {i['anchors']} anchors and {i['trees']} scored trees ({i['vocab_added']} new draft tokens)…",
    Phase.CONTROL: lambda i, s: f"training {model_label('token_only' if i['tree_term'] == 'none' else i['tree_term'], s)} (same data, steps and seed)…",
    Phase.EVALUATE: lambda i, s: (f"decoding held-out prompts with {', '.join(model_label(n, s) for n in i['drafters'])} (T = 0, T = 0.7 top-p 0.9, T = 1): "
                                  f"{i['prompts']} planned" + (f", up to {i['most']} while the minutes allow" if i["most"] > i["prompts"] else "")
                                  + f"; a verdict needs {i['least']}…"),
    Phase.EVALUATED: lambda i, s: (f"held-out tau at {LAWS[PAGE_LAW].describe()} over {i['prompts']} prompt{'s' * (i['prompts'] != 1)}: "
                                   f"{model_label('base', s)} {i['base'][PAGE_LAW]['tau']:.3f}, {model_label('adapted', s)} {i['adapted'][PAGE_LAW]['tau']:.3f} "
                                   "(tokens per target forward)"),
    Phase.MASS: lambda i, s: "where the target's mass leaves each drafter's trees on the held-out answers…",
}


def progress_sentence(event: Progress, settings: dict) -> str:
    """What a workload run's event says in words (the page's status and the command line's log): the
    sentence of the phase it starts or belongs to, a training step's loss; ``settings``: the run's
    training settings (the drafters' names, as the result table gives them)."""
    if event.phase is Phase.TRAIN and "step" in event.info:
        return f"fine-tuning: step {event.info['step']} · token loss {event.info['loss_tok']:.3f}"
    if event.starts and event.phase in _SAYS:
        return _SAYS[event.phase](event.info, settings)
    return str(event.phase) + "…"
