"""The verifier lab: one fixed tree, every exact verifier run many times.

Shows fixed-tree equivalence: all saturated exact verifiers share the exit law
``Pr(exit = v) = w(v)`` and the mean block length ``1 + C(T)``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from tev.core.flow import TargetFlow, target_flow
from tev.core.sampling import SamplingLaw
from tev.core.tree import DraftTree
from tev.core.verify import SAMPLING_VERIFIERS, ProbRows as TargetRows, verify_rows  # the rows it builds are probabilities
from tev.engine.round import draft_and_forward, prefill, room_left
from tev.engine.session import CausalLMSession
from tev.engine.target import Target
from tev.util.stats import median, standard_error

__all__ = ["LabTree", "LabResult", "tree_from_prompt", "synthetic_tree", "SYNTHETIC_WORDS", "folded", "run_lab"]


@dataclass(eq=False)
class LabTree:
    """A tree with its target rows and flow."""

    tree: DraftTree
    rows: TargetRows
    flow: TargetFlow
    source: str


@dataclass(eq=False)
class LabResult:
    """Per verifier: exit-node frequencies (`list[N]`), mean block length, its standard
    error, median decision time (seconds); ``draws`` per verifier."""

    frequencies: dict[str, list[float]]
    mean_lengths: dict[str, float]
    length_se: dict[str, float]
    seconds: dict[str, float]
    draws: int


def tree_from_prompt(target: Target, drafter, prompt_ids: list[int], budget: int, temperature: float) -> LabTree:
    """The first speculation round's tree for a prompt, with the target's rows on it."""
    if temperature <= 0:
        raise ValueError("the verifier lab samples: use a temperature > 0")
    session = CausalLMSession(target, feature_layers=drafter.feature_layers)
    state = drafter.new_state()
    prefill(session, prompt_ids, state)
    if room_left(session) < 1:
        raise ValueError("the prompt fills the target's context; shorten it")
    tree, output = draft_and_forward(session, drafter, list(prompt_ids), budget, state)
    rows = output.rows(SamplingLaw(temperature))
    return LabTree(tree, rows, rows.flow(tree), "prompt")


# The synthetic tree's 8-token vocabulary, as words (token t is SYNTHETIC_WORDS[t]).
SYNTHETIC_WORDS = (" the", " cat", " sat", " on", " mat", " dog", " ran", " a")


def synthetic_tree() -> LabTree:
    """A small hand-made tree over an 8-token vocabulary (no model needed; its tokens read as
    :data:`SYNTHETIC_WORDS`)."""
    tree = DraftTree.from_paths(0, [[1, 2, 3], [1, 2, 4], [1, 5], [6, 7], [2]])
    generator = torch.Generator().manual_seed(7)
    probs = torch.softmax(2.5 * torch.randn(tree.num_nodes, 8, generator=generator), dim=-1)
    # make the drafted tokens likely, as a good drafter would
    for v in range(1, tree.num_nodes):
        probs[tree.parents[v], tree.tokens[v]] += 0.35
    probs = probs / probs.sum(dim=1, keepdim=True)
    return LabTree(tree, TargetRows(probs), target_flow(tree, probs), "synthetic")


def folded(lab: LabTree) -> tuple[DraftTree, TargetRows]:
    """The lab's tree over a folded vocabulary: the tree's own tokens, then one entry holding the
    mass of every other token.

    Which node a verifier exits at, and so the block length, depends only on each row's mass
    on the tree's child tokens and on the rest taken together: folding leaves their law exactly
    as it is (only the bonus token's identity is lost when it is not a tree token), and every
    draw then works on a few dozen entries instead of the whole vocabulary.

    Returns (the same tree with tokens renumbered ``0 .. m - 1``, float64 rows `Tensor[N, m + 1]`).
    """
    tokens = lab.tree.tokens_list
    kept = sorted(set(tokens))
    index = {t: i for i, t in enumerate(kept)}
    tree = DraftTree.from_parents([index[t] for t in tokens], lab.tree.parents_list)
    rows = lab.rows.all_rows().double()  # [N, V]
    on_tree = rows[:, torch.tensor(kept, device=rows.device)]  # [N, m]
    other = (1.0 - on_tree.sum(dim=1, keepdim=True)).clamp(min=0.0)
    probs = torch.cat([on_tree, other], dim=1)
    return tree, TargetRows((probs / probs.sum(dim=1, keepdim=True)).cpu())


def run_lab(lab: LabTree, verifiers=SAMPLING_VERIFIERS, draws: int = 2000, seed: int = 0, should_stop=None, timed_draws: int = 20,
            on_verifier=None) -> LabResult:
    """Run each verifier ``draws`` times on the same tree (same seed for each).

    The draws run on the folded rows (:func:`folded`: the exit law and block lengths exactly as on
    the full rows, far cheaper); the decision time is the median of ``timed_draws`` draws on the
    full rows, as in decoding. ``on_verifier(name, i)`` is called before each verifier.
    """
    n = lab.tree.num_nodes
    tree, rows = folded(lab)
    frequencies, means, errors, seconds = {}, {}, {}, {}
    for i, name in enumerate(verifiers):
        if on_verifier is not None:
            on_verifier(name, i)
        generator = torch.Generator().manual_seed(seed)
        counts = [0] * n
        lengths = []
        for _ in range(draws):
            if should_stop is not None and should_stop():
                break
            verdict = verify_rows(name, tree, rows, generator)
            counts[verdict.exit_node] += 1
            lengths.append(verdict.block_length)
        done = max(1, len(lengths))
        frequencies[name] = [c / done for c in counts]
        means[name] = sum(lengths) / done
        errors[name] = standard_error(lengths)
        timer = torch.Generator(device=lab.rows.device).manual_seed(seed)
        times = []
        for _ in range(timed_draws):
            start = time.perf_counter()
            verify_rows(name, lab.tree, lab.rows, timer)
            times.append(time.perf_counter() - start)
        seconds[name] = median(times)
    return LabResult(frequencies, means, errors, seconds, draws)
