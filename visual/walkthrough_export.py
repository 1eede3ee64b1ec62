"""The walkthrough from the command line, as one standalone HTML file for slides and handouts:

    python -m visual.walkthrough_export --prompt "Give me three tips for studying." --rounds 2 --out walkthrough.html

Every step of every round: its title, its text with this round's numbers, and its figure
(plotly.js inlined once, so the file opens offline). Same prompt, settings and seed: same rounds.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from tqdm import tqdm

from tev.core.verify import VERIFIERS
from tev.engine.decode import DecodeConfig
from tev.engine.models import DRAFTER_KINDS, PAIRS, load_bundle
from tev.engine.prompt_text import check_prompt_text, encode_chat, encode_prompt
from tev.engine.walkthrough import trace_round
from visual.walkthrough import walkthrough_html


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompt", required=True)
    parser.add_argument("--out", required=True, help="the HTML file to write")
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--pair", choices=PAIRS, default=None)
    parser.add_argument("--drafter", choices=DRAFTER_KINDS, default="block")
    parser.add_argument("--verifier", choices=VERIFIERS, default="tev")
    parser.add_argument("--budget", type=int, default=16)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--top-p", type=float, default=0.9)
    parser.add_argument("--top-k", type=int, default=0)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    check_prompt_text(args.prompt)
    if not 1 <= args.rounds <= 50:
        parser.error("--rounds must be from 1 to 50")
    config = DecodeConfig(budget=args.budget, temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, verifier=args.verifier, seed=args.seed)
    bundle = load_bundle(pair=args.pair)
    context = (encode_chat if bundle.is_chat else encode_prompt)(bundle.tokenizer, args.prompt, bundle.context_length)
    traces = []
    for index in tqdm(range(args.rounds), desc="rounds", unit="round"):
        trace = trace_round(bundle.runner, bundle.drafter(args.drafter), context, config.law, config.verifier, config.budget, config.seed, round_index=index)
        traces.append(trace)
        context = trace.next_context
    token_text = lambda token: bundle.tokenizer.decode([token], clean_up_tokenization_spaces=False)  # noqa: E731
    Path(args.out).write_text(walkthrough_html(traces, token_text), encoding="utf-8")
    print(f"wrote {args.out}: {args.rounds} round(s) x 8 steps")


if __name__ == "__main__":
    main()
