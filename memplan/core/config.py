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
    `$LOCAL_RANK` and `$RANK`) only each node's rank 0 does, so that a node's terminal or
    log shows one bar, not one per rank; a launcher that sets only `$RANK`, its rank 0."""
    rank = os.environ.get("LOCAL_RANK", os.environ.get("RANK", "0"))
    return rank.strip() in ("", "0")
