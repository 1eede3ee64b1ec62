"""Tidy tree layout: depth on x, leaf order on y, each parent centred over its children.

Pure Python on a parent list, so it lays out any tree (a :class:`~tev.core.tree.DraftTree`'s
``parents_list``, or that list with extra nodes appended, such as the bonus token).
"""

from __future__ import annotations

from typing import Sequence

__all__ = ["tidy_layout"]


def tidy_layout(parents: Sequence[int]) -> tuple[list[float], list[float]]:
    """Positions for a rooted tree given as a parent list.

    Args:
        parents: ``parents[v]`` is ``pa(v)``; ``parents[0] == -1`` (the root) and every
            parent precedes its child (``parents[v] < v``), as in a ``DraftTree``.

    Returns:
        ``(x, y)``, two lists of length ``N``: ``x[v] = d(v)`` (the depth) and ``y[v]`` a row
        index. Leaves take rows ``0, 1, 2, ...`` in depth-first order (children in node
        order), and an internal node sits at the midpoint of its first and last child.
        Two nodes at the same depth are therefore always at least one row apart.
    """
    n = len(parents)
    if n == 0:
        return [], []
    children: list[list[int]] = [[] for _ in range(n)]
    for v in range(1, n):
        parent = int(parents[v])
        if not 0 <= parent < v:
            raise ValueError(f"node {v} has parent {parent}: every parent must precede its child")
        children[parent].append(v)
    x = [0.0] * n
    for v in range(1, n):  # parents precede children, so one forward pass gives depths
        x[v] = x[int(parents[v])] + 1.0
    y = [0.0] * n
    next_row = 0
    # Iterative post-order (a chain of 1000 nodes would overflow recursion).
    stack: list[tuple[int, bool]] = [(0, False)]
    while stack:
        v, expanded = stack.pop()
        if not children[v]:
            y[v] = float(next_row)
            next_row += 1
        elif expanded:
            y[v] = (y[children[v][0]] + y[children[v][-1]]) / 2.0
        else:
            stack.append((v, True))
            stack.extend((u, False) for u in reversed(children[v]))
    return x, y
