"""Whether a drafter's proposals depend on the torch thread count.

A server that runs a visitor's rounds at more threads while no other process holds a core (:mod:`tev.util.cpus`) keeps a seed's answer
only where nothing in a round rounds differently at another count. The row-invariant target forward is checked for
it as it is chosen (:func:`~tev.engine.target_precision.rows_agree_across_threads`); a drafter is checked here, by
the rounds it drives: on a 2-core AVX2 EPYC the path drafter (float32, int8 head) proposed the same trees bit for bit
at one and two threads, while copies of one seeded answer through the bfloat16 block drafter, some run alone at two
threads and some at one, gave two texts (bfloat16 is emulated there, and its kernels split their sums by thread).
"""

from __future__ import annotations

import torch

from tev.engine.decode import DecodeConfig, Request, run_to_end, speculative_generate
from tev.engine.target import Target
from tev.util.machine_cache import model_shape, recall, remember

__all__ = ["proposals_agree_across_threads", "agree_here"]


def proposals_agree_across_threads(target: Target, drafter, counts: tuple[int, ...], new_tokens: int = 3, seed: int = 1) -> bool:
    """Whether a short seeded run (budget 16, T = 1) through ``drafter`` gives the same trees, draft probabilities
    and tokens bit for bit at every torch thread count of ``counts``; the caller's count is left as it was.

    Args:
        target: the target (its forward as the server runs it).
        drafter: the drafter to check.
        counts: the thread counts a server would run its rounds with.
        new_tokens: the run's length (a few rounds).
        seed: the prompt's and the run's seed.
    """
    vocab = int(target.model.config.vocab_size)
    prompt = torch.randint(1, vocab, (24,), generator=torch.Generator().manual_seed(seed)).tolist()
    config = DecodeConfig(budget=16, temperature=1.0, max_new_tokens=new_tokens, seed=seed, stop_at_eos=False)
    before, runs = torch.get_num_threads(), []
    try:
        for count in counts:
            torch.set_num_threads(count)
            records, summary = run_to_end(speculative_generate(Request(target, drafter, prompt, config)))
            runs.append((summary.token_ids, [(record.tree.tokens, record.tree.draft_logprob, record.flow.reach) for record in records]))
    finally:
        torch.set_num_threads(before)
    first_tokens, first_rounds = runs[0]
    return all(tokens == first_tokens and len(rounds) == len(first_rounds)
               and all(all(torch.equal(a, b) for a, b in zip(mine, theirs)) for mine, theirs in zip(rounds, first_rounds))
               for tokens, rounds in runs[1:])


def agree_here(target: Target, drafter, counts: tuple[int, ...]) -> bool:
    """:func:`proposals_agree_across_threads` on this machine, from an earlier start's check where one was kept
    (:mod:`tev.util.machine_cache`: the same CPU, torch, shapes and precisions run the same kernels, whose order of
    summing is what the check finds out)."""
    model = getattr(drafter, "model", None)
    shapes = sorted((name, list(weight.shape), str(weight.dtype)) for name, weight in model.named_parameters()) if isinstance(model, torch.nn.Module) else None
    parts = {"target": model_shape(target.model), "drafter": type(drafter).__name__, "name": getattr(drafter, "name", ""), "weights": shapes,
             "counts": list(counts), "check": "a seeded 3-token run, budget 16, T = 1"}
    kept = recall("drafter-threads", parts)
    if kept is not None and isinstance(kept.get("agree"), bool):
        return kept["agree"]
    agree = proposals_agree_across_threads(target, drafter, counts)
    remember("drafter-threads", parts, {"agree": agree})
    return agree
