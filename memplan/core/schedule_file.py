"""Schedules as JSON: memplan's own form and back, and what `memplan solve` writes.

memplan's form is `{"steps": [[kind, node id], ...], "backward_start": n}`, read back
through memplan.core.checks: a malformed schedule is a GraphError naming the bad field. A
solve of a literature graph writes its schedule as that literature scores it: the
sequence of computed nodes by the file's ids. No torch here.
"""

from __future__ import annotations

from typing import Any

from memplan.core import checks
from memplan.core.errors import GraphError, InvalidSchedule
from memplan.core.graph import (
    STEP_TYPES,
    Free,
    Graph,
    Offload,
    Prefetch,
    Schedule,
    SolveResult,
    Step,
    Wait,
)
from memplan.core.simulate import simulate

_KINDS = tuple(STEP_TYPES)


def schedule_to_json(schedule: Schedule) -> dict[str, Any]:
    return {
        "steps": [[type(s).__name__.lower(), s.node] for s in schedule.steps],
        "backward_start": schedule.backward_start,
    }


def schedule_from_json(data: object) -> Schedule:
    """The schedule that schedule_to_json wrote; GraphError naming the bad field otherwise.

    Node ids and backward_start must be JSON integers: a float or a numeric string is
    refused rather than converted, as int() would silently truncate 1.5 to 1.
    """
    if not isinstance(data, dict):
        raise GraphError(f"schedule JSON must be an object, got {type(data).__name__}")
    raw = data.get("steps")
    if not isinstance(raw, list):
        raise GraphError("schedule JSON has no 'steps' list")
    return Schedule(
        steps=tuple(_step(index, item) for index, item in enumerate(raw)),
        backward_start=_backward_start(data.get("backward_start")),
    )


def _step(index: int, item: object) -> Step:
    where = f"schedule JSON 'steps'[{index}] is {checks.shown(item)}"
    if not (isinstance(item, list) and len(item) == 2 and item[0] in _KINDS):
        raise GraphError(f"{where}, not [kind, node id] with kind one of {', '.join(_KINDS)}")
    try:
        return STEP_TYPES[item[0]](checks.integer(item[1]))
    except checks.Mismatch as mismatch:
        raise GraphError(f"{where}: its node id {mismatch}") from None


def _backward_start(value: object) -> int | None:
    if value is None or checks.is_int(value):
        return value
    raise GraphError(
        f"schedule JSON 'backward_start' must be an integer or null, got {checks.shown(value)}"
    )


def solved_schedule(
    graph: Graph, budget: int, result: SolveResult, *, bandwidth: float | None = None
) -> dict[str, Any]:
    """The JSON a solve writes, once the simulator accepted the schedule.

    `sequence` lists the computed nodes by the file's ids (a repeat is a recomputation), so
    any scorer of the literature's rules can check it; a schedule with paging adds its
    transfer steps, in order, as `steps`. InvalidSchedule if the simulator rejects the
    schedule, or if the solver called it feasible and its peak is over the budget.
    """
    if result.schedule is None:
        raise InvalidSchedule(f"solver {result.solver!r} returned no schedule ({result.status})")
    trace = simulate(graph, result.schedule, bandwidth=bandwidth)
    if result.status in ("optimal", "feasible") and trace.peak > budget:
        raise InvalidSchedule(
            f"solver {result.solver!r} reported {result.status} but its schedule peaks at "
            f"{trace.peak} B, over the budget of {budget} B"
        )
    ids = graph.source_ids or tuple(range(len(graph)))
    computes = result.schedule.computes()
    report: dict[str, Any] = {
        "graph": graph.name,
        "budget": budget,
        "solver": result.solver,
        "sequence": [ids[v] for v in computes],
        "peak": trace.peak,
        "duration": sum(graph[v].time for v in computes) + trace.stall,
        "status": result.status,
        "solve_seconds": result.solve_seconds,
    }
    transfers = [s for s in result.schedule.steps if isinstance(s, (Offload, Prefetch, Wait))]
    if transfers:
        report["steps"] = [
            [type(s).__name__.lower(), ids[s.node]]
            for s in result.schedule.steps
            if not isinstance(s, Free)
        ]
    if result.gap is not None:
        report["gap"] = result.gap
    return report
