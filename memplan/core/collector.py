"""Python's cyclic garbage collector paused around the solve: pure-Python work that makes
hundreds of thousands of short-lived, acyclic objects (schedules, traces, decision maps).

Each of them counts towards the collector's next scan, and in a process that holds a
model, its traced graphs and Inductor's state, the scans of that heap cost a large share
of the solve: greedy on a mixture-of-experts decoder's 1145-node graph, 6.8 s with the
collector against 4.5 s without, beside 0.5 million tracked objects (2026-12-06). What
the solve leaves in cycles (an exception kept with its traceback) is collected once the
collector runs again.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic collector off for the block, and back as it was after it (on, unless
    the caller had turned it off)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
