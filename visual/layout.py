"""Tidy tree layout: depth on x, leaf order on y, each parent centred over its children.

The tree is a ``networkx`` directed graph built from a parent list, so it lays out any tree
(a :class:`~tev.core.tree.DraftTree`'s ``parents_list``, or that list with extra nodes
appended, such as the bonus token).
"""

from __future__ import annotations

from typing import Sequence

import networkx as nx

__all__ = ["tree_graph", "tidy_layout"]


def tree_graph(parents: Sequence[int]) -> nx.DiGraph:
    """The rooted tree as a ``DiGraph`` with edges ``pa(v) -> v`` added in node order, so
    each node's successors are its children in node order.

    Args:
        parents: ``parents[v]`` is ``pa(v)``; ``parents[0] == -1`` (the root) and every
            parent precedes its child (``parents[v] < v``), as in a ``DraftTree``.
    """
    graph = nx.DiGraph()
    graph.add_nodes_from(range(len(parents)))
    for v in range(1, len(parents)):
        parent = int(parents[v])
        if not 0 <= parent < v:
            raise ValueError(f"node {v} has parent {parent}: every parent must precede its child")
        graph.add_edge(parent, v)
    return graph


def tidy_layout(parents: Sequence[int]) -> tuple[list[float], list[float]]:
    """Positions for a rooted tree given as a parent list (see :func:`tree_graph`).

    Returns:
        ``(x, y)``, two lists of length ``N``: ``x[v] = d(v)`` (the depth) and ``y[v]`` a row
        index. Leaves take rows ``0, 1, 2, ...`` in depth-first order (children in node
        order), and an internal node sits at the midpoint of its first and last child.
        Two nodes at the same depth are therefore always at least one row apart.
    """
    n = len(parents)
    if n == 0:
        return [], []
    graph = tree_graph(parents)
    depth = nx.single_source_shortest_path_length(graph, 0)
    x = [float(depth[v]) for v in range(n)]
    y = [0.0] * n
    next_row = 0
    for v in nx.dfs_postorder_nodes(graph, 0):  # children before parents (iterative: deep chains are fine)
        children = list(graph.successors(v))
        if children:
            y[v] = (y[children[0]] + y[children[-1]]) / 2.0
        else:
            y[v] = float(next_row)
            next_row += 1
    return x, y
