"""Where a speculation round's time goes on the default pair: the tree forward against a
one-token forward on the same context, the same tokens as a plain causal forward (no tree
mask), the trunk's arithmetic rate, and the T > 0 decision op by op (torch.profiler).

    python scripts/profile_round.py --json runs/profile/round.json

Medians over ``--repeats`` interleaved calls; every forward is rolled back, so each one runs
on the same cached context (a chat prompt and its first greedy answer tokens).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tev.core.sampling import SamplingLaw  # noqa: E402
from tev.core.tree import DraftTree  # noqa: E402
from tev.core.verify import verify_rows  # noqa: E402
from tev.engine.decode import DecodeConfig, autoregressive_generate  # noqa: E402
from tev.engine.drafters import DraftContext  # noqa: E402
from tev.engine.models import DEFAULT_PAIR, load_bundle  # noqa: E402
from tev.engine.prompt_text import encode_chat  # noqa: E402
from tev.engine.round import prefill  # noqa: E402
from tev.engine import session as session_module  # noqa: E402
from tev.engine.session import CausalLMSession  # noqa: E402

PROMPT = "Write a Python function that checks whether a string is a palindrome, and explain it."


def _chain(tokens: list[int]) -> DraftTree:
    return DraftTree.from_parents(tokens, [-1] + list(range(len(tokens) - 1)))


def _median_ms(calls, repeats: int) -> list[float]:
    """Interleaved: call every function once per repeat; medians in ms, in the given order."""
    times = [[] for _ in calls]
    for _ in range(repeats):
        for i, call in enumerate(calls):
            start = time.perf_counter()
            call()
            times[i].append(1e3 * (time.perf_counter() - start))
    return [statistics.median(t) for t in times]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--budget", type=int, default=16)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    bundle = load_bundle(pair=DEFAULT_PAIR.name, device="cpu")
    target, drafter = bundle.target, bundle.drafters["block"]
    prompt = encode_chat(bundle.tokenizer, PROMPT)
    answer = autoregressive_generate(target, prompt, DecodeConfig(temperature=0.0, max_new_tokens=24), bundle.tokenizer)
    ids = prompt + list(answer.token_ids)
    session = CausalLMSession(target, feature_layers=drafter.feature_layers)
    state = drafter.new_state()
    prefill(session, ids, state)
    base = session.length
    tree = drafter.propose(DraftContext(ids, max_depth=64), args.budget, state)
    result = {"context_tokens": base + 1, "threads": args.threads, "tree_nodes": tree.num_nodes}

    def tree_forward(t: DraftTree):
        def call():
            session.forward_tree(t)
            session.rollback(base)
        return call

    def causal_forward(tokens: list[int]):
        def call():
            session.extend(tokens)
            session.rollback(base)
        return call

    def trunk_only(count: int):
        hidden = torch.randn(1, count, target.config.hidden_size)
        layer = target.model.layers[0]

        def call():  # the MLP's three matrices, 30 times: the trunk's arithmetic without attention
            with torch.no_grad():
                for _ in range(target.config.num_hidden_layers):
                    layer.mlp(hidden)
        return call

    sizes = [1, 2, 4, 8, 17, 33]
    chains = {n: _chain(ids[-1:] + list(range(100, 100 + n - 1))) for n in sizes}
    calls = [tree_forward(chains[n]) for n in sizes] + [causal_forward(ids[-1:] + list(range(100, 100 + n - 1))) for n in sizes]
    calls += [tree_forward(tree)] + [trunk_only(n) for n in sizes]
    medians = _median_ms(calls, args.repeats)
    k = len(sizes)
    result["forward_ms"] = {
        "tree_mask_chain": dict(zip(map(str, sizes), medians[:k])),
        "causal_no_tree_mask": dict(zip(map(str, sizes), medians[k : 2 * k])),
        "drafted_tree": medians[2 * k],
        "mlp_only_30_layers": dict(zip(map(str, sizes), medians[2 * k + 1 :])),
    }
    params = sum(p.numel() for p in target.model.parameters())
    result["trunk_gflop_per_token"] = 2 * params / 1e9
    one = medians[0]
    result["ratio_to_one_token"] = {str(n): medians[i] / one for i, n in enumerate(sizes)}

    # the decision at T > 0 on the drafted tree: head (the rows through the head, cut and
    # normalised: the flow) then verify, against one read of the float32 head by the same rows
    output = session.forward_tree(tree)
    session.rollback(base)
    laws_t = {"T=1": SamplingLaw(1.0), "T=0.7 top-p 0.9": SamplingLaw(0.7, top_p=0.9)}

    def head_read():
        torch.nn.functional.linear(output.hidden, output.head)

    def head_stage(law):
        return lambda: output.rows(law).flow(tree)

    medians = _median_ms([head_read] + [head_stage(law) for law in laws_t.values()], args.repeats)
    result["head_read_ms"] = medians[0]
    result["head_stage_ms"] = dict(zip(laws_t, medians[1:]))
    result["head_stage_over_head_read"] = {name: ms / medians[0] for name, ms in zip(laws_t, medians[1:])}
    at_once_default = session_module.ALL_ROWS_AT_ONCE
    laws = {"T=1": SamplingLaw(1.0), "T=0.7 top-p 0.9": SamplingLaw(0.7, top_p=0.9), "T=0": SamplingLaw(0.0)}
    generator = torch.Generator().manual_seed(0)

    def decide(law, at_once: int = session_module.ALL_ROWS_AT_ONCE):
        verifier = "greedy" if law.greedy else "tev"

        def call():
            session_module.ALL_ROWS_AT_ONCE = at_once
            return verify_rows(verifier, tree, output.rows(law), generator)
        return call

    # beside each sampling law, the same decision projecting only the parent rows first (then
    # the exit row when it is a leaf), interleaved with the default
    sampling = [name for name, law in laws.items() if not law.greedy]
    medians = _median_ms([decide(law) for law in laws.values()] + [decide(laws[name], 0) for name in sampling], args.repeats)
    result["decision_ms"] = dict(zip(laws, medians))
    result["decision_ms_parent_rows_first"] = dict(zip(sampling, medians[len(laws):]))
    session_module.ALL_ROWS_AT_ONCE = at_once_default
    profiles = {}
    for name, law in laws.items():
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profiler:
            for _ in range(5):
                decide(law)()
        rows = sorted(profiler.key_averages(), key=lambda e: -e.self_cpu_time_total)[:8]
        profiles[name] = [{"op": e.key, "self_ms_per_decision": e.self_cpu_time_total / 5e3, "calls_per_decision": e.count / 5} for e in rows]
    result["decision_profile"] = profiles
    text = json.dumps(result, indent=1)
    print(text)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(text)


if __name__ == "__main__":
    main()
