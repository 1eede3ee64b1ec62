"""Which forward the target runs on this machine, and in which precision: checked and measured at load.

Candidates on a CPU: the row-invariant forward (:mod:`tev.engine.row_invariant`) with its products
in bfloat16 or in float32, and transformers' own float32 forward (today's path, whose rows differ in
their last bits between a tree and a one-token step). A row-invariant candidate is kept only if

1. its products give every row the same bits for every row count the engine uses
   (:func:`~tev.engine.row_products.invariance_failures` on one layer's products and the head), and
2. every node of a random tree, after a context that crosses an attention block, equals the same
   row computed alone, one token at a time (:func:`tree_rows_differ`);

then the candidates are timed on this machine (a forward and its head over 1 and over 9 new tokens
after 128 cached ones, eleven interleaved passes in shuffled order, the median of the last ten). The
choice prefers a row-invariant candidate, since with it greedy speculation equals greedy decoding by
construction: among those whose one-token step is within 25% of transformers' float32 one and whose
9-token forward (a tree) is faster than it, the one fastest at 9 tokens; where none qualifies,
transformers' float32. The margins sit far from what this project's CPUs measure, so the noise of
one start cannot flip the choice: on a 2-core AVX2 EPYC, six starts, the row-invariant float32 step
measured 0.82-0.85x of transformers' at two threads and 1.08-1.15x at one (its products' floor: two
prepacked rows cost about one MKL row there), its 9-token forward 0.60-0.79x at both. At one thread
plain decoding so pays about 10% for trees a quarter cheaper and greedy equality by construction;
the reason says both figures. (The old rule, 10% of the fastest pass, chose either forward from start
to start there, and a 15% margin on medians still flipped one start in three.)

The check and the times are kept for the next start on the same machine (:mod:`tev.util.machine_cache`:
the same CPU, torch, threads and model shapes run the same kernels), which reads them back instead of
spending about 10 s on them; the reason then says when they were measured.

Where bfloat16 is emulated (:func:`~tev.util.precision.bf16_speedup` measures it far below float32's
speed: AVX2-only CPUs) the bfloat16 candidate is not built at all. ``TEV_TARGET_FORWARD`` forces a candidate: ``bfloat16`` or ``float32`` (row-invariant, still
checked), or ``transformers``. On CUDA the target runs through transformers as loaded. The choice is
set on the :class:`~tev.engine.target.Target` (its ``precision`` and ``forward``), which every session on it reads.
"""

from __future__ import annotations

import contextlib
import os
import random
import statistics
import time

import torch
from transformers import DynamicCache

from tev.core.visibility import attention_bias, chain_ancestors, tree_visibility
from tev.engine.row_invariant import BLOCK, RowInvariantForward, unsupported_reason
from tev.engine.row_products import MAX_ROWS, invariance_failures, packed_products_available
from tev.engine.target import Target, TargetPrecision
from tev.util.machine_cache import model_shape, recall, remember
from tev.util.precision import bf16_speedup

__all__ = ["TargetPrecision", "choose_target_forward", "forced_target_forward", "tree_rows_differ",
           "rows_agree_across_threads", "thread_counts", "FORWARD_ENV"]

