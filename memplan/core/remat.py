"""The general rematerialization problem of the literature (Checkmate, Moccasin, POET).

A schedule is a sequence of node ids in which a node may appear more than once (a
recomputation). Computing v reads the most recent copy of each of its inputs, which must
exist. A copy is resident from the step that computes it through the last step that
reads it (only its own step if nothing reads it); the peak is the largest sum of resident
copies over the steps, and the duration the sum of the computed nodes' times. Every node
is computed at least once. These are the scoring rules of ../shared/graphs/README.md,
where no node has a workspace; a node that has one holds it in its own step.

`score` implements them on its own, so that it can check the simulator, which judges the
same sequence once `to_schedule` has put a Free after each copy's last read.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from memplan.core.budget import Budget
from memplan.core.errors import InvalidSchedule
from memplan.core.graph import Compute, Graph, Schedule, with_frees


@dataclass(frozen=True)
class Score:
    """A sequence's peak memory (bytes) and duration (the graph's time unit)."""

    peak: int
    duration: float


def score(graph: Graph, sequence: Sequence[int]) -> Score:
    """Peak and duration of `sequence` by the literature's rules; InvalidSchedule if a node
    reads an input never computed before it, an id is unknown, or a node is never computed."""
    last_read = copy_ends(graph, sequence)
    computed = set(sequence)
    if len(computed) < len(graph):
        missing = next(v for v in range(len(graph)) if v not in computed)
        raise InvalidSchedule(f"{graph[missing].name} is never computed")
    memory = memory_by_step(graph, sequence, last_read)
    return Score(peak=max([0, *memory]), duration=sum(graph[v].time for v in sequence))


def copy_ends(graph: Graph, sequence: Sequence[int]) -> list[int]:
    """Per step, the last step that reads the copy made there (the step itself where
    nothing does); InvalidSchedule if an id is unknown or a node reads an input not
    computed before it."""
    n = len(graph)
    latest: dict[int, int] = {}  # node -> step of its most recent copy
    last_read: list[int] = []
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
    return last_read


def memory_by_step(graph: Graph, sequence: Sequence[int], last_read: Sequence[int]) -> list[int]:
    """The resident bytes at each step: each copy from its step through `last_read` of it,
    and each node's workspace in its own step alone."""
    # A difference array: a copy adds its bytes at its step and takes them back after its
    # last read; a workspace is added and taken back around its step.
    change = [0] * (len(sequence) + 1)
    for step, v in enumerate(sequence):
        change[step] += graph[v].bytes + graph[v].workspace
        change[step + 1] -= graph[v].workspace
        change[last_read[step] + 1] -= graph[v].bytes
    memory, level = [], 0
    for delta in change[:-1]:
        level += delta
        memory.append(level)
    return memory


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


def resolve_budget(graph: Graph, budget: Budget | str | float) -> int:
    """Bytes for a budget on the general problem (memplan.core.budget's grammar): a share is of
    the reference order's peak P0, rounded up as the published protocol does,
    B = ceil(m * P0)."""
    return Budget.parse(budget).resolve(reference(graph).peak, of="the reference peak")
