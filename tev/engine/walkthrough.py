"""One speculation round, traced step by step for the walkthrough: every intermediate the
round computes, kept for the figures (the context, the drafter's marginals, the builder's
order, the tree-attention mask, the target's rows on the tree, the verifier's decision, the
bonus token's residual, the commit).

The round is the decode loop's own (:func:`~tev.engine.round.draft_and_forward`, then the named
verifier on the target rows), and the decision shown is the one the verifier wrote down while
deciding (``verify_rows(..., log=...)``): what the walkthrough shows is what the verifier did.
``p`` is the target, ``q`` the drafter.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import torch

from tev.core.flow import TargetFlow, flow_from_edge_prob
from tev.core.sampling import SamplingLaw
from tev.core.tree import DraftTree
from tev.core.verify import TargetRows, Verdict, exit_residual, verify_rows
from tev.engine.drafters import DraftContext, Drafter
from tev.engine.oracle_tree import oracle_tree
from tev.engine.round import draft_and_forward, prefill, room_left
from tev.engine.session import CausalLMSession
from tev.engine.target import Target

__all__ = ["RoundTrace", "trace_round", "TOP_TOKENS"]

TOP_TOKENS = 6  # tokens shown per depth (marginals) and per row (the bonus step)


@dataclass(eq=False)
class RoundTrace:
    """Everything one round did, step by step.

    Attributes:
        context: `list[int]` committed tokens before the round; the root is ``context[-1]``.
        round_index: which round of the walkthrough (0 first).
        drafter: the drafter's name (``block``, ``chain``, ``ar``, ...) and ``shape`` (``tree``,
            ``chain``, or ``dynamic`` for an AR drafter's tree grown depth by depth).
        law: the target's sampling law; verifier: the verifier that decided (greedy at T = 0).
        marginals: ``(tokens, probs)``, each `Tensor[K, TOP_TOKENS]`: the drafter's top tokens
            per depth ``q_1 .. q_K`` (None for a drafter without per-depth marginals).
        tree: the draft tree (node order = the order the builder added them).
        positions: `LongTensor[N]` each node's position id (``len(context) - 1 + d(v)``).
        flow: reach, local exit, exit law and coverage of the tree under ``p``.
        verdict: the accepted path, exit node and bonus token.
        decision: what the verifier wrote down while deciding (see
            :func:`~tev.core.verify.verify_rows`'s ``log``; empty for a verifier that logs nothing).
        bonus: the exit row ``p_V`` and its residual: ``row`` (top ``(token, p)``), ``removed``
            (V's child tokens), ``residual`` (top ``(token, p_res)``), ``greedy`` (T = 0: the
            row is shown as softmax at T = 1 and the bonus is its argmax).
        rows: the target rows (for replaying the decision many times).
        seconds: wall time of the round (draft, forward, decision).
        oracle: the oracle tree at the same root, law and budget (the target drafting for itself:
            :func:`~tev.engine.oracle_tree.oracle_tree`), and ``oracle_flow`` its flow; None when not traced.
    """

    context: list[int]
    round_index: int
    drafter: str
    shape: str
    law: SamplingLaw
    verifier: str
    marginals: tuple[torch.Tensor, torch.Tensor] | None
    tree: DraftTree
    positions: torch.Tensor
    flow: TargetFlow
    verdict: Verdict
    decision: dict
    bonus: dict
    rows: TargetRows = field(repr=False)
    seconds: float = 0.0
    oracle: DraftTree | None = None
    oracle_flow: TargetFlow | None = None

    @property
    def block(self) -> list[int]:
        """The tokens this round commits: accepted draft tokens, then the bonus token."""
        return self.verdict.block_tokens(self.tree)

    @property
    def next_context(self) -> list[int]:
        return self.context + self.block


def trace_round(target: Target, drafter: Drafter, context: list[int], law: SamplingLaw, verifier: str, budget: int, seed: int, round_index: int = 0,
                oracle: bool = True) -> RoundTrace:
    """Run one round after ``context`` (prompt and tokens committed so far) and keep every step.

    The target caches the context first (the decode loop's prefill); the round's randomness
    comes from ``seed + round_index``, so the same settings give the same round. With ``oracle``,
    also the oracle tree of the same budget at the same root and law, after the round (one target
    forward per node; outside the round's time).
    """
    verifier = "greedy" if law.greedy else verifier
    session = CausalLMSession(target, feature_layers=drafter.feature_layers)
    state = drafter.new_state()
    prefill(session, context, state)
    room = room_left(session)
    if room < 1:
        raise ValueError("the context fills the target's context window; start again with a shorter prompt")
    round_start = time.perf_counter()
    marginals = drafter.marginals(DraftContext(list(context), max_depth=room), state)  # [K, V] log q_d, or None
    tree, output = draft_and_forward(session, drafter, list(context), budget, state)
    rows = output.rows(law)
    flow = rows.flow(tree)
    generator = torch.Generator(device=rows.device).manual_seed(seed + round_index)
    decision: dict = {}
    verdict = verify_rows(verifier, tree, rows, generator, log=decision)  # the verifier writes down its own decisions
    seconds = time.perf_counter() - round_start
    positions = (len(context) - 1) + tree.depths
    shape = drafter.shape if marginals is not None else "dynamic"  # an AR drafter grows its tree depth by depth
    top = None
    if marginals is not None:
        probs, tokens = torch.softmax(marginals, dim=-1).topk(TOP_TOKENS, dim=-1)
        top = (tokens, probs)
    best = best_flow = None
    if oracle and budget > 0:
        best, best_flow = _oracle(target, list(context), law, budget, horizon=min(budget, room))
    return RoundTrace(list(context), round_index, drafter.name, shape, law, verifier, top, tree, positions, flow, verdict, decision, _bonus(tree, rows, verdict, law), rows,
                      seconds, best, best_flow)


def _oracle(target: Target, context: list[int], law: SamplingLaw, budget: int, horizon: int) -> tuple[DraftTree, TargetFlow]:
    """The oracle tree of ``budget`` nodes under ``context[-1]`` at ``law`` and its flow (each node's edge
    probability is its recorded ``p``: the oracle grew it from the target's own rows)."""
    session = CausalLMSession(target)
    if len(context) > 1:
        session.extend(context[:-1])
    tree = oracle_tree(session, context, law, budget, horizon)
    return tree, flow_from_edge_prob(tree, tree.draft_logprob.exp())


def _bonus(tree, rows, verdict, law) -> dict:
    v = verdict.exit_node
    node = torch.tensor([v], device=rows.device)
    if law.greedy:
        row = torch.softmax(rows.logits_at(node)[0], dim=-1)
    else:
        row = rows.rows_at(node)[0].float()
    removed = sorted({tree.tokens_list[u] for u in tree.children(v)})
    residual = exit_residual(tree, row, node)  # what TEV draws the bonus from
    residual = residual / residual.sum()
    top = row.topk(TOP_TOKENS)
    top_residual = residual.topk(TOP_TOKENS)
    return {
        "row": list(zip(top.indices.tolist(), top.values.tolist())),
        "removed": [(t, float(row[t])) for t in removed],
        "residual": list(zip(top_residual.indices.tolist(), top_residual.values.tolist())),
        "bonus_residual_prob": float(residual[verdict.bonus_token]),
        "greedy": law.greedy,
    }
