"""The one place memplan reads the environment: where its caches live."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """`$MEMPLAN_CACHE_DIR` if set, else `~/.cache/memplan`."""
    return Path(os.environ.get("MEMPLAN_CACHE_DIR") or Path.home() / ".cache" / "memplan")
