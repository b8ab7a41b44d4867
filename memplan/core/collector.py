"""Python's cyclic garbage collector paused for a block, and restored as it was after it.

Two kinds of work want it paused. A step whose allocations are recorded: garbage from
earlier work, collected in the middle of the step, would show as frees of blocks the
step never allocated (planner/measure.py, planner/peak_contents.py). And the solve
(planner/solve.py): pure-Python work that makes hundreds of thousands of short-lived,
acyclic objects (schedules, traces, decision maps). Each of them counts towards the
collector's next scan, and in a process that holds a model, its traced graphs and
Inductor's state, the scans of that heap cost a large share of the solve: greedy on a
mixture-of-experts decoder's 1145-node graph, 6.8 s with the collector against 4.5 s
without, beside 0.5 million tracked objects (2026-12-06). What a paused block leaves in
cycles (an exception kept with its traceback) is collected once the collector runs again.
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
