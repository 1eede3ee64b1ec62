"""How fast the target writes drafter training data: the continuous-batching writer against the
batch writer that wrote the first drafters, on the same requests, interleaved:

    python -m tev bench data-writer [--requests 192] [--threads 1 2] [--slots 192] [--json OUT.json]

The requests are written once (by the continuous writer, as ``train-drafter`` writes a shard's);
then each writer answers all of them, half greedily and half at T = 1, at most
``--response-tokens`` tokens each, in alternating order over ``--passes`` passes. The batch writer
runs as ``train-drafter`` ran it before (transformers' forward, the target in the low precision
this CPU measures faster on its probe, batches of 96 one temperature each); the continuous one as
it runs now (:mod:`tev.engine.batch_writer`). The figure is response tokens a second, of wall time
and of process CPU time (the CPU figure holds up better where other work shares the machine),
and their ratio per pass.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from tev.engine.batch_writer import WriterPrompt, write_answers, writer_dtype
from tev.engine.default_target import ensure_default_target
from tev.engine.models import load_causal_lm, load_tokenizer
from tev.engine.prompt_text import ChatTemplate
from tev.train.teacher import write_requests
from tev.util.precision import cpu_capability, low_precision
from tev.util.stored import write_result

__all__ = ["add_arguments", "run", "time_writer"]

BATCH_WRITER_ROWS = 96  # the batch writer's rows, as the recipe had them


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", default=None, help="target folder (default: SmolLM2-135M-Instruct, the default pair's)")
    parser.add_argument("--requests", type=int, default=192, help="requests answered by each writer per pass")
    parser.add_argument("--response-tokens", type=int, default=192, help="most tokens an answer may have (the recipe's)")
    parser.add_argument("--threads", type=int, nargs="+", default=[1], help="torch thread counts to time at")
    parser.add_argument("--slots", type=int, default=192, help="the continuous writer's rows")
    parser.add_argument("--passes", type=int, default=2, help="passes, each writer once per pass in alternating order")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="write the result here")


def time_writer(model, prompts: list[WriterPrompt], max_new_tokens: int, stop_id: int, slots: int, continuous: bool) -> dict:
    """One writer over ``prompts``: response tokens, wall and CPU seconds, and their rates."""
    wall, cpu = time.perf_counter(), time.process_time()
    tokens = sum(len(item[1]) for item in write_answers(model, prompts, max_new_tokens, stop_id, slots, continuous) if item is not None)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {"tokens": tokens, "wall_s": round(wall, 2), "cpu_s": round(cpu, 2), "tokens_per_s": round(tokens / wall, 1), "tokens_per_cpu_s": round(tokens / cpu, 1)}


def run(args: argparse.Namespace) -> int:
    source = args.target or str(ensure_default_target())
    tokenizer = load_tokenizer(source)
    template = ChatTemplate.of(tokenizer)
    low = low_precision("cpu")
    models = {"batch": load_causal_lm(source, device="cpu", dtype=low).eval(), "continuous": load_causal_lm(source, device="cpu", dtype="float32").eval()}
    requests = write_requests(models["continuous"], tokenizer, args.requests, args.seed, slots=args.slots)
    greedy = args.requests // 2
    prompts = [WriterPrompt(tuple(template.prompt_ids(tokenizer, text)), 0.0 if i < greedy else 1.0, args.seed + i) for i, (_, text) in enumerate(requests)]
    result = {"cpu_capability": cpu_capability(), "requests": args.requests, "response_tokens": args.response_tokens, "slots": args.slots,
              "batch_writer": {"rows": BATCH_WRITER_ROWS, "dtype": str(low).removeprefix("torch.")},
              "continuous_writer": {"rows": args.slots, "dtype": str(writer_dtype(models["continuous"], args.slots)).removeprefix("torch.")}, "timing": {}}
    for threads in args.threads:
        torch.set_num_threads(threads)
        passes = []
        for number in range(args.passes):
            order = ["batch", "continuous"] if number % 2 == 0 else ["continuous", "batch"]
            row = {}
            for name in order:
                rows = BATCH_WRITER_ROWS if name == "batch" else args.slots
                row[name] = time_writer(models[name], prompts, args.response_tokens, template.end_of_turn, rows, continuous=name == "continuous")
                print(f"{threads} thread(s), pass {number + 1}, {name}: {row[name]}", flush=True)
            row["ratio_wall"] = round(row["continuous"]["tokens_per_s"] / row["batch"]["tokens_per_s"], 2)
            row["ratio_cpu"] = round(row["continuous"]["tokens_per_cpu_s"] / row["batch"]["tokens_per_cpu_s"], 2)
            passes.append(row)
        result["timing"][str(threads)] = {"passes": passes, "median_ratio_wall": statistics.median(p["ratio_wall"] for p in passes),
                                          "median_ratio_cpu": statistics.median(p["ratio_cpu"] for p in passes)}
        print(f"{threads} thread(s): continuous / batch response tokens a second, median over passes: "
              f"{result['timing'][str(threads)]['median_ratio_wall']}x of wall time, {result['timing'][str(threads)]['median_ratio_cpu']}x of CPU time", flush=True)
    if args.json:
        write_result(args.json, "data-writer", result)
    return 0
