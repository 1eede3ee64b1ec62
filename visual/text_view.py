"""The generated text as HTML, each round's kept tokens coloured (draft tokens vs the bonus token)."""

from __future__ import annotations

import html

from .style import BONUS_COLOUR, TokenText

__all__ = ["text_view_html"]

# Two palettes, alternating per round: (draft token background, bonus token background).
TEXT_PALETTES = (("#d6e6ff", "#8fb8ff"), ("#dff3d6", "#9bd68a"))
NEWLINE_MARK = '<span class="tev-nl" style="opacity:0.45">↵</span>'


def _span(text: str, css_class: str, background: str, title: str, bold: bool = False, round_index: int | None = None) -> str:
    """One coloured token; a newline keeps its line break and shows a faint '↵' before it. A bold
    (bonus) token is also underlined in the tree figure's bonus colour, so it differs by more than weight."""
    weight = f"font-weight:600;border-bottom:2px solid {BONUS_COLOUR};" if bold else ""
    data = f' data-round="{round_index}"' if round_index is not None else ""
    body = html.escape(text).replace("\n", NEWLINE_MARK + "\n")
    return (
        f'<span{data} class="{css_class}" style="background:{background};{weight}border-radius:3px" '
        f'title="{html.escape(title)}">{body}</span>'
    )


def _round_spans(record, token_text: TokenText) -> list[str]:
    """Spans for one round's kept tokens: accepted draft tokens, then the bonus token."""
    draft_bg, bonus_bg = TEXT_PALETTES[record.index % 2]
    accepted = len(record.verdict.path) - 1
    spans = []
    for i, token in enumerate(record.emitted):
        text = token_text(int(token))
        if i < accepted:
            title = f"round {record.index}: draft token (accepted, depth {i + 1})"
            spans.append(_span(text, "tev-draft", draft_bg, title, round_index=record.index))
        else:
            title = f"round {record.index}: bonus token (drawn from the target at the exit node)"
            spans.append(_span(text, "tev-bonus", bonus_bg, title, bold=True, round_index=record.index))
    return spans


def text_view_html(records, token_text: TokenText = str, prompt_text: str = "") -> str:
    """HTML of the generated text, each round's tokens coloured.

    Args:
        records: a list of :class:`~tev.engine.round.RoundRecord`; ``record.emitted`` are the tokens
            kept (the last round may be cut at a stop): the first ``len(accepted)`` are
            accepted draft tokens, the rest is the bonus token.
        token_text: token id -> text (each token is decoded on its own).
        prompt_text: shown first, in grey, on its own lines above the generated text.

    Spans carry ``class="tev-draft"`` or ``"tev-bonus"``, ``data-round`` and a ``title``
    (hover) naming the round and the kind. Text is HTML-escaped; whitespace is kept
    (``white-space: pre-wrap``) and a newline token also shows a faint '↵'.
    """
    parts = []
    if prompt_text:
        parts.append(f'<div class="tev-prompt" style="color:#777;border-bottom:1px dashed #bbb;padding-bottom:4px;margin-bottom:6px" '
                     f'title="prompt">{html.escape(prompt_text)}</div>')
    for record in records:
        parts += _round_spans(record, token_text)
    legend = (
        '<div class="tev-legend" style="font-size:0.85em;color:#555;margin-bottom:4px">'
        + _span("accepted draft", "tev-key", TEXT_PALETTES[0][0], "accepted draft tokens")
        + " "
        + _span("bonus", "tev-key", TEXT_PALETTES[0][1], "bonus token from the target", bold=True)
        + " · the prompt is grey, above the line · colours alternate per round; hover a token for its round</div>"
    )
    body = "".join(parts)
    return f'{legend}<div class="tev-text" style="white-space:pre-wrap;font-family:ui-monospace,monospace;line-height:1.7">{body}</div>'
