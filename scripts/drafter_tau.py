"""`tau` of shipped or earlier block drafters on the held-out chat prompts, the way
`python -m tev train-drafter` measures it (float32 target, TEV, greedy at T = 0, seed 0):

    python scripts/drafter_tau.py FOLDER [FOLDER ...] [--json OUT.json]

(the recipe's budgets, new tokens and seed, through the same function as the build).

An earlier drafter can be taken out of git first, e.g.
`git show REV:assets/models/smollm2/drafter-block/drafter.safetensors > old/drafter.safetensors`
(and its `drafter_config.json`), so a retrained drafter is compared on the same prompts.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


from tev.data.prompts import load_prompt_set  # noqa: E402
from tev.engine.default_target import ensure_default_target  # noqa: E402
from tev.engine.block_drafter import BlockDrafter  # noqa: E402
from tev.engine.models import load_causal_lm, load_tokenizer  # noqa: E402
from tev.pipelines.train_drafter import DrafterRecipe, chat_prompt_tau  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("drafters", nargs="+", help="drafter folders (drafter.safetensors + drafter_config.json)")
    parser.add_argument("--json", help="write the rows here")
    args = parser.parse_args()
    source = str(ensure_default_target())
    tokenizer = load_tokenizer(source)
    target = load_causal_lm(source, device="cpu", dtype="float32").eval()
    prompts = load_prompt_set("chat")
    results = {}
    for folder in args.drafters:
        rows = chat_prompt_tau(target, tokenizer, BlockDrafter.from_pretrained(folder, target), prompts, DrafterRecipe())
        results[folder] = rows
        for row in rows:
            print(f"{folder}: T={row['temperature']:g} B={row['budget']}: tau {row['tau']:.3f} +- {row['tau_se']:.3f} (1 + C {row['tau_bound']:.3f})", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
