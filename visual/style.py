"""What the figures and the text view share: colours, the token-text callable and token labels.

``p`` is the target model and ``q`` the draft model. Every number drawn in ``visual`` is read from a
:class:`~tev.core.tree.DraftTree`, :class:`~tev.core.flow.TargetFlow`, :class:`~tev.core.verify.Verdict` or
:class:`~tev.engine.round.RoundRecord`; no probability is recomputed (``flow.reach``,
``flow.exit_weight`` etc. are used as given). Token text comes from a ``token_text``
callable (for example ``lambda t: tokenizer.decode([t])``); the default is ``str``.
"""

from __future__ import annotations

import html
from typing import Callable

__all__ = ["BONUS_COLOUR", "EXIT_COLOUR", "PATH_COLOUR", "TokenText", "floats", "token_label"]

TokenText = Callable[[int], str]

PATH_COLOUR = "#111111"
EXIT_COLOUR = "#d62728"
BONUS_COLOUR = "#ff7f0e"

_VISIBLE_WHITESPACE = {" ": "·", "\n": "↵", "\t": "→", "\r": "␍"}


def _visible(text: str) -> str:
    return "".join(_VISIBLE_WHITESPACE.get(ch, ch) for ch in text)


def token_label(token: int, token_text: TokenText = str, max_chars: int | None = 8) -> str:
    """The token's text with whitespace made visible, cut to ``max_chars`` with '…'.

    The result is HTML-escaped (plotly renders a subset of HTML in text and hover).
    An empty decoding shows as ``⟨id⟩``; a special token (``<|im_end|>``, ``</s>``) is never cut,
    so it stays readable.
    """
    raw = token_text(int(token))
    text = _visible(raw)
    if not text:
        text = f"⟨{int(token)}⟩"
    special = len(raw) <= 24 and raw.startswith("<") and raw.endswith(">") and " " not in raw
    if max_chars is not None and len(text) > max_chars and not special:
        text = text[: max_chars - 1] + "…"
    return html.escape(text, quote=False)


def floats(tensor) -> list[float]:
    return [float(v) for v in tensor.detach().cpu().tolist()]
