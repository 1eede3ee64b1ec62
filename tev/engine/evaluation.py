"""How well a drafter serves a target over a prompt set: ``tau`` (tokens emitted per target
forward), and the mean block length against the ``1 + C`` that bounds it.

Shared by the benchmarks, the report, drafter training and the app. ``p`` is the target, ``q``
the drafter.
"""

from __future__ import annotations

from tqdm import tqdm

from tev.engine.decode import DecodeConfig, Request, speculative_generate
from tev.engine.prompt_text import encode_chat, encode_prompt
from tev.engine.session import max_positions
from tev.engine.target import Target
from tev.util.compute_thread import result_of
from tev.util.stats import quantile, ratio_standard_error
from tev.util.stored import TAU, row_figure

__all__ = ["fit_prompt", "decode_rounds", "evaluation_rounds", "evaluate_drafter", "format_tau_table"]


def fit_prompt(tokenizer, prompt: dict, limit: int) -> list[int]:
    """A prompt's ids (``prompt["ids"]``, or its ``"text"`` encoded: as a user message through the
    chat template when ``prompt["chat"]``, else raw), left-truncated to ``limit``
    tokens so that generation has room; BOS, when present, is kept first."""
    if "ids" in prompt:
        ids = list(prompt["ids"])
    else:
        ids = (encode_chat if prompt.get("chat") else encode_prompt)(tokenizer, prompt["text"])
    if len(ids) <= limit:
        return ids
    bos = getattr(tokenizer, "bos_token_id", None)
    if bos is not None and ids[0] == bos:
        return [bos] + ids[len(ids) - limit + 1 :]
    return ids[len(ids) - limit :]


def decode_rounds(target: Target, tokenizer, drafter, ids: list[int], config: DecodeConfig, should_stop=None):
    """One prompt decoded with tree speculation: yields each round's record and returns the
    :class:`GenerationSummary`, or None when ``should_stop`` ended the decoding first (a part of a
    prompt is not a measurement)."""
    summary = yield from speculative_generate(Request(target, drafter, ids, config), tokenizer, should_stop=should_stop)
    return None if summary.stop_reason == "cancelled" else summary


def evaluation_rounds(
    target: Target,
    tokenizer,
    drafter,
    prompts: list[dict],
    budgets=(8, 16, 32, 64),
    temperatures=(0.0, 1.0),
    max_new_tokens: int = 64,
    seed: int = 0,
    verifier: str = "tev",
    progress: bool = True,
    desc: str = "evaluate",
):
    """:func:`evaluate_drafter` as a generator: yields every speculation round's record (a caller
    takes turns with other work between rounds, or stops) and returns the list of rows (PEP 380)."""
    context = max_positions(target.model)
    encoded = [fit_prompt(tokenizer, p, context - max_new_tokens) for p in prompts]
    rows = []
    settings = [(b, t) for t in temperatures for b in budgets]
    bar = tqdm(total=len(settings) * len(encoded), desc=desc, disable=not progress)
    for budget, temperature in settings:
        lengths, bounds, per_prompt, tokens, rounds, seconds = [], [], [], [], [], 0.0
        for i, ids in enumerate(encoded):
            config = DecodeConfig(budget=budget, temperature=temperature, verifier=verifier, max_new_tokens=max_new_tokens, seed=seed + i)
            summary = yield from decode_rounds(target, tokenizer, drafter, ids, config)
            lengths += summary.block_lengths
            bounds += summary.tau_bounds
            per_prompt.append(summary.tau)
            tokens.append(len(summary.token_ids))
            rounds.append(summary.rounds)
            seconds += summary.seconds
            bar.update(1)
        n = len(lengths)
        rows.append(
            {
                "budget": budget,
                "temperature": temperature,
                "tau": sum(tokens) / n,
                "tau_se": ratio_standard_error(tokens, rounds),
                "mean_block_length": sum(lengths) / n,
                "tau_bound": sum(bounds) / n,
                "prompt_tau_q25": quantile(per_prompt, 0.25),
                "prompt_tau_q75": quantile(per_prompt, 0.75),
                "prompts": len(encoded),
                "rounds": n,
                "tokens": sum(tokens),
                "tokens_per_second": sum(tokens) / seconds if seconds else float("nan"),
            }
        )
    bar.close()
    return rows


def evaluate_drafter(target: Target, tokenizer, drafter, prompts: list[dict], budgets=(8, 16, 32, 64), temperatures=(0.0, 1.0), max_new_tokens: int = 64,
                     seed: int = 0, verifier: str = "tev", progress: bool = True, desc: str = "evaluate") -> list[dict]:
    """Measured ``tau`` and mean block length against mean ``1 + C`` per setting (a server steps
    :func:`evaluation_rounds` instead, taking turns with its other users).

    Returns one row per (budget, temperature): ``tau`` (tokens emitted over target forwards, all
    prompts pooled) and ``tau_se``, its standard error over prompts (a prompt's rounds are not
    independent); ``mean_block_length`` (accepted + bonus, tokens past a stop included) and
    ``tau_bound`` (mean ``1 + C``, which bounds it); the spread of per-prompt ``tau`` (q25/q75);
    prompts, rounds and tokens.
    """
    return result_of(evaluation_rounds(target, tokenizer, drafter, prompts, budgets, temperatures, max_new_tokens, seed, verifier, progress, desc))


def format_tau_table(rows: list[dict]) -> str:
    """The rows of :func:`evaluate_drafter` as a markdown table. A row measured before ``tau``
    counted tokens per forward holds only ``mean_block_length`` (with its error over rounds,
    ``mean_block_length_se``) and names it (:func:`~tev.util.stored.row_figure`): its tau column says "not measured"."""
    lines = ["| T | B | tau (+- s.e. over prompts) | mean block length | mean 1 + C | per-prompt tau q25-q75 | rounds |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        if row_figure(r) == TAU:
            tau, length, spread = f"{r['tau']:.3f} +- {r['tau_se']:.3f}", f"{r['mean_block_length']:.3f}", f"{r['prompt_tau_q25']:.2f}-{r['prompt_tau_q75']:.2f}"
        else:
            tau, length, spread = "not measured", f"{r['mean_block_length']:.3f} +- {r['mean_block_length_se']:.3f} (s.e. over rounds)", "-"
        lines.append(f"| {r['temperature']:g} | {r['budget']} | {tau} | {length} | {r['tau_bound']:.3f} | {spread} | {r['rounds']} |")
    return "\n".join(lines)
