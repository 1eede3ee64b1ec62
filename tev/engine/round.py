"""One speculation round: draft -> tree -> target rows -> verdict -> commit.

The decode loop runs :func:`speculation_round` once per round. The verifier lab and the report
stop after the target forward (:func:`draft_and_forward`) and run the verdict themselves, many
times over the same tree. ``p`` is the target, ``q`` the drafter.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tev.core.budget import BudgetChoice
from tev.core.flow import TargetFlow, flow_from_edge_prob
from tev.core.sampling import SamplingLaw
from tev.core.tree import DraftTree
from tev.core.verify import TargetRows, Verdict, verify_rows
from tev.engine.auto_budget import AutoBudget
from tev.engine.drafters import DraftContext
from tev.engine.session import CausalLMSession, ForwardOutput
from tev.util.timing import StageTimer

__all__ = ["RoundResult", "room_left", "prefill", "draft_tree", "draft_and_forward", "speculation_round"]


@dataclass(frozen=True, eq=False)
class RoundResult:
    """What one round produced.

    Attributes:
        tree: the draft tree (root = the last committed token).
        rows: the target rows ``p_v`` on it (temperature applied).
        verdict: accepted path, exit node, bonus token.
        flow: the target flow through the tree (reach, exit law, coverage).
        features: `Tensor[committed - 1, F]` the target's features at every committed position
            before the new root, for the next round's drafter (None when it needs none).
        choice: with budget "auto", how the tree's size was chosen (None for a fixed budget).
    """

    tree: DraftTree
    rows: TargetRows
    verdict: Verdict
    flow: TargetFlow
    features: torch.Tensor | None
    choice: BudgetChoice | None = None


def room_left(session: CausalLMSession) -> int:
    """The deepest tree depth the target's context still allows (negative when it is full)."""
    return session.max_positions - 1 - session.length


def prefill(session: CausalLMSession, prompt_ids: list[int]) -> torch.Tensor | None:
    """Cache every prompt token but the last (the first round's root); returns their features
    `Tensor[len(prompt_ids) - 1, F]`, or None (no features asked, or a one-token prompt)."""
    return session.extend(prompt_ids[:-1]).features if len(prompt_ids) > 1 else None


def draft_tree(
    session: CausalLMSession,
    drafter,
    committed: list[int],
    features: torch.Tensor | None,
    budget: int,
    drafter_state,
    timer: StageTimer,
    auto: AutoBudget | None = None,
) -> tuple[DraftTree, BudgetChoice | None]:
    """Draft a tree of at most ``budget`` nodes under ``committed[-1]``; with ``auto``, draft
    ``auto.cap`` nodes and keep the best-first prefix the machine pays for (chosen from the
    drafter and past rounds only, before the target sees the tree)."""
    room = room_left(session)
    tree = drafter.propose(DraftContext(committed, features, max_depth=room), (budget if auto is None else auto.cap) if room > 0 else 0, drafter_state, timer)
    if auto is None:
        return tree, None
    with timer.stage("tree_build"):
        return auto.choose(tree)


def draft_and_forward(
    session: CausalLMSession,
    drafter,
    committed: list[int],
    features: torch.Tensor | None,
    budget: int,
    drafter_state,
    timer: StageTimer | None = None,
) -> tuple[DraftTree, ForwardOutput]:
    """Draft a tree of at most ``budget`` nodes under ``committed[-1]`` and run the target's one
    forward over it; the tree stays provisional in the cache until :meth:`CausalLMSession.commit`."""
    timer = timer or StageTimer()
    tree, _ = draft_tree(session, drafter, committed, features, budget, drafter_state, timer)
    return tree, _forward(session, tree, timer)


def _forward(session: CausalLMSession, tree: DraftTree, timer: StageTimer) -> ForwardOutput:
    with timer.stage("verify"):
        return session.forward_tree(tree)  # one target forward over every node


def speculation_round(
    session: CausalLMSession,
    drafter,
    committed: list[int],
    features: torch.Tensor | None,
    budget: int,
    verifier: str,
    sampling: SamplingLaw | float,
    generator: torch.Generator,
    drafter_state,
    timer: StageTimer,
    auto: AutoBudget | None = None,
) -> RoundResult:
    """One round on ``session``: draft, target forward, verdict, then commit the accepted path
    to the cache. ``committed`` is read, not changed (the caller appends the block it keeps).
    ``sampling`` is the target's law (or a bare temperature; 0 is greedy).

    On a GPU a round with the block drafter waits for the device twice: the drafter's marginals
    come to the host (the tree is built there) and the verdict does (one transfer for TEV and
    predraw; greedy adds one when it exits at a leaf). ``timer`` may add its own syncs
    (:class:`StageTimer` on a CUDA device synchronises around each stage).

    With ``auto`` the round's size is chosen by the cost-aware rule (``budget`` is then unused)
    and the round's coverage and stage times feed ``auto`` for the rounds after it."""
    tree, choice = draft_tree(session, drafter, committed, features, budget, drafter_state, timer, auto)
    output = _forward(session, tree, timer)
    with timer.stage("verify_decision"):
        rows = output.rows(sampling)  # lazy: the head projects only the rows the verifier reads
        verdict = verify_rows(verifier, tree, rows, generator)
    with timer.stage("commit"):
        session.commit(verdict.path)
        if output.features is not None:
            accepted = output.features[torch.as_tensor(verdict.path).to(output.features.device, non_blocking=True)]
            features = accepted if features is None else torch.cat([features, accepted])
    flow = verdict.flow or flow_from_edge_prob(tree, rows.edge_prob(tree))
    if auto is not None:  # after the verdict: this round's rows inform only later rounds
        auto.observe(tree, flow.coverage, timer.seconds["verify"] + timer.seconds["verify_decision"], sum(timer.seconds.values()))
    return RoundResult(tree, rows, verdict, flow, features, choice)
