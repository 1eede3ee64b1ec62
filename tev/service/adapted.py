"""What the server keeps of workload adaptation for each browser session: the drafters adapted in
it, and the chat prompts it sent in Live (a workload of its own to adapt to).

An adapted drafter is served only to the session that made it ("adapted: <workload>" among its
drafters), kept in memory only (never written under ``assets/``), and at most
:data:`CAPACITY` are kept on the server, the least recently used dropped first. One adapted block
drafter of the default pair holds 14 MB where bfloat16 serves (measured: its own weights and its
copy of the target's head rows for its 8,212-token draft vocabulary), about 29 MB where float32
does; :meth:`AdaptedDrafters.memory_bytes` says what the kept ones take. Its download is the folder ``--draft`` loads, zipped in a fresh
temporary folder.
"""

from __future__ import annotations

import copy
import tempfile
import threading
import zipfile
from pathlib import Path

from tev.engine.block_drafter import BlockDrafter
from tev.engine.drafters import BlockTreeDrafter
from tev.util.lru import LRU

__all__ = ["ADAPTED_PREFIX", "CAPACITY", "MIN_ASKED", "is_adapted", "drafter_kind", "AdaptedDrafters", "AskedPrompts"]

ADAPTED_PREFIX = "adapted: "
CAPACITY = 8  # adapted drafters the server keeps, all sessions together (at most about 230 MB in float32)
MIN_ASKED = 8  # Live prompts a session needs before they make a workload
ASKED_PER_SESSION = 64  # the most recent Live prompts kept per session
ASKED_SESSIONS = 256  # sessions whose Live prompts are kept (the least recently active dropped first)


def is_adapted(name) -> bool:
    """Whether a drafter choice names an adapted drafter (``"adapted: <workload>"``)."""
    return isinstance(name, str) and name.startswith(ADAPTED_PREFIX)


def drafter_kind(name) -> str:
    """The drafter kind a choice names, for the checks that need one: an adapted drafter is a block
    drafter (which session's it is, the handler decides)."""
    return "block" if is_adapted(name) else name


class AdaptedDrafters:
    """The adapted drafters, keyed by (browser session, label); least recently used dropped first."""

    def __init__(self, capacity: int = CAPACITY):
        self.capacity = capacity
        self._kept: LRU[tuple[str, str], BlockTreeDrafter] = LRU(capacity)

    def keep(self, session: str, workload: str, model: BlockDrafter) -> str:
        """Keep a copy of ``model`` (served: eval mode, the serving precision) for ``session``
        under ``"adapted: <workload>"`` (replacing one of the same name); returns the label."""
        label = ADAPTED_PREFIX + workload
        drafter = BlockTreeDrafter(copy.deepcopy(model).served(), name=label)
        self._kept.put((session, label), drafter)
        return label

    def labels(self, session: str) -> list[str]:
        """The labels kept for ``session``, oldest first."""
        return [label for owner, label in self._kept.keys() if owner == session]

    def drafter(self, session: str, label: str) -> BlockTreeDrafter:
        """The drafter ``label`` of ``session`` (now the most recently used); ``ValueError``
        saying why when this session has none of that name."""
        drafter = self._kept.get((session, label))
        if drafter is None:
            raise ValueError(f"drafter {label!r} is not kept for this browser session: adapted drafters are kept only for the session that "
                             f"made them, the {self.capacity} most recently used on this server; run the workload adaptation again")
        return drafter

    def export(self, session: str, label: str) -> Path:
        """The drafter's folder (``drafter_config.json``, ``drafter.safetensors``: what
        ``--draft`` loads) zipped in a fresh temporary folder; returns the zip's path."""
        model = self.drafter(session, label).model
        folder = Path(tempfile.mkdtemp(prefix="tev-adapted-"))
        name = "".join(c if c.isalnum() or c in "-_" else "-" for c in label[len(ADAPTED_PREFIX):]) or "workload"
        model.save_pretrained(folder / f"drafter-{name}")
        path = folder / f"drafter-{name}.zip"
        with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
            for file in sorted((folder / f"drafter-{name}").iterdir()):
                archive.write(file, f"drafter-{name}/{file.name}")
        return path

    def memory_bytes(self) -> int:
        """Bytes the kept drafters hold: their weights and buffers, and their copies of the head rows."""
        models = [drafter.model for drafter in self._kept.values()]
        own = sum(t.numel() * t.element_size() for model in models for t in model.state_dict().values())
        return own + sum(t.numel() * t.element_size() for model in models for t in model._head_copies.values())


class AskedPrompts:
    """The chat prompts each browser session sent in Live, the most recent :data:`ASKED_PER_SESSION`
    per session (a repeat counts once), for :data:`ASKED_SESSIONS` sessions at most."""

    def __init__(self, per_session: int = ASKED_PER_SESSION, sessions: int = ASKED_SESSIONS):
        self.per_session, self.sessions = per_session, sessions
        self._asked: LRU[str, list[str]] = LRU(sessions)
        self._lock = threading.Lock()  # a session's list is read, changed and put back as one

    def add(self, session: str, prompt: str) -> None:
        with self._lock:
            prompts = [p for p in self._asked.peek(session, []) if p != prompt] + [prompt]
            self._asked.put(session, prompts[-self.per_session :])  # now the most recent session

    def get(self, session: str) -> list[str]:
        return list(self._asked.peek(session, []))
