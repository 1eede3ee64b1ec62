"""Summary statistics shared by the benchmarks, the report and the verifier lab (one copy each)."""

from __future__ import annotations

import math

import numpy as np

__all__ = ["quantile", "median", "spread", "standard_error", "ratio_standard_error", "paired_ratio_change", "standard_error_of_mean", "change_in_words"]


def _floats(values) -> np.ndarray:
    return np.fromiter((float(x) for x in values), dtype=np.float64)


def quantile(values, q: float, method: str = "linear") -> float:
    """The ``q`` quantile of ``values`` (numpy's ``method``; ``"linear"`` interpolates between
    order statistics); NaN when there are none."""
    data = _floats(values)
    return float(np.quantile(data, q, method=method)) if data.size else float("nan")


def median(values) -> float:
    return quantile(values, 0.5)


def spread(values) -> dict:
    """Median and interquartile range: ``{"median", "q25", "q75", "n"}``."""
    data = _floats(values)
    return {"median": quantile(data, 0.5), "q25": quantile(data, 0.25), "q75": quantile(data, 0.75), "n": int(data.size)}


def standard_error(values) -> float:
    """Standard error of the mean of ``values`` (sample standard deviation over ``sqrt(n)``);
    0 with fewer than two values, where no spread can be measured."""
    data = _floats(values)
    if data.size < 2:
        return 0.0
    return float(data.std(ddof=1) / math.sqrt(data.size))


def ratio_standard_error(numerators, denominators) -> float:
    """Standard error of ``sum(numerators) / sum(denominators)`` over independent units (one pair
    per unit, e.g. a prompt's tokens and rounds), by the delta method:
    ``sqrt(sum((y_i - R x_i)^2) / (n (n - 1))) / mean(x)``; nan with fewer than two units (one
    prompt's rounds are not independent draws, so they give no error)."""
    y, x = _floats(numerators), _floats(denominators)
    if y.size < 2 or x.sum() <= 0:
        return float("nan")
    ratio = y.sum() / x.sum()
    return float(np.sqrt(np.sum((y - ratio * x) ** 2) / (y.size * (y.size - 1))) / x.mean())


def paired_ratio_change(after, before) -> tuple[float, float]:
    """``R - 1`` and its standard error, where ``R = (sum y_a / sum x_a) / (sum y_b / sum x_b)`` over
    the same independent units measured twice (``after`` and ``before``: one ``(y, x)`` pair per
    unit, e.g. a prompt's tokens and rounds with two drafters on the same prompt and seed). Delta
    method on ``log R``, whose influence of unit ``i`` is ``y_a/Y_a - x_a/X_a - y_b/Y_b + x_b/X_b``,
    so a prompt that is easy for both drafters cancels out; nan error with fewer than two units."""
    a, b = np.asarray(after, dtype=float).reshape(-1, 2), np.asarray(before, dtype=float).reshape(-1, 2)
    if a.shape != b.shape:
        raise ValueError(f"paired units differ: {a.shape[0]} after, {b.shape[0]} before")
    totals_a, totals_b = a.sum(0), b.sum(0)
    ratio = (totals_a[0] / totals_a[1]) / (totals_b[0] / totals_b[1])
    n = a.shape[0]
    if n < 2:
        return float(ratio - 1), float("nan")
    influence = a[:, 0] / totals_a[0] - a[:, 1] / totals_a[1] - b[:, 0] / totals_b[0] + b[:, 1] / totals_b[1]
    return float(ratio - 1), float(ratio * np.sqrt(n / (n - 1) * np.sum(influence**2)))


def standard_error_of_mean(errors) -> float:
    """Standard error of the plain mean of independent estimates with standard errors ``errors``."""
    data = _floats(errors)
    return float(np.sqrt(np.sum(data**2)) / data.size) if data.size else float("nan")


def change_in_words(change: float, se: float) -> str:
    """A relative change as a verdict: a gain or a loss when it lies outside two standard errors,
    else "no measurable change"; markdown, e.g. ``**+18.0% +- 4.0%** (a gain)``. Without a
    standard error (nan: one prompt measured) it gives the change and says that none is known."""
    if not math.isfinite(se):
        return f"{100 * change:+.1f}% (no standard error: too few prompts measured to tell a change from noise)"
    text = f"{100 * change:+.1f}% +- {100 * se:.1f}%"
    if abs(change) <= 2 * se:
        return f"no measurable change ({text})"
    return f"**{text}**" + (" (a gain)" if change > 0 else " (a loss)")
