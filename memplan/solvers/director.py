"""A DELTA-style director (Tang et al. 2022): a fast filter-and-director heuristic.

Tensors (training) or idle intervals between uses (general) are ranked by bytes freed
times idle time; walking that rank, each is released by offload where the transfer hides,
else by recompute, until a predicted memory profile fits the budget, which the simulator
then confirms (a few fix-up rounds release more where the prediction was short).
"""

from __future__ import annotations

import dataclasses
import heapq
import math
import random
import time
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from memplan import remat
from memplan.errors import GraphError, InvalidSchedule
from memplan.graph import Decision, Graph, NodeKind, Schedule, SolveResult
from memplan.planner.simulate import MemoryTrace, simulate
from memplan.solvers import SolverOptions
from memplan.solvers.baselines import sqrt_decisions
from memplan.solvers.training import (
    build_schedule,
    decider,
    position_profile,
    recompute_chain_time,
    saved_storages,
    simulate_decisions,
)

# Fix-up rounds after the first prediction: each costs one build and one simulation.
_ROUNDS = 12
# Direct-then-restore cycles in the training director (see _solve_training).
_CYCLES = 4
# Longest recompute chain (nodes) the general director first accepts for one release:
# longer chains cost more time than the bytes are usually worth. When nothing more can be
# released the cap grows by _CHAIN_GROWTH up to _CHAIN_LIMIT, trading time for memory.
_MAX_CHAIN = 32
_CHAIN_GROWTH = 4
_CHAIN_LIMIT = 512
# Bisection steps on the internal target when minimising memory.
_MINIMIZE_STEPS = 8


def solve(graph: Graph, budget: int, options: SolverOptions) -> SolveResult:
    """Release the best-ranked tensors until the simulated peak fits `budget`.

    "feasible" only when the simulator's peak is within the budget; otherwise
    "infeasible" with the least peak reached (or "timeout" if the time limit cut the
    search short). The objective is the simulated step time (training) or the sequence's
    duration (general).
    """
    started = time.perf_counter()
    deadline = started + options.time_limit
    if options.problem == "general":
        return _solve_general(graph, budget, options, started, deadline)
    return _solve_training(graph, budget, options, started, deadline)


# --- general problem ----------------------------------------------------------------------


@dataclass
class _Sequenced:
    """A general-problem sequence with its score, as the director tracks its best."""

    sequence: list[int]
    score: remat.Score
    timed_out: bool = False


def _solve_general(
    graph: Graph, budget: int, options: SolverOptions, started: float, deadline: float
) -> SolveResult:
    best = _general_search(graph, budget, options, deadline)
    schedule = remat.to_schedule(graph, best.sequence)
    trace = simulate(graph, schedule)  # the judge: feasibility is never claimed on a guess
    result = _result(
        graph, budget, options, started, schedule, trace, best.score.duration, best.timed_out, {}
    )
    floor = max((_step_bytes(graph, v) for v in range(len(graph))), default=0)
    if trace.peak > budget and floor > budget:
        # Say when no sequence can fit: some step alone needs more than the budget.
        message = f"{result.message}; every sequence peaks at {floor} B or more"
        return dataclasses.replace(result, message=message)
    return result


