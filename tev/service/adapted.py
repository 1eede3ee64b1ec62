"""What the server keeps of workload adaptation for each browser session: the drafters adapted in
it, and the chat prompts it sent in Live (a workload of its own to adapt to).

An adapted drafter is served only to the session that made it ("adapted: <workload>" among its
drafters), kept in memory only (never written under ``assets/``), and at most
:data:`CAPACITY` are kept on the server, the least recently used dropped first. One adapted
drafter of the default pair holds 14 MB where bfloat16 serves (measured: its own weights and its
copy of the target's head rows for its 8,212-token draft vocabulary), about 29 MB where float32
does; :meth:`AdaptedDrafters.memory_bytes` says what the kept ones take. Its download is the folder ``--draft`` loads, zipped in a fresh
temporary folder.

An adapted drafter is served in Live only at the laws where it measured no worse than the base on
its held-out prompts (:meth:`AdaptedDrafters.serving`): fine-tuning on the target's answers sharpens
``q`` towards what those answers chose, which greedy decoding wants and sampling at T = 1 often does
not, so at a law where it measured a loss Live runs the shipped drafter it was adapted from and says why.

A script calling the page's API is a session of its own (its client's session hash), so it cannot
name the browser's drafter by its label: the session that made it is also shown its API name,
``"adapted: <workload> #<key>"`` (:meth:`AdaptedDrafters.api_name`), a random key that only that
session is told, which serves it to whoever sends it while the server keeps the drafter.
"""

from __future__ import annotations

import copy
import dataclasses
import secrets
import tempfile
import threading
import zipfile
from pathlib import Path

from tev.core.sampling import SamplingLaw
from tev.engine.block_drafter import BlockDrafter
from tev.engine.drafters import BlockTreeDrafter
from tev.engine.models import tree_drafter_of
from tev.engine.path_drafter import PathTreeDrafter
from tev.pipelines.workload_report import LAWS, MIN_VERDICT_PROMPTS
from tev.util.lru import LRU

__all__ = ["ADAPTED_PREFIX", "KEY_MARK", "CAPACITY", "MIN_ASKED", "is_adapted", "measured_law", "lost_laws", "AdaptedDrafters", "AskedPrompts"]

ADAPTED_PREFIX = "adapted: "
KEY_MARK = " #"  # between a label and its key in an API name
CAPACITY = 8  # adapted drafters the server keeps, all sessions together (at most about 230 MB in float32)
MIN_ASKED = 8  # Live prompts a session needs before they make a workload
ASKED_PER_SESSION = 64  # the most recent Live prompts kept per session
ASKED_SESSIONS = 256  # sessions whose Live prompts are kept (the least recently active dropped first)


def is_adapted(name) -> bool:
    """Whether a drafter choice names an adapted drafter (``"adapted: <workload>"``)."""
    return isinstance(name, str) and name.startswith(ADAPTED_PREFIX)


def measured_law(law: SamplingLaw) -> str:
    """The key of the workload verdict's law (:data:`~tev.pipelines.workload_report.LAWS`) nearest to
    ``law``: greedy for T = 0, else the sampled law of the nearest temperature (then top-p)."""
    if law.temperature == 0:
        return next(key for key, measured in LAWS.items() if measured.temperature == 0)
    sampled = [key for key, measured in LAWS.items() if measured.temperature > 0]
    return min(sampled, key=lambda key: (abs(LAWS[key].temperature - law.temperature), abs(LAWS[key].top_p - law.top_p)))


def lost_laws(gains: dict[str, dict]) -> list[str]:
    """The law keys where an adapted drafter measured a loss against the base (``gains``: per law
    key ``{"gain", "se"}``): the laws Live does not serve it at."""
    return [key for key, measured in gains.items() if measured["gain"] < 0]


@dataclasses.dataclass
class _Kept:
    drafter: BlockTreeDrafter | PathTreeDrafter
    key: str  # its API key
    gains: dict[str, dict]  # per law key of LAWS: {"gain", "se", "prompts"} over the base on the held-out prompts ({} when not measured)


