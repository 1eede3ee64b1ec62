"""The real trees that claims 1-3 measure on, and the verifier lab run over them.

A real tree is the first speculation round's tree on a prompt (or a prefix of it), with the
target's rows on every node (:class:`~tev.engine.lab.LabTree`).
"""

from __future__ import annotations

from tqdm import tqdm

from tev.bench.report.common import ReportSettings
from tev.core.verify import SAMPLING_VERIFIERS
from tev.engine.lab import LabResult, run_lab, tree_from_prompt

__all__ = ["prompt_cuts", "real_trees", "run_labs", "depth_profile"]


def prompt_cuts(ids: list[int], cuts) -> list[int]:
    """Prefix lengths of ``ids`` at the given fractions (at least 2 tokens, distinct)."""
    lengths = {min(len(ids), max(2, round(f * len(ids)))) for f in cuts}
    return sorted(lengths)


def real_trees(bundle, drafter, encoded: list[tuple[str, list[int]]], settings: ReportSettings, progress: bool) -> list[dict]:
    """First-round trees (``B = settings.tree_budget``) on every prompt and prompt prefix.

    Returns ``[{"prompt", "length", "lab": LabTree}]``.
    """
    jobs = [(pid, ids[:k]) for pid, ids in encoded for k in prompt_cuts(ids, settings.cuts)]
    trees = []
    for pid, ids in tqdm(jobs, desc="real trees", disable=not progress):
        lab = tree_from_prompt(bundle.runner, drafter, ids, settings.tree_budget, settings.tree_temperature)
        trees.append({"prompt": pid, "length": len(ids), "lab": lab})
    return trees


def run_labs(trees: list[dict], draws: int, seed: int, progress: bool) -> list[LabResult]:
    """Every saturated verifier ``draws`` times on each tree (seeded per tree)."""
    return [run_lab(t["lab"], verifiers=SAMPLING_VERIFIERS, draws=draws, seed=seed + i) for i, t in enumerate(tqdm(trees, desc="verifier lab", disable=not progress))]


def _pad_mean(vectors: list[list[float]]) -> list[float]:
    size = max(len(v) for v in vectors)
    return [sum(v[d] if d < len(v) else 0.0 for v in vectors) / len(vectors) for d in range(size)]


def depth_profile(trees: list[dict], results: list[LabResult]) -> dict:
    """Per depth, averaged over trees: reach, exit law ``w``, node count, and TEV's empirical
    exit-depth frequency (from the lab draws)."""
    tables = [t["lab"].flow.by_depth() for t in trees]
    empirical = []
    for tree, result in zip(trees, results):
        depths = tree["lab"].tree.depths.tolist()
        row = [0.0] * (max(depths) + 1)
        for v, f in enumerate(result.frequencies["tev"]):
            row[depths[v]] += f
        empirical.append(row)
    return {
        "reach": _pad_mean([t["reach"].tolist() for t in tables]),
        "exit_law": _pad_mean([t["exit"].tolist() for t in tables]),
        "nodes": _pad_mean([t["nodes"].tolist() for t in tables]),
        "tev_exit_frequency": _pad_mean(empirical),
    }
