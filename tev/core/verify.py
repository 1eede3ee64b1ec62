"""Exact tree verifiers: TEV, predraw-and-follow, sequential residual, greedy.

Notation: ``p`` is the **target** distribution (rows ``p_v``, one per tree node, temperature
applied); ``q`` is the **draft** model, which only shaped the tree and never enters the
verdict. Every sampling verifier here is exact: the output block (accepted draft tokens, then
the bonus token) is distributed exactly as ``L`` tokens sampled from ``p``. The saturated ones
(all three) attain ``E[L] = 1 + C(T)`` and share the exit law ``Pr(exit = v) = w(v)``.

All verifiers take an explicit ``torch.Generator``: the same seed gives the same verdict.

On a GPU the tree's arrays (built on the host) are copied to the device without waiting for it
(``non_blocking``: a pageable host array is staged before the call returns), so the only host
syncs are the verdict's own transfers: one for TEV and predraw, one or two for greedy (the
sequential verifier decides child by child on the host, a few syncs per visited node).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from tev.core.flow import TargetFlow, check_probs, flow_from_edge_prob
from tev.core.sampling import LawCut, SamplingLaw, as_law, sample_rows
from tev.core.tree import DraftTree

__all__ = ["SAMPLING_VERIFIERS", "VERIFIERS", "Verdict", "ParentRows", "TargetRows", "ProbRows", "LogitRows", "target_rows", "verify", "verify_rows", "walk_tree", "exit_residual"]

@dataclass(frozen=True, eq=False)
class Verdict:
    """The outcome of verifying one tree.

    Attributes:
        path: accepted node indices, root first (``path[0] == 0``, ``path[-1] == exit_node``).
        exit_node: the node where the target leaves the tree.
        bonus_token: the token drawn from the target at the exit node.
        verifier: the verifier's name.
    """

    path: list[int]
    exit_node: int
    bonus_token: int
    verifier: str

    @property
    def block_length(self) -> int:
        """``L``: accepted draft tokens + 1 bonus token."""
        return len(self.path)

    def accepted_tokens(self, tree: DraftTree) -> list[int]:
        tokens = tree.tokens_list
        return [tokens[v] for v in self.path[1:]]

    def block_tokens(self, tree: DraftTree) -> list[int]:
        """The output block: accepted draft tokens then the bonus token (length ``L``)."""
        return self.accepted_tokens(tree) + [self.bonus_token]


@dataclass(eq=False)
class ParentRows:
    """The rows of a tree's internal nodes (those with children), computed once per tree.

    Attributes:
        tree: the tree they belong to.
        internal: `LongTensor[k]` the internal nodes, sorted.
        slot: `LongTensor[N - 1]` each non-root node's parent's index in ``internal``.
        values: their probabilities `Tensor[k, V]` (probability rows), their law's
            :class:`~tev.core.sampling.LawCut` (logit rows), or None (greedy logit rows: only
            argmaxes are defined).
        argmax: `LongTensor[k]` each internal row's argmax, once asked for.
    """

    tree: DraftTree
    internal: torch.Tensor
    slot: torch.Tensor
    values: torch.Tensor | LawCut | None
    argmax: torch.Tensor | None = None


class TargetRows:
    """The target rows ``p_v`` of one tree (row ``v`` for node ``v``), one class per kind of
    input: :class:`ProbRows` (normalised probabilities, taken as they are), :class:`LogitRows`
    (logits under a :class:`SamplingLaw`) and the engine's ``HeadRows`` (final hidden states
    through the output head, a kind of logit rows).

    A verifier reads only :meth:`edge_prob` / :meth:`flow` (the parents' rows), :meth:`rows_at`
    (a few rows), :meth:`all_rows` (predraw) and :meth:`argmax_at` / :meth:`parent_argmax`
    (greedy). The parents' rows are computed once per tree (:meth:`parent_rows`), so the edge
    probabilities and an internal exit row read the same numbers.

    Attributes:
        law: the target's sampling law (``temperature`` is its temperature).
        num_rows: ``N``; ``vocab_size``: ``V``; ``device``: where the rows are.
        probs, logits: the kind's source tensor `Tensor[N, V]` where it has one, else None.
    """

    probs: torch.Tensor | None = None
    logits: torch.Tensor | None = None

    def _declare(self, law: SamplingLaw, num_rows: int, vocab_size: int, device: torch.device) -> None:
        self.law = law
        self.temperature = law.temperature
        self.num_rows = num_rows
        self.vocab_size = vocab_size
        self.device = device
        self._parents: ParentRows | None = None  # of the last tree asked for
        self._flow_of: tuple[DraftTree, TargetFlow] | None = None  # (tree, its flow)

    @property
    def greedy_only(self) -> bool:
        """Whether only argmaxes are defined (logits at ``T == 0``)."""
        return False

    def select(self, nodes: torch.Tensor) -> "TargetRows":
        """The rows of ``nodes`` (`LongTensor[k]`) alone, as rows of the same kind."""
        raise NotImplementedError

    def argmax_at(self, nodes: torch.Tensor) -> torch.Tensor:
        """`LongTensor[k]`: the argmax token of rows ``nodes`` (`LongTensor[k]`)."""
        raise NotImplementedError

    def rows_at(self, nodes: torch.Tensor) -> torch.Tensor:
        """`Tensor[k, V]`: normalised rows ``p_v`` for node indices ``nodes`` (`LongTensor[k]`)."""
        raise NotImplementedError

    def all_rows(self) -> torch.Tensor:
        """`Tensor[N, V]`: every row, normalised."""
        raise NotImplementedError

    def _parent_values(self, internal: torch.Tensor) -> torch.Tensor | None:
        """The rows of the internal nodes ``internal`` as :class:`ParentRows` keeps them."""
        raise NotImplementedError

    def _edge_values(self, parents: ParentRows, tokens: torch.Tensor) -> torch.Tensor:
        """`Tensor[N - 1]` edge probabilities: each non-root node's token (``tokens``) in its parent's row."""
        raise NotImplementedError

    def _argmax_of(self, values) -> torch.Tensor:
        """`LongTensor[k]` each parent row's argmax from the ``values`` :class:`ParentRows` keeps."""
        raise NotImplementedError

    def parent_rows(self, tree: DraftTree) -> ParentRows:
        """The internal nodes' rows of ``tree`` (computed once per tree)."""
        if self._parents is not None and self._parents.tree is tree:
            return self._parents
        internal, slot = torch.unique(tree.parents[1:], return_inverse=True)
        internal, slot = internal.to(self.device, non_blocking=True), slot.to(self.device, non_blocking=True)
        self._parents = ParentRows(tree, internal, slot, self._parent_values(internal))
        return self._parents

    def parent_argmax(self, tree: DraftTree) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(``internal``, ``slot``, `LongTensor[k]` the argmax of each internal node's row)."""
        parents = self.parent_rows(tree)
        if parents.argmax is None:
            parents.argmax = self._argmax_of(parents.values) if parents.values is not None else self.argmax_at(parents.internal)
        return parents.internal, parents.slot, parents.argmax

    def edge_prob(self, tree: DraftTree) -> torch.Tensor:
        """`Tensor[N]`: ``p_pa(v)(x_v)`` (1 at the root); touches only parent rows.

        At ``T == 0`` the target is a point mass on the argmax: edge probabilities are 1 or 0.
        """
        n = tree.num_nodes
        edge = torch.ones(n, dtype=torch.float32 if self.probs is None else self.probs.dtype, device=self.device)
        if n == 1:
            return edge
        tokens = tree.tokens[1:].to(self.device, non_blocking=True)
        if self.greedy_only:
            _, slot, best = self.parent_argmax(tree)
            edge[1:] = (best[slot] == tokens).float()
            return edge
        parents = self.parent_rows(tree)
        edge[1:] = self._edge_values(parents, tokens)
        return edge

    def flow(self, tree: DraftTree) -> TargetFlow:
        """The target flow through ``tree`` (reach, exit law, coverage), computed once per tree."""
        if self._flow_of is None or self._flow_of[0] is not tree:
            self._flow_of = (tree, flow_from_edge_prob(tree, self.edge_prob(tree)))
        return self._flow_of[1]


class ProbRows(TargetRows):
    """Target rows given as probabilities `Tensor[N, V]`, already normalised (temperature
    applied), taken as they are."""

    def __init__(self, probs: torch.Tensor):
        if probs.dim() != 2:
            raise ValueError(f"target rows must have shape [N, V], got {tuple(probs.shape)}")
        self.probs = probs
        self._declare(as_law(1.0), probs.shape[0], probs.shape[1], probs.device)

    def select(self, nodes: torch.Tensor) -> "ProbRows":
        return ProbRows(self.probs.index_select(0, nodes))

    def argmax_at(self, nodes: torch.Tensor) -> torch.Tensor:
        return self.probs.index_select(0, nodes).argmax(dim=-1)

    def rows_at(self, nodes: torch.Tensor) -> torch.Tensor:
        return self.probs.index_select(0, nodes)

    def all_rows(self) -> torch.Tensor:
        return self.probs

    def _parent_values(self, internal: torch.Tensor) -> torch.Tensor:
        return self.probs.index_select(0, internal)

    def _edge_values(self, parents: ParentRows, tokens: torch.Tensor) -> torch.Tensor:
        return parents.values[parents.slot, tokens]

    def _argmax_of(self, values: torch.Tensor) -> torch.Tensor:
        return values.argmax(dim=-1)


class LogitRows(TargetRows):
    """Target rows from logits `Tensor[N, V]` under a :class:`SamplingLaw` (``p_v =
    softmax(logits_v / T)`` truncated by the law; with ``T == 0`` only argmax is defined).

    Rows are normalised once: :meth:`SamplingLaw.log_probs` gives each row's truncation and its
    one normaliser, and the parents' log-probabilities are kept for the tree. A subclass with
    another source of logits (the engine's rows from hidden states through the output head)
    overrides :meth:`logits_at`, :meth:`all_logits` and :meth:`argmax_at`.

    Args:
        logits: `Tensor[N, V]`.
        temperature: the law's temperature, or
        law: the whole :class:`SamplingLaw` (top-k, top-p, min-p).
    """

    def __init__(self, logits: torch.Tensor, temperature: float = 1.0, law: SamplingLaw | None = None):
        if logits.dim() != 2:
            raise ValueError(f"target rows must have shape [N, V], got {tuple(logits.shape)}")
        self.logits = logits
        self._declare(as_law(temperature) if law is None else law, logits.shape[0], logits.shape[1], logits.device)

    @property
    def greedy_only(self) -> bool:
        return self.temperature == 0

    def select(self, nodes: torch.Tensor) -> "LogitRows":
        return LogitRows(self.logits.index_select(0, nodes), law=self.law)

    def logits_at(self, nodes: torch.Tensor) -> torch.Tensor:
        """`Tensor[k, V]` float32 logits of rows ``nodes`` (`LongTensor[k]`)."""
        return self.logits.index_select(0, nodes).float()

    def all_logits(self) -> torch.Tensor:
        """`Tensor[N, V]` float32 logits of every row."""
        return self.logits.float()

    def argmax_at(self, nodes: torch.Tensor) -> torch.Tensor:
        return self.logits_at(nodes).argmax(dim=-1)

    def rows_at(self, nodes: torch.Tensor) -> torch.Tensor:
        parents = self._parents
        if parents is not None and parents.values is not None and nodes.numel() == 1 and self.device.type == "cpu":
            where = (parents.internal == nodes).nonzero()  # TEV's exit row, when an internal node's (no device sync on a CPU)
            if where.numel():
                return torch.exp(parents.values.log_probs(where[0]))
        return self.law.probs(self.logits_at(nodes))

    def all_rows(self) -> torch.Tensor:
        return self.law.probs(self.all_logits())

    def _parent_values(self, internal: torch.Tensor) -> LawCut | None:
        if self.greedy_only:
            return None  # only argmaxes are defined
        return self.law.cut(self.logits_at(internal))  # [k, V]: the cut and the normaliser, once

    def _edge_values(self, parents: ParentRows, tokens: torch.Tensor) -> torch.Tensor:
        return torch.exp(parents.values.log_probs_at(parents.slot, tokens))

    def _argmax_of(self, values: LawCut) -> torch.Tensor:
        return values.log_probs().argmax(dim=-1)


def target_rows(probs: torch.Tensor | None = None, *, logits: torch.Tensor | None = None, temperature: float = 1.0,
                law: SamplingLaw | None = None) -> TargetRows:
    """The rows of the kind given: exactly one of ``probs`` or ``logits`` (with ``temperature`` or ``law``)."""
    if (probs is None) == (logits is None):
        raise ValueError("give exactly one of probs or logits")
    return ProbRows(probs) if probs is not None else LogitRows(logits, temperature, law)


def _check_tree_fits(tree: DraftTree, rows: TargetRows) -> None:
    if rows.num_rows != tree.num_nodes:
        raise ValueError(f"target rows: got {rows.num_rows} rows but the tree has {tree.num_nodes} nodes (one row per node)")
    if int(tree.tokens.max()) >= rows.vocab_size:
        raise ValueError(f"tree token {int(tree.tokens.max())} is outside the target vocabulary of {rows.vocab_size}")


def walk_tree(tree: DraftTree, choice: list[int]) -> list[int]:
    """Follow from the root the child whose token equals ``choice[v]``; return the path."""
    path = [0]
    child_by_token = tree.child_by_token
    while True:
        child = child_by_token[path[-1]].get(choice[path[-1]])
        if child is None:
            return path
        path.append(child)


def exit_residual(tree: DraftTree, row: torch.Tensor, exit_node: torch.Tensor) -> torch.Tensor:
    """The residual ``p_V^res`` the bonus token is drawn from, unnormalised: ``row`` (`Tensor[V]`,
    ``p_V``) with the child tokens of ``exit_node`` (`LongTensor[1]`, on ``row``'s device, so no
    host sync) removed."""
    parents = tree.parents[1:].to(row.device, non_blocking=True)
    tokens = tree.tokens[1:].to(row.device, non_blocking=True)
    # a count per token, so repeated tokens elsewhere in the tree are safe
    is_child = (parents == exit_node).to(row.dtype)
    child_count = torch.zeros_like(row).index_add_(0, tokens, is_child)
    residual = torch.where(child_count > 0, torch.zeros_like(row), row)
    # Not in the algorithm, but needed: if rounding left no residual mass, fall back to p_V.
    return torch.where(residual.sum() > 0, residual, row)


def _tev(tree: DraftTree, rows: TargetRows, generator: torch.Generator | None, log: dict | None) -> Verdict:
    # Level-parallel: the exit law for all nodes at once, one exit draw, one bonus draw.
    flow = rows.flow(tree)
    exit_node = sample_rows(flow.exit_weight.unsqueeze(0), generator)  # [1]
    row = rows.rows_at(exit_node)[0]  # p_V, [V]
    bonus = sample_rows(exit_residual(tree, row, exit_node).unsqueeze(0), generator)  # [1]
    exit_value, bonus_value = torch.cat([exit_node, bonus]).tolist()  # the one host sync
    if log is not None:
        log["exit_law"] = flow.exit_weight.tolist()
    return Verdict(tree.path_to(exit_value), exit_value, bonus_value, "tev")


def _predraw(tree: DraftTree, rows: TargetRows, generator: torch.Generator | None, log: dict | None) -> Verdict:
    # DDTree: one draw R_v ~ p_v at every node, follow matches, bonus = R_exit.
    draws = sample_rows(rows.all_rows(), generator).tolist()
    path = walk_tree(tree, draws)
    if log is not None:
        log["draws"] = draws
    return Verdict(path, path[-1], draws[path[-1]], "predraw")


def _sequential(tree: DraftTree, rows: TargetRows, generator: torch.Generator | None, log: dict | None) -> Verdict:
    # EAGLE/SpecInfer style for a deterministic draft: at each node test the children in
    # order, accepting x_j with probability g(x_j) of the current residual g; a rejection
    # removes x_j from g and renormalises. This accepts child j with overall probability p_v(x_j).
    path, tests = [0], []
    tokens = tree.tokens_list
    while True:
        v = path[-1]
        p_v = rows.rows_at(torch.tensor([v], device=rows.device))[0].double()
        residual = p_v.clone()
        accepted, tried = None, []
        for u in tree.children(v):
            mass = float(residual.sum())
            g_x = float(residual[tokens[u]]) / mass if mass > 0 else 0.0
            accepted = u if g_x > 0 and float(torch.rand((), generator=generator, device=rows.device)) < g_x else None
            tried.append((u, tokens[u], g_x, accepted is not None))
            if accepted is not None:
                break
            residual[tokens[u]] = 0.0
        tests.append((v, tried))
        if accepted is None:
            if float(residual.sum()) <= 0:
                residual = p_v  # Not in the algorithm: rounding removed all mass; keep p_v.
            bonus = int(sample_rows(residual, generator))
            if log is not None:
                log["tests"] = tests  # per visited node: (child, token, g, accepted) in test order
            return Verdict(path, v, bonus, "sequential")
        path.append(accepted)


def _greedy(tree: DraftTree, rows: TargetRows, generator: torch.Generator | None, log: dict | None) -> Verdict:
    # T = 0: follow argmax while it is a child; the bonus is the argmax at the exit node.
    # Only parent rows can continue the walk, so only they (and a leaf exit's row) are needed:
    # one transfer for the parents' argmaxes, one more when the walk ends at a leaf.
    best = {}
    if tree.num_nodes > 1:
        _, _, parent_best = rows.parent_argmax(tree)
        internal = sorted(set(tree.parents_list[1:]))  # the host's copy of parent_argmax's (sorted) node order
        best = dict(zip(internal, parent_best.tolist()))
    path = [0]
    child_by_token = tree.child_by_token
    while path[-1] in best and best[path[-1]] in child_by_token[path[-1]]:
        path.append(child_by_token[path[-1]][best[path[-1]]])
    exit_node = path[-1]
    if exit_node not in best:  # a leaf: its row is needed for the bonus
        best[exit_node] = int(rows.argmax_at(torch.tensor([exit_node]).to(rows.device, non_blocking=True)))
    if log is not None:
        log["argmax"] = {v: best[v] for v in path}
    return Verdict(path, exit_node, best[exit_node], "greedy")


# The sampling verifiers (T > 0), by name: a new one is a function above and one line here, and
# the lab, the benches, the report, the walkthrough and the load test offer it from this list.
_SAMPLERS = {"tev": _tev, "predraw": _predraw, "sequential": _sequential}
SAMPLING_VERIFIERS = tuple(_SAMPLERS)
VERIFIERS = (*SAMPLING_VERIFIERS, "greedy")  # greedy is the one verifier of T = 0
_IMPLEMENTATIONS = {**_SAMPLERS, "greedy": _greedy}


def verify_rows(name: str, tree: DraftTree, rows: TargetRows, generator: torch.Generator | None = None, log: dict | None = None) -> Verdict:
    """Verify ``tree`` against target rows (probabilities or logits).

    With ``log`` (a dict) the verifier records its own decisions in it, by verifier: ``tev``:
    ``exit_law`` (`list[N]`); ``predraw``: ``draws`` (one token per node); ``sequential``:
    ``tests`` (per visited node, ``(node, [(child, token, g, accepted), ...])`` in test order);
    ``greedy``: ``argmax`` (node -> its row's argmax, on the path).
    """
    if name not in _IMPLEMENTATIONS:
        raise ValueError(f"unknown verifier {name!r}; choose one of {', '.join(VERIFIERS)}")
    _check_tree_fits(tree, rows)
    if rows.greedy_only and name != "greedy":
        raise ValueError(f"temperature 0 is deterministic: use the 'greedy' verifier, not {name!r}")
    return _IMPLEMENTATIONS[name](tree, rows, generator, log)


def verify(
    name: str,
    tree: DraftTree,
    probs: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    *,
    logits: torch.Tensor | None = None,
    temperature: float = 1.0,
    law: SamplingLaw | None = None,
    validate: bool = True,
) -> Verdict:
    """Verify a draft tree with the named exact verifier.

    Args:
        name: one of ``VERIFIERS``.
        tree: the draft tree, ``N`` nodes.
        probs: `Tensor[N, V]`, row ``v`` is ``p_v`` (temperature already applied). Or
        logits: `Tensor[N, V]` target logits, with ``temperature`` (0 means greedy only) or
            the whole sampling ``law`` (top-k, top-p, min-p).
        generator: the source of randomness (same seed, same verdict).
        validate: check that ``probs`` rows are finite, non-negative and normalised.
    """
    if name not in _IMPLEMENTATIONS:
        raise ValueError(f"unknown verifier {name!r}; choose one of {', '.join(VERIFIERS)}")
    if probs is not None and validate:
        check_probs(probs, tree.num_nodes)
    if logits is not None and validate and (torch.isnan(logits).any() or (logits == float("inf")).any()):
        raise ValueError("logits contain NaN or +infinity")
    return verify_rows(name, tree, target_rows(probs, logits=logits, temperature=temperature, law=law), generator)
