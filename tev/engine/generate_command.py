"""``python -m tev generate``: speculative (or autoregressive) generation from the command line."""

from __future__ import annotations

import json
import sys

from tqdm import tqdm

from tev.engine.decode import DecodeConfig, autoregressive_generate, run_to_end, Request, speculative_generate
from tev.engine.models import load_bundle
from tev.engine.prompt_text import check_prompt_text, encode_chat, encode_prompt
from tev.util.precision import figure_precision

__all__ = ["generate_command"]


def generate_command(args) -> None:
    check_prompt_text(args.prompt)
    if any(not stop for stop in args.stop or ()):
        raise ValueError("--stop needs a non-empty string")
    config = DecodeConfig(  # checked before the models load: a bad flag fails at once
        budget=args.budget,
        budget_cap=args.budget_cap,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        min_p=args.min_p,
        verifier=args.verifier,
        max_new_tokens=args.max_new_tokens,
        seed=args.seed,
        stop_strings=tuple(args.stop or ()),
    )
    bundle = load_bundle(args.target, args.draft, device=args.device, dtype=args.dtype, device_map=args.device_map, allow_download=args.allow_download, pair=args.pair)
    kind = args.drafter or bundle.default_drafter
    chat = bundle.is_chat if args.chat is None else args.chat
    if chat and not bundle.is_chat:
        raise ValueError("--chat needs a target with a chat template; this one has none (use --raw)")
    prompt_ids = (encode_chat if chat else encode_prompt)(bundle.tokenizer, args.prompt, bundle.context_length)
    if args.ar:
        summary = autoregressive_generate(bundle.runner, prompt_ids, config, bundle.tokenizer)
        records = []
    else:
        drafter = bundle.drafter(kind)
        bar = tqdm(total=config.max_new_tokens, desc=f"{drafter.name}+{config.effective_verifier}", unit="tok", disable=args.json or not sys.stderr.isatty())

        def shown(record) -> None:
            bar.update(len(record.emitted))
            if not args.json:
                print(record.text, end="", flush=True)

        records, summary = run_to_end(speculative_generate(Request(bundle.runner, drafter, prompt_ids, config), bundle.tokenizer), shown)
        bar.close()
    if args.json:
        payload = summary.to_dict()
        payload["precision"] = figure_precision(next(bundle.target.parameters()).device, bundle.target, {} if args.ar else {kind: bundle.drafter(kind)},
                                                 bundle.precision.label if bundle.precision else None)
        text = lambda token: bundle.tokenizer.decode([token], clean_up_tokenization_spaces=False)  # noqa: E731
        payload["rounds_detail"] = [record.to_dict(text) for record in records]
        print(json.dumps(payload, indent=2))
        return
    if args.ar:
        print(summary.text, end="")
    print()
    print(
        f"[{summary.method}] {len(summary.token_ids)} tokens in {summary.seconds:.2f}s "
        f"({summary.tokens_per_second:.1f} tok/s), rounds {summary.rounds}, tau {summary.tau:.2f} (tokens emitted per forward), "
        f"mean block length {summary.mean_block_length:.2f} against mean 1+C {summary.tau_bound:.2f}, stop: {summary.stop_reason}",
        file=sys.stderr,
    )
