"""What a row of the target costs on this machine, per forward and precision, and which operations
keep a row's bits when other rows come along:

    python -m tev bench row-cost [--threads 1 2] [--sizes 1 2 3 5 9 17 25 33] [--json OUT.json]

Timing: the whole target forward and its head (attention, norms, cache included) over ``n`` new
tokens after 128 cached ones, for transformers' forward in float32 and in bfloat16 and the
row-invariant forward (:mod:`tev.engine.row_invariant`) in float32 and in bfloat16; every cell
interleaved in shuffled passes; the fastest pass and the median. ``steps`` divides by
transformers' float32 one-token forward (plain decoding until now).

Invariance: for each operation of a transformers forward and of the row-invariant one, whether a
row's result is bit for bit the same computed alone and among other rows (products by row count,
the norm, the rotary angles, attention over a cache plus a masked tree, the softmax normaliser,
and whole forwards over a random tree against one-token steps).

Under the AVX2 kernels (what an AVX2-only CPU runs), set before the command:
``ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time

import torch
from tqdm import tqdm

from tev.core.tree import DraftTree
from tev.core.visibility import attention_bias, tree_visibility
from tev.engine.default_target import ensure_default_target
from tev.engine.models import load_causal_lm
from tev.engine.row_products import RowProducts, invariance_failures, packed_products_available
from tev.engine.session import CausalLMSession
from tev.engine.target import Target
from tev.engine.target_precision import choose_target_forward, forced_target_forward
from tev.util.precision import cpu_capability
from tev.util.stored import write_result
from tev.util.timing import machine_info

__all__ = ["add_arguments", "run", "time_forwards", "operation_invariance", "forward_rows_differ", "format_cost_table"]

CONTEXT = 128
ISA_ENV = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", default=None, help="target folder (default: SmolLM2-135M-Instruct, the default pair's)")
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="torch thread counts to time at")
    parser.add_argument("--sizes", type=int, nargs="+", default=[1, 2, 3, 5, 9, 17, 25, 33], help="new tokens per forward")
    parser.add_argument("--passes", type=int, default=5, help="timed passes (after one warm-up pass)")
    parser.add_argument("--forwards", nargs="+", default=["transformers float32", "transformers bfloat16", "row-invariant float32", "row-invariant bfloat16"],
                        help="forwards to time and check")
    parser.add_argument("--json", help="write the result here")


def _chain(n: int, vocab: int, generator: torch.Generator) -> DraftTree:
    tokens = torch.randint(0, vocab, (n,), generator=generator).tolist()
    return DraftTree.chain(tokens[0], tokens[1:])


def _sessions(models: dict, forward_name: str) -> tuple[Target, str]:
    """``(target, force)`` for a forward's name: which loaded target and which forward it runs."""
    kind, dtype = forward_name.split()
    if kind == "transformers":
        return models[dtype], "transformers"
    return models["float32"], dtype


def time_forwards(models: dict[str, Target], names: list[str], sizes: list[int], passes: int, seed: int = 0, progress: bool = True) -> dict:
    """``{name: {n: {"min_ms", "median_ms"}}}``: a forward of ``n`` new tokens (a chain) after
    :data:`CONTEXT` cached ones, and the head over its rows, every cell interleaved. ``models``:
    the target loaded in each dtype (``"float32"``, ``"bfloat16"``)."""
    generator = torch.Generator().manual_seed(seed)
    vocab = models["float32"].model.get_output_embeddings().weight.shape[0]
    context = torch.randint(0, vocab, (CONTEXT,), generator=generator).tolist()
    cells = [(name, n) for name in names for n in sizes]
    times = {cell: [] for cell in cells}
    order = random.Random(seed)
    bar = tqdm(total=(passes + 1) * len(cells), desc="row cost", disable=not progress)
    for repeat in range(passes + 1):
        for name, n in order.sample(cells, len(cells)):
            target, force = _sessions(models, name)
            with forced_target_forward(target, force):
                session = CausalLMSession(target)
                session.extend(context)
                tree = _chain(n, vocab, generator)
                start = time.perf_counter()
                session.forward_tree(tree).rows(1.0).all_logits()
                seconds = time.perf_counter() - start
            if repeat:
                times[(name, n)].append(seconds)
            bar.update(1)
    bar.close()
    return {name: {str(n): {"min_ms": round(1e3 * min(times[(name, n)]), 2), "median_ms": round(1e3 * statistics.median(times[(name, n)]), 2)}
                   for n in sizes} for name in names}


