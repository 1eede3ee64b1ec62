"""What every claim of the report shares: the settings, the claim row, number formatting.

``p`` is the target and ``q`` the drafter, as everywhere.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from tev.bench.e2e import format_e2e_table

__all__ = ["ReportSettings", "QUICK", "FULL", "HOLDS", "claim", "yes", "finite", "pct", "ms", "clean", "rows_of", "image", "decoding_lines"]

HOLDS = ("yes", "partly", "no", "n/a")  # partly: the direction holds, the size does not


@dataclass(frozen=True)
class ReportSettings:
    """How much the report measures. ``QUICK`` takes a couple of minutes on small models."""

    num_prompts: int = 8
    tree_budget: int = 32  # claims 1-3: B of the real trees
    tree_temperature: float = 1.0
    cuts: tuple[float, ...] = (1 / 3, 2 / 3, 1.0)  # prompt prefixes (fractions of its tokens)
    draws: int = 1000  # per tree and verifier
    latency_budgets: tuple[int, ...] = (32, 64, 128)
    latency_temperature: float = 0.6  # the paper's Table 3 setting
    latency_prompts: int = 4
    latency_repeats: int = 25
    synthetic_vocab: int = 151936
    synthetic_repeats: int = 10  # 0 skips the synthetic decision-stage benchmark
    sweep_budgets: tuple[int, ...] = (8, 16, 32, 64, 128)
    temperatures: tuple[float, ...] = (0.0, 1.0)
    e2e_budget: int = 32
    max_new_tokens: int = 64
    e2e_repeats: int = 1


FULL = ReportSettings()
QUICK = ReportSettings(
    num_prompts=3, cuts=(0.5, 1.0), draws=300, latency_prompts=2, latency_repeats=8, synthetic_repeats=0, sweep_budgets=(8, 16), max_new_tokens=16
)


def claim(number: int | str, name: str, paper: str, this_run: str, value, holds: str, rule: str, figures: dict | None = None) -> dict:
    """One row of the claims table; ``holds`` is one of :data:`HOLDS`."""
    assert holds in HOLDS, holds
    return {"id": number, "claim": name, "paper": paper, "this_run": this_run, "value": value, "holds": holds, "rule": rule, "figures": figures or {}}


def yes(condition: bool) -> str:
    return "yes" if condition else "no"


def finite(x) -> bool:
    """A real, finite number (not a bool, not None)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def pct(x: float) -> str:
    return f"{100 * x:+.1f}%" if finite(x) else "n/a"


def ms(spread: dict) -> str:
    """A ``{"median", "q25", "q75"}`` spread of seconds as ``median (q25-q75)`` milliseconds."""
    return f"{1e3 * spread['median']:.3f} ({1e3 * spread['q25']:.3f}-{1e3 * spread['q75']:.3f})"


def clean(value):
    """JSON-safe copy: NaN / infinity become None, tuples lists, tensors numbers."""
    if isinstance(value, dict):
        return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [clean(v) for v in value]
    if isinstance(value, torch.Tensor):
        return clean(value.tolist())
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def rows_of(result: dict, prefix: str) -> list[dict]:
    """bench_e2e rows of one drafter (``"block"`` matches ``block+tev`` and ``block+greedy``)."""
    return [r for r in result["rows"] if r["method"].split("+")[0] == prefix]


def image(plots: dict, name: str, caption: str) -> str:
    """Markdown that embeds the plot ``name`` (a PNG path relative to report.md)."""
    return f"![{caption}]({plots[name]})"


def decoding_lines(result: dict) -> list[str]:
    """A bench_e2e result as markdown: how it was run, then its table."""
    return [
        f"{result['prompts']} prompts x {result['repeats']} repeats, {result['max_new_tokens']} new tokens, methods interleaved with an autoregressive run; median (IQR).",
        "",
        format_e2e_table(result),
    ]
