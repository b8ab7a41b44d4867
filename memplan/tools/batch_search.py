"""The search for a method's largest batch under a memory cap and a step-time overhead
limit, over any function that tries one batch (tools/maxbatch.py runs the real ones).
No torch here: the CLI reads its methods and defaults without loading it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

METHODS = ("eager", "pytorch", "memplan")
DEFAULT_OVERHEAD = 0.25


@dataclass(frozen=True)
class Probe:
    """One batch size tried: whether it fit, with which setting, and why not if not."""

    batch: int
    fits: bool
    setting: str = ""  # PyTorch's activation budget or memplan's solver that fit
    step_seconds: float | None = None
    reason: str = ""


@dataclass(frozen=True)
class MaxBatch:
    """A method's largest batch under the cap, and every probe on the way."""

    method: str
    cap_bytes: int
    batch: int  # 0: not even the first batch fits
    step_seconds: float | None
    setting: str
    probes: list[Probe] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "cap_bytes": self.cap_bytes,
            "batch": self.batch,
            "step_seconds": self.step_seconds,
            "setting": self.setting,
            "probes": [p.__dict__ for p in self.probes],
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> MaxBatch:
        """The search result that to_json wrote."""
        probes = [Probe(**p) for p in data["probes"]]
        return cls(**{**data, "probes": probes})


def search(
    method: str,
    attempt: Callable[[int], Probe],
    cap_bytes: int,
    start: int,
    limit: int,
    on_probe: Callable[[str, Probe], None] | None,
) -> MaxBatch:
    """The largest batch that runs under the cap and within the overhead limit.

    Two searches, because the two limits move differently with the batch. Memory grows
    with it, so whether a step runs under the cap at all is searched by doubling from
    `start` and bisecting. Time per sample falls as the batch grows, until the cap forces
    recomputation, so a batch too slow at `start` may be fast enough higher up: the
    largest fast-enough batch is then bisected between the largest fast one found and the
    largest that runs.
    """
    probes: dict[int, Probe] = {}

    def probe(batch: int) -> Probe:
        if batch not in probes:
            probes[batch] = attempt(batch)
            if on_probe is not None:
                on_probe(method, probes[batch])
        return probes[batch]

    def runs(batch: int) -> bool:  # under the cap, whatever its time
        found = probe(batch)
        return found.fits or found.step_seconds is not None

    top = largest(runs, start, limit, 0)
    if top and not probe(top).fits:
        fast = [b for b, found in probes.items() if found.fits and b < top]
        top = largest(lambda b: probe(b).fits, top, top, max(fast, default=0))
    best = probes.get(top)
    every = list(probes.values())  # in the order they were tried
    if best is None or not best.fits:
        return MaxBatch(method, cap_bytes, 0, None, "", every)
    return MaxBatch(method, cap_bytes, best.batch, best.step_seconds, best.setting, every)


def largest(holds: Callable[[int], bool], start: int, limit: int, low: int) -> int:
    """The largest batch up to `limit` for which `holds`, taken to hold up to some batch
    and not above it: double from `start` while it holds, then bisect above `low` (a
    batch known to hold, 0 for none) and below the first that does not."""
    batch = start
    while batch <= limit and holds(batch):
        low, batch = batch, batch * 2
    high = min(batch, limit + 1)
    while high - low > 1:
        middle = (low + high) // 2
        if holds(middle):
            low = middle
        else:
            high = middle
    return low
