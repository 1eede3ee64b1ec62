"""The cost-aware tree budget ("auto"): how many of the drafter's best nodes a round keeps.

``q`` is the drafter, ``p`` the target. A round keeps the best-first prefix of ``k`` nodes of the
drafter's tree (``k = 0`` is plain decoding) whose expected tokens pay for its time::

    expected(k) = 1 + c * sum_{i <= k} q(v_i)
    k = argmax_k  expected(k) - lam * cost(k + 1)

where ``q(v_i)`` is the ``i``-th best node's drafter path probability (``prod_d q_d`` for a
block drafter), ``c`` the calibration factor (how the target's realised coverage ``C(T)``
compared with the drafter's estimate in past rounds, :class:`Calibration`) and ``cost(n)`` the
time of a round whose target forward holds ``n`` new tokens (the root and ``k`` nodes). A node's
calibrated path probability ``c * q(v_i)`` (capped at 1) is the drafter's estimate of the
target's reach ``P(v_i)`` (:mod:`tev.core.flow`). ``expected(k)`` estimates ``1 + C``, the
expected output-block length of a saturated verifier, and ``lam`` is the rate (tokens per second)
the past rounds achieved: a node is kept while its calibrated path probability pays for its extra
time at that rate. Maximising ``expected(k) - lam * cost(k + 1)`` each round, with
``lam`` the achieved rate, is what maximises the rate of the whole generation (``sum L / sum
time``, Dinkelbach's argument for a ratio of sums); maximising each round's own ratio
``expected(k) / cost(k + 1)`` instead undervalues a good tree's extra nodes. Before any round
``lam`` is that best ratio itself, so the first round keeps the size of best expected rate.

The choice reads only the drafter's tree and past rounds, never the current round's target
rows: the tree is fixed before the target sees it, so every exact verifier stays exact.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["BudgetChoice", "Calibration", "RoundRate", "choose_prefix"]


@dataclass(frozen=True, eq=False)
class BudgetChoice:
    """One round's choice of its tree size, with what it was chosen from.

    Attributes:
        size: ``k``, the non-root nodes kept (0 .. ``M``).
        cap: the most nodes the round could keep (the drafted tree's ``M`` is at most this).
        path_prob: `Tensor[M]`, the drafted nodes' path probabilities under ``q``, best first.
        expected: `Tensor[M + 1]`, ``1 + c * sum_{i <= k} q(v_i)`` for ``k = 0 .. M`` (each
            node's calibrated path probability capped at 1).
        cost: `Tensor[M + 1]`, ``cost(k + 1)`` in seconds.
        rate: `Tensor[M + 1]`, ``expected / cost``: expected tokens per second.
        calibration: ``c``.
        going_rate: ``lam``, the tokens per second a kept node's calibrated path probability had to pay for.
    """

    size: int
    cap: int
    path_prob: torch.Tensor
    expected: torch.Tensor
    cost: torch.Tensor
    rate: torch.Tensor
    calibration: float
    going_rate: float

    @property
    def estimate(self) -> float:
        """The drafter's own (uncalibrated) estimate of ``C`` for the kept nodes."""
        return float(self.path_prob[: self.size].sum())

    def to_dict(self) -> dict:
        """Plain JSON values (per-size lists have length ``M + 1``, index = size ``k``)."""
        def rounded(tensor) -> list[float]:
            return [round(float(x), 6) for x in tensor.tolist()]

        return {
            "size": self.size,
            "cap": self.cap,
            "calibration": round(self.calibration, 6),
            "going_rate": round(self.going_rate, 6),
            "estimate": round(self.estimate, 6),
            "expected_length": round(float(self.expected[self.size]), 6),
            "cost_seconds": round(float(self.cost[self.size]), 6),
            "expected_by_size": rounded(self.expected),
            "cost_seconds_by_size": rounded(self.cost),
            "rate_by_size": rounded(self.rate),
        }


def choose_prefix(path_prob: torch.Tensor, cost: torch.Tensor, calibration: float, cap: int | None = None, going_rate: float | None = None) -> BudgetChoice:
    """The best-first prefix size whose expected tokens best pay for its time at ``going_rate``.

    Args:
        path_prob: `Tensor[M]`, the drafted nodes' path probabilities under ``q`` in best-first
            order (each node's parent earlier: see :meth:`~tev.core.tree.DraftTree.best_first_order`).
        cost: `Tensor[M + 1]` (or longer), ``cost[n - 1]`` the cost of a target forward of
            ``n`` new tokens, ``n = 1 .. M + 1``; positive.
        calibration: ``c >= 0``, multiplies every path probability.
        cap: the largest ``k`` allowed (default ``M``).
        going_rate: ``lam > 0``, tokens per second the past rounds achieved (None: the best
            ``expected / cost`` of this tree, which keeps the size of best expected rate).

    Returns:
        a :class:`BudgetChoice`; ties go to the smaller tree.
    """
    path_prob = torch.as_tensor(path_prob, dtype=torch.float64).detach().cpu().flatten()
    cost = torch.as_tensor(cost, dtype=torch.float64).detach().cpu().flatten()
    cap = path_prob.numel() if cap is None else int(cap)
    if cap < 0:
        raise ValueError(f"cap must be >= 0, got {cap}")
    path_prob = path_prob[:cap]
    m = path_prob.numel()
    if cost.numel() < m + 1:
        raise ValueError(f"cost needs the sizes 1 .. {m + 1}, got {cost.numel()} values")
    cost = cost[: m + 1]
    if not (cost > 0).all() or not torch.isfinite(cost).all():
        raise ValueError("every cost must be a positive finite number")
    if ((path_prob < 0) | (path_prob > 1) | torch.isnan(path_prob)).any():
        raise ValueError("path probabilities must lie in [0, 1]")
    if not calibration >= 0:
        raise ValueError(f"calibration must be >= 0, got {calibration}")
    calibrated = (calibration * path_prob).clamp(max=1.0)  # c * q(v_i): no node is reached more than surely
    expected = torch.cat([torch.ones(1, dtype=torch.float64), 1.0 + calibrated.cumsum(0)])  # [M + 1]
    rate = expected / cost
    if going_rate is None:
        going_rate = float(rate.max())
    elif not (going_rate > 0 and going_rate < float("inf")):
        raise ValueError(f"the going rate must be a positive finite number, got {going_rate}")
    net = expected - going_rate * cost
    size = int(torch.nonzero(net >= net.max() - 1e-12)[0])  # the first maximum: the smallest tree
    return BudgetChoice(size, cap, path_prob, expected, cost, rate, float(calibration), float(going_rate))


@dataclass
class Calibration:
    """How the target's realised coverage compares with the drafter's estimate, over past rounds.

    ``factor = (R + prior * strength) / (E + strength)`` where ``R`` and ``E`` are
    exponentially weighted sums (each round multiplies them by ``1 - weight`` before adding its
    own) of the realised ``C(T)`` and the drafter's estimate ``sum q`` of the trees the rounds
    kept. ``strength`` (in units of coverage) pulls the factor towards ``prior`` when the rounds
    say little: a round that kept no node adds nothing and only decays the sums, so after a run
    of plain-decoding rounds the factor drifts back to ``prior`` and a tree is tried again
    (plain decoding alone would never learn whether a tree pays). A strength of 2 (about two
    rounds' coverage) keeps one unlucky round from halving the factor; the page keeps one
    calibration per drafter across a browser session's answers, so it starts each answer
    from what the earlier ones taught.
    """

    weight: float = 0.1
    prior: float = 1.0
    strength: float = 2.0
    realised: float = 0.0
    estimated: float = 0.0
    rounds: int = 0

    @property
    def factor(self) -> float:
        return (self.realised + self.prior * self.strength) / (self.estimated + self.strength)

    def observe(self, realised: float, estimate: float) -> None:
        """Add one round: the target's ``C(T)`` on the kept tree and the drafter's ``sum q`` on it."""
        if realised < 0 or estimate < 0:
            raise ValueError(f"coverages are >= 0, got realised {realised} and estimate {estimate}")
        keep = 1.0 - self.weight
        self.realised = keep * self.realised + realised
        self.estimated = keep * self.estimated + estimate
        self.rounds += 1


@dataclass
class RoundRate:
    """The rate past rounds achieved: exponentially weighted tokens over cost (each round
    multiplies both sums by ``1 - weight`` before adding its own block length and cost, in the
    cost curve's units: seconds). ``rate`` is None before any round."""

    weight: float = 0.1
    tokens: float = 0.0
    seconds: float = 0.0

    @property
    def rate(self) -> float | None:
        return self.tokens / self.seconds if self.seconds > 0 else None

    def observe(self, tokens: float, seconds: float) -> None:
        """Add one round: its block length (or, replaying rounds, its expected length) and its cost."""
        if tokens < 1 or not seconds > 0:
            raise ValueError(f"a round emits >= 1 token in > 0 seconds, got {tokens} in {seconds}")
        keep = 1.0 - self.weight
        self.tokens = keep * self.tokens + tokens
        self.seconds = keep * self.seconds + seconds
