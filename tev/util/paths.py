"""Where the embedded assets live: ``assets/`` in the repository, or ``$TEV_ASSETS_DIR``.

Read at call time, so a test or a load test can point a server at another (e.g. quick-built)
assets folder without touching the shipped files.
"""

from __future__ import annotations

import os
from pathlib import Path

__all__ = ["REPO_ROOT", "assets_dir", "models_dir", "prompts_dir"]

REPO_ROOT = Path(__file__).resolve().parents[2]


def assets_dir() -> Path:
    return Path(os.environ.get("TEV_ASSETS_DIR") or REPO_ROOT / "assets")


def models_dir() -> Path:
    return assets_dir() / "models"


def prompts_dir() -> Path:
    return assets_dir() / "prompts"

