"""Budget "auto": each round keeps the best-first prefix of the drafter's tree that this machine
pays for (:func:`~tev.core.budget.choose_prefix`), learning from the rounds as they run.

The drafter builds a tree of ``cap`` nodes; :meth:`AutoBudget.choose` keeps its best ``k`` by the
drafter's path probability, using the machine's :class:`~tev.engine.cost_curve.CostCurve`, the
:class:`~tev.core.budget.Calibration` of past rounds and the :class:`~tev.core.budget.RoundRate`
they achieved; after the round, :meth:`AutoBudget.observe` feeds all three with the round's
stage times, realised coverage and block length. Nothing here reads the current round's target
rows before the tree is fixed.
"""

from __future__ import annotations

from collections import deque

from tev.core.budget import BudgetChoice, Calibration, RoundRate, choose_prefix
from tev.core.tree import DraftTree
from tev.engine.cost_curve import CostCurve, machine_cost_curve
from tev.engine.target import Target

__all__ = ["AutoBudget", "AUTO_CAP"]

AUTO_CAP = 32
MIN_DRAFTED = 8  # the smallest tree drafted for the rule to choose from
KEPT_MEMORY = 16  # rounds whose kept sizes set the next draft's size


class AutoBudget:
    """One generation's budget rule: the cap, the machine's cost curve and the calibration.

    Args:
        curve: the machine's cost curve (shared by the generations of a process).
        cap: the most non-root nodes a round may keep.
        calibration: realised ``C`` against the drafter's estimate (a fresh one by default).
        rate: the tokens per second past rounds achieved (a fresh one by default).

    A caller that passes the same ``calibration`` and ``rate`` to the generations of one user
    (the page: one per browser session and drafter) lets each answer start from the last.
    """

    def __init__(self, curve: CostCurve, cap: int = AUTO_CAP, calibration: Calibration | None = None, rate: RoundRate | None = None):
        if isinstance(cap, bool) or not isinstance(cap, int) or cap < 1:
            raise ValueError(f"the auto budget's cap must be an integer >= 1, got {cap!r}")
        self.curve = curve
        self.cap = cap
        self.calibration = calibration if calibration is not None else Calibration()
        self.rate = rate if rate is not None else RoundRate()
        self.kept_sizes: deque[int] = deque(maxlen=KEPT_MEMORY)
        self.kept_floors: deque[float] = deque(maxlen=KEPT_MEMORY)  # the least probable node each round that kept one kept

    def draft_size(self) -> int:
        """Nodes to draft this round: twice the most any recent round kept (at least
        :data:`MIN_DRAFTED`), at most the cap; the cap until a round was kept.

        Nodes past that are rarely kept, and a drafter that pays per depth (the path drafter's
        steps) or per node (the tree build) would draft them for nothing. A block drafter's
        best-first tree keeps the same first ``k`` nodes however many more it drafts; a round that
        keeps every drafted node doubles the next draft."""
        if not self.kept_sizes:
            return self.cap
        return min(self.cap, max(MIN_DRAFTED, 2 * max(self.kept_sizes)))

    def draft_floor(self) -> float:
        """Half the path probability of the least probable node any recent round kept (0 until
        one kept a node): a node below it is rarely kept, and it may fall by half a round."""
        return 0.5 * min(self.kept_floors) if self.kept_floors else 0.0

    @classmethod
    def for_target(cls, target: Target, cap: int = AUTO_CAP, calibration: Calibration | None = None, rate: RoundRate | None = None) -> "AutoBudget":
        """With ``target``'s cost curve in the forward it runs (measured on first use, then kept on it)."""
        return cls(machine_cost_curve(target), cap, calibration, rate)

    def choose(self, tree: DraftTree) -> tuple[DraftTree, BudgetChoice]:
        """The kept tree (its nodes best first) and the choice, from the drafted ``tree`` alone."""
        order = tree.best_first_order()[: self.cap]  # [M]
        path_prob = tree.path_logprob[order].exp()
        choice = choose_prefix(path_prob, self.curve.costs(order.numel() + 1), self.calibration.factor, self.cap, self.rate.rate)
        return tree.keep(order[: choice.size].tolist()), choice

    def observe(self, kept: DraftTree, choice: BudgetChoice, coverage: float, sized_seconds: float, round_seconds: float, block_length: int) -> None:
        """After the round: the kept tree and its choice, its realised ``C(T)``, the time of its
        stages that grow with the tree (forward, head, verdict), its whole time and its block
        length. The rate is kept in the cost curve's own terms (the block over ``choice``'s cost
        of the kept size, which follows the rounds' times unless the curve is frozen), so a
        frozen curve's choices depend on no timing at all."""
        self.kept_sizes.append(kept.num_nodes - 1)
        if kept.num_nodes > 1:
            self.kept_floors.append(float(kept.path_logprob[1:].exp().min()))
        self.calibration.observe(coverage, kept.draft_coverage)
        self.rate.observe(block_length, float(choice.cost[choice.size]))
        self.curve.observe(kept.num_nodes, sized_seconds, round_seconds - sized_seconds)
