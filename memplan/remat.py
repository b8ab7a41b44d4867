"""The general rematerialization problem of the literature (Checkmate, Moccasin, POET).

A schedule is a sequence of node ids in which a node may appear more than once (a
recomputation). Computing v reads the most recent copy of each of its inputs, which must
exist. A copy is resident from the step that computes it through the last step that
reads it (only its own step if nothing reads it); the peak is the largest sum of resident
copies over the steps, and the duration the sum of the computed nodes' times. Every node
is computed at least once. These are the scoring rules of ../shared/graphs/README.md.

`score` implements them on its own, so that it can check the simulator, which judges the
same sequence once `to_schedule` has put a Free after each copy's last read.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from memplan.errors import BudgetError, InvalidSchedule
from memplan.graph import (
    MAX_BUDGET_BYTES,
    Budget,
    Compute,
    Free,
    Graph,
    Node,
    Offload,
    Prefetch,
    Schedule,
    SolveResult,
    Wait,
    exact_number,
    with_frees,
)
from memplan.planner.simulate import simulate


@dataclass(frozen=True)
class Score:
    """A sequence's peak memory (bytes) and duration (the graph's time unit)."""

    peak: int
    duration: float


def score(graph: Graph, sequence: Sequence[int]) -> Score:
    """Peak and duration of `sequence` by the literature's rules; InvalidSchedule if a node
    reads an input never computed before it, an id is unknown, or a node is never computed."""
    n = len(graph)
    latest: dict[int, int] = {}  # node -> step of its most recent copy
    last_read: list[int] = []  # per step: the last step that reads the copy made there
    duration = 0.0
    for step, v in enumerate(sequence):
        if not (isinstance(v, int) and 0 <= v < n):
            raise InvalidSchedule(f"step {step}: unknown node id {v!r}")
        for u in graph[v].inputs:
            if u not in latest:
                raise InvalidSchedule(
                    f"step {step}: {graph[v].name} reads {graph[u].name}, not computed before"
                )
            last_read[latest[u]] = step
        latest[v] = step
        last_read.append(step)
        duration += graph[v].time
    if len(latest) < n:
        missing = next(v for v in range(n) if v not in latest)
        raise InvalidSchedule(f"{graph[missing].name} is never computed")
    # Memory over steps as a difference array: a copy adds its bytes from its step through
    # its last read.
    change = [0] * (len(sequence) + 1)
    for step, v in enumerate(sequence):
        change[step] += graph[v].bytes
        change[last_read[step] + 1] -= graph[v].bytes
    peak = memory = 0
    for delta in change[:-1]:
        memory += delta
        peak = max(peak, memory)
    return Score(peak=peak, duration=duration)


def missing_ancestors(graph: Graph, targets: Sequence[int], available: set[int]) -> list[int]:
    """The nodes to compute so that every one of `targets` is available: each target not
    in `available` and its missing ancestors, inputs first (an iterative post-order walk,
    so long chains need no recursion). Adds them to `available`."""
    order: list[int] = []
    stack: list[tuple[int, bool]] = [(v, False) for v in reversed(targets)]
    while stack:
        v, inputs_done = stack.pop()
        if v in available:
            continue
        if inputs_done:
            order.append(v)
            available.add(v)
        else:
            stack.append((v, True))
            stack.extend((u, False) for u in reversed(graph[v].inputs) if u not in available)
    return order


def reference(graph: Graph) -> Score:
    """The graph's own topological order, with no recomputation: P0 and D0."""
    return score(graph, range(len(graph)))


def to_schedule(graph: Graph, sequence: Sequence[int]) -> Schedule:
    """The sequence as a Schedule the simulator judges: each copy freed after its last read."""
    return Schedule(steps=tuple(with_frees(graph, [Compute(v) for v in sequence])))


def resolve_budget(graph: Graph, budget: str | float) -> int:
    """Bytes for a budget given as bytes or a size ("2e9", "2GiB"), or as a share of the
    reference peak ("0.8", "80%"), rounded up as the published protocol does:
    B = ceil(m * P0). A plain number up to 1 is a share; above 1, bytes. BudgetError for
    anything else, and for a budget that comes to under 1 byte (a share of a graph whose
    reference peak is 0) or over 2**63 - 1 bytes."""
    text = str(budget).strip()
    share = exact_number(text)  # not Fraction(text): Fraction("1e-999999999") never ends
    if share is None or not 0 < share <= 1:
        parsed = Budget.parse(text)
        if parsed.bytes is not None:
            return parsed.bytes
        share = Fraction(parsed.fraction)
    peak = reference(graph).peak
    resolved = math.ceil(share * peak)
    if not 1 <= resolved <= MAX_BUDGET_BYTES:
        raise BudgetError(
            f"budget {text!r} of the reference peak of {peak} bytes is {resolved} bytes; "
            "a budget is 1 to 2**63 - 1 bytes"
        )
    return resolved


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


def random_layered_graph(n: int, width: int = 20, seed: int = 0) -> Graph:
    """A random layered DAG like the literature's, of any size: layers of `width` nodes,
    each reading 1-3 nodes of the previous 1-3 layers, with 1-1000 bytes and 1-100 time
    units. The bundled random_layered graphs stop at 1000 nodes; the director's 10,000-node
    target is measured on this one."""
    rng = random.Random(seed)
    nodes: list[Node] = []
    layers: list[list[int]] = []
    while len(nodes) < n:
        layer = []
        for _ in range(min(width, n - len(nodes))):
            v = len(nodes)
            pool = [u for previous in layers[-rng.randint(1, 3) :] for u in previous]
            inputs = tuple(sorted(rng.sample(pool, min(len(pool), rng.randint(1, 3)))))
            size, duration = rng.randint(1, 1000), float(rng.randint(1, 100))
            nodes.append(
                Node(id=v, name=f"n{v}", op="op", inputs=inputs, bytes=size, time=duration)
            )
            layer.append(v)
        layers.append(layer)
    return Graph(nodes=tuple(nodes), name=f"layered{n}")
