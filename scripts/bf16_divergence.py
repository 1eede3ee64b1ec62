"""Greedy speculation against greedy decoding with the default target in bfloat16 on the CPU:
on how many prompts the two part, at which token, and whether they part at a near-tie.

    python scripts/bf16_divergence.py --prompts 24 --tokens 64 --json docs/bf16-divergence.json

In float32 the two are equal token for token (the tests check it). In bfloat16 a tree forward
(several tokens at once) and a one-token forward sum in different orders and round differently,
so where the target's two best logits are nearly tied they can pick different tokens. For each
parting the script records the top-2 logit gap of the one-token (autoregressive) run at that
position, beside the same gap over all its positions; it also says how often bfloat16 greedy
decoding itself parts from float32 greedy decoding (the precision's own effect), and the time
per token of each run (one process, interleaved per prompt).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tev.data.prompts import evaluation_prompts  # noqa: E402
from tev.engine.decode import DecodeConfig, autoregressive_generate, run_to_end, Request, speculative_generate  # noqa: E402
from tev.engine.models import DEFAULT_PAIR, load_bundle  # noqa: E402
from tev.engine.prompt_text import encode_chat  # noqa: E402


def first_difference(a: list[int], b: list[int]) -> int | None:
    """The first index where ``a`` and ``b`` differ (None when one is a prefix of the other)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None


@torch.no_grad()
def top2_gaps(target, prompt: list[int], answer: list[int]) -> list[float]:
    """The gap between the two largest logits before each answer token (teacher-forced, one causal forward)."""
    ids = torch.tensor([prompt + answer])
    logits = target(input_ids=ids).logits[0, len(prompt) - 1 : -1].float()
    top = logits.topk(2, dim=-1).values
    return (top[:, 0] - top[:, 1]).tolist()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=24)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--budget", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--json", help="write the result here")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    half = load_bundle(pair=DEFAULT_PAIR.name, device="cpu", dtype="bfloat16")
    full = load_bundle(pair=DEFAULT_PAIR.name, device="cpu", dtype="float32")
    prompts = evaluation_prompts(chat=True, count=args.prompts)
    config = DecodeConfig(budget=args.budget, temperature=0.0, max_new_tokens=args.tokens)
    rows, all_gaps, seconds = [], [], {"ar_bf16": 0.0, "spec_bf16": 0.0, "ar_fp32": 0.0, "spec_fp32": 0.0}
    tokens = {key: 0 for key in seconds}
    for prompt in tqdm(prompts, desc="prompts"):
        ids = encode_chat(half.tokenizer, prompt["text"], half.context_length)
        runs = {}
        for key, bundle in (("ar_bf16", half), ("spec_bf16", half), ("ar_fp32", full), ("spec_fp32", full)):
            start = time.perf_counter()
            if key.startswith("ar"):
                out = autoregressive_generate(bundle.target, ids, config, bundle.tokenizer).token_ids
            else:
                out = run_to_end(speculative_generate(Request(bundle.target, bundle.drafter("block"), ids, config), bundle.tokenizer))[1].token_ids
            seconds[key] += time.perf_counter() - start
            tokens[key] += len(out)
            runs[key] = list(out)
        gaps = top2_gaps(half.target, ids, runs["ar_bf16"])
        all_gaps += gaps
        part = first_difference(runs["spec_bf16"], runs["ar_bf16"])
        rows.append({
            "domain": prompt.get("domain"),
            "spec_vs_ar_bf16_part_at": part,
            "gap_at_part": gaps[part] if part is not None and part < len(gaps) else None,
            "bf16_vs_fp32_ar_part_at": first_difference(runs["ar_bf16"], runs["ar_fp32"]),
            "spec_vs_ar_fp32_part_at": first_difference(runs["spec_fp32"], runs["ar_fp32"]),
            "tokens": len(runs["ar_bf16"]),
            "ar_bf16_text_at_part": half.tokenizer.decode(runs["ar_bf16"][part : part + 4]) if part is not None else None,
            "spec_bf16_text_at_part": half.tokenizer.decode(runs["spec_bf16"][part : part + 4]) if part is not None else None,
        })
    parted = [r for r in rows if r["spec_vs_ar_bf16_part_at"] is not None]
    part_gaps = [r["gap_at_part"] for r in parted if r["gap_at_part"] is not None]
    sorted_gaps = sorted(all_gaps)

    def share_at_or_below(x: float) -> float:
        return sum(g <= x for g in sorted_gaps) / len(sorted_gaps)

    result = {
        "command": "python scripts/bf16_divergence.py " + " ".join(sys.argv[1:]),
        "prompts": len(rows),
        "tokens_per_prompt": args.tokens,
        "budget": args.budget,
        "spec_vs_ar_bf16_parted": len(parted),
        "spec_vs_ar_fp32_parted": sum(r["spec_vs_ar_fp32_part_at"] is not None for r in rows),
        "bf16_vs_fp32_ar_parted": sum(r["bf16_vs_fp32_ar_part_at"] is not None for r in rows),
        "median_part_index": statistics.median([r["spec_vs_ar_bf16_part_at"] for r in parted]) if parted else None,
        "top2_gap_at_parts": part_gaps,
        "top2_gap_all_positions_median": statistics.median(all_gaps),
        "share_of_positions_with_gap_at_or_below_the_largest_parting_gap": share_at_or_below(max(part_gaps)) if part_gaps else None,
        "ms_per_token": {key: 1e3 * seconds[key] / max(1, tokens[key]) for key in seconds},
        "rows": rows,
    }
    text = json.dumps(result, indent=1)
    print(json.dumps({k: v for k, v in result.items() if k != "rows"}, indent=1))
    if args.json:
        Path(args.json).write_text(text + "\n")


if __name__ == "__main__":
    main()
