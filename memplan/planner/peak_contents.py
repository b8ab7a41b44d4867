"""What a step holds at its allocator peak, and where each block was allocated.

The allocator's peak says how many bytes a step needed, not which. Where a measured peak
is above the prediction or the budget, the blocks live at that moment are what to look
at: this records one step's allocation events, finds the moment of its peak above the
level at its start (blocks allocated before the step are left out, as measure.py's CPU
reading leaves them out), and groups the blocks live then by size and by where they were
allocated.

- On CPU, torch.profiler's allocation events (allocator.py); a block's site is the op
  that allocated it and the calls around it (`aten::empty_strided < aten::mm`, a compiled
  graph's region).
- On CUDA, the caching allocator's recorded history (`torch.cuda.memory.
  _record_memory_history`, with Python stacks), a block freed when its free is requested
  (where `max_memory_allocated` counts it freed); a block's site is the innermost Python
  frames outside torch's own files: Inductor's generated code names its buffer there. The
  recording replaces any the user had on, and is off afterwards.
"""

from __future__ import annotations

import collections
import os
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from memplan.core.collector import collector_paused
from memplan.core.errors import MemplanWarning
from memplan.planner.allocator import Allocated, Recording, recording

# Frames inside torch name no user code (the separator: not torchvision's files).
TORCH_FILES = str(Path(torch.__file__).parent) + os.sep
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
    grouped by size and site, the largest groups (by bytes) first."""
    device = torch.device(device)
    with collector_paused():  # garbage freed mid-step would show as frees of blocks it never made
        recorded = _cuda_recording(step, device) if device.type == "cuda" else _cpu(step, device)
    counted = collections.Counter(
        (block.nbytes, " < ".join(block.calls)) for block in recorded.live_at_peak()
    )
    groups = [LiveBlocks(nbytes, count, site) for (nbytes, site), count in counted.items()]
    return sorted(groups, key=lambda g: (-g.total, -g.nbytes, g.site))


def _cpu(step: Callable[[], object], device: torch.device) -> Recording:
    """The profiler's allocation events of `step()`, each with the calls that made it."""
    with recording(device, with_calls=True) as found:
        step()
    return found


def _cuda_recording(step: Callable[[], object], device: torch.device) -> Recording:
    """The blocks the caching allocator handed out or took back during `step()`, from its
    recorded history, in order; each allocation with its Python frames."""
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
    trace = snapshot["device_traces"][index]
    if len(trace) >= HISTORY_ENTRIES:
        warnings.warn(
            f"the step made over {HISTORY_ENTRIES} allocator events; the earliest were "
            "overwritten, so blocks live at the peak may be missing",
            MemplanWarning,
            stacklevel=3,
        )
    found = Recording()
    for order, entry in enumerate(trace):
        if entry["action"] == "alloc":
            frames = _frames(entry.get("frames", []))
            found.events.append(Allocated(order, entry["size"], entry["addr"], frames))
        elif entry["action"] == "free_requested":
            found.events.append(Allocated(order, -entry["size"], entry["addr"]))
    return found


def _frames(frames: Iterable[dict[str, Any]]) -> tuple[str, ...]:
    """The innermost Python frames outside torch's files, as `file:line function`."""
    named = [
        f"{Path(f['filename']).name}:{f['line']} {f['name']}"
        for f in frames
        if not str(f["filename"]).startswith(TORCH_FILES)
    ]
    return tuple(named[:FRAMES_KEPT]) or ("(no Python frame outside torch)",)
