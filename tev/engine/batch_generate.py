"""Many prompts continued at once by the target: the data writer of training and adaptation.

Hugging Face ``generate`` spends most of a batched step on a CPU outside the model (at 48
rows in bfloat16 about 375 ms a step against a forward of about 90 ms: its logits
processors and sampler run over the whole 49,152-token vocabulary, and finished rows keep
being computed until the longest one ends). This loop does only what data writing needs:
one prefill of the left-padded batch, then one forward of the rows still writing per step
(finished rows leave the batch and the cache), logits only for the last position, and a
draw from the target's law (temperature T, or a whole :class:`~tev.core.sampling.SamplingLaw` with
its top-k / top-p / min-p cut) by :func:`tev.core.sampling.sample_rows` (exact; greedy at T = 0).

The text is what the target writes; padding and the batch's size may move a near-tie, as in
any batched decoding. :func:`generate_batch_steps` is the same loop as a generator of its
forwards, so a server's compute thread can step a Live round between two of them.
"""

from __future__ import annotations

import torch
from transformers import DynamicCache

from tev.core.sampling import SamplingLaw, as_law, sample_rows
from tev.util.compute_thread import result_of

__all__ = ["generate_batch", "generate_batch_steps"]


def generate_batch(
    target, prompts: list[list[int]], max_new_tokens: int, temperature: "float | SamplingLaw", stop_id: int | None, seed: int, pad_id: int = 0,
) -> list[list[int]]:
    """The continuation of each prompt, until ``stop_id`` (kept) or ``max_new_tokens``
    (:func:`generate_batch_steps` run to its end)."""
    return result_of(generate_batch_steps(target, prompts, max_new_tokens, temperature, stop_id, seed, pad_id))


def generate_batch_steps(
    target, prompts: list[list[int]], max_new_tokens: int, temperature: "float | SamplingLaw", stop_id: int | None, seed: int, pad_id: int = 0,
):
    """The continuation of each prompt, until ``stop_id`` (kept) or ``max_new_tokens``: a generator
    that yields the rows still writing after each forward (the prefill, then one per new token) and
    returns the continuations (PEP 380).

    Args:
        target: a Hugging Face causal LM with a ``.model`` body and an output head (Llama, Qwen).
        prompts: token ids, one list per row (any lengths, at least one token each).
        temperature: 0 for greedy decoding, else sampling from ``softmax(logits / T)``; or a
            :class:`SamplingLaw`, sampled with its truncation.
        stop_id: the token that ends a row (``None``: rows run to ``max_new_tokens``).
        seed: seeds the sampler (the same inputs and seed give the same continuations).
    Returns:
        one list of new token ids per prompt, in order.
    """
    if any(len(p) == 0 for p in prompts):
        raise ValueError("every prompt needs at least one token")
    rows = len(prompts)
    outputs: list[list[int]] = [[] for _ in range(rows)]
    if rows == 0 or max_new_tokens <= 0:
        return outputs
    yield from _write(target, prompts, max_new_tokens, as_law(temperature), stop_id, seed, pad_id, outputs)
    return outputs


@torch.no_grad()  # on a generator: grad mode is off only while it runs, not between its steps
def _write(target, prompts, max_new_tokens, law, stop_id, seed, pad_id, outputs):
    """The loop of :func:`generate_batch_steps`, appending each row's tokens to ``outputs``."""
    rows = len(prompts)
    device = next(target.parameters()).device
    width = max(len(p) for p in prompts)
    ids = torch.full((rows, width), pad_id, dtype=torch.long)
    mask = torch.zeros((rows, width), dtype=torch.long)
    for row, prompt in enumerate(prompts):
        ids[row, width - len(prompt) :] = torch.tensor(prompt)
        mask[row, width - len(prompt) :] = 1
    positions = (mask.cumsum(1) - 1).clamp(min=0)
    generator = torch.Generator().manual_seed(seed)
    cache = DynamicCache()
    mask, positions = mask.to(device), positions.to(device)
    hidden = target.model(input_ids=ids.to(device), attention_mask=mask, position_ids=positions, cache=cache, use_cache=True).last_hidden_state[:, -1]
    writing = torch.arange(rows)  # the prompt index of each row still in the batch
    yield rows
    position = positions[:, -1:]
    head = target.get_output_embeddings()
    for step in range(max_new_tokens):
        logits = head(hidden).float().cpu()  # [rows writing, vocab]
        if not law.greedy:
            chosen = sample_rows(law.probs(logits), generator)
        else:
            chosen = logits.argmax(-1)
        keep = []
        for slot, (row, token) in enumerate(zip(writing.tolist(), chosen.tolist())):
            outputs[row].append(token)
            if token != stop_id:
                keep.append(slot)
        if not keep or step == max_new_tokens - 1:
            break
        if len(keep) < len(writing):  # finished rows leave the batch and the cache
            kept = torch.tensor(keep)
            on_device = kept.to(device)
            cache.batch_select_indices(on_device)
            writing, chosen, mask, position = writing[kept], chosen[kept], mask[on_device], position[on_device]
        mask = torch.cat([mask, mask.new_ones((len(writing), 1))], dim=1)
        position = position + 1
        hidden = target.model(input_ids=chosen[:, None].to(device), attention_mask=mask, position_ids=position, cache=cache,
                              use_cache=True).last_hidden_state[:, -1]
        yield len(writing)