FORWARD_ENV = "TEV_TARGET_FORWARD"
_EMULATED = 0.5  # a bfloat16 probe product slower than this many times float32's is emulated (about 0.01x on AVX2)
# A row-invariant one-token step may be measured this much slower than transformers' float32 one:
# on the 2-core AVX512_BF16 Xeon at 2 threads the bfloat16 step measured 0.95-1.08x of it (noise
# and oneDNN's two-row kernel) while its 9-token forward cost 0.79x and speculation at budget auto
# ran 1.28x the tokens/s at T = 0 (docs/benchmarks.md, "The price of a row"); on a 2-core AVX2 EPYC
# the float32 step 1.08-1.15x at one thread over six starts (two prepacked rows cost one F.linear row).
_PLAIN_SLACK = 1.25
_PASSES = 10  # timed passes per candidate and size, after one that warms the kernels
_TIMED_SIZES = (1, 9)
_CONTEXT = 128
_HEAD_ROWS = 33  # a tree's rows are projected at most this many at once (session.ALL_ROWS_AT_ONCE)
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def _random_tree(size: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """`(depths [n], ancestors [n, n])` of a random tree of ``size`` nodes, node 0 the root."""
    parents = [-1] + [int(torch.randint(0, i, (1,), generator=generator)) for i in range(1, size)]
    ancestors = torch.eye(size, dtype=torch.bool)
    depths = torch.zeros(size, dtype=torch.long)
    for i in range(1, size):
        ancestors[i] |= ancestors[parents[i]]
        depths[i] = depths[parents[i]] + 1
    return depths, ancestors


def tree_rows_differ(forward: RowInvariantForward, config, context: int = BLOCK + 6, size: int = 12, seed: int = 0) -> int:
    """How many nodes of a random ``size``-node tree, after ``context`` random tokens, are not bit
    for bit the row computed alone by one-token steps along the node's path (hidden state and
    logits); 0 is the property. The nodes are stepped in depth-first order, so the cache always
    holds the path to the node's parent: one step per node."""
    generator = torch.Generator().manual_seed(seed)
    vocab = forward.head.out_features
    context = min(context, forward.max_positions - size - 1)
    prompt = torch.randint(0, vocab, (context,), generator=generator)
    depths, ancestors = _random_tree(size, generator)
    tokens = torch.randint(0, vocab, (size,), generator=generator)
    cache = DynamicCache(config=config)
    forward.forward(prompt, torch.arange(context), chain_ancestors(context), cache, 0)
    tree_hidden, _ = forward.forward(tokens, context + depths, ancestors, cache, context)
    tree_logits = forward.project(tree_hidden)
    cache.crop(-size)
    children = {node: [] for node in range(size)}
    for node in range(1, size):
        children[int(ancestors[node, :node].nonzero().flatten()[-1])].append(node)  # the deepest ancestor is the parent
    differ, stack = 0, [0]
    while stack:
        node = stack.pop()
        depth = int(depths[node])
        if cache.get_seq_length() > context + depth:
            cache.crop(context + depth - cache.get_seq_length())
        hidden, _ = forward.forward(tokens[node:node + 1], torch.tensor([context + depth]), chain_ancestors(1), cache, context + depth)
        differ += not (torch.equal(hidden[0], tree_hidden[node]) and torch.equal(forward.project(hidden)[0], tree_logits[node]))
        stack.extend(reversed(children[node]))
    return differ


def _refusal(forward: RowInvariantForward, config) -> str | None:
    """Why ``forward``'s rows are not invariant on this machine (None: they are). One product of
    each shape is checked, once per process and thread count."""
    layer = forward.layers[0]
    for name, products, largest in (("query/key/value", layer.qkv, MAX_ROWS), ("output", layer.o, MAX_ROWS), ("gate/up", layer.gate_up, MAX_ROWS),
                                    ("down", layer.down, MAX_ROWS), ("head", forward.head, _HEAD_ROWS)):
        # the library picks its kernel by shape, precision and threads, not by the weights' values
        key = (products.out_features, products.in_features, products.dtype, products.min_rows, products.max_rows, largest, torch.get_num_threads())
        if key not in _PRODUCTS_CHECKED:
            _PRODUCTS_CHECKED[key] = invariance_failures(products, list(range(1, largest + 1)))
        failed = _PRODUCTS_CHECKED[key]
        if failed:
            return f"its {name} product gives a row other bits among {failed[0]} rows than alone"
    differ = tree_rows_differ(forward, config)
    if differ:
        return f"{differ} of 12 tree rows differ from the same rows computed alone"
    counts = thread_counts()
    if len(counts) > 1 and not rows_agree_across_threads(forward, config, counts):
        return f"a tree's rows come out with other bits at {' and at '.join(map(str, counts))} torch threads"
    return None


def thread_counts() -> tuple[int, ...]:
    """The torch thread counts this process's target forwards are checked at: the count in force as
    the target loads (a server's compute thread, at its full count), one fewer (its reduced count while
    another process holds a core) and one (a tool or a ``TEV_THREADS`` that runs the same target at another count)."""
    count = torch.get_num_threads()
    return tuple(sorted({1, max(1, count - 1), count}))


def rows_agree_across_threads(forward: RowInvariantForward, config, counts: tuple[int, ...], size: int = 9, seed: int = 1) -> bool:
    """Whether a random tree's logits after a short context are bit for bit the same at every
    thread count of ``counts``: a server that gives a visitor's rounds more threads than background work
    switches counts between one step and the next, so a row must not depend on them either."""
    generator = torch.Generator().manual_seed(seed)
    vocab = forward.head.out_features
    context = min(BLOCK + 6, forward.max_positions - size - 1)
    prompt, tokens = torch.randint(0, vocab, (context,), generator=generator), torch.randint(0, vocab, (size,), generator=generator)
    depths, ancestors = _random_tree(size, generator)
    before, results = torch.get_num_threads(), []
    try:
        for count in counts:
            torch.set_num_threads(count)
            cache = DynamicCache(config=config)
            forward.forward(prompt, torch.arange(context), chain_ancestors(context), cache, 0)
            hidden, _ = forward.forward(tokens, context + depths, ancestors, cache, context)
            results.append(forward.project(hidden))
    finally:
        torch.set_num_threads(before)
    return all(torch.equal(results[0], other) for other in results[1:])


_PRODUCTS_CHECKED: dict[tuple, list[int]] = {}  # a product shape's failing row counts, once per process

def _checked(target: Target, dtype: str) -> tuple[RowInvariantForward | None, str | None]:
    """``target``'s row-invariant forward in ``dtype`` and why it may not run (None: it may), built
    and checked once per target and precision (a comparison switches forwards many times)."""
    model, built = target.model, target.built
    if dtype not in built:
        if not packed_products_available(_DTYPES[dtype]):
            built[dtype] = (None, "oneDNN's prepacked products do not run in it here")
        else:
            try:
                forward = RowInvariantForward(model, _DTYPES[dtype])
                problem = _checked_here(forward, model, dtype)
            except Exception as error:  # noqa: BLE001 - a forward that cannot run here is refused with why, never a failed load
                forward, problem = None, f"it failed on this model: {str(error).splitlines()[0] if str(error) else type(error).__name__}"
            built[dtype] = (None if problem else forward, problem)
    return built[dtype]


def _checked_here(forward: RowInvariantForward, model, dtype: str) -> str | None:
    """:func:`_refusal` on this machine, from an earlier start's check where one was kept
    (:mod:`tev.util.machine_cache`: the same CPU, torch, threads and model shapes run the same
    kernels, and the check reads no weight's value)."""
    parts = {"model": model_shape(model), "dtype": dtype, "threads": thread_counts(), "check": "products, 12 tree rows, threads"}
    kept = recall("row-invariance", parts)
    if kept is not None and "problem" in kept:
        return kept["problem"]
    problem = _refusal(forward, model.config)
    remember("row-invariance", parts, {"problem": problem})
    return problem


def _step_seconds(model, forward: RowInvariantForward | None, count: int, cache: DynamicCache, vocab: int) -> float:
    """One forward of ``count`` new tokens (a chain) after the cache's tokens, and its head."""
    cached = cache.get_seq_length()
    tokens = torch.randint(0, vocab, (count,))
    positions = torch.arange(cached, cached + count)
    start = time.perf_counter()
    with torch.no_grad():
        if forward is None:
            mask = attention_bias(tree_visibility(cached, chain_ancestors(count)), torch.float32)[None, None]
            hidden = model.model(input_ids=tokens[None], position_ids=positions[None], attention_mask=mask, cache=cache, use_cache=True).last_hidden_state[0]
            torch.nn.functional.linear(hidden, model.get_output_embeddings().weight)
        else:
            hidden, _ = forward.forward(tokens, positions, chain_ancestors(count), cache, cached)
            forward.project(hidden)
    seconds = time.perf_counter() - start
    cache.crop(-count)
    return seconds


def _measure(model, candidates: dict[str, RowInvariantForward | None], passes: int = _PASSES) -> dict[str, dict[str, float]]:
    """Milliseconds per candidate and size: the median of ``passes`` interleaved, shuffled passes
    (a median moves less with a busy moment than the fastest pass does)."""
    vocab = model.get_output_embeddings().weight.shape[0]
    room = int(getattr(model.config, "max_position_embeddings", 1 << 30)) - max(_TIMED_SIZES) - 1
    length = max(1, min(_CONTEXT, room))
    context = torch.randint(0, vocab, (length,), generator=torch.Generator().manual_seed(0))
    caches = {}
    for name, forward in candidates.items():
        caches[name] = DynamicCache(config=model.config)
        with torch.no_grad():
            if forward is None:
                model.model(input_ids=context[None], cache=caches[name], use_cache=True)
            else:
                forward.forward(context, torch.arange(length), chain_ancestors(length), caches[name], 0)
    cells = [(name, count) for name in candidates for count in _TIMED_SIZES]
    times: dict[tuple[str, int], list[float]] = {cell: [] for cell in cells}
    order = random.Random(0)
    for repeat in range(passes + 1):
        for name, count in order.sample(cells, len(cells)):
            seconds = _step_seconds(model, candidates[name], count, caches[name], vocab)
            if repeat:  # the first pass warms the kernels
                times[(name, count)].append(seconds)
    return {name: {str(count): round(1e3 * statistics.median(times[(name, count)]), 2) for count in _TIMED_SIZES} for name in candidates}


def _measured_here(model, candidates: dict[str, RowInvariantForward | None]) -> tuple[dict[str, dict[str, float]], str | None]:
    """:func:`_measure`'s times, and the date an earlier start on this machine measured them (None:
    measured now). A start reads them back, so it does not spend about 6 s on them, and several
    starts on one machine make one choice."""
    parts = {"model": model_shape(model), "candidates": sorted(candidates), "passes": _PASSES, "sizes": _TIMED_SIZES, "context": _CONTEXT}
    kept = recall("forward-times", parts)
    if kept is not None and _readable(kept.get("step_ms"), candidates):
        return kept["step_ms"], kept.get("measured_at", "an earlier day")
    step_ms = _measure(model, candidates)
    remember("forward-times", parts, {"step_ms": step_ms})
    return step_ms, None


def _readable(step_ms, candidates) -> bool:
    """Whether a kept ``step_ms`` holds a positive time at every timed size for each candidate."""
    return (isinstance(step_ms, dict) and set(step_ms) == set(candidates)
            and all(isinstance(ms, dict) and all(isinstance(ms.get(str(n)), (int, float)) and ms[str(n)] > 0 for n in _TIMED_SIZES) for ms in step_ms.values()))


def _decide(step_ms: dict) -> tuple[str, str]:
    """(the chosen candidate's name, why) from the measured step times."""
    plain = step_ms["transformers float32"]
    ready = {name: ms for name, ms in step_ms.items() if name.startswith("row-invariant")}
    fast_enough = {name: ms for name, ms in ready.items() if ms["1"] <= _PLAIN_SLACK * plain["1"] and ms["9"] < plain["9"]}
    if fast_enough:
        name = min(fast_enough, key=lambda n: fast_enough[n]["9"])
        ms = fast_enough[name]
        return name, (f"rows equal alone by construction; a one-token step {ms['1']:.0f} ms and 9 tokens {ms['9']:.0f} ms "
                      f"(transformers float32: {plain['1']:.0f} and {plain['9']:.0f} ms)")
    best = min(ready, key=lambda n: ready[n]["1"])
    ms = ready[best]
    slower = (f"its one-token step is more than {_PLAIN_SLACK - 1:.0%} slower" if ms["1"] > _PLAIN_SLACK * plain["1"]
              else "its 9-token forward is no faster")
    return "transformers float32", (f"the row-invariant forward ({best}: one token {ms['1']:.0f} ms, 9 tokens {ms['9']:.0f} ms) "
                                    f"loses to transformers' float32 one ({plain['1']:.0f} and {plain['9']:.0f} ms) on this machine: {slower}")


def choose_target_forward(target: Target, force: str | None = None, measure: bool = True) -> TargetPrecision:
    """Check, time and choose the forward of ``target`` (see the module note) and set it there
    (:meth:`Target.run`), so every session made on it runs the choice; returns what was chosen.

    Args:
        target: the target (its model, and the forwards built for it before).
        force: ``"bfloat16"``, ``"float32"``, ``"transformers"`` or None (``TEV_TARGET_FORWARD``,
            else measured).
        measure: time the candidates (False: take the first that passes, bfloat16 first; for tests).
    """
    force = force or os.environ.get(FORWARD_ENV, "").strip().lower() or None
    if force not in (None, "auto", "transformers", *_DTYPES):
        raise ValueError(f"{FORWARD_ENV}={force!r}: choose auto, bfloat16, float32 or transformers")
    model = target.model
    device = next(model.parameters()).device
    own = str(next(model.parameters()).dtype).removeprefix("torch.")
    refused: dict[str, str] = {}
    if device.type != "cpu" or force == "transformers":
        why = "forced (TEV_TARGET_FORWARD or a comparison)" if force == "transformers" else f"on {device.type} the products of a tree cost about one token's"
        return target.run(TargetPrecision("transformers", own, why), None)
    unsupported = unsupported_reason(model)
    wanted = [force] if force in _DTYPES else ["bfloat16", "float32"]
    emulated = force != "bfloat16" and bf16_speedup() < _EMULATED  # bfloat16 without the instructions: far slower
    candidates: dict[str, RowInvariantForward | None] = {}
    for name in wanted:
        if name == "bfloat16" and emulated:
            refused[f"row-invariant {name}"] = f"bfloat16 products run {bf16_speedup():.2g}x float32's speed on this CPU (emulated: no bfloat16 instructions)"
        elif unsupported:
            refused[f"row-invariant {name}"] = unsupported
        else:
            forward, problem = _checked(target, name)
            if problem:
                refused[f"row-invariant {name}"] = problem
            else:
                candidates[f"row-invariant {name}"] = forward
    if force in _DTYPES and candidates:
        name = next(iter(candidates))
        return target.run(TargetPrecision("row-invariant", force, "forced (TEV_TARGET_FORWARD or a comparison); rows checked equal alone"), candidates[name])
    if not candidates:
        why = "no row-invariant forward runs here: " + "; ".join(f"{n}: {why}" for n, why in refused.items())
        return target.run(TargetPrecision("transformers", own, why, refused=refused), None)
    if not measure:
        name = next(iter(candidates))
        return target.run(TargetPrecision("row-invariant", name.split()[-1], "the first candidate whose rows equal alone (not timed)",
                                          refused=refused), candidates[name])
    if own != "float32":
        return target.run(TargetPrecision("transformers", own, f"the target was loaded in {own} (TEV_DTYPE)", refused=refused), None)
    step_ms, measured_at = _measured_here(model, {**candidates, "transformers float32": None})
    name, why = _decide(step_ms)
    threads = torch.get_num_threads()
    when = f", measured at a start on {measured_at}" if measured_at else ""
    why += f" (medians of {_PASSES} interleaved passes at {threads} torch thread{'s' if threads != 1 else ''}{when})"
    forward, dtype = name.split()
    for other in [d for d in target.built if f"row-invariant {d}" != name]:  # the losers' packed weights go (rebuilt if forced)
        del target.built[other]
    return target.run(TargetPrecision(forward, dtype, why, step_ms, refused), candidates.get(name))


@contextlib.contextmanager
def forced_target_forward(target: Target, force: str):
    """Inside, the sessions made on ``target`` run the forward ``force`` names (``"bfloat16"``,
    ``"float32"``: row-invariant and checked; ``"transformers"``); the earlier choice comes back
    after. Yields the :class:`TargetPrecision` in force (row-invariant where the check passed, else transformers')."""
    before = target.precision, target.forward
    try:
        yield choose_target_forward(target, force=force, measure=False)
    finally:
        target.run(*before)
