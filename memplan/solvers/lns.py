"""Large-neighbourhood search for the general problem: CP-SAT re-solves windows of a
sequence with the rest held fixed.

Moccasin's whole model has a copy interval per node and a read literal per edge and copy
pair; from a few hundred nodes CP-SAT builds it and finds nothing better than its hint
within a minute. A window of WINDOW computations is small enough to solve exactly in
under a second, and the schedules that come out of the director waste time in windows:
a recomputation made to carry a value past the peak, where another order in the same
steps would need none.

The window model (Checkmate's matrices, on the window's slots only). Slots 0..L-1 each
compute at most one node of a candidate set C (the window's own computations, the
values the suffix reads on entry, and the inputs of both); `resident[u][s]` says a copy of
u is held at slot s, which needs a copy at s-1 or u's computation at s; a node computed at
s needs its inputs resident at s; the resident bytes and the computing node's workspace
stay within the budget at every slot. Before slot 0 a copy exists only where the prefix
left one (`carry[u]`), and carrying it keeps it resident through the prefix from its last
read there, so the prefix steps it crosses are constrained too. After the last slot the
suffix reads what it reads on entry, so those values must be resident then; the suffix's
own memory does not depend on the window. Nodes the prefix and suffix never compute are
computed in the window. The objective is the window's compute time.

A copy held in the model from its computation through its last read covers what the
literature's rules hold (memplan/core/remat.py), so a window solution scored by remat.score
peaks no higher than the model says. Every window's sequence is judged again in full by
the simulator and kept only if it is valid, within the budget and faster: a window can
never make the schedule worse or invalid.

Windows are tried where the recomputation time is largest, each at most once for a given
content, until none is left or the deadline passes. A window's search is bounded by
CP-SAT's deterministic time on one worker, so the same sequence, graph and seed give the
same result whenever the search ends before its deadline.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from memplan.core import remat
from memplan.core.errors import InvalidSchedule
from memplan.core.graph import Graph
from memplan.core.simulate import simulate
from memplan.solvers.cpsat_model import cp_model_module

if TYPE_CHECKING:
    from ortools.sat.python import cp_model

# Computations re-solved at once, and the idle slots the window may fill with
# recomputations beyond its own.
WINDOW = 40
EXTRA_SLOTS = 12
# CP-SAT's deterministic time per window (two to four seconds of one worker here).
WINDOW_WORK = 2.0
# Integer units of the most expensive candidate's time in the objective.
TIME_UNITS = 1000


@dataclass(frozen=True)
class Search:
    """What one search did: windows solved, and windows that made the sequence faster."""

    windows: int
    improved: int


def improve(
    graph: Graph,
    sequence: Sequence[int],
    budget: int,
    deadline: float,
    seed: int = 0,
    window: int = WINDOW,
) -> tuple[list[int], Search]:
    """A sequence at most as slow as `sequence` (valid and within `budget`, which it must
    be), with windows of `window` computations re-solved by CP-SAT until none is left or
    `deadline` passes."""
    best = list(sequence)
    best_time = remat.score(graph, best).duration
    tried: set[tuple[int, ...]] = set()
    windows = improved = 0
    while time.perf_counter() < deadline:
        start = _next_window(graph, best, tried, window)
        if start is None:
            break
        stop = min(len(best), start + window)
        tried.add((start, *best[start:stop]))
        windows += 1
        solved = _solve_window(graph, best, start, stop, budget, deadline, seed)
        if solved is None:
            continue
        candidate = best[:start] + solved + best[stop:]
        duration = _judged(graph, candidate, budget)
        if duration is not None and duration < best_time:
            best, best_time = candidate, duration
            improved += 1
    return best, Search(windows, improved)


def _judged(graph: Graph, sequence: list[int], budget: int) -> float | None:
    """The sequence's duration where the simulator accepts it within `budget` (it also
    holds a graph's outputs to the end, which the window model does not know), else None:
    a window the model allowed and the judge refuses is never kept."""
    try:
        simulate(graph, remat.to_schedule(graph, sequence), budget=budget)
    except InvalidSchedule:  # invalid, or over the budget
        return None
    return remat.score(graph, sequence).duration


def _next_window(
    graph: Graph, sequence: list[int], tried: set[tuple[int, ...]], window: int
) -> int | None:
    """The start of the untried window of `window` steps (starting at multiples of half
    that) with the most recomputation time in it; None where no window recomputes."""
    seen: set[int] = set()
    recomputed = [0.0] * len(sequence)
    for step, v in enumerate(sequence):
        if v in seen:
            recomputed[step] = graph[v].time
        seen.add(v)
    best, best_time = None, 0.0
    for start in range(0, len(sequence), max(1, window // 2)):
        stop = min(len(sequence), start + window)
        spent = sum(recomputed[start:stop])
        if spent > best_time and (start, *sequence[start:stop]) not in tried:
            best, best_time = start, spent
    return best


@dataclass
class _Boundary:
    """What the window's surroundings fix: for the prefix, where each node's latest copy
    was last read (or made) there and the memory of its steps without any carry; for the
    suffix, the nodes it reads on entry; and the nodes only the window computes."""

    last_read: dict[int, int]  # node -> prefix step of its latest copy's last prefix read
    prefix_memory: list[int]
    entry: set[int]
    only_here: set[int]


def _boundary(graph: Graph, sequence: list[int], start: int, stop: int) -> _Boundary:
    prefix, suffix = sequence[:start], sequence[stop:]
    copy_end = remat.copy_ends(graph, prefix)
    latest = {v: step for step, v in enumerate(prefix)}
    entry: set[int] = set()
    made: set[int] = set()
    for v in suffix:
        entry.update(u for u in graph[v].inputs if u not in made)
        made.add(v)
    return _Boundary(
        last_read={v: copy_end[step] for v, step in latest.items()},
        prefix_memory=remat.memory_by_step(graph, prefix, copy_end),
        entry=entry,
        only_here=set(sequence[start:stop]) - set(prefix) - made,
    )


def _solve_window(
    graph: Graph,
    sequence: list[int],
    start: int,
    stop: int,
    budget: int,
    deadline: float,
    seed: int,
    extra: int = EXTRA_SLOTS,
) -> list[int] | None:
    """The fastest computations for steps start..stop (with up to `extra` more) that
    CP-SAT finds, or None where it finds none faster than the window's own."""
    cp = cp_model_module()
    inside = sequence[start:stop]
    edge = _boundary(graph, sequence, start, stop)
    core = set(inside) | {u for v in inside for u in graph[v].inputs}
    # Values the suffix reads that the window neither reads nor makes pass through it
    # carried: recomputing them here would need inputs that nothing here holds.
    passing = sorted(edge.entry - core)
    held = sorted(core)
    # A node can be computed here where all its inputs can be held here.
    computable = [v for v in held if set(graph[v].inputs) <= core]
    slots = len(inside) + extra
    largest = max(graph[v].time for v in computable) or 1.0
    cost = {v: round(graph[v].time / largest * TIME_UNITS) for v in computable}

    m = cp.CpModel()
    x = {(s, v): m.new_bool_var(f"x{s}_{v}") for s in range(slots) for v in computable}
    resident = {(s, u): m.new_bool_var(f"r{s}_{u}") for s in range(slots) for u in held}
    carry: dict[int, cp_model.IntVar | int] = {
        u: m.new_bool_var(f"c{u}") for u in held if u in edge.last_read
    }
    carry.update(dict.fromkeys(passing, 1))
    room = budget - sum(graph[u].bytes for u in passing)
    busy = [sum(x[s, v] for v in computable) for s in range(slots)]
    for s in range(slots):
        m.add(busy[s] <= 1)
        if s + 1 < slots:
            m.add(busy[s] >= busy[s + 1])  # idle slots last: they change nothing
    for u in held:
        for s in range(slots):
            before = resident[s - 1, u] if s else carry.get(u, 0)
            made_here = x[s, u] if u in cost else 0
            m.add(resident[s, u] <= before + made_here)
    for v in computable:
        for s in range(slots):
            m.add_implication(x[s, v], resident[s, v])
            for u in dict.fromkeys(graph[v].inputs):
                m.add_implication(x[s, v], resident[s, u])
    for u in edge.entry & core:
        m.add(resident[slots - 1, u] == 1)
    for v in edge.only_here:
        m.add(sum(x[s, v] for s in range(slots)) >= 1)
    for s in range(slots):
        m.add(
            sum(graph[u].bytes * resident[s, u] for u in held)
            + sum(graph[v].workspace * x[s, v] for v in computable if graph[v].workspace)
            <= room
        )
    _bound_prefix(m, graph, edge, carry, budget)
    m.minimize(sum(cost[v] * x[s, v] for s in range(slots) for v in computable))
    _hint(m, graph, sequence[:start], inside, edge.entry & core, x, resident, carry)

    solver = cp.CpSolver()
    solver.parameters.random_seed = seed
    solver.parameters.num_workers = 1
    solver.parameters.max_deterministic_time = WINDOW_WORK
    solver.parameters.max_time_in_seconds = max(0.01, deadline - time.perf_counter())
    status = solver.solve(m)
    if status not in (cp.OPTIMAL, cp.FEASIBLE):
        return None
    if solver.objective_value >= sum(cost[v] for v in inside):
        return None
    window = []
    for s in range(slots):
        window.extend(v for v in computable if solver.boolean_value(x[s, v]))
    return window


