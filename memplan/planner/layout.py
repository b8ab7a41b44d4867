"""Placement of a schedule's allocations in one arena: where each tensor lives, not only
how many bytes are live.

The simulator gives every storage instance its size and the steps it is live in
(planner/simulate.py, `Allocation`). Laying them out is two-dimensional packing with
time fixed: each allocation gets an offset so that no two allocations live at the same
step overlap in address. The arena is the highest address used; the sum-of-live peak is
a lower bound on it (at the peak step every live byte needs its own address), and
`Layout.fragmentation` is how far above that bound the arena is.

Methods (`lay_out(..., method=)`):
- "size": largest first, each into the smallest gap that fits among the allocations
  placed so far that share a step with it (best fit; Zhang et al. 2019's static pool).
- "start": allocation order, each into the lowest gap that fits: what an online
  first-fit allocator that never moves a block does.
- "exact": CP-SAT with one no-overlap-2D constraint (time fixed, offset free), minimizing
  the arena, started from the better heuristic; proved optimal on small schedules.
- "best": the better heuristic, then "exact" where there are at most EXACT_LIMIT
  allocations, the heuristic is above the live peak and the caller asks for the proof
  (`prove`; a plan whose budget bounds live bytes only reports its arena, and does not).
No torch here: solvers may call it.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from memplan.core.errors import MemplanError, MissingDependency
from memplan.core.simulate import Allocation

METHODS = ("size", "start", "exact", "best")
HEURISTICS = ("size", "start")
# The CUDA caching allocator rounds every block up to a multiple of 512 bytes.
ALLOCATOR_ALIGNMENT = 512
# "best" runs the exact solve only up to this many allocations: beyond, CP-SAT rarely
# improves on the heuristics within seconds.
EXACT_LIMIT = 300
EXACT_TIME_LIMIT = 10.0


class LayoutError(MemplanError):
    """A layout in which two allocations live at the same step share addresses."""


@dataclass(frozen=True)
class Layout:
    """An offset per allocation (in the order given) and the arena they need."""

    method: str
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]  # each allocation's bytes rounded up to the alignment
    arena: int
    live_peak: int  # the most bytes live at one step, with the same rounding
    # "optimal": proved least (by CP-SAT, or by reaching the live peak); "feasible": a
    # CP-SAT point not proved optimal; "heuristic": a heuristic's arena above the peak.
    status: str = "heuristic"

    @property
    def fragmentation(self) -> float:
        """Arena bytes above the live peak, as a fraction of it."""
        return self.arena / self.live_peak - 1 if self.live_peak else 0.0


def live_peak(allocations: Sequence[Allocation], alignment: int = 1) -> int:
    """The most bytes live at one step: the least arena any layout can have."""
    if not allocations:
        return 0
    first = min(a.start for a in allocations)
    last = max(a.end for a in allocations)
    change = np.zeros(last - first + 1, dtype=np.int64)
    for a in allocations:
        if a.end > a.start:
            change[a.start - first] += _aligned(a.bytes, alignment)
            change[a.end - first] -= _aligned(a.bytes, alignment)
    return int(np.cumsum(change).max())


def lay_out(
    allocations: Sequence[Allocation],
    method: str = "best",
    *,
    alignment: int = 1,
    time_limit: float = EXACT_TIME_LIMIT,
    prove: bool = True,
) -> Layout:
    """Place every allocation; the offsets are multiples of `alignment`. Without `prove`,
    "best" is the better heuristic alone."""
    if method not in METHODS:
        raise MemplanError(f"layout method must be one of {', '.join(METHODS)}, got {method!r}")
    if not (isinstance(alignment, int) and alignment >= 1):
        raise MemplanError(f"alignment must be a positive integer, got {alignment!r}")
    for a in allocations:
        if a.end < a.start or a.start < -1 or a.bytes < 0:
            raise MemplanError(f"not an allocation's lifetime and size: {a}")
    if method in HEURISTICS:
        return _heuristic(allocations, method, alignment)
    best = min((_heuristic(allocations, h, alignment) for h in HEURISTICS), key=_arena)
    at_bound = best.arena == best.live_peak
    if method == "best" and (at_bound or len(allocations) > EXACT_LIMIT or not prove):
        return best
    return _exact(allocations, best, alignment, time_limit)


def check_layout(allocations: Sequence[Allocation], layout: Layout) -> None:
    """Raise LayoutError unless allocations live at a common step have disjoint addresses,
    every offset is non-negative and every allocation live at some step ends within the
    arena (one never live takes no memory)."""
    if len(layout.offsets) != len(allocations) or len(layout.sizes) != len(allocations):
        raise LayoutError(f"{len(layout.offsets)} offsets for {len(allocations)} allocations")
    for index, (offset, size) in enumerate(zip(layout.offsets, layout.sizes, strict=True)):
        never_live = allocations[index].end <= allocations[index].start
        outside = offset < 0 or (offset + size > layout.arena and not never_live)
        if outside or size < allocations[index].bytes:
            raise LayoutError(
                f"allocation {index} ({size} B at {offset}) is outside the arena of "
                f"{layout.arena} B or smaller than its {allocations[index].bytes} B"
            )
    # Two allocations that share a step both live at the later one's start, so checking
    # the allocations live at each start finds every overlap.
    live: list[int] = []
    for index in sorted(range(len(allocations)), key=lambda i: allocations[i].start):
        now = allocations[index].start
        live = [i for i in live if allocations[i].end > now]
        if allocations[index].end > now and layout.sizes[index] > 0:
            live.append(index)
        ordered = sorted(live, key=lambda i: layout.offsets[i])
        for below, above in itertools.pairwise(ordered):
            if layout.offsets[below] + layout.sizes[below] > layout.offsets[above]:
                raise LayoutError(
                    f"allocations {below} and {above} overlap in address at step {now}"
                )


def _aligned(size: int, alignment: int) -> int:
    return -(-size // alignment) * alignment


def _arena(layout: Layout) -> int:
    return layout.arena


def _heuristic(allocations: Sequence[Allocation], method: str, alignment: int) -> Layout:
    """Place allocations one by one ("size": largest first, best fit; "start": in
    allocation order, first fit) among the placed ones that share a step with each."""
    sizes = np.array([_aligned(a.bytes, alignment) for a in allocations], dtype=np.int64)
    starts = np.array([a.start for a in allocations], dtype=np.int64)
    ends = np.array([a.end for a in allocations], dtype=np.int64)
    if method == "size":
        order = sorted(range(len(allocations)), key=lambda i: (-sizes[i], starts[i], i))
    else:
        order = sorted(range(len(allocations)), key=lambda i: (starts[i], i))
    offsets = np.zeros(len(allocations), dtype=np.int64)
    placed = np.zeros(len(allocations), dtype=bool)
    for i in order:
        if sizes[i] == 0 or ends[i] <= starts[i]:
            continue
        sharing = np.flatnonzero(placed & (starts < ends[i]) & (starts[i] < ends))
        offsets[i] = _gap(offsets[sharing], sizes[sharing], int(sizes[i]), best=method == "size")
        placed[i] = True
    arena = int((offsets + sizes)[placed].max()) if placed.any() else 0
    bound = live_peak(allocations, alignment)
    return Layout(
        method=method,
        offsets=tuple(int(o) for o in offsets),
        sizes=tuple(int(s) for s in sizes),
        arena=arena,
        live_peak=bound,
        status="optimal" if arena == bound else "heuristic",  # no arena is below the peak
    )


def _gap(offsets: np.ndarray, sizes: np.ndarray, size: int, *, best: bool) -> int:
    """The offset of the smallest (best) or lowest (first) free gap of at least `size`
    bytes among the occupied [offset, offset + size) ranges; above them all if none."""
    order = np.argsort(offsets, kind="stable")
    top = 0
    chosen, chosen_room = None, math.inf
    for offset, occupied in zip(offsets[order], sizes[order], strict=True):
        room = int(offset) - top
        if room >= size and room < chosen_room:
            chosen, chosen_room = top, room
            if not best:
                break
        top = max(top, int(offset + occupied))
    return top if chosen is None else chosen


def _exact(
    allocations: Sequence[Allocation], start: Layout, alignment: int, time_limit: float
) -> Layout:
    """The least arena by CP-SAT, hinted with `start`; `start` if CP-SAT finds nothing."""
    try:
        from ortools.sat.python import cp_model
    except ImportError as error:  # pragma: no cover - ortools is a dependency
        raise MissingDependency("the exact layout needs OR-Tools: pip install ortools") from error
    placed = [i for i, a in enumerate(allocations) if start.sizes[i] > 0 and a.end > a.start]
    if not placed:
        return Layout("exact", start.offsets, start.sizes, start.arena, start.live_peak, "optimal")
    # Offsets are multiples of a common quantum: dividing by it keeps CP-SAT's numbers small.
    quantum = math.gcd(*(start.sizes[i] for i in placed), *(start.offsets[i] for i in placed))
    model = cp_model.CpModel()
    height = model.new_int_var(start.live_peak // quantum, start.arena // quantum, "arena")
    offset = {}
    times, spaces = [], []
    for i in placed:
        units = start.sizes[i] // quantum
        offset[i] = model.new_int_var(0, start.arena // quantum - units, f"offset{i}")
        model.add(offset[i] + units <= height)
        model.add_hint(offset[i], start.offsets[i] // quantum)
        a = allocations[i]
        times.append(model.new_fixed_size_interval_var(a.start, a.end - a.start, f"time{i}"))
        spaces.append(model.new_fixed_size_interval_var(offset[i], units, f"space{i}"))
    model.add_no_overlap_2d(times, spaces)
    model.add_hint(height, start.arena // quantum)
    model.minimize(height)
    solver = cp_model.CpSolver()
    # One worker and a deterministic time limit: the same layout for the same input, however
    # loaded the machine (a wall-clock limit would stop the search at different points).
    solver.parameters.max_deterministic_time = time_limit
    solver.parameters.num_workers = 1
    outcome = solver.solve(model)
    if outcome not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        return start
    offsets = list(start.offsets)
    for i in placed:
        offsets[i] = solver.value(offset[i]) * quantum
    return Layout(
        method="exact",
        offsets=tuple(offsets),
        sizes=start.sizes,
        arena=solver.value(height) * quantum,
        live_peak=start.live_peak,
        status="optimal" if outcome == cp_model.OPTIMAL else "feasible",
    )
