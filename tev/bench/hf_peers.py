"""The peers a user would pick instead: Hugging Face ``generate`` on the same target.

Plain ``generate`` (greedy at T = 0, pure sampling at T > 0: ``top_k=0, top_p=1``, the same
law the speculative methods sample from) and prompt-lookup decoding
(``prompt_lookup_num_tokens``), with the same prompt, token budget, end-of-sequence token and
threads. Each returns a :class:`~tev.engine.decode.GenerationSummary`, so the benchmark
treats them like the project's own methods.
"""

from __future__ import annotations

import time

import torch

from tev.engine.decode import DecodeConfig, GenerationSummary, eos_token_id

__all__ = ["PEERS", "BF16_PEER", "hf_generate"]

PEERS = ("hf-generate", "hf-prompt-lookup")
BF16_PEER = "hf-generate-bf16"  # plain ``generate`` on a bfloat16 copy of the target (the bench loads it)
PROMPT_LOOKUP_TOKENS = 10  # transformers' documented default for prompt lookup


@torch.no_grad()
def hf_generate(target, prompt_ids: list[int], config: DecodeConfig, tokenizer=None, method: str = "hf-generate") -> GenerationSummary:
    """One ``target.generate`` run; ``method`` is ``hf-generate`` or ``hf-prompt-lookup``."""
    if method not in (*PEERS, BF16_PEER):
        raise ValueError(f"method must be one of {PEERS + (BF16_PEER,)}, got {method!r}")
    device = next(target.parameters()).device
    eos = eos_token_id(target, tokenizer)
    kwargs = {"max_new_tokens": config.max_new_tokens, "eos_token_id": eos, "pad_token_id": eos}
    if config.temperature == 0:
        kwargs["do_sample"] = False
    else:
        # the same law as the project's verifiers: temperature, then top-k, top-p, min-p
        kwargs.update(do_sample=True, temperature=config.temperature, top_k=config.top_k, top_p=config.top_p, min_p=config.min_p or None)
        torch.manual_seed(config.seed)
    if method == "hf-prompt-lookup":
        kwargs["prompt_lookup_num_tokens"] = PROMPT_LOOKUP_TOKENS
    ids = torch.tensor([prompt_ids], device=device)
    start = time.perf_counter()
    out = target.generate(input_ids=ids, attention_mask=torch.ones_like(ids), **kwargs)
    seconds = time.perf_counter() - start
    tokens = out[0, len(prompt_ids) :].tolist()
    text = tokenizer.decode(tokens) if tokenizer is not None else ""
    stop = "eos" if eos is not None and tokens and tokens[-1] == eos else "max_new_tokens"
    return GenerationSummary(
        prompt_ids=list(prompt_ids), token_ids=tokens, text=text, rounds=len(tokens), block_lengths=[], tau_bounds=[],
        seconds=seconds, prefill_seconds=float("nan"), time_to_first_token=float("nan"), stop_reason=stop, method=method,
    )