def forward_rows_differ(target: Target, force: str, size: int = 17, context: int = 70, seed: int = 0) -> int:
    """Nodes of a random ``size``-node tree (8 deep at most) after ``context`` tokens whose logits
    differ, in any bit, from one-token steps along their path, through the forward ``force`` names."""
    generator = torch.Generator().manual_seed(seed)
    vocab = target.model.get_output_embeddings().weight.shape[0]
    prompt = torch.randint(0, vocab, (context,), generator=generator).tolist()
    parents, depths = [-1], [0]
    while len(parents) < size:
        parent = int(torch.randint(0, len(parents), (1,), generator=generator))
        if depths[parent] < 8:
            parents.append(parent)
            depths.append(depths[parent] + 1)
    tree = DraftTree.from_parents([prompt[-1]] + torch.randint(0, vocab, (size - 1,), generator=generator).tolist(), parents)
    with forced_target_forward(target, force):
        session = CausalLMSession(target)
        session.extend(prompt[:-1])
        rows = session.forward_tree(tree).rows(1.0).all_logits()
        alone = CausalLMSession(target)
        alone.extend(prompt[:-1])
        differ = 0
        for node in range(tree.num_nodes):
            alone.rollback(context - 1)
            for token in [prompt[-1]] + tree.path_tokens(node):
                out = alone.extend([token])
            differ += not torch.equal(out.last_logits(), rows[node])
    return differ


def _same_rows(batched: torch.Tensor, alone: list[torch.Tensor]) -> bool:
    return all(torch.equal(batched[i], row) for i, row in enumerate(alone))


