"""The one check of a prompt's text, the one encode (raw or as a chat turn), and the token-id
check the decode loop needs.

Every caller (the command line, the app's service, the benchmarks, the decode loop) goes
through these; each raises ``ValueError`` with a message that says what to change.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

__all__ = ["ChatTemplate", "check_prompt_text", "check_prompt_ids", "encode_prompt", "encode_chat", "has_chat_template"]


def check_prompt_text(prompt, max_chars: int | None = None) -> str:
    """Return ``prompt`` unchanged if it is non-blank text the tokenizer can take.

    Refuses a non-string, a blank prompt, one over ``max_chars`` characters, a NUL
    character, and text that is not valid UTF-8 (an unpaired surrogate: what Python makes of
    undecodable command-line bytes, or a JSON ``\\ud800``).
    """
    if not isinstance(prompt, str):
        raise ValueError("the prompt must be text")
    if not prompt.strip():
        raise ValueError("the prompt is empty; type some text to continue")
    if max_chars is not None and len(prompt) > max_chars:
        raise ValueError(f"the prompt is {len(prompt)} characters; shorten it to at most {max_chars}")
    if "\x00" in prompt:
        raise ValueError("the prompt contains a NUL character; remove it")
    try:
        prompt.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("the prompt is not valid UTF-8 text (invalid Unicode: an unpaired surrogate); retype it or check the terminal's encoding") from None
    return prompt


def check_prompt_ids(prompt_ids: Iterable[int], max_tokens: int | None = None) -> list[int]:
    """The prompt's token ids as a list of ints; refuses none at all, or more than ``max_tokens``
    (the target's context)."""
    ids = [int(t) for t in prompt_ids]
    if not ids:
        raise ValueError("the prompt is empty; give at least one token")
    if max_tokens is not None and len(ids) > max_tokens:
        raise ValueError(f"the prompt is {len(ids)} tokens long but the target's context is {max_tokens}; shorten it")
    return ids


def encode_prompt(tokenizer, text: str, max_tokens: int | None = None, max_chars: int | None = None) -> list[int]:
    """Token ids of a checked prompt, starting with the BOS token when the tokenizer has one.

    Args:
        tokenizer: the target's tokenizer.
        text: the prompt (checked by :func:`check_prompt_text` with ``max_chars``).
        max_tokens: the target's context; a longer prompt is refused.
        max_chars: the longest prompt accepted, in characters (checked before tokenizing).

    Returns:
        ``list[int]`` of length ``<= max_tokens``; more than the BOS token alone.
    """
    check_prompt_text(text, max_chars)
    ids = tokenizer(text, add_special_tokens=False, verbose=False)["input_ids"]
    bos = tokenizer.bos_token_id
    if bos is not None and (not ids or ids[0] != bos):
        ids = [bos] + ids
    if len(ids) == 0 or (bos is not None and len(ids) == 1):
        raise ValueError("the prompt produced no tokens; type some text to continue")
    return check_prompt_ids(ids, max_tokens)


# --------------------------------------------------------------------------- chat
SENTINEL = "\u2063TEV-SENTINEL\u2063"


@dataclass(frozen=True)
class ChatTemplate:
    """The pieces of a target's chat template this module needs.

    Attributes:
        user_opening: the text of a conversation up to where the user's message starts
            (the template's default system turn, if any, then the user-turn header).
        end_of_turn: the token id that ends a turn (``<|im_end|>`` for ChatML templates).
        special_ids: the ids of the tokenizer's special tokens, less an unknown-text token that
            plain text becomes where the vocabulary lacks a character.
        own_special_ids: the special-token ids the template itself writes around one user
            message, the generation prompt included, in order (ChatML: ``<|im_start|>`` and
            ``<|im_end|>`` of the system turn, of the user turn, then ``<|im_start|>`` again).
    """

    user_opening: str
    end_of_turn: int
    special_ids: frozenset[int]
    own_special_ids: tuple[int, ...]

    @classmethod
    def of(cls, tokenizer) -> "ChatTemplate":
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("the target's tokenizer has no chat template; chat mode needs an instruct (chat) model; use raw continuation instead")
        rendered = tokenizer.apply_chat_template([{"role": "user", "content": SENTINEL}], tokenize=False, add_generation_prompt=True)
        opening, _, closing = rendered.partition(SENTINEL)
        closing_ids = tokenizer.encode(closing, add_special_tokens=False)
        if not closing_ids:
            raise ValueError("could not find the chat template's end-of-turn token")
        special = {i for i, token in tokenizer.added_tokens_decoder.items() if token.special} | set(tokenizer.all_special_ids)
        special -= set(tokenizer.encode(SENTINEL, add_special_tokens=False))  # an unknown-text token (a word-level vocabulary's [UNK]) comes from plain text
        own = tuple(t for t in tokenizer.encode(rendered, add_special_tokens=False) if t in special)  # the sentinel is plain text
        return cls(opening, closing_ids[0], frozenset(special), own)

    def prompt_ids(self, tokenizer, user_text: str) -> list[int]:
        """A conversation's ids up to the assistant's first token (the generation prompt added).

        The user's text is data: a special-token string in it (``<|im_end|>``, ``<|im_start|>``)
        is encoded as the ordinary characters it is made of, so a message cannot close its own
        turn and forge a system or assistant turn. Only the template's own markers become
        special tokens. transformers' ``sanitize_control_tokens`` does this without touching the
        shared tokenizer's settings (the app encodes for many users at once); a message without
        special-token strings gets the ids of the whole rendered conversation, as before (less
        the private-use characters U+F0000 and U+F0001, which the library marks with). The
        check below holds whatever the library does: the prompt's special tokens are exactly
        the template's own.
        """
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": user_text}], add_generation_prompt=True, tokenize=True, return_dict=False, sanitize_control_tokens=True
        )
        ids = [int(t) for t in ids]
        if tuple(t for t in ids if t in self.special_ids) != self.own_special_ids:
            raise ValueError("the message would be encoded with special tokens the chat template did not write; remove the special-token text (such as <|im_end|>) from it")
        return ids


def has_chat_template(tokenizer) -> bool:
    return bool(getattr(tokenizer, "chat_template", None))


def encode_chat(tokenizer, text: str, max_tokens: int | None = None, max_chars: int | None = None) -> list[int]:
    """Token ids of ``text`` sent as one user message through the tokenizer's chat template,
    with the assistant's generation prompt added (the model answers from there)."""
    check_prompt_text(text, max_chars)
    return check_prompt_ids(ChatTemplate.of(tokenizer).prompt_ids(tokenizer, text), max_tokens)
