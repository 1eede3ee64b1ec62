"""Stored results: every JSON result a command writes carries its kind and schema version, and is
read back by one reader that refuses any other.

A stored result is a JSON object whose first key is ``"schema": "<kind>/<version>"`` (e.g.
``"e2e/1"``). In every kind, ``tau`` is tokens emitted per target forward (the bonus included)
and ``tau_se`` (``se`` in a workload cell) its standard error over prompts; the mean block
length (accepted draft tokens + the bonus, tokens past a stop included) is
``mean_block_length``, and ``tau_bound`` is mean ``1 + C``, which bounds the mean block length.
A row measured before ``tau`` counted tokens per forward holds no ``tau``: only
``mean_block_length`` with its error over rounds, ``mean_block_length_se``.

Files written before results carried a schema, or under an older version of their kind's, are
rewritten once by ``python -m tev migrate PATH ...`` (:mod:`tev.pipelines.migrate`), which alone
knows their older key names.
"""

from __future__ import annotations

import json
from pathlib import Path

from tev.util.files import write_text_atomic

__all__ = ["SCHEMA_KEY", "VERSIONS", "MIGRATE_COMMAND", "StoredResultError", "schema_of", "stamped", "result_text", "write_result",
           "check_result", "read_result"]

SCHEMA_KEY = "schema"
MIGRATE_COMMAND = "python -m tev migrate"
# kind -> its current schema version; a reader accepts that version only (a version bump comes
# with its step in tev.pipelines.migrate)
VERSIONS = {
    "build": 1,  # build-assets: assets/models/build.json (the tiny pair)
    "training": 1,  # train-drafter: a drafter's training.json
    "exittrain": 1,  # exittrain --install / bench exittrain --install: a drafter's exittrain.json (and exittrain's report.json)
    "ablation": 1,  # bench exittrain: exittrain-eval.json
    "workload": 2,  # adapt --json: one pack's adaptation (2: minutes_allowed, the command is adapt)
    "workload-table": 2,  # bench workload-table --install: models/<pair>/workload-results.json (2: the commands are adapt)
    "e2e": 1,  # bench e2e --json
    "report": 1,  # bench report: report.json
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
    "measurement": 1,  # a documented measurement whose script is gone (docs/bf16-divergence.json, ...)
}


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
