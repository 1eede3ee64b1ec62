"""`tau` of shipped or earlier block drafters on the held-out chat prompts, the way
`python -m tev train-drafter` measures it (float32 target, TEV, greedy at T = 0, seed 0):

    python -m tev bench drafter-tau FOLDER [FOLDER ...] [--json OUT.json]

(the recipe's budgets, new tokens and seed, through the same function as the build).

An earlier drafter can be taken out of git first, e.g.
`git show REV:assets/models/smollm2/drafter-block/drafter.safetensors > old/drafter.safetensors`
(and its `drafter_config.json`), so a retrained drafter is compared on the same prompts.
"""

from __future__ import annotations

import argparse

from tev.data.prompts import load_prompt_set
from tev.engine.block_drafter import BlockDrafter
from tev.engine.default_target import ensure_default_target
from tev.engine.models import load_causal_lm, load_tokenizer
from tev.pipelines.train_drafter import DrafterRecipe, chat_prompt_tau
from tev.util.stored import write_result


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("drafters", nargs="+", help="drafter folders (drafter.safetensors + drafter_config.json)")
    parser.add_argument("--json", help="write the rows here")


def run(args: argparse.Namespace) -> int:
    source = str(ensure_default_target())
    tokenizer = load_tokenizer(source)
    target = load_causal_lm(source, device="cpu", dtype="float32").eval()
    prompts = load_prompt_set("chat")
    results = {}
    for folder in args.drafters:
        rows = chat_prompt_tau(target, tokenizer, BlockDrafter.from_pretrained(folder, target), prompts, DrafterRecipe())
        results[folder] = rows
        for row in rows:
            print(f"{folder}: T={row['temperature']:g} B={row['budget']}: tau {row['tau']:.3f} +- {row['tau_se']:.3f}, mean block length {row['mean_block_length']:.3f} (1 + C {row['tau_bound']:.3f})", flush=True)
    if args.json:
        write_result(args.json, "drafter-tau", {"drafters": results})
    return 0