def _general_search(
    graph: Graph, budget: int, options: SolverOptions, deadline: float
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
    if not options.minimize_memory:
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
    """Bytes resident while v runs with only its inputs: no sequence peaks below this."""
    return graph[v].bytes + sum(graph[u].bytes for u in dict.fromkeys(graph[v].inputs))


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
        mem = np.cumsum(change[:-1])
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
        memory = np.cumsum(change[:-1])
        out = np.zeros(n, dtype=np.int64)
        np.maximum.at(out, np.asarray(positions), memory)
        return out


# --- training problem ---------------------------------------------------------------------


@dataclass(frozen=True)
class _Storage:
    """A forward storage the backward reads: released as one (its saved views pin it).

    Idle from after position `last_forward` (its last forward read) to `first_backward`
    (its first backward read), in node ids, which the schedule follows.
    """

    owner: int
    members: tuple[int, ...]
    last_forward: int
    first_backward: int
    idle: float  # compute time between the two


def _solve_training(
    graph: Graph, budget: int, options: SolverOptions, started: float, deadline: float
) -> SolveResult:
    """Direct from keep-all; where that ends over the target, keep some released storages
    again (_restore) and direct once more from there, the kept ones now checkpoints. If
    that still ends over the target, do the same from Chen's sqrt(n) checkpoints, which
    break recompute cascades from the start."""
    target = 0 if options.minimize_memory else budget
    prefix = [0.0]
    for node in graph:
        prefix.append(prefix[-1] + (node.time if node.kind is NodeKind.COMPUTE else 0.0))
    storages = _rank_storages(graph, prefix, options.seed)
    keep_all = {v: Decision.KEEP for v in graph.saved_candidates}
    best: tuple[MemoryTrace, dict[int, Decision]] | None = None
    timed_out = False
    for start in (keep_all, {**keep_all, **sqrt_decisions(graph)}):
        trace, decisions, timed_out = _cycles(
            graph, storages, start, target, budget, prefix, deadline, options
        )
        if best is None or _better(trace, best[0], budget):
            best = (trace, decisions)
        if best[0].peak <= target or timed_out:
            break
    assert best is not None
    trace, decisions = best
    schedule = build_schedule(graph, decisions, bandwidth=options.bandwidth)
    return _result(
        graph, budget, options, started, schedule, trace, trace.time, timed_out, decisions
    )


def _cycles(
    graph: Graph,
    storages: list[_Storage],
    start: dict[int, Decision],
    target: int,
    budget: int,
    prefix: Sequence[float],
    deadline: float,
    options: SolverOptions,
) -> tuple[MemoryTrace, dict[int, Decision], bool]:
    """Direct-then-restore cycles from `start`: the best state reached, and whether the
    deadline cut them short."""
    decisions = dict(start)
    _, trace = simulate_decisions(graph, decisions, options.bandwidth)
    # Storages the director has decided on (released, or kept again by _restore).
    released = {graph.storage_owner[v] for v, d in start.items() if d is not Decision.KEEP}
    best = (trace, dict(decisions))
    timed_out = False
    for _ in range(_CYCLES):
        trace, decisions, timed_out = _direct_rounds(
            graph, storages, trace, decisions, released, target, prefix, deadline, options
        )
        if _better(trace, best[0], budget):
            best = (trace, dict(decisions))
        if trace.peak <= target or timed_out:
            break
        restored = _restore(graph, storages, trace, decisions, deadline, options)
        if restored is None:
            break
        trace, decisions, timed_out = restored
        if _better(trace, best[0], budget):
            best = (trace, dict(decisions))
    return best[0], best[1], timed_out


def _better(new: MemoryTrace, old: MemoryTrace, budget: int) -> bool:
    """A lower (peak, time); or, both within the budget, the faster."""
    return (new.peak, new.time) < (old.peak, old.time) or (
        new.peak <= budget and old.peak <= budget and new.time < old.time
    )


def _direct_rounds(
    graph: Graph,
    storages: list[_Storage],
    trace: MemoryTrace,
    decisions: dict[int, Decision],
    released: set[int],
    target: int,
    prefix: Sequence[float],
    deadline: float,
    options: SolverOptions,
) -> tuple[MemoryTrace, dict[int, Decision], bool]:
    """Release ranked storages where the predicted profile is over the target, simulate,
    and repeat with the simulated profile until it fits or nothing is left to release."""
    schedule = build_schedule(graph, decisions, bandwidth=options.bandwidth)
    mem = position_profile(graph, schedule, trace)
    for _ in range(_ROUNDS):
        if trace.peak <= target:
            break
        if time.perf_counter() > deadline:
            return trace, decisions, True
        changes = _direct(graph, storages, decisions, released, mem, target, prefix, options)
        if not changes:
            break
        proposal = {**decisions, **changes}
        try:
            schedule, new_trace = simulate_decisions(graph, proposal, options.bandwidth)
        except InvalidSchedule:
            break  # a chain the estimate thought possible is not: keep what we had
        decisions, trace = proposal, new_trace
        mem = position_profile(graph, schedule, trace)
    return trace, decisions, False


def _restore(
    graph: Graph,
    storages: list[_Storage],
    trace: MemoryTrace,
    decisions: dict[int, Decision],
    deadline: float,
    options: SolverOptions,
) -> tuple[MemoryTrace, dict[int, Decision], bool] | None:
    """Keep released storages again, lowest ranked first, wherever that lowers the peak;
    None if none does.

    Releasing a run of neighbouring storages by recompute makes each chain recompute the
    next, so the whole run comes back at once in the backward: past some point, releasing
    more raises the peak. Keeping some of them again (checkpoints) breaks the cascade.
    """
    changed = False
    for storage in reversed(storages):
        if decisions.get(storage.owner, Decision.KEEP) is Decision.KEEP:
            continue
        if time.perf_counter() > deadline:
            return trace, decisions, True
        proposal = {**decisions, **dict.fromkeys(storage.members, Decision.KEEP)}
        try:
            _, new_trace = simulate_decisions(graph, proposal, options.bandwidth)
        except InvalidSchedule:
            continue
        if (new_trace.peak, new_trace.time) < (trace.peak, trace.time):
            trace, decisions, changed = new_trace, proposal, True
    return (trace, decisions, False) if changed else None


def _rank_storages(graph: Graph, prefix: Sequence[float], seed: int) -> list[_Storage]:
    """Saved forward storages, best first by bytes x idle time (seeded ties)."""
    groups = saved_storages(graph)
    order = list(range(len(graph)))
    random.Random(seed).shuffle(order)
    storages = []
    for owner, members in groups.items():
        reads = [u for m in (owner, *members) for u in graph.users[m]]
        last_forward = max([owner, *members, *(u for u in reads if not graph[u].is_backward)])
        first_backward = min(u for u in reads if graph[u].is_backward)
        idle = prefix[first_backward] - prefix[last_forward + 1]
        storages.append(_Storage(owner, tuple(members), last_forward, first_backward, idle))
    storages.sort(
        key=lambda s: (-graph[s.owner].bytes * s.idle, -graph[s.owner].bytes, order[s.owner])
    )
    return storages


def _direct(
    graph: Graph,
    storages: list[_Storage],
    decisions: dict[int, Decision],
    released: set[int],
    mem: np.ndarray,
    target: int,
    prefix: Sequence[float],
    options: SolverOptions,
) -> dict[int, Decision]:
    """The director: walk the ranked storages and release each that spans a position the
    predicted profile puts over `target`: offload if its round trip hides under its idle
    compute, else the cheaper of the exposed transfer and the recompute chain. Updates
    `mem` and `released` in place; returns the decisions changed."""
    changes: dict[int, Decision] = {}
    merged = dict(decisions)  # what decide() reads: the decisions with changes so far
    decide = decider(graph, merged)
    bandwidth = options.bandwidth
    for storage in storages:
        if mem.max() <= target:
            break
        lo, hi = storage.last_forward + 1, storage.first_backward
        if storage.owner in released or hi <= lo or mem[lo:hi].max() <= target:
            continue
        owner = graph[storage.owner]
        recompute = recompute_chain_time(graph, list(storage.members), decide)
        offload = bandwidth is not None and owner.offloadable
        views = [v for v in storage.members if v != storage.owner]
        view_time = recompute_chain_time(graph, views, decide, stop_at=storage.owner)
        offload = offload and math.isfinite(view_time)
        exposed = max(0.0, 2 * owner.bytes / bandwidth - storage.idle) if bandwidth else math.inf
        if offload and (exposed == 0 or not math.isfinite(recompute) or exposed < recompute):
            changes.update(dict.fromkeys(views, Decision.RECOMPUTE))
            changes[storage.owner] = Decision.OFFLOAD
            # The prefetch lands a transfer's worth of compute before the first use.
            assert bandwidth is not None
            hi = _prefetch_position(prefix, hi, owner.bytes / bandwidth, lo)
        elif math.isfinite(recompute):
            changes.update(dict.fromkeys(storage.members, Decision.RECOMPUTE))
        else:
            continue  # neither: keep it
        merged.update(changes)
        released.add(storage.owner)
        mem[lo:hi] -= owner.bytes
    return changes


def _prefetch_position(prefix: Sequence[float], use: int, transfer: float, floor: int) -> int:
    """The position a prefetch for a use at `use` is issued at: the latest whose compute
    up to `use` covers `transfer` (not before `floor`)."""
    position = bisect_right(prefix, prefix[use] - transfer) - 1
    return max(floor, min(use, position))


# --- shared -------------------------------------------------------------------------------


def _result(
    graph: Graph,
    budget: int,
    options: SolverOptions,
    started: float,
    schedule: Schedule,
    trace: MemoryTrace,
    objective: float,
    timed_out: bool,
    decisions: dict[int, Decision],
) -> SolveResult:
    fits = trace.peak <= budget
    status = "feasible" if fits else "timeout" if timed_out else "infeasible"
    return SolveResult(
        solver="director",
        status=status,
        schedule=schedule,
        objective=objective,
        solve_seconds=time.perf_counter() - started,
        decisions=decisions,
        options=options.to_json(),
        message=f"peak {trace.peak} B for a budget of {budget} B",
    )
