"""The DELTA-style director on the general problem: idle intervals between a value's
uses, ranked by bytes freed times idle time per recompute cost, are released (the value
dropped and recomputed before its next use) until a predicted memory profile fits the
budget; the simulator judges every sequence.

The releases are placed on one topological order: the reference order first, then
ORDERS memory-aware orders (solvers/ordering.py), each with its own seed; the best
sequence over them is the answer (within the budget, the fastest; else the least peak).
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import random
import time
from bisect import bisect_right
from dataclasses import dataclass

import numpy as np

from memplan.core import remat
from memplan.core.errors import GraphError
from memplan.core.graph import Graph, SolveResult
from memplan.core.simulate import simulate
from memplan.solvers import SolverOptions, ordering
from memplan.solvers.result import judged, peak_message

# Fix-up rounds after the first prediction: each costs one build and one scoring.
_ROUNDS = 12
# Longest recompute chain (nodes) the director first accepts for one release: longer
# chains cost more time than the bytes are usually worth. When nothing more can be
# released the cap grows by _CHAIN_GROWTH up to _CHAIN_LIMIT, trading time for memory.
_MAX_CHAIN = 32
_CHAIN_GROWTH = 4
_CHAIN_LIMIT = 512
# Bisection steps on the internal target when minimising memory.
_MINIMIZE_STEPS = 8
# Memory-aware orders tried after the reference order, and the share of the time left
# that searching for the next one may take: a search is a fixed number of moves (a few
# seconds), so the share only cuts it short under small limits, and the result then
# depends on the machine. Above ORDER_MAX_NODES nodes only the reference order is used:
# a search there costs seconds per order (each annealing move is O(n)), more than the
# director's 5 s target at 10,000 nodes allows.
ORDERS = 4
ORDER_SHARE = 0.5
ORDER_MAX_NODES = 5_000


@dataclass
class _Sequenced:
    """A general-problem sequence with its score, as the director tracks its best."""

    sequence: list[int]
    score: remat.Score
    timed_out: bool = False


def solve(
    graph: Graph, budget: int | None, options: SolverOptions, started: float, deadline: float
) -> SolveResult:
    """The director's sequence for `budget` (None: the least peak), judged by the simulator."""
    best = _over_orders(graph, budget, options, deadline)
    schedule = remat.to_schedule(graph, best.sequence)
    trace = simulate(graph, schedule)  # the judge: feasibility is never claimed on a guess
    unfit = "timeout" if best.timed_out else "infeasible"
    result = judged(
        "director", schedule, trace, budget, options, started, objective=best.score.duration,
        unfit=unfit, message=peak_message(trace.peak, budget),
    )  # fmt: skip
    floor = max((_step_bytes(graph, v) for v in range(len(graph))), default=0)
    if budget is not None and trace.peak > budget and floor > budget:
        # Say when no sequence can fit: some step alone needs more than the budget.
        message = f"{result.message}; every sequence peaks at {floor} B or more"
        return dataclasses.replace(result, message=message)
    return result


def _over_orders(
    graph: Graph, budget: int | None, options: SolverOptions, deadline: float
) -> _Sequenced:
    """The best of the director's sequences on the reference order and on up to ORDERS
    searched orders; it stops once one fits without recomputation, or when the first
    searched order does no better than the reference order."""
    best = _general_search(graph, budget, options, deadline)
    no_recomputation = graph.total_time
    for k in range(ORDERS if len(graph) <= ORDER_MAX_NODES else 0):
        now = time.perf_counter()
        if now > deadline or (_fits(best, budget) and best.score.duration <= no_recomputation):
            break
        search_deadline = now + ORDER_SHARE * (deadline - now)
        order = ordering.searched_order(graph, budget, options.seed * ORDERS + k, search_deadline)
        found = _general_search(ordering.reordered(graph, order), budget, options, deadline)
        mapped = _Sequenced([order[v] for v in found.sequence], found.score, found.timed_out)
        if not _better(mapped, best, budget):
            if k == 0:
                break  # the order is not where this graph's cost lies (chains): stop here
            continue
        best = mapped
    return best


def _fits(found: _Sequenced, budget: int | None) -> bool:
    return budget is not None and found.score.peak <= budget


