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

from tev.core.budget import BudgetChoice, Calibration, RoundRate, choose_prefix
from tev.core.tree import DraftTree
from tev.engine.cost_curve import CostCurve, machine_cost_curve

__all__ = ["AutoBudget", "AUTO_CAP"]

AUTO_CAP = 32


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

    @classmethod
    def for_target(cls, target, cap: int = AUTO_CAP, calibration: Calibration | None = None, rate: RoundRate | None = None) -> "AutoBudget":
        """With the process's cost curve for ``target`` (measured on first use)."""
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
        self.calibration.observe(coverage, kept.draft_coverage)
        self.rate.observe(block_length, float(choice.cost[choice.size]))
        self.curve.observe(kept.num_nodes, sized_seconds, round_seconds - sized_seconds)
