"""Target flow through a draft tree: reach, local exit, exit law, coverage, missing mass.

``p`` is the target. With ``p_v`` the target's next-token distribution at node ``v``:

- edge probability ``p_pa(v)(x_v)``,
- reach ``P(r) = 1``, ``P(v) = P(pa(v)) * p_pa(v)(x_v)``,
- local exit ``rho(v) = 1 - sum_{u in Ch(v)} p_v(x_u)`` (1 at a leaf),
- exit weight ``w(v) = P(v) * rho(v)``: the exit law, ``sum_v w(v) = 1``,
- coverage ``C(T) = sum_{v != r} P(v)``, the expected exit depth; ``E[L] <= 1 + C(T)``.

Everything here is a pure tensor function; no Python loop runs over nodes.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tev.core.tree import DraftTree

__all__ = ["TargetFlow", "target_flow", "flow_from_edge_prob", "check_probs"]


@dataclass(frozen=True, eq=False)
class TargetFlow:
    """The target's flow through one draft tree (all tensors on the probs' device).

    Attributes:
        edge_prob: `Tensor[N]`, ``p_pa(v)(x_v)``; 1 at the root.
        reach: `Tensor[N]`, ``P(v)``.
        child_mass: `Tensor[N]`, ``sum_{u in Ch(v)} p_v(x_u)``.
        rho: `Tensor[N]`, ``rho(v)``, clamped at 0 where child mass rounds above 1.
        exit_weight: `Tensor[N]`, ``w(v) = P(v) rho(v)``.
        depths: `LongTensor[N]`, the tree's depths (on the same device).
    """

    edge_prob: torch.Tensor
    reach: torch.Tensor
    child_mass: torch.Tensor
    rho: torch.Tensor
    exit_weight: torch.Tensor
    depths: torch.Tensor

    @property
    def coverage(self) -> float:
        """``C(T) = sum_{v != r} P(v)``: the expected number of accepted draft tokens."""
        return float(self.reach[1:].detach().sum())  # a number for reports; no graph kept

    @property
    def tau_bound(self) -> float:
        """``1 + C(T)``: the expected output-block length of a saturated exact verifier."""
        return 1.0 + self.coverage

    def by_depth(self) -> dict[str, torch.Tensor]:
        """Per-depth sums for the figures; index ``d`` is depth ``d`` (0 = root).

        Returns a dict of `Tensor[D + 1]` (CPU, float64): ``reach`` (coverage contributed
        by depth ``d``; ``reach[1:].sum() == C(T)``), ``exit`` (missing mass leaving at depth
        ``d``; sums to 1) and ``nodes`` (node count).
        """
        depths = self.depths.cpu()
        size = int(depths.max()) + 1
        reach = torch.zeros(size, dtype=torch.float64).index_add_(0, depths, self.reach.detach().cpu().double())
        exits = torch.zeros(size, dtype=torch.float64).index_add_(0, depths, self.exit_weight.detach().cpu().double())
        nodes = torch.bincount(depths, minlength=size).double()
        return {"reach": reach, "exit": exits, "nodes": nodes}


def check_probs(probs: torch.Tensor, num_nodes: int, atol: float = 1e-3) -> None:
    """Raise ``ValueError`` unless ``probs`` is `[num_nodes, V]` of finite, non-negative,
    normalised rows (within ``atol``)."""
    if probs.dim() != 2:
        raise ValueError(f"probs must have shape [N, V], got {tuple(probs.shape)}")
    if probs.shape[0] != num_nodes:
        raise ValueError(f"probs has {probs.shape[0]} rows but the tree has {num_nodes} nodes (one row per node)")
    if not torch.isfinite(probs).all():
        raise ValueError("probs contains NaN or infinity")
    if (probs < 0).any():
        raise ValueError("probs contains negative values")
    row_sums = probs.double().sum(dim=1)
    worst = float((row_sums - 1).abs().max())
    if worst > atol:
        raise ValueError(f"probs rows must sum to 1 (worst row is off by {worst:.3g}); apply softmax first")


def flow_from_edge_prob(tree: DraftTree, edge_prob: torch.Tensor) -> TargetFlow:
    """The flow from edge probabilities alone.

    Args:
        tree: the draft tree (``N`` nodes).
        edge_prob: `Tensor[N]`, ``p_pa(v)(x_v)``; entry 0 is ignored (set to 1).
    """
    device = edge_prob.device
    n = tree.num_nodes
    edge_prob = edge_prob.clone()
    edge_prob[:1] = 1.0  # a slice: setting one element of a CUDA tensor copies from the host and waits
    ancestors = tree.ancestors.to(device, non_blocking=True)  # [N, N]; non_blocking: no wait for the device
    # P(v) = product of edge probabilities on the path: one masked product per row.
    reach = torch.where(ancestors, edge_prob.unsqueeze(0), torch.ones((), dtype=edge_prob.dtype, device=device)).prod(dim=1)
    parents = tree.parents.to(device, non_blocking=True)
    child_mass = torch.zeros(n, dtype=edge_prob.dtype, device=device).index_add_(0, parents[1:], edge_prob[1:])
    rho = (1.0 - child_mass).clamp(min=0.0)
    return TargetFlow(
        edge_prob=edge_prob,
        reach=reach,
        child_mass=child_mass,
        rho=rho,
        exit_weight=reach * rho,
        depths=tree.depths.to(device, non_blocking=True),
    )


def target_flow(tree: DraftTree, probs: torch.Tensor, validate: bool = True) -> TargetFlow:
    """Compute ``P``, ``rho``, ``w`` for every node at once.

    Args:
        tree: the draft tree (``N`` nodes).
        probs: `Tensor[N, V]`, row ``v`` is ``p_v`` (temperature already applied).
        validate: check the rows are finite, non-negative and normalised.
    """
    if validate:
        check_probs(probs, tree.num_nodes)
    parents = tree.parents.to(probs.device, non_blocking=True)
    tokens = tree.tokens.to(probs.device, non_blocking=True)
    edge_prob = torch.ones(tree.num_nodes, dtype=probs.dtype, device=probs.device)
    if tree.num_nodes > 1:
        edge_prob[1:] = probs[parents[1:], tokens[1:]]
    return flow_from_edge_prob(tree, edge_prob)