def _better(found: _Sequenced, best: _Sequenced, budget: int | None) -> bool:
    """Within the budget, the faster (a fit beats a miss); else, or without a budget, the
    lower peak, then the faster."""
    if _fits(found, budget) != _fits(best, budget):
        return _fits(found, budget)
    if _fits(found, budget):
        return found.score.duration < best.score.duration
    return (found.score.peak, found.score.duration) < (best.score.peak, best.score.duration)


def _general_search(
    graph: Graph, budget: int | None, options: SolverOptions, deadline: float
) -> _Sequenced:
    """The director's sequence for `budget`, or, when minimising memory, the least peak of
    a bisection over internal targets between the largest single step and the reference."""
    if graph.resident_inputs:
        first = graph[graph.resident_inputs[0]]
        raise GraphError(
            f"the general problem computes every node, but {first.name} is a resident "
            f"{first.kind.value}; solve this graph with problem='training'"
        )
    plan = _GeneralPlan(graph, options.seed)
    if budget is not None:
        return plan.run(budget, deadline)
    low = max((_step_bytes(graph, v) for v in range(len(graph))), default=0)
    high = plan.reference.peak
    best = plan.run(low, deadline)
    for _ in range(_MINIMIZE_STEPS):
        if best.score.peak <= low or low >= high or time.perf_counter() > deadline:
            break
        middle = (low + high) // 2
        found = plan.run(middle, deadline)
        if found.score.peak < best.score.peak:
            best = found
        if found.score.peak <= middle:
            high = middle
        else:
            low = middle + 1
    return best


def _step_bytes(graph: Graph, v: int) -> int:
    """Bytes resident while v runs with only its inputs (and its workspace): no sequence
    peaks below this."""
    node = graph[v]
    return node.bytes + node.workspace + sum(graph[u].bytes for u in dict.fromkeys(node.inputs))


# An idle interval of value v between its touch points a (its definition or a use) and b
# (the next use), the index-th of v's: released, v is dropped after step a and recomputed
# before b. Ranked by -(bytes x idle time / recompute cost), seeded tie, so heapq pops the
# best first; a plain tuple, as the heap compares millions of them on large graphs.
_Gap = tuple[float, int, int, int, int, int]  # (rank, tie, v, index, a, b)


