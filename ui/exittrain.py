"""The ExitTrain tab: a short live fine-tune of the base drafter, or the shipped one, against the base."""

from __future__ import annotations

import dataclasses

import gradio as gr
import torch

from tev.bench.lab import tree_from_prompt
from tev.data.prompts import load_prompt_set
from tev.engine.drafters import BlockDrafter, BlockTreeDrafter
from tev.engine.evaluation import evaluate_drafter, fit_prompt
from tev.service.live_exittrain import LIVE_CONFIG, live_trainer, load_live_data
from tev.service.service import LIMITS, UserInputError, check_number
from tev.util.paths import embedded
from ui import shared
from ui.shared import _user_error
from visual import before_after_figure, training_figure, tree_figure


def run_exittrain(weights, steps, lambda_exit, request: gr.Request, progress=gr.Progress()):
    """A short live fine-tune of the base drafter; then base vs trained on held-out prompts."""
    owner = getattr(request, "session_hash", None) or "anonymous"
    try:
        steps = check_number("steps", steps, LIMITS.min_exittrain_steps, LIMITS.max_exittrain_steps, integer=True)
        lambda_exit = check_number("lambda", lambda_exit, 0, LIMITS.max_lambda_exit)
        config = dataclasses.replace(LIVE_CONFIG, weights=weights, steps=steps, lambda_exit=lambda_exit)
        train, heldout, first_anchor = load_live_data()
        bundle = shared.EXITTRAIN_SERVICE.bundle()
        if "block" not in bundle.drafters:
            raise UserInputError("ExitTrain needs the block drafter, which is not loaded")
    except (ValueError, FileNotFoundError) as error:
        raise _user_error(error) from None
    if not shared.EXITTRAIN_SLOT.acquire(owner):
        raise gr.Error("another ExitTrain run is in progress on this server; wait for it to finish, then start again", print_exception=False)
    try:
        trainer = live_trainer(bundle.target, config, (train, heldout, first_anchor))
        shared.EXITTRAIN_SLOT.trainer = trainer
        with shared.SERVICE.compute:
            before = trainer.heldout_expected_tau()
        history = [{"step": 0, "loss": float("nan"), "loss_tok": float("nan"), "loss_exit": float("nan"), "expected_tau": before, "heldout_expected_tau": before}]
        events = trainer.run()
        while True:
            with shared.SERVICE.compute:
                event = next(events, None)
            if event is None:
                break
            history.append(event.__dict__)
            progress(event.step / config.steps, desc=f"step {event.step}/{config.steps} · loss {event.loss:.3f}")
            if event.step % 5 == 0 or event.step == config.steps:
                yield training_figure(history), f"step {event.step}/{config.steps} · batch 1 + C {event.expected_tau:.3f}", gr.skip(), gr.skip()
        status = "cancelled" if trainer.cancelled else "finished"
        trained = trainer.accelerator.unwrap_model(trainer.drafter).eval().to(torch.bfloat16)  # served like the shipped drafters
        yield training_figure(history), f"{status} after {trainer.step} steps; comparing on held-out prompts…", gr.skip(), gr.skip()
        rows, table = _compare(bundle, {"base": BlockTreeDrafter(BlockDrafter.from_pretrained(embedded("block"), bundle.target), name="base"), f"ExitTrain ({weights}, live)": BlockTreeDrafter(trained, name="live")})
        yield training_figure(history), f"{status} after {trainer.step} steps", before_after_figure(rows), table
    finally:
        shared.EXITTRAIN_SLOT.release()


def cancel_exittrain(request: gr.Request):
    owner = getattr(request, "session_hash", None) or "anonymous"
    return "cancelling after this step…" if shared.EXITTRAIN_SLOT.cancel(owner) else "no ExitTrain run of yours is in progress"


def compare_shipped(progress=gr.Progress()):
    try:
        bundle = shared.EXITTRAIN_SERVICE.bundle()
    except ValueError as error:  # the models could not be loaded: say why
        raise _user_error(error) from None
    if "exittrain" not in bundle.drafters:
        raise gr.Error("no shipped ExitTrain drafter in assets/models; run `python -m tev exittrain --install` first", print_exception=False)
    rows, table = _compare(bundle, {"base": bundle.drafter("block"), "ExitTrain (shipped)": bundle.drafter("exittrain")})
    prompt = fit_prompt(bundle.tokenizer, load_prompt_set("heldout")[5], bundle.context_length - 8)
    trees = []
    for name in ("block", "exittrain"):
        with shared.SERVICE.compute:
            lab = tree_from_prompt(bundle.target, bundle.drafter(name), prompt, 32, 1.0)
        trees.append(tree_figure(lab.tree, lab.flow, None, token_text=shared.EXITTRAIN_SERVICE.token_text, title=f"{name} drafter, same prompt"))
    return before_after_figure(rows), table, trees[0], trees[1]


def _compare(bundle, drafters: dict):
    prompts = load_prompt_set("heldout")[1::8][:6]
    rows, lines = [], ["| drafter | T | tau | 1 + C | per-prompt tau q25-q75 |", "|---|---|---|---|---|"]
    for name, drafter in drafters.items():
        with shared.SERVICE.compute:
            measured = evaluate_drafter(bundle.target, bundle.tokenizer, drafter, prompts, budgets=(32,), temperatures=(0.0, 1.0), max_new_tokens=48, progress=False)
        for row in measured:
            rows.append({"drafter": name, "temperature": row["temperature"], "tau": row["tau"], "tau_q25": row["prompt_tau_q25"], "tau_q75": row["prompt_tau_q75"]})
            lines.append(f"| {name} | {row['temperature']:g} | {row['tau']:.3f} | {row['tau_bound']:.3f} | {row['prompt_tau_q25']:.2f}-{row['prompt_tau_q75']:.2f} |")
    return rows, "\n".join(lines) + f"\n\nB = 32, {len(prompts)} held-out prompts, 48 new tokens each, TEV (greedy at T = 0)."
