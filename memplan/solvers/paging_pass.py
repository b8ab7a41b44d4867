"""Paging instead of recomputing, on a schedule of any size: a pass over a sequence that
replaces recomputations by a copy paged out to the host and back.

Where the exact paging model (solvers/cpsat_paging.py) is too big to solve, a remat
schedule from the window search still recomputes where a transfer could bring the value
back for free: the copy stream is idle while the compute stream works. For each
recomputation, most expensive first, the pass pages the value out right after the
computation whose copy the recomputation replaces (unless a host copy already exists),
starts paging it in as late as lets it land before it is read (by the step times the
simulator gives), and waits for it where it was recomputed. Recomputations that then feed
nothing (a recomputed chain's ancestors) are dropped. Each change is kept only if the
simulator accepts the whole schedule, within the budget, and it is faster, stalls
included: the pass never makes a schedule slower or invalid.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from memplan.core.errors import InvalidSchedule
from memplan.core.graph import (
    Compute,
    Free,
    Graph,
    Offload,
    Prefetch,
    Schedule,
    Step,
    Wait,
    with_frees,
)
from memplan.core.simulate import MemoryTrace, simulate


@dataclass(eq=False)
class _Event:
    """One step of the sequence being edited; compared by identity, so that a
    recomputation keeps its name while steps around it come and go."""

    kind: type[Step]
    node: int

    def step(self) -> Step:
        return self.kind(self.node)


def page_recomputations(
    graph: Graph, schedule: Schedule, budget: int, bandwidth: float, deadline: float
) -> Schedule:
    """`schedule` with recomputations replaced by paging where that is faster within
    `budget` over a host link of `bandwidth` bytes per time unit (see the module); the
    schedule itself where nothing is, or when `deadline` (perf_counter) passes first."""
    events = [_Event(type(s), s.node) for s in schedule.steps if not isinstance(s, Free)]
    start = best = _judge(graph, events, budget, bandwidth)
    if best is None:
        return schedule
    seen: set[int] = set()
    recomputed = []
    for event in events:
        if event.kind is Compute and event.node in seen and graph[event.node].offloadable:
            recomputed.append(event)
        if event.kind in (Compute, Wait):
            seen.add(event.node)
    recomputed.sort(key=lambda e: -graph[e.node].time)
    clock = _clock_by_event(events, *best)
    for target in recomputed:
        if time.perf_counter() > deadline:
            break
        if not any(e is target for e in events):
            continue  # dropped with an earlier change
        for edited in _paged(graph, events, target, clock, bandwidth):
            judged = _judge(graph, edited, budget, bandwidth)
            if judged is not None and judged[1].time < best[1].time:
                events, best = edited, judged
                clock = _clock_by_event(events, *best)
                break
    return schedule if best is start else best[0]


def _paged(
    graph: Graph,
    events: list[_Event],
    target: _Event,
    clock: dict[_Event, float],
    bandwidth: float,
) -> list[list[_Event]]:
    """`events` with the recomputation `target` replaced by a page-in (and a page-out
    after the copy before it, where the host has none yet), timed by the current
    schedule's `clock`: the page-in started where it lands in time (no earlier than the
    old copy's last read, after which it is freed), halfway from there to the wait, and
    at the wait, which hold its bytes for less and stall instead; none where no earlier
    copy exists."""
    v = target.node
    at = next(i for i, e in enumerate(events) if e is target)
    made = max(
        (i for i in range(at) if events[i].node == v and events[i].kind in (Compute, Wait)),
        default=None,
    )
    if made is None:
        return []
    edited = list(events)
    edited[at] = _Event(Wait, v)
    last_read = max((i for i in range(made + 1, at) if _reads(graph, events[i], v)), default=made)
    if not any(e.kind is Offload and e.node == v for e in events[:at]):
        edited.insert(made + 1, _Event(Offload, v))
        at, last_read = at + 1, last_read + 1
    # The latest start that lands in time: the compute time between it and the wait at
    # least the transfer's.
    needed = graph[v].bytes / bandwidth
    ready = clock[target] - graph[v].time  # when the recomputation started
    on_time = at
    while on_time > last_read + 1 and ready - clock[edited[on_time - 1]] < needed:
        on_time -= 1
    starts = sorted({on_time, (on_time + at) // 2, at})
    return [
        _drop_unread(
            graph, [*edited[:start], _Event(Prefetch, v), *edited[start:]], set(graph[v].inputs)
        )
        for start in starts
    ]


def _clock_by_event(
    events: list[_Event], schedule: Schedule, trace: MemoryTrace
) -> dict[_Event, float]:
    """Each event's compute-stream time after it, read from the trace of its schedule
    (whose Free steps, inserted by with_frees, are skipped)."""
    clocks = [
        c for s, c in zip(schedule.steps, trace.clock, strict=True) if not isinstance(s, Free)
    ]
    return dict(zip(events, clocks, strict=True))


def _reads(graph: Graph, event: _Event, v: int) -> bool:
    """Whether `event` reads the device copy of v: a computation taking it, or its
    page-out."""
    return (event.kind is Compute and v in graph[event.node].inputs) or (
        event.kind is Offload and event.node == v
    )


def _drop_unread(graph: Graph, events: list[_Event], suspects: set[int]) -> list[_Event]:
    """`events` without recomputations of `suspects` (and, as those go, of their inputs)
    whose copy nothing reads before it is made again or the schedule ends (outputs are
    read at the end); every node keeps one computation."""
    outputs = set(graph.outputs)
    while suspects:
        u = suspects.pop()
        computes = [i for i, e in enumerate(events) if e.kind is Compute and e.node == u]
        for i in reversed(list(computes)):
            if len(computes) > 1 and not _read_before_remade(graph, events, i, outputs):
                del events[i]
                computes.remove(i)
                suspects.update(graph[u].inputs)
    return events


def _read_before_remade(graph: Graph, events: list[_Event], at: int, outputs: set[int]) -> bool:
    v = events[at].node
    for e in events[at + 1 :]:
        if e.node == v and e.kind in (Compute, Wait):
            return False
        if _reads(graph, e, v):
            return True
    return v in outputs


def _judge(
    graph: Graph, events: list[_Event], budget: int, bandwidth: float
) -> tuple[Schedule, MemoryTrace] | None:
    """The schedule of `events` and its trace, or None where the simulator rejects it or
    it peaks over `budget`."""
    schedule = Schedule(tuple(with_frees(graph, (e.step() for e in events))))
    try:
        return schedule, simulate(graph, schedule, bandwidth=bandwidth, budget=budget)
    except InvalidSchedule:
        return None
