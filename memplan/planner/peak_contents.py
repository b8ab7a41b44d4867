"""What a step holds at its allocator peak, and where each block was allocated.

The allocator's peak says how many bytes a step needed, not which. Where a measured peak
is above the prediction or the budget, the blocks live at that moment are what to look
at: this records one step's allocation events, finds the moment of the peak (above the
level at the step's start, as measure.py counts it), and groups the blocks live then by
size and by where they were allocated.

- On CPU, torch.profiler's allocation events (allocator.py); a block's site is the op
  that allocated it and the calls around it (`aten::empty_strided < aten::mm`, a compiled
  graph's region).
- On CUDA, the caching allocator's recorded history (`torch.cuda.memory.
  _record_memory_history`, with Python stacks); a block's site is the innermost Python
  frames outside torch's own files: Inductor's generated code names its buffer there.
"""

from __future__ import annotations

import collections
import gc
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from memplan.planner.allocator import recording

TORCH_FILES = str(Path(torch.__file__).parent)  # frames inside torch name no user code
FRAMES_KEPT = 3  # Python frames named per CUDA block
HISTORY_ENTRIES = 1_000_000  # CUDA allocator events kept: a large step's, and no more


@dataclass(frozen=True)
class LiveBlocks:
    """Blocks of one size, allocated at one site, live at the peak."""

    nbytes: int  # of each block
    count: int
    site: str  # innermost first, " < " between calls

    @property
    def total(self) -> int:
        return self.nbytes * self.count


def live_at_peak(step: Callable[[], object], device: torch.device) -> list[LiveBlocks]:
    """Run `step()` once and return the blocks it allocated that were live at its peak,
    grouped by size and site, the largest groups (by bytes) first. Blocks allocated before
    the step are not its own and are left out, as measure_peak leaves them out."""
    device = torch.device(device)
    gc.collect()
    gc.disable()  # garbage freed mid-step would show as frees of blocks it never made
    try:
        events = _cuda_events(step, device) if device.type == "cuda" else _cpu_events(step, device)
    finally:
        gc.enable()
    live: dict[int, tuple[int, str]] = {}
    level = peak = 0
    at_peak: dict[int, tuple[int, str]] = {}
    for nbytes, address, site in events:
        if nbytes > 0:
            live[address] = (nbytes, site)
            level += nbytes
        elif address in live:
            level -= live.pop(address)[0]
        if level > peak:
            peak, at_peak = level, dict(live)
    counted = collections.Counter(at_peak.values())
    groups = [LiveBlocks(nbytes, count, site) for (nbytes, site), count in counted.items()]
    return sorted(groups, key=lambda g: (-g.total, -g.nbytes, g.site))


def _cpu_events(step: Callable[[], object], device: torch.device) -> list[tuple[int, int, str]]:
    """(signed bytes, address, site) per allocation event of `step()`, in time order."""
    with recording(device) as recorded:
        step()
    return [(e.nbytes, e.ptr, " < ".join(e.calls)) for e in recorded.events]


def _cuda_events(step: Callable[[], object], device: torch.device) -> list[tuple[int, int, str]]:
    """(signed bytes, address, site) per block the caching allocator handed out or took
    back during `step()`, from its recorded history."""
    memory = torch.cuda.memory
    torch.cuda.synchronize(device)
    memory._record_memory_history(
        "all",
        context="alloc",
        stacks="python",
        max_entries=HISTORY_ENTRIES,
        device=device,
        clear_history=True,
    )
    try:
        step()
        torch.cuda.synchronize(device)
        snapshot = memory._snapshot(device)
    finally:
        memory._record_memory_history(None, device=device)
    index = device.index if device.index is not None else torch.cuda.current_device()
    events = []
    for entry in snapshot["device_traces"][index]:
        if entry["action"] == "alloc":
            events.append((entry["size"], entry["addr"], _site(entry.get("frames", []))))
        elif entry["action"] == "free_completed":
            events.append((-entry["size"], entry["addr"], ""))
    return events


def _site(frames: Iterable[dict[str, Any]]) -> str:
    """The innermost Python frames outside torch's files, as `file:line function`."""
    named = [
        f"{Path(f['filename']).name}:{f['line']} {f['name']}"
        for f in frames
        if not str(f["filename"]).startswith(TORCH_FILES)
    ]
    return " < ".join(named[:FRAMES_KEPT]) or "(no Python frame outside torch)"
