"""One speculation round: draft -> build -> forward -> head -> verify -> commit.

The decode loop runs :func:`speculation_round` once per round; its :class:`RoundRecord` is what
the page, the JSON and the benchmarks read. The verifier lab and the report stop after the
target forward (:func:`draft_and_forward`) and run the verdict themselves, many times over the
same tree. ``p`` is the target, ``q`` the drafter.

The round's stages (:data:`STAGES`, timed on a :class:`~tev.util.timing.StageTimer`; they sum to
the round's time): ``draft`` (the drafter's model), ``build`` (the tree from its output),
``forward`` (the target's one forward over the tree), ``head`` (the tree's rows through the
output head, truncated, with their normalisers), ``verify`` (the verifier's own choice of exit
and bonus), ``commit`` (the cache and the drafter's state keep the accepted path).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import torch

from tev.core.budget import BudgetChoice
from tev.core.flow import TargetFlow
from tev.core.sampling import SamplingLaw
from tev.core.tree import DraftTree
from tev.core.verify import Verdict, verify_rows
from tev.engine.auto_budget import AutoBudget
from tev.engine.drafters import DraftContext, Drafter, DraftState
from tev.engine.session import CausalLMSession, ForwardOutput
from tev.util.timing import StageTimer

__all__ = ["STAGES", "RoundRecord", "room_left", "prefill", "draft_tree", "draft_and_forward", "speculation_round"]

STAGES = ("draft", "build", "forward", "head", "verify", "commit")


@dataclass(eq=False)
class RoundRecord:
    """Everything one round did, for the page, the JSON and the benchmarks.

    Attributes:
        tree: the draft tree (root = the last committed token).
        flow: the target flow through it (reach, exit law, coverage).
        verdict: accepted path, exit node, bonus token.
        timings: seconds per stage (:data:`STAGES`).
        drafter: the drafter's name; verifier: the verifier that decided.
        position: tokens committed before the round (the root's position).
        index: round number (0-based), set by the decode loop.
        emitted: tokens this round added to the output (the block, cut at a stop), and
        text: the decoded text they added; both set by the decode loop's stop rules.
        choice: with budget "auto", how the tree's size was chosen (None for a fixed budget).
    """

    tree: DraftTree
    flow: TargetFlow
    verdict: Verdict
    timings: dict[str, float]
    drafter: str
    verifier: str
    position: int
    index: int = 0
    emitted: list[int] = field(default_factory=list)
    text: str = ""
    choice: BudgetChoice | None = None

    @property
    def block_length(self) -> int:
        return self.verdict.block_length

    @property
    def accepted_tokens(self) -> list[int]:
        return self.verdict.accepted_tokens(self.tree)

    @property
    def bonus_token(self) -> int:
        return self.verdict.bonus_token

    def to_dict(self, token_text: Callable[[int], str] | None = None) -> dict:
        """The round as plain JSON values (the app's export and ``generate --json``).

        Per-node lists (``tree``, ``reach``, ``rho``, ``exit_weight``) have length ``N``;
        probabilities are rounded to 6 decimals; ``stage_seconds`` holds ``timings``. With
        ``token_text`` (token id -> text) the tree's tokens, the accepted tokens and the bonus
        token are also given as text (``tree.text``, ``accepted_text``, ``bonus_text``).
        ``draft_coverage`` is the drafter's estimate of ``coverage`` (its path probabilities
        summed); with budget "auto", ``auto_budget`` holds :meth:`BudgetChoice.to_dict`.
        """
        def rounded(tensor) -> list[float]:
            return [round(float(x), 6) for x in tensor.tolist()]

        words = {}
        if token_text is not None:
            words = {"accepted_text": [token_text(t) for t in self.accepted_tokens], "bonus_text": token_text(self.bonus_token)}
        tree = {"tokens": self.tree.tokens.tolist(), "parents": self.tree.parents.tolist(), "draft_logprob": rounded(self.tree.draft_logprob)}
        if token_text is not None:
            tree["text"] = [token_text(t) for t in self.tree.tokens_list]
        return {
            "round": self.index,
            "position": self.position,
            "drafter": self.drafter,
            "verifier": self.verifier,
            "budget": self.tree.size,
            "tree": tree,
            "reach": rounded(self.flow.reach),
            "rho": rounded(self.flow.rho),
            "exit_weight": rounded(self.flow.exit_weight),
            "coverage": self.flow.coverage,
            "draft_coverage": self.tree.draft_coverage,
            **({"auto_budget": self.choice.to_dict()} if self.choice is not None else {}),
            "tau_bound": self.flow.tau_bound,
            "path": self.verdict.path,
            "exit_node": self.verdict.exit_node,
            "accepted": self.accepted_tokens,
            "bonus_token": self.bonus_token,
            **words,
            "block_length": self.block_length,
            "emitted": self.emitted,
            "text": self.text,
            "stage_seconds": dict(self.timings),
        }


def room_left(session: CausalLMSession) -> int:
    """The deepest tree depth the target's context still allows (negative when it is full)."""
    return session.max_positions - 1 - session.length


def prefill(session: CausalLMSession, prompt_ids: list[int], state: DraftState) -> None:
    """Cache every prompt token but the last (the first round's root); the drafter's ``state``
    gets their features (when it reads any)."""
    if len(prompt_ids) > 1:
        state.add_features(session.extend(prompt_ids[:-1]).features)


def draft_tree(
    session: CausalLMSession, drafter: Drafter, committed: list[int], budget: int | str, state: DraftState, timer: StageTimer, sizing: AutoBudget | None = None
) -> tuple[DraftTree, BudgetChoice | None]:
    """Draft a tree of at most ``budget`` nodes under ``committed[-1]``; with ``sizing`` (budget
    ``"auto"``), draft :meth:`AutoBudget.draft_size` nodes (at most its cap) and keep the best-first prefix the machine pays for
    (chosen from the drafter and past rounds only, before the target sees the tree)."""
    room = room_left(session)
    drafted = budget if sizing is None else sizing.draft_size()  # nodes drafted: the budget, or what the auto rule may keep a prefix of
    context = DraftContext(committed, max_depth=room, min_path_prob=0.0 if sizing is None else sizing.draft_floor())
    tree = drafter.propose(context, drafted if room > 0 else 0, state, timer)
    if sizing is None:
        return tree, None
    with timer.stage("build"):
        return sizing.choose(tree)


def draft_and_forward(
    session: CausalLMSession,
    drafter: Drafter,
    committed: list[int],
    budget: int,
    state: DraftState,
    timer: StageTimer | None = None,
) -> tuple[DraftTree, ForwardOutput]:
    """Draft a tree of at most ``budget`` nodes under ``committed[-1]`` and run the target's one
    forward over it; the tree stays provisional in the cache until :meth:`CausalLMSession.commit`."""
    timer = timer or StageTimer()
    tree, _ = draft_tree(session, drafter, committed, budget, state, timer)
    return tree, _forward(session, tree, timer)


def _forward(session: CausalLMSession, tree: DraftTree, timer: StageTimer) -> ForwardOutput:
    with timer.stage("forward"):
        return session.forward_tree(tree)  # one target forward over every node


def speculation_round(
    session: CausalLMSession,
    drafter: Drafter,
    committed: list[int],
    budget: int | str,
    verifier: str,
    law: SamplingLaw,
    generator: torch.Generator,
    state: DraftState,
    timer: StageTimer,
    sizing: AutoBudget | None = None,
) -> RoundRecord:
    """One round on ``session``: draft, target forward, head, verdict, then commit the accepted
    path to the cache and the drafter's ``state``. ``committed`` is read, not changed (the caller
    appends the block it keeps).

    On a GPU a round with the block drafter waits for the device twice: the drafter's marginals
    come to the host (the tree is built there) and the verdict does (one transfer for TEV and
    predraw; greedy adds one when it exits at a leaf). ``timer`` may add its own syncs
    (:class:`StageTimer` on a CUDA device synchronises around each stage).

    With ``sizing`` (``budget`` is then ``"auto"``) the round's size is chosen by the cost-aware rule
    and the round's coverage and stage times feed ``sizing`` for the rounds after it."""
    position = session.length
    tree, choice = draft_tree(session, drafter, committed, budget, state, timer, sizing)
    output = _forward(session, tree, timer)
    with timer.stage("head"):
        rows = output.rows(law)
        flow = rows.flow(tree)  # the edge probabilities: the parents' rows through the head, truncated and normalised
    with timer.stage("verify"):
        verdict = verify_rows(verifier, tree, rows, generator)
    with timer.stage("commit"):
        session.commit(verdict.path)
        if output.features is not None:
            state.add_features(output.features[torch.as_tensor(verdict.path).to(output.features.device, non_blocking=True)])
    if sizing is not None:  # after the verdict: this round's rows inform only later rounds
        seconds = timer.seconds
        sizing.observe(tree, choice, flow.coverage, seconds["forward"] + seconds["head"] + seconds["verify"], sum(seconds.values()), verdict.block_length)
    return RoundRecord(tree, flow, verdict, dict(timer.seconds), drafter.name, verifier, position, choice=choice)