class _GeneralPlan:
    """Released gaps per value over the reference order, and the memory they predict.

    mem[p] is the predicted memory at reference position p (its recompute block and its
    step): the sum of the bytes of the values live there, corrected by each simulated
    round. Invariant the builder relies on: a value is resident just before step p iff
    it was computed before p, p is at most its last use and p is a touch point or inside
    an unreleased gap of it.
    """

    def __init__(self, graph: Graph, seed: int) -> None:
        self.graph = graph
        n = len(graph)
        self.touch = [(v, *graph.users[v]) for v in range(n)]
        self.inputs = [node.inputs for node in graph]
        self.bytes = np.array([node.bytes for node in graph], dtype=np.int64)
        self.workspace = np.array([node.workspace for node in graph], dtype=np.int64)
        self.sizes = [node.bytes for node in graph]  # the same as Python ints, for loops
        times = [node.time for node in graph]
        self.prefix = [0.0]
        for t in times:
            self.prefix.append(self.prefix[-1] + t)
        # Without times every step counts as one unit, so idle intervals still rank.
        self.unit_time = not any(times)
        order = list(range(n))
        random.Random(seed).shuffle(order)
        self.tie = order  # seeded tie-breaks, a fixed permutation of node ids
        self.reference = remat.reference(graph)
        self._reset()

    def _reset(self) -> None:
        """No gap released: the reference order, chains capped at _MAX_CHAIN nodes."""
        n = len(self.graph)
        self.released: list[set[int]] = [set() for _ in range(n)]
        self.anchors: list[list[int]] = [[] for _ in range(n)]  # positions chains read v at
        self.max_chain = _MAX_CHAIN
        self.too_long: dict[tuple[int, int], int] = {}  # gap -> the cap its chain exceeded
        # Per position: the most bytes a recompute chain before it holds beyond its value.
        self.extra = np.zeros(n, dtype=np.int64)

    def run(self, target: int, deadline: float) -> _Sequenced:
        """Release gaps until the scored peak fits `target` (or nothing more helps); the
        sequence with the least peak, then duration, seen on the way."""
        self._reset()
        graph, n = self.graph, len(self.graph)
        change = np.zeros(n + 1, dtype=np.int64)
        for v in range(n):
            change[v] += self.bytes[v]
            change[self.touch[v][-1] + 1] -= self.bytes[v]
        mem = np.cumsum(change[:-1]) + self.workspace
        best = _Sequenced(list(range(n)), self.reference)
        if best.score.peak <= target:
            return best
        gaps = self._gaps()
        for _ in range(_ROUNDS):
            if time.perf_counter() > deadline:
                best.timed_out = True
                break
            released = self._release(gaps, mem, target, deadline)
            sequence, positions = self._build()
            found = remat.score(graph, sequence)
            if found.peak < best.score.peak or (
                found.peak <= target and found.duration < best.score.duration
            ):
                best = _Sequenced(sequence, found)
            if found.peak <= target:
                break
            if not released:
                if self.max_chain >= _CHAIN_LIMIT:
                    break
                self.max_chain *= _CHAIN_GROWTH
            mem = self._profile(sequence, positions)
        return best

    def _gaps(self) -> list[_Gap]:
        """Every releasable gap, ranked by bytes x idle time per estimated recompute cost
        (the value and those of its inputs already dead by b)."""
        graph, prefix = self.graph, self.prefix
        last = [t[-1] for t in self.touch]
        gaps = []
        for v, touch in enumerate(self.touch):
            size = int(self.bytes[v])
            if size == 0:
                continue
            node = graph[v]
            for index in range(len(touch) - 1):
                a, b = touch[index], touch[index + 1]
                if b - a < 2:
                    continue  # nothing runs between the two touches: nothing to free
                idle = b - a - 1 if self.unit_time else prefix[b] - prefix[a + 1]
                cost = node.time + sum(graph[x].time for x in node.inputs if last[x] < b)
                rank = size * idle / (cost + 1e-9) if cost > 0 else math.inf * (idle > 0)
                gaps.append((-rank, self.tie[v], v, index, a, b))
        return gaps

    def _release(self, gaps: list[_Gap], mem: np.ndarray, target: int, deadline: float) -> int:
        """Walk the gaps best first (lazily re-ranked by their actual chain cost) and
        release each that covers a position over `target`; stop once none is over."""
        graph = self.graph
        heap = [g for g in gaps if g[3] not in self.released[g[2]]]
        heapq.heapify(heap)
        fresh: set[tuple[int, int]] = set()  # gaps whose rank already uses the real chain
        count = 0
        over = bool(mem.max() > target)
        while heap and over:
            if time.perf_counter() > deadline:
                break
            gap = heapq.heappop(heap)
            _, tie, v, index, a, b = gap
            if mem[a + 1 : b].max() <= target:
                continue
            if self.too_long.get((v, index), 0) >= self.max_chain:
                continue  # availability only shrinks: the chain is still too long
            if any(a < p < b for p in self.anchors[v]):
                continue  # a released chain reads v there: releasing would lengthen it
            chain = self._chain(v, b)
            if chain is None:
                self.too_long[v, index] = self.max_chain
                continue
            nodes, reads = chain
            if (v, index) not in fresh:
                # Re-rank by the real chain; pop again if something else now ranks first.
                fresh.add((v, index))
                cost = sum(graph[x].time for x in nodes)
                idle = b - a - 1 if self.unit_time else self.prefix[b] - self.prefix[a + 1]
                size = int(self.bytes[v])
                rank = size * idle / (cost + 1e-9) if cost > 0 else math.inf * (idle > 0)
                gap = (-rank, tie, v, index, a, b)
                if heap and gap > heap[0]:
                    heapq.heappush(heap, gap)
                    continue
            transient = self._chain_peak(nodes) - int(self.bytes[v])
            extra = max(int(self.extra[b]), transient)
            if transient > 0 and int(mem[b]) - int(self.bytes[b]) + extra > target:
                continue  # the recompute block before b would become the new peak
            self.released[v].add(index)
            mem[a + 1 : b] -= self.bytes[v]
            self.extra[b] = extra
            for x in reads:
                self.anchors[x].append(b)
            count += 1
            over = bool(mem.max() > target)
        return count

    def _chain(self, v: int, p: int) -> tuple[list[int], set[int]] | None:
        """The nodes recomputed to bring v back before step p (v first) and the available
        values they read; None if the chain is longer than max_chain."""
        inputs, touch, released = self.inputs, self.touch, self.released
        nodes, seen, reads = [v], {v}, set()
        stack = [v]
        while stack:
            y = stack.pop()
            for x in inputs[y]:
                if x in seen:
                    continue
                # Whether x has a copy before step p (a touch at p counts: x is brought back
                # for p's own use anyway); inlined, as large graphs spend their time here.
                mine = touch[x]
                if x < p <= mine[-1]:
                    index = bisect_right(mine, p) - 1
                    if mine[index] == p:
                        continue
                    if index not in released[x]:
                        reads.add(x)  # read where it sits idle: an anchor
                        continue
                seen.add(x)
                nodes.append(x)
                if len(nodes) > self.max_chain:
                    return None
                stack.append(x)
        return nodes, reads

    def _chain_peak(self, nodes: list[int]) -> int:
        """The most bytes a chain holds while it is recomputed in id order (a topological
        order), each node until its last read in the chain, the first (the value) to the end."""
        order = sorted(nodes)
        inputs, size = self.inputs, self.sizes
        last = {x: x for x in order}
        for y in order:
            for x in inputs[y]:
                if x in last:
                    last[x] = y
        last[nodes[0]] = len(self.graph)
        memory = peak = 0
        for y in order:
            memory += size[y]
            peak = max(peak, memory)
            for x in dict.fromkeys(inputs[y]):  # an input read twice is freed once
                if last.get(x) == y:
                    memory -= size[x]
        return peak

    def _build(self) -> tuple[list[int], list[int]]:
        """The sequence the releases describe, and each step's reference position.

        Reference order; before step p, every input of p without a copy is recomputed
        with its missing ancestors (post-order). After step p, values whose released gap
        starts at p, whose last use is p, or that were only brought back for p's chain
        are dropped.
        """
        graph = self.graph
        drop_after: dict[int, list[int]] = {}
        for v, gaps in enumerate(self.released):
            for index in gaps:
                drop_after.setdefault(self.touch[v][index], []).append(v)
        resident: set[int] = set()
        sequence: list[int] = []
        positions: list[int] = []
        for p, node in enumerate(graph):
            brought: list[int] = []
            for x in node.inputs:
                if x not in resident:
                    self._materialise(x, resident, sequence, brought)
            positions.extend([p] * (len(sequence) - len(positions)))
            sequence.append(p)
            positions.append(p)
            resident.add(p)
            inputs = set(node.inputs)
            for x in brought:
                if x not in inputs:
                    resident.discard(x)
            for x in (*node.inputs, p):
                if self.touch[x][-1] == p:
                    resident.discard(x)
            for x in drop_after.get(p, ()):
                resident.discard(x)
        return sequence, positions

    def _materialise(
        self, target: int, resident: set[int], sequence: list[int], brought: list[int]
    ) -> None:
        """Append the recomputation of `target` and its missing ancestors, inputs first."""
        made = remat.missing_ancestors(self.graph, [target], resident)
        sequence.extend(made)
        brought.extend(made)

    def _profile(self, sequence: list[int], positions: list[int]) -> np.ndarray:
        """The scored memory of each reference position (max over its block and step),
        by the rules of remat.score."""
        n = len(self.graph)
        latest: dict[int, int] = {}
        last_read = list(range(len(sequence)))
        for step, v in enumerate(sequence):
            for u in self.graph[v].inputs:
                last_read[latest[u]] = step
            latest[v] = step
        change = np.zeros(len(sequence) + 1, dtype=np.int64)
        sizes = self.bytes[np.asarray(sequence)]
        np.add.at(change, np.arange(len(sequence)), sizes)
        np.add.at(change, np.asarray(last_read) + 1, -sizes)
        memory = np.cumsum(change[:-1]) + self.workspace[np.asarray(sequence)]
        out = np.zeros(n, dtype=np.int64)
        np.maximum.at(out, np.asarray(positions), memory)
        return out
