"""Reading the allocator, the measurement of truth: what an out-of-memory error counts.

On CPU, torch.profiler's allocation events (profile_memory=True): every block the
allocator hands out or takes back, on any thread, with its address, kernels' own buffers
included. A free counts only where the block was allocated inside what is measured, so
that garbage from before a step (freed during it) does not hide the step's own peak. On
CUDA, measure.py and profile.py read the caching allocator's counters instead
(memory_allocated and max_memory_allocated).
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from memplan import compat
from memplan.core.errors import AllocatorUnreadable

# How many of the calls around an allocation it keeps, innermost first: the op that
# allocated it, the ops that called it, and the region around them (a compiled graph).
CALLS_KEPT = 4
# What c10's CPU allocator logs (CPUAllocator.cpp, LOG(WARNING), the first time and every
# 1000th) when a block allocated before a memory-profiling session is freed inside it:
# every step measured frees such blocks (the last step's gradients, garbage of earlier
# work), and a free of a block not allocated inside is what `Recording` leaves out anyway.
UNKNOWN_SIZE = b"Memory block of unknown size was allocated before the profiling started"


@dataclass(frozen=True)
class Allocated:
    """One allocation event: when (ns), its signed size (a free is negative), the block,
    and the calls it was made in, innermost first (peak_contents.py names them)."""

    at: int
    nbytes: int
    ptr: int
    calls: tuple[str, ...] = ()


@dataclass
class Recording:
    """The allocation events of a profiled block in time order, and the ranges it opened
    with torch.profiler.record_function, by name."""

    events: list[Allocated] = field(default_factory=list)
    ranges: dict[str, tuple[int, int]] = field(default_factory=dict)

    def peak_above_start(self) -> int:
        """The most bytes of blocks allocated inside the block live at once."""
        return _peak_and_end(self.events)[0]

    def live_at_peak(self) -> list[Allocated]:
        """The allocations of the blocks live at that peak (the first moment it is reached)."""
        reached = _peak_and_end(self.events)[2]
        live: dict[int, Allocated] = {}
        for event in self.events[:reached]:
            if event.nbytes > 0:
                live[event.ptr] = event
            else:
                live.pop(event.ptr, None)
        return list(live.values())

    def transients(self) -> dict[str, int]:
        """Per range: the most bytes of blocks allocated inside it live at once, above what
        is left at its end: the bytes a kernel held inside itself beyond its outputs."""
        times = [e.at for e in self.events]
        found = {}
        for name, (start, end) in self.ranges.items():
            peak, left, _ = _peak_and_end(
                self.events[bisect_left(times, start) : bisect_right(times, end)]
            )
            found[name] = peak - left
        return found


def _peak_and_end(events: list[Allocated]) -> tuple[int, int, int]:
    """The most bytes of the blocks allocated in `events` live at once, the bytes live at
    the end, and how many events it takes to first reach that peak."""
    live: dict[int, int] = {}
    level = peak = reached = 0
    for count, event in enumerate(events, start=1):
        if event.nbytes > 0:
            live[event.ptr] = event.nbytes
            level += event.nbytes
            if level > peak:
                peak, reached = level, count
        elif event.ptr in live:
            level -= live.pop(event.ptr)
    return peak, level, reached


def readable() -> bool:
    """Whether `recording` can run now: not inside another torch.profiler session (a
    user's, around a training step that compiles). Kineto records one session at a time;
    one started inside another ends the outer one's recording and its events are lost."""
    return not compat.profiler_running()


@contextlib.contextmanager
def recording(
    device: torch.device, marked: str | None = None, *, with_calls: bool = False
) -> Iterator[Recording]:
    """Record `device`'s allocation events inside the block (CPU), and the ranges opened
    with a name that starts with `marked`; `with_calls`, each allocation with the calls
    it was made in (a walk up the event tree per allocation: only for who asks). Kineto's
    start and stop lines on stderr are held back: a user's terminal is no place for them.
    Raises AllocatorUnreadable, starting nothing, inside another profiler session."""
    if not readable():
        raise AllocatorUnreadable(
            "cannot read the CPU allocator inside a running torch.profiler session: a "
            "second session would end it and lose its events; measure outside it"
        )
    profiler = torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True
    )
    with _stderr_held_back(_every_line):
        profiler.__enter__()
    found = Recording()
    try:
        with _stderr_held_back(_unknown_size):
            yield found
    finally:
        with _stderr_held_back(_every_line):
            profiler.__exit__(None, None, None)
    allocation = compat.allocation_event()
    pending = list(profiler.profiler.kineto_results.experimental_event_tree())
    while pending:
        event = pending.pop()
        pending.extend(event.children)
        if event.tag == allocation:
            fields = event.extra_fields
            if _on(fields.device, device):
                calls = _calls(event.parent) if with_calls else ()
                found.events.append(
                    Allocated(event.start_time_ns, fields.alloc_size, fields.ptr, calls)
                )
        elif marked is not None and event.name.startswith(marked):
            found.ranges[event.name] = (event.start_time_ns, event.end_time_ns)
    found.events.sort(key=lambda e: e.at)


def _calls(event: Any) -> tuple[str, ...]:
    """The names of `event` and the events around it, innermost first, up to CALLS_KEPT."""
    names = []
    while event is not None and len(names) < CALLS_KEPT:
        names.append(event.name)
        event = event.parent
    return tuple(names)


def _on(actual: torch.device, wanted: torch.device) -> bool:
    return actual.type == wanted.type and wanted.index in (None, actual.index)


def _every_line(line: bytes) -> bool:
    return True


def _unknown_size(line: bytes) -> bool:
    return UNKNOWN_SIZE in line


@contextlib.contextmanager
def _stderr_held_back(dropped: Callable[[bytes], bool]) -> Iterator[None]:
    """Hold this process's stderr (file descriptor 2, which C++ writes to) in a file inside
    the block, and pass its lines on after it, but those `dropped` says to drop."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            kept = b"".join(line for line in held if not dropped(line))
            while kept:
                kept = kept[os.write(2, kept) :]
