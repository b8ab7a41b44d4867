"""The one place memplan reads the environment: where its caches live, and which process
of a distributed run shows progress."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """`$MEMPLAN_CACHE_DIR` if set, else `~/.cache/memplan`."""
    return Path(os.environ.get("MEMPLAN_CACHE_DIR") or Path.home() / ".cache" / "memplan")


def shows_progress() -> bool:
    """Whether this process may draw progress bars and spinners: under torchrun (which sets
    `$RANK`) only rank 0 does, so that a terminal shows one bar, not one per rank."""
    return os.environ.get("RANK", "0").strip() in ("", "0")