class AdaptedDrafters:
    """The adapted drafters, keyed by (browser session, label); least recently used dropped first."""

    def __init__(self, capacity: int = CAPACITY):
        self.capacity = capacity
        self._kept: LRU[tuple[str, str], _Kept] = LRU(capacity)

    def keep(self, session: str, workload: str, model: BlockDrafter, gains: dict[str, dict] | None = None) -> str:
        """Keep a copy of ``model`` (served: eval mode, the serving precision) for ``session``
        under ``"adapted: <workload>"`` (replacing one of the same name, and its key); returns the label.
        ``gains``: its held-out gain over the base per law (a workload result's ``gain[law]["adapted"]``)."""
        label = ADAPTED_PREFIX + workload
        drafter = tree_drafter_of(copy.deepcopy(model).served(), name=label)
        self._kept.put((session, label), _Kept(drafter, secrets.token_urlsafe(12), dict(gains or {})))
        return label

    def serving(self, session: str, label: str, law: SamplingLaw, base) -> tuple[object, str | None]:
        """The drafter Live runs for the choice ``label`` at ``law``, and why when it is not that one:
        the adapted drafter where it measured no worse than the base at the nearest measured law
        (:func:`measured_law`), else ``base`` (the shipped drafter it was adapted from). ``ValueError`` as :meth:`drafter`."""
        kept = self._find(session, label)
        key = measured_law(law)
        if key not in lost_laws(kept.gains):
            return kept.drafter, None
        measured, shown = kept.gains[key], label.split(KEY_MARK)[0]
        prompts = measured.get("prompts")
        few = f" (from {prompts} held-out prompt{'s' * (prompts != 1)}: too few to tell a loss from the prompts drawn)" if prompts is not None and prompts < MIN_VERDICT_PROMPTS else ""
        if not few:  # the workload table's verdict on the same figure, in its words (a loss, or no measurable change)
            few = " (a loss)" if measured["gain"] < -2 * measured["se"] else " (within two standard errors: no measurable change, but below zero)"
        return base, (f"**{shown}** measured {100 * measured['gain']:+.0f}% ± {100 * measured['se']:.0f}% tokens per forward against the shipped "
                      f"drafter at {LAWS[key].describe()} on its held-out prompts{few}, so at this law Live runs the shipped **{base.name}** drafter "
                      "(an adapted drafter is served only at the laws where its held-out figure is not below zero, measurable or not)")

    def gains(self, session: str, label: str) -> dict[str, dict]:
        """The held-out gains per law ``label`` was kept with."""
        return dict(self._kept.peek((session, label)).gains)

    def _owner(self, session: str, label: str) -> tuple[str, str]:
        """The store's key of ``label`` for ``session`` (an API name resolves to its owner's)."""
        if KEY_MARK in label:
            label, key = label.rsplit(KEY_MARK, 1)
            session = next((owner for owner, kept in self._kept.keys() if kept == label and secrets.compare_digest(self._kept.peek((owner, kept)).key, key)), None)
        return session, label

    def api_name(self, session: str, label: str) -> str:
        """The name that serves ``session``'s drafter ``label`` to an API call from any session:
        ``"<label> #<key>"`` (``ValueError`` as :meth:`drafter` when none is kept)."""
        kept = self._kept.peek((session, label))
        if kept is None:
            self.drafter(session, label)  # raises, saying why
        return f"{label}{KEY_MARK}{kept.key}"

    def labels(self, session: str) -> list[str]:
        """The labels kept for ``session``, oldest first."""
        return [label for owner, label in self._kept.keys() if owner == session]

    def drafter(self, session: str, label: str) -> BlockTreeDrafter | PathTreeDrafter:
        """The drafter ``label`` of ``session``, or of any session when ``label`` is its API name
        (:meth:`api_name`); now the most recently used. ``ValueError`` saying why when there is none."""
        return self._find(session, label).drafter

    def _find(self, session: str, label: str) -> _Kept:
        """What is kept under ``label`` for ``session`` (or under its API name), now the most recently used."""
        session, label = self._owner(session, label)
        kept = self._kept.get((session, label)) if session is not None else None
        if kept is None:
            raise ValueError(f"drafter {label!r} is not kept for this browser session: adapted drafters are kept only for the session that "
                             f"made them (or to a call that names it with the key that session was shown), the {self.capacity} most recently used on "
                             "this server; run the workload adaptation again")
        return kept

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
        """Bytes the kept drafters hold: their weights and buffers, and their copies of the head rows
        (float or int8)."""
        models = [kept.drafter.model for kept in self._kept.values()]
        own = sum(t.numel() * t.element_size() for model in models for t in model.state_dict().values())
        copies = sum(t.numel() * t.element_size() for model in models for t in model._head_copies.values())
        return own + copies + sum(head.nbytes for model in models for head in model._int8_heads.values())


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
