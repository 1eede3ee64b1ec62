"""The training corpus: the Python standard library of the running interpreter.

Every Python install carries it, so the embedded models rebuild anywhere with no download.
Files are split into train and held-out by a hash of their relative path (deterministic,
independent of file order); held-out files are never trained on.
"""

from __future__ import annotations

import hashlib
import sysconfig
from dataclasses import dataclass
from pathlib import Path

__all__ = ["SourceFile", "stdlib_root", "list_stdlib_files", "split_of", "load_split", "HELD_OUT_PERCENT"]

HELD_OUT_PERCENT = 5
_SKIP_PARTS = {"site-packages", "dist-packages", "__pycache__", "idle_test", "venv"}


@dataclass(frozen=True)
class SourceFile:
    relative_path: str
    text: str


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def split_of(relative_path: str) -> str:
    """``"heldout"`` for about ``HELD_OUT_PERCENT`` percent of paths, else ``"train"``."""
    bucket = int(hashlib.sha256(relative_path.encode("utf-8")).hexdigest(), 16) % 100
    return "heldout" if bucket < HELD_OUT_PERCENT else "train"


def list_stdlib_files(root: Path | None = None) -> list[Path]:
    """Sorted ``.py`` files under the stdlib, without installed packages or caches."""
    root = root or stdlib_root()
    return sorted(p for p in root.rglob("*.py") if not (_SKIP_PARTS & set(p.relative_to(root).parts)) and p.is_file())


def load_split(split: str, root: Path | None = None, limit_files: int | None = None) -> list[SourceFile]:
    """The files of one split, read as UTF-8 (files that do not decode are skipped).

    Args:
        split: ``"train"`` or ``"heldout"``.
        limit_files: keep only the first this many files of the split (for quick builds).
    """
    if split not in ("train", "heldout"):
        raise ValueError(f"split must be 'train' or 'heldout', got {split!r}")
    root = root or stdlib_root()
    files = []
    for path in list_stdlib_files(root):
        relative = path.relative_to(root).as_posix()
        if split_of(relative) != split:
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if text.strip():
            files.append(SourceFile(relative, text))
        if limit_files is not None and len(files) >= limit_files:
            break
    if not files:
        raise FileNotFoundError(f"no readable {split} files under {root}")
    return files
