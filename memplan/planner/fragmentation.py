"""Fragmentation-aware planning: fit the arena of a plan's layout within the budget, not
only its sum of live bytes.

A schedule whose live bytes fit can still need a larger arena: the bytes it frees may be
scattered between tensors that stay. While the arena is above the budget, two moves are
tried in turn and the first that lowers the arena is kept:

- "window" (Coop, NeurIPS 2023, for the training problem): the allocation that reaches
  the arena's top at step s needs that many contiguous bytes lower down. Slide a window
  over the allocations live at s in address order and release (recompute or offload)
  the saved storages of the cheapest window spanning at least those bytes, free gaps
  included, so that the bytes freed are contiguous rather than scattered.
- "tighten": solve again with the live budget lowered by the arena's excess.

No torch here.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

from memplan.core.errors import InvalidSchedule
from memplan.core.graph import Decision, Graph, SolveResult
from memplan.core.simulate import Allocation, MemoryTrace, simulate
from memplan.planner.layout import EXACT_TIME_LIMIT, Layout, lay_out
from memplan.solvers import SolverOptions
from memplan.solvers.greedy import hiding_windows, release_options
from memplan.solvers.training import build_schedule, decider, saved_storages

# How many moves are made before giving up on fitting the arena.
ROUNDS = 8
MOVES = ("window", "tighten")


@dataclass(frozen=True)
class ArenaFit:
    """The schedule chosen, its trace and layout, and the moves that led to it."""

    result: SolveResult
    trace: MemoryTrace
    layout: Layout
    moves: tuple[str, ...]


def fit_arena(
    graph: Graph,
    budget: int,
    start: ArenaFit,
    solve: Callable[[int], SolveResult],
    options: SolverOptions,
    *,
    method: str = "best",
    alignment: int = 1,
    layout_seconds: float = EXACT_TIME_LIMIT,
    moves: tuple[str, ...] = MOVES,
) -> ArenaFit:
    """Starting from `start` (a solver's result, its trace and layout, no moves), make
    moves while the arena is above `budget`, at most ROUNDS; a move is kept only if it
    lowers the arena. `solve(live_budget)` runs the solver for the "tighten" move; each
    candidate is laid out by `method`. The caller checks the returned layout's arena
    against the budget."""

    def laid_out(result: SolveResult, done: tuple[str, ...]) -> ArenaFit | None:
        if result.schedule is None:
            return None
        trace = simulate(graph, result.schedule, bandwidth=options.bandwidth)
        if done:  # a schedule the solver did not return as it stands: judged here
            result = dataclasses.replace(result, status="feasible", objective=trace.time)
        return ArenaFit(
            result,
            trace,
            lay_out(trace.allocations, method, alignment=alignment, time_limit=layout_seconds),
            done,
        )

    fit = start
    live_budget = budget
    for _ in range(ROUNDS):
        if fit.layout.arena <= budget:
            break
        candidates: list[ArenaFit | None] = []
        if "window" in moves and options.problem == "training":
            released = _window(graph, fit, options)
            if released is not None:
                candidates.append(laid_out(released, (*fit.moves, "window")))
        if not _lower(fit, candidates) and "tighten" in moves:
            # From the live peak, not the last live budget: a budget above the peak
            # changes nothing. A tightening that does not lower the arena is not kept,
            # but the next round tightens further.
            live_budget = min(live_budget, fit.trace.peak) - (fit.layout.arena - budget)
            if live_budget <= 0:
                break
            tightened = solve(live_budget)
            if tightened.schedule is not None:
                candidates.append(laid_out(tightened, (*fit.moves, "tighten")))
        lower = _lower(fit, candidates)
        if lower is not None:
            fit = lower
        elif "tighten" not in moves:
            break
    return fit


def _lower(fit: ArenaFit, candidates: list[ArenaFit | None]) -> ArenaFit | None:
    """The candidate with the least arena, if below the current fit's."""
    found = [c for c in candidates if c is not None and c.layout.arena < fit.layout.arena]
    return min(found, key=lambda c: c.layout.arena, default=None)


def _window(graph: Graph, fit: ArenaFit, options: SolverOptions) -> SolveResult | None:
    """The result with the cheapest contiguous window below the arena's top released."""
    allocations, layout = fit.trace.allocations, fit.layout
    top = max(
        range(len(allocations)),
        key=lambda i: (layout.offsets[i] + layout.sizes[i], -allocations[i].start),
    )
    step, need = allocations[top].start, layout.sizes[top]
    live = sorted(
        (
            i
            for i, a in enumerate(allocations)
            if a.start <= step < a.end and i != top and layout.sizes[i] > 0
        ),
        key=lambda i: layout.offsets[i],
    )
    decisions = dict(fit.result.decisions)
    releases = _releases(graph, [allocations[i] for i in live], decisions, options)
    best: tuple[float, dict[int, Decision]] | None = None
    for first in range(len(live)):
        floor = layout.offsets[live[first - 1]] + layout.sizes[live[first - 1]] if first else 0
        cost, changes = 0.0, {}
        for last in range(first, len(live)):
            release = releases[last]
            if release is None:
                break
            cost += release[0]
            changes.update(release[1])
            # Under the top allocation, not the arena: its own bytes are not freed.
            above = live[last + 1] if last + 1 < len(live) else top
            ceiling = layout.offsets[above]
            if ceiling - floor >= need:
                if best is None or cost < best[0]:
                    best = (cost, dict(changes))
                break
    if best is None:
        return None
    decisions.update(best[1])
    try:
        schedule = build_schedule(graph, decisions, bandwidth=options.bandwidth)
    except InvalidSchedule:
        return None
    return dataclasses.replace(
        fit.result,
        schedule=schedule,
        decisions=decisions,
        message=" ".join(
            filter(None, [fit.result.message, "A contiguous window was released to fit the arena."])
        ),
    )


def _releases(
    graph: Graph,
    allocations: list[Allocation],
    decisions: dict[int, Decision],
    options: SolverOptions,
) -> list[tuple[float, dict[int, Decision]] | None]:
    """Per allocation: the cheapest (added seconds, decisions) that releases its saved
    storage, None where it holds no kept saved storage (a workspace never does)."""
    groups = saved_storages(graph)
    decision = decider(graph, decisions)
    windows = hiding_windows(graph) if options.bandwidth else {}
    found: list[tuple[float, dict[int, Decision]] | None] = []
    for allocation in allocations:
        if allocation.workspace:
            found.append(None)
            continue
        owner = graph.storage_owner[allocation.node]
        kept = [v for v in groups.get(owner, []) if decision(v) is Decision.KEEP]
        ways = release_options(graph, owner, kept, decision, windows, options) if kept else []
        cheapest = min(ways, key=lambda way: way[0], default=None)
        found.append(cheapest if cheapest and math.isfinite(cheapest[0]) else None)
    return found
