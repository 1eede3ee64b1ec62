"""Stored results: every JSON result a command writes carries its kind and schema version, and is
read back by one reader that refuses any other.

A stored result is a JSON object whose first key is ``"schema": "<kind>/<version>"`` (e.g.
``"e2e/2"``). In every kind, ``tau`` is tokens emitted per target forward (the bonus included)
and ``tau_se`` (``se`` in a workload cell) its standard error over prompts; the mean block
length (accepted draft tokens + the bonus, tokens past a stop included) is
``mean_block_length``, and ``tau_bound`` is mean ``1 + C``, which bounds the mean block length.
A row measured before ``tau`` counted tokens per forward holds no ``tau``: only
``mean_block_length`` with its error over rounds, ``mean_block_length_se``, and it says so:
``"figure": "mean_block_length"``. A row that names no figure measured ``tau``. Readers ask
:func:`row_figure` (one row) or :func:`rows_figure` (a table) which figure to show, never which
keys a row happens to hold.

Files written before results carried a schema, or under an older version of their kind's, are
rewritten once by ``python -m tev migrate PATH ...`` (:mod:`tev.pipelines.migrate`), which alone
knows their older key names.
"""

from __future__ import annotations

import json
from pathlib import Path

from tev.util.files import write_text_atomic

__all__ = ["SCHEMA_KEY", "VERSIONS", "MIGRATE_COMMAND", "FIGURE_KEY", "TAU", "BLOCK_LENGTH", "StoredResultError", "schema_of", "stamped",
           "result_text", "write_result", "check_result", "read_result", "row_figure", "rows_figure"]

SCHEMA_KEY = "schema"
MIGRATE_COMMAND = "python -m tev migrate"
# kind -> its current schema version; a reader accepts that version only (a version bump comes
# with its step in tev.pipelines.migrate)
VERSIONS = {
    # (n: ...) says what version n changed; "rows name their figure": a row measured before tau counted tokens per
    # forward carries "figure": "mean_block_length" (FIGURE_KEY)
    "build": 2,  # build-assets: assets/models/build.json (the tiny pair) (2: rows name their figure)
    "training": 2,  # train-drafter: a drafter's training.json (2: rows name their figure; "resumed" always, null when the run did not say)
    "exittrain": 2,  # exittrain --install / bench exittrain --install: a drafter's exittrain.json (and exittrain's report.json) (2: rows name their figure)
    "ablation": 2,  # bench exittrain: exittrain-eval.json (2: rows name their figure)
    "workload": 3,  # adapt --json: one pack's adaptation (2: minutes_allowed, the command is adapt; 3: cells name their figure)
    "workload-table": 3,  # bench workload-table --install: models/<pair>/workload-results.json (2: the commands are adapt; 3: cells name their figure)
    "e2e": 2,  # bench e2e --json (2: rows name their figure)
    "report": 2,  # bench report: report.json (2: rows and cells name their figure)
    "reach": 1,  # bench reach --json
    "oracle-reach": 1,  # bench oracle-reach --json
    "adapted-coverage": 1,  # bench adapted-coverage --json
    "row-cost": 1,  # bench row-cost --json
    "data-writer": 1,  # bench data-writer --json
    "page-speed": 1,  # bench page-speed --json
    "page-load": 1,  # bench page-load --json
    "loadtest": 1,  # bench loadtest: loadtest.json
    "gpu-check": 2,  # bench gpu-check: gpu-check.json (2: seconds_allowed)
    "drafter-tau": 1,  # bench drafter-tau --json
    "workload-path": 2,  # bench workload-path --json (2: minutes_allowed)
    "verifiers": 1,  # bench verifiers --json
    "live-exittrain": 1,  # the ExitTrain tab's live mode: exittrain-live.json
    "measurement": 2,  # a documented measurement whose script is gone (docs/bf16-divergence.json, ...) (2: rows name their figure)
}
# what a row measured: its figure's key, named under FIGURE_KEY where it is not TAU
FIGURE_KEY, TAU, BLOCK_LENGTH = "figure", "tau", "mean_block_length"


class StoredResultError(ValueError):
    """A file that is not a stored result of the kind and version asked for."""


def schema_of(kind: str) -> str:
    """``"<kind>/<version>"``, the schema value of ``kind``'s current version."""
    if kind not in VERSIONS:
        raise KeyError(f"unknown result kind {kind!r}; kinds: {', '.join(VERSIONS)}")
    return f"{kind}/{VERSIONS[kind]}"


def stamped(kind: str, result: dict) -> dict:
    """``result`` with ``kind``'s schema as its first key (a copy)."""
    return {SCHEMA_KEY: schema_of(kind), **{k: v for k, v in result.items() if k != SCHEMA_KEY}}


def result_text(kind: str, result: dict, indent: int = 1, **options) -> str:
    """The JSON text of ``result`` stamped as ``kind`` (for writers that place the text themselves);
    ``options`` go to :func:`json.dumps` (e.g. ``default=str``)."""
    return json.dumps(stamped(kind, result), indent=indent, **options) + "\n"


def write_result(path: str | Path, kind: str, result: dict, indent: int = 1, **options) -> Path:
    """Write ``result`` stamped as ``kind`` to ``path`` (atomically: readers see the old or the new file)."""
    path = Path(path)
    write_text_atomic(path, result_text(kind, result, indent, **options))
    return path


def check_result(data, kind: str, source: str = "result") -> dict:
    """``data`` when it is a stored result of ``kind``'s current version, else a
    :class:`StoredResultError` that names what it is and the command that migrates it."""
    expected = schema_of(kind)
    found = data.get(SCHEMA_KEY) if isinstance(data, dict) else None
    if found == expected:
        return data
    if found is None:
        why = "it carries no schema (written before stored results were versioned)" if isinstance(data, dict) else "it is not a JSON object"
    else:
        why = f"it is {found!r}"
    raise StoredResultError(f"{source}: expected a stored {kind} result ({expected!r}), but {why}; "
                            f"an older result is rewritten once with `{MIGRATE_COMMAND} {source}`")


def read_result(path: str | Path, kind: str) -> dict:
    """The stored result of ``kind`` at ``path`` (its current schema version only)."""
    path = Path(path)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise StoredResultError(f"{path}: not JSON ({error})") from error
    return check_result(data, kind, str(path))


def row_figure(row: dict) -> str:
    """The key of the figure a stored row (or workload cell) measured: :data:`TAU`, or the figure it
    names under :data:`FIGURE_KEY` (:data:`BLOCK_LENGTH` in a row measured before tau counted tokens
    per forward). A row that lacks the figure it measured is refused."""
    figure = row.get(FIGURE_KEY, TAU)
    if figure not in row:
        raise StoredResultError(f"a stored row measured {figure!r} but holds no such key (keys: {', '.join(row)}); "
                                f"a row of an older result is rewritten once with `{MIGRATE_COMMAND} PATH`")
    return figure


def rows_figure(rows) -> str:
    """The figure a table of stored rows is shown in: :data:`TAU` when every row measured it, else
    :data:`BLOCK_LENGTH`, which every row holds."""
    return TAU if all(row_figure(row) == TAU for row in rows) else BLOCK_LENGTH
