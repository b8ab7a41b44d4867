"""The spinner the torch.compile backend shows while it plans and compiles a graph."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from rich import get_console

from memplan.core.config import shows_progress


@contextlib.contextmanager
def spinner(doing: str, progress: bool) -> Iterator[None]:
    """A spinner saying what the backend is `doing`, on a terminal where progress is on:
    planning a graph and compiling it with Inductor, a few times over where the rounds
    plan it again, can take minutes in the user's first step. One rank of a distributed
    run shows it (shows_progress)."""
    console = get_console()
    if not (progress and console.is_terminal and shows_progress()):
        yield
        return
    with console.status(f"memplan: {doing}"):
        yield