def _bound_prefix(
    m: cp_model.CpModel,
    graph: Graph,
    edge: _Boundary,
    carry: dict[int, cp_model.IntVar | int],
    budget: int,
) -> None:
    """A carried copy is held from its last prefix read to the window: at every prefix
    step after it, the prefix's memory plus the carried copies crossing it fit the budget.
    The carried set only grows along the prefix, so one row per distinct last read, on the
    most memory of the steps up to the next, says it all."""
    crossing = sorted((edge.last_read[u], u) for u in carry)
    memory = edge.prefix_memory
    for i, (read, _) in enumerate(crossing):
        if i + 1 < len(crossing) and crossing[i + 1][0] == read:
            continue  # one row for all the copies last read at this step
        until = crossing[i + 1][0] + 1 if i + 1 < len(crossing) else len(memory)
        steps = memory[read + 1 : until]
        if steps:
            carried = crossing[: i + 1]
            m.add(sum(graph[u].bytes * carry[u] for _, u in carried) <= budget - max(steps))


def _hint(
    m: cp_model.CpModel,
    graph: Graph,
    prefix: list[int],
    inside: list[int],
    entry: set[int],
    x: dict[tuple[int, int], cp_model.IntVar],
    resident: dict[tuple[int, int], cp_model.IntVar],
    carry: dict[int, cp_model.IntVar | int],
) -> None:
    """The window as it is: each copy resident from its computation (slot -1 where the
    prefix made it) through its last read in the window, and to the last slot where the
    suffix reads it on entry; idle slots after the window's own."""
    slots = 1 + max(s for s, _ in x)
    latest = dict.fromkeys(prefix, -1)  # node -> slot of its latest copy
    last: dict[tuple[int, int], int] = {}  # (node, slot made) -> last slot held
    for s, v in enumerate(inside):
        for u in graph[v].inputs:
            last[u, latest[u]] = s
        latest[v] = s
        last[v, s] = s
    for u in entry:
        last[u, latest[u]] = slots - 1
    held = {(s, u) for (u, made), end in last.items() for s in range(max(made, 0), end + 1)}
    for key, var in resident.items():
        m.add_hint(var, (key[0], key[1]) in held)
    for u, var in carry.items():
        if not isinstance(var, int):
            m.add_hint(var, (u, -1) in last)
    for (s, v), var in x.items():
        m.add_hint(var, s < len(inside) and inside[s] == v)