def operation_invariance(model, seed: int = 0) -> dict:
    """Per operation of a forward in ``model``'s dtype: whether each row of a batch (a tree's rows)
    equals the row computed alone; products list the row counts (of 1-33) where some row differs."""
    dtype = next(model.parameters()).dtype
    generator = torch.Generator().manual_seed(seed)
    layer = model.model.layers[0]
    hidden = model.config.hidden_size
    x = torch.randn(17, hidden, generator=generator).to(dtype)
    out: dict[str, object] = {}
    with torch.no_grad():
        for name, weight in (("q/k/v (576 in)", layer.self_attn.q_proj.weight), ("down (1536 in)", layer.mlp.down_proj.weight),
                             ("head", model.get_output_embeddings().weight)):
            w = weight.detach().to(dtype)
            wide = torch.randn(33, w.shape[1], generator=generator).to(dtype)
            alone = torch.cat([torch.nn.functional.linear(wide[i:i + 1], w) for i in range(33)])
            out[f"torch linear, {name}"] = [m for m in range(1, 34) if not torch.equal(torch.nn.functional.linear(wide[:m], w), alone[:m])]
            if packed_products_available(dtype):
                out[f"prepacked, 2-64 rows, {name}"] = invariance_failures(RowProducts(weight, dtype), list(range(1, 34)))
        norm = layer.input_layernorm
        out["RMSNorm (transformers)"] = _same_rows(norm(x), [norm(x[i:i + 1])[0] for i in range(17)])
        positions = torch.arange(100, 117)[None]
        cos, _ = model.model.rotary_emb(x[None], positions)
        out["rotary angles computed in a batch"] = _same_rows(cos[0], [model.model.rotary_emb(x[None, :1], positions[:, i:i + 1])[0][0, 0] for i in range(17)])
        # attention of 9 tree rows over 100 cached keys plus the tree, against each row over cache + its path
        heads, d, cached, n = 3, 64, 100, 9
        q = torch.randn(1, heads, n, d, generator=generator).to(dtype)
        keys = torch.randn(1, heads, cached + n, d, generator=generator).to(dtype)
        values = torch.randn(1, heads, cached + n, d, generator=generator).to(dtype)
        ancestors = torch.eye(n, dtype=torch.bool)
        for i in range(1, n):
            ancestors[i] |= ancestors[(i - 1) // 2]  # a binary tree
        visible = tree_visibility(cached, ancestors)
        mask = attention_bias(visible, dtype)
        batched = torch.nn.functional.scaled_dot_product_attention(q, keys, values, attn_mask=mask[None, None])[0].transpose(0, 1)
        alone = []
        for i in range(n):
            seen = visible[i].nonzero().flatten()
            alone.append(torch.nn.functional.scaled_dot_product_attention(q[:, :, i:i + 1], keys[:, :, seen], values[:, :, seen])[0, :, 0])
        out["attention over a cache plus a masked tree (SDPA)"] = _same_rows(batched, alone)
        scores = torch.randn(n, cached + n, generator=generator).to(dtype).masked_fill(~visible, float("-inf"))
        out["softmax normaliser with masked entries"] = all(torch.equal(scores.softmax(-1)[i, visible[i]], scores[i, visible[i]].softmax(-1)) for i in range(n))
    return out


def format_cost_table(result: dict) -> str:
    """Milliseconds (fastest pass) and one-token steps of transformers' float32 forward, per thread count."""
    lines = []
    for threads, by_forward in result["timing"].items():
        sizes = list(next(iter(by_forward.values())))
        base = by_forward.get("transformers float32", next(iter(by_forward.values())))["1"]["min_ms"]
        lines += [f"**{threads} thread(s)**: ms (one-token steps of transformers float32, {base:.1f} ms)", "",
                  "| forward | " + " | ".join(f"n = {n}" for n in sizes) + " |", "|---|" + "---|" * len(sizes)]
        for name, cells in by_forward.items():
            lines.append(f"| {name} | " + " | ".join(f"{cells[n]['min_ms']:.1f} ({cells[n]['min_ms'] / base:.2f})" for n in sizes) + " |")
        lines.append("")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    source = args.target or str(ensure_default_target())
    models = {dtype: Target(load_causal_lm(source, device="cpu", dtype=dtype).eval()) for dtype in ("float32", "bfloat16")}
    result = {"machine": machine_info("cpu"), "cpu_capability": cpu_capability(), "isa_env": {k: os.environ[k] for k in ISA_ENV if k in os.environ},
              "context": CONTEXT, "passes": args.passes, "timing": {}, "rows_differ_in_a_17_node_tree": {}, "operations": {}}
    available = [name for name in args.forwards if not name.startswith("row-invariant") or packed_products_available(getattr(torch, name.split()[1]))]
    result["skipped"] = sorted(set(args.forwards) - set(available))
    for threads in args.threads:
        torch.set_num_threads(threads)
        result["timing"][str(threads)] = time_forwards(models, available, args.sizes, args.passes)
    for name in available:
        target, force = _sessions(models, name)
        result["rows_differ_in_a_17_node_tree"][name] = forward_rows_differ(target, force)
    for dtype, target in models.items():
        result["operations"][dtype] = operation_invariance(target.model)
    result["chosen_here"] = choose_target_forward(models["float32"]).to_dict()
    print(format_cost_table(result))
    print("rows of a 17-node tree that differ from one-token steps:", json.dumps(result["rows_differ_in_a_17_node_tree"]))
    for dtype, checks in result["operations"].items():
        print(f"{dtype}:", "; ".join(f"{k}: {'row-invariant' if v is True or v == [] else v}" for k, v in checks.items()))
    print(f"chosen here: {result['chosen_here']['label']} ({result['chosen_here']['reason']})")
    if args.json:
        write_result(args.json, "row-cost", result)
    return 0
