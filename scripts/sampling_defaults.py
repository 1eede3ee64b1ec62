"""How the app's default sampling was chosen: coherent text and graded reach, by measurement.

For each candidate law, block + TEV (B = 16) answers the same held-out chat prompts; per law:
the target's own mean negative log-likelihood of the answers at T = 1 (word salad is text the
model itself finds unlikely), the share of distinct word 3-grams (loops repeat them), the share
of rounds whose tree shows more than two distinct reach values (graded colours), and tau.

    python scripts/sampling_defaults.py --prompts 9 --tokens 96 --json docs/sampling-defaults.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from tqdm import tqdm

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tev.data.prompts import evaluation_prompts  # noqa: E402
from tev.engine.decode import DecodeConfig, run_to_end, Request, speculative_generate  # noqa: E402
from tev.engine.models import load_bundle  # noqa: E402
from tev.engine.prompt_text import encode_chat  # noqa: E402

CANDIDATES = {
    "T=1 (pure sampling)": dict(temperature=1.0),
    "T=0.7": dict(temperature=0.7),
    "T=1, top-p 0.9": dict(temperature=1.0, top_p=0.9),
    "T=0.7, top-p 0.9": dict(temperature=0.7, top_p=0.9),
    "T=0.7, top-p 0.8": dict(temperature=0.7, top_p=0.8),
    "T=0.5, top-p 0.9": dict(temperature=0.5, top_p=0.9),
    "T=0.7, top-k 50": dict(temperature=0.7, top_k=50),
    "T=0 (greedy)": dict(temperature=0.0),
}


@torch.no_grad()
def answer_nll(target, prompt_ids: list[int], answer_ids: list[int]) -> float:
    """The target's mean negative log-likelihood (nats per token, T = 1, untruncated) of the answer."""
    if not answer_ids:
        return float("nan")
    ids = torch.tensor([prompt_ids + answer_ids])
    logp = torch.log_softmax(target(input_ids=ids).logits[0, len(prompt_ids) - 1 : -1].float(), dim=-1)
    return float(-logp.gather(1, torch.tensor(answer_ids)[:, None]).mean())


def distinct_trigrams(text: str) -> float:
    words = text.split()
    grams = [tuple(words[i : i + 3]) for i in range(len(words) - 2)]
    return len(set(grams)) / len(grams) if grams else 1.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=9)
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--budget", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="write the table here")
    args = parser.parse_args()
    torch.manual_seed(args.seed)
    bundle = load_bundle()
    prompts = evaluation_prompts(chat=True, count=args.prompts)
    encoded = [encode_chat(bundle.tokenizer, p["text"], bundle.context_length) for p in prompts]
    rows = []
    for name, law in tqdm(CANDIDATES.items(), desc="laws"):
        nll, trigrams, graded, taus, samples = [], [], [], [], []
        for i, ids in enumerate(encoded):
            config = DecodeConfig(budget=args.budget, max_new_tokens=args.tokens, seed=args.seed + i, **law)
            records, summary = run_to_end(speculative_generate(Request(bundle.target, bundle.drafter("block"), ids, config), bundle.tokenizer))
            nll.append(answer_nll(bundle.target, ids, summary.token_ids))
            trigrams.append(distinct_trigrams(summary.text))
            graded += [len({round(float(x), 3) for x in r.flow.reach.tolist()}) > 2 for r in records]
            taus.append(summary.tau)
            samples.append(summary.text[:300])
        row = {
            "law": name,
            "settings": law,
            "nll": sum(nll) / len(nll),
            "distinct_trigrams": sum(trigrams) / len(trigrams),
            "graded_rounds": sum(graded) / max(1, len(graded)),
            "tau": sum(taus) / len(taus),
            "samples": samples,
        }
        rows.append(row)
        print(f"{name:22s} nll {row['nll']:.2f}  distinct 3-grams {row['distinct_trigrams']:.2f}  graded rounds {row['graded_rounds']:.0%}  tau {row['tau']:.2f}", flush=True)
        print("   e.g. " + samples[0].replace("\n", " ")[:160], flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"prompts": [p["id"] for p in prompts], "tokens": args.tokens, "budget": args.budget, "rows": rows}, indent=2))


if __name__ == "__main__":
    main()
