"""A lower bound on the peak of every schedule of the general problem (memplan/core/remat.py).

The bound holds for every sequence the literature's rules accept, recomputation included,
so a budget below it is proved infeasible, whatever a solver finds. It rests on
co-residence: when v is computed, v's copy, its workspace and the copies it reads are all
resident. Going one step back: among the copies resident at a step that were computed
before it, the one computed last (x) was computed while all the others were already
resident (they are still resident later), together with the copies x read. The schedule
chooses which copy came last, so the bound takes the least over that choice, and repeats
the argument a few steps back (`DEPTH`).

Only the general problem: there every node's output is a copy of its own. In a joint
training graph views share storages, and summing the bytes of a node's inputs could count
one storage twice.
"""

from __future__ import annotations

from functools import cache

from memplan.core.graph import Graph

# Steps back from each node's computation. Each step branches on every copy of the set,
# so the work grows as (inputs per node) ** DEPTH; 2 takes well under a second on the
# bundled 1,000-node graph and already adds to the one-step bound on the layered graphs.
DEPTH = 2


def peak_lower_bound(graph: Graph, depth: int = DEPTH) -> int:
    """The largest co-residence bound over the graph's nodes, in bytes (see the module)."""
    sizes = [n.bytes for n in graph]
    inputs = [frozenset(n.inputs) for n in graph]

    def held(copies: frozenset[int]) -> int:
        return sum(sizes[c] for c in copies)

    @cache
    def earlier(resident: frozenset[int], steps: int) -> int:
        """The least peak forced at or before a step by `resident`: copies computed before
        that step and resident at it, looking `steps` computations back. The least is
        over which copy of `resident` was computed last."""
        if steps == 0 or not resident:
            return 0
        return min(
            max(
                held(resident | inputs[last]) + graph[last].workspace,
                earlier((resident - {last}) | inputs[last], steps - 1),
            )
            for last in resident
        )

    return max(
        (
            max(sizes[v] + graph[v].workspace + held(inputs[v] - {v}), earlier(inputs[v], depth))
            for v in range(len(graph))
        ),
        default=0,
    )
