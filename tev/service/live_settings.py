"""One Live press as the page sends it, and what checking it gives.

The page's inputs, the app's ``/generate`` API parameters and the check that refuses a bad value
by name all read the field names of :class:`LiveSettings`, so a setting is named once, here (the
load test's own request type sends the same fields by name, with a load test's defaults; a test
holds the two to the same fields).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import NamedTuple

from tev.engine.decode import DecodeConfig

__all__ = ["LiveSettings", "LiveInput"]


@dataclass(frozen=True)
class LiveSettings:
    """A Live press's settings as sent, unchecked (values may be of any type: the check says what to change).

    ``budget`` is the node count B, or with ``auto`` the most a round may keep; ``compare_ar``: time plain
    decoding after the answer (the speed-up); ``chat``: the prompt is a user message (chat template)."""

    prompt: object = None
    drafter: object = None  # a drafter kind of the target, or a session's adapted drafter ("adapted: <workload>")
    verifier: object = None
    budget: object = None
    temperature: object = None
    max_new_tokens: object = None
    seed: object = None
    compare_ar: object = False
    chat: object = False
    top_p: object = 1.0
    top_k: object = 0
    auto: object = False

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """The fields in the page's order (the order of ``/generate``'s parameters)."""
        return tuple(field.name for field in dataclasses.fields(cls))

    @classmethod
    def defaults(cls) -> dict[str, object]:
        return {field.name: field.default for field in dataclasses.fields(cls)}


class LiveInput(NamedTuple):
    """A Live press's settings as checked (:meth:`~tev.service.service.ModelService.check_live`): the prompt's
    token ids and the generation's settings."""

    prompt_ids: tuple[int, ...]
    config: DecodeConfig
