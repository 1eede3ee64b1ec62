"""Crash-safe writes: a folder or file is either the old one or the complete new one.

A folder is written into a staging folder beside it and swapped in with two renames
(``destination -> .<name>.old-<pid>``, ``staging -> destination``); a file is written to a
temporary name and renamed over the old one. A writer killed between the two folder renames
leaves only the retired copy, which the next swap (or :func:`recover_folder`) restores.
A swap removes the staging leftovers of killed writers (their process is gone), never the
staging folder of a writer still running; two live writers of one destination should still
take a lock (the last swap wins).
"""

from __future__ import annotations

import os
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

__all__ = ["atomic_folder", "atomic_file", "write_text_atomic", "recover_folder"]


def _sibling(path: Path, kind: str, pid: int | str | None = None) -> Path:
    """``<parent>/.<name>.<kind>-<pid>`` (``pid`` ``"*"`` makes a glob pattern)."""
    return path.with_name(f".{path.name}.{kind}-{os.getpid() if pid is None else pid}")


def _writer_gone(leftover: Path) -> bool:
    """Whether the process that named ``leftover`` (``.<name>.<kind>-<pid>``) no longer runs."""
    pid = leftover.name.rsplit("-", 1)[-1]
    if not pid.isdigit():
        return True
    if int(pid) == os.getpid():
        return True  # this process's own leftover from an earlier write
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # another user's live process
        return False
    return False


def recover_folder(destination: Path) -> None:
    """Restore ``destination`` from a retired copy when a swap died between its renames, and
    drop retired copies that are no longer needed (a swap died while deleting one)."""
    destination = Path(destination)
    if not destination.parent.is_dir():
        return
    for retired in sorted(destination.parent.glob(_sibling(destination, "old", "*").name)):
        if destination.exists():
            shutil.rmtree(retired, ignore_errors=True)
        else:
            os.replace(retired, destination)


@contextmanager
def atomic_folder(destination: Path) -> Iterator[Path]:
    """Yield an empty staging folder; when the block ends without an error, swap it in for
    ``destination`` (which may or may not exist). On an error the staging folder is removed and
    ``destination`` is left as it was.

    Example::

        with atomic_folder(out / "drafter") as staging:
            drafter.save_pretrained(staging)
    """
    destination = Path(destination)
    destination.parent.mkdir(parents=True, exist_ok=True)
    recover_folder(destination)
    for leftover in destination.parent.glob(_sibling(destination, "new", "*").name):  # killed writers' partial folders
        if _writer_gone(leftover):
            shutil.rmtree(leftover, ignore_errors=True)
    staging = _sibling(destination, "new")
    staging.mkdir()
    try:
        yield staging
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)  # never leave a partial folder behind
        raise
    retired = _sibling(destination, "old")
    if destination.exists():
        os.replace(destination, retired)
    os.replace(staging, destination)
    shutil.rmtree(retired, ignore_errors=True)


@contextmanager
def atomic_file(path: Path) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; rename it over ``path`` when the block ends
    without an error (removed otherwise)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = _sibling(path, "tmp")
    try:
        yield temporary
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    os.replace(temporary, path)


def write_text_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` (UTF-8) so that readers see the old or the new file, never half."""
    with atomic_file(path) as temporary:
        temporary.write_text(text, encoding="utf-8")
