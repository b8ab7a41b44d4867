"""Checkpoint selection on the chain of cut points (Hong et al. 2025, arXiv 2502.12499).

`chain_dp` runs the dynamic program over checkpoint sets of the chain model below at a
sweep of model budgets that does not depend on the budget asked for, and lets the
simulator judge every set it finds; `linear` is a linear-time selector on the same chain.
The model only proposes: peaks, times and statuses all come from the simulator.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import time
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from memplan import remat
from memplan.graph import Compute, Decision, Graph, Schedule, SolveResult
from memplan.planner.simulate import simulate
from memplan.solvers import SolverOptions
from memplan.solvers.baselines import sqrt_decisions
from memplan.solvers.training import build_schedule

# Pareto states kept per checkpoint in the budgeted DP; beyond it the DP thins its fronts
# rather than growing without bound on long chains.
_FRONT_LIMIT = 64
# Model budgets chain_dp's sweep visits at most (plus its least-peak set): each is
# simulated, so this bounds the solve time.
_SWEEP = 32
# Segment caps the linear selector tries: a constant, so it stays O(n).
_LINEAR_CAPS = 24


# --- the chain ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Selection:
    """A checkpoint set: stage indices in increasing order (the last stage, n, always
    among them) and the stored ones among them, whose whole stage is kept instead of
    being recomputed when the segment ending there is."""

    checkpoints: tuple[int, ...]
    stored: frozenset[int] = frozenset()


@dataclass(frozen=True)
class Chain:
    """The forward graph as a chain of stages 1..n, stage k ending at cut point cuts[k-1].

    Index 0 is a virtual start (nothing held, d=0): a segment (0, j] is recomputed from
    the graph's sources. Per stage k (lists are indexed by k, entry 0 unused):
    keep[k-1] the nodes a checkpoint at k keeps: the cut and the outputs carved from it,
    d[k]   bytes of their storage (a view holds its owner's),
    a[k]   bytes of the stage's other storages the backward reads: after a recomputation
           they stay until the stage's backward has run,
    c[k]   bytes of the stage's storages the backward reads, the checkpoint's included:
           what a recomputed stage holds until its backward has run,
    fw[k]  peak bytes of running the stage's forward alone (its input not counted),
    h[k]   the most bytes of values outside the chain (gradients, the parameter gradients
           made so far) live while a backward node of stage k runs,
    t[k]   forward time of the whole stage,
    ti[k]  time of what a segment ending at checkpoint k recomputes of stage k: the
           stage's nodes outside the checkpoint that the backward reads, and their
           ancestors inside the stage,
    reach[k]  whether stage k's backward reads a forward value outside the checkpoint, so
           that a segment ending at checkpoint k is recomputed while stage k's backward runs.
    """

    cuts: tuple[int, ...]
    stages: tuple[tuple[int, ...], ...]
    keep: tuple[tuple[int, ...], ...]
    d: tuple[int, ...]
    a: tuple[int, ...]
    c: tuple[int, ...]
    fw: tuple[int, ...]
    h: tuple[int, ...]
    t: tuple[float, ...]
    ti: tuple[float, ...]
    reach: tuple[bool, ...]
    has_backward: bool

    @property
    def n(self) -> int:
        return len(self.cuts)

    def stage_costs(self, i: int, k: int, held: int) -> tuple[int, int]:
        """Bytes beyond the checkpoints <= i while stage k of a segment from checkpoint i
        runs, given `held` = bytes the recomputed stages i+1..k-1 hold: (k inside the
        segment, k its end).

        Forward: stage k's input cut (unless it is checkpoint i) and its work. Backward:
        inside, the recomputed stages i+1..k-1, stage k's retained values and the
        gradients; at the end, the recomputation has happened only if stage k's backward
        reaches back.
        """
        forward = (self.d[k - 1] if k - 1 > i else 0) + self.fw[k]
        if not self.has_backward:
            return forward, forward
        grads = self.h[k]
        inside = held + self.c[k] + grads
        end = held + self.a[k] + self.d[k] + grads if self.reach[k] else self.d[k] + grads
        return max(forward, inside), max(forward, end)

    def segment_costs(self) -> list[list[int]]:
        """U[i][j] = the most bytes segment (i, j] adds on top of the checkpoints <= i:
        max(stage costs inside, its end's), for 0 <= i < j <= n. O(n^2)."""
        n = self.n
        upper = [[0] * (n + 1) for _ in range(n + 1)]
        for i in range(n):
            held, worst = 0, 0
            for k in range(i + 1, n + 1):
                inside, end = self.stage_costs(i, k, held)
                upper[i][k] = max(worst, end)
                worst = max(worst, inside)
                held += self.c[k]
        return upper

    def held_bytes(self, k: int, stored: bool) -> int:
        """Bytes checkpoint k holds from the forward until its stage's backward."""
        return self.d[k] + (self.a[k] if stored else 0)

    def recompute_time(self, i: int, j: int, stored: bool = False) -> float:
        """Time the backward spends recomputing segment (i, j]: stages i+1..j-1 whole and
        what stage j's backward reads (nothing if stage j is stored); nothing without a
        backward."""
        if not self.has_backward:
            return 0.0
        return float(self.between[i, j]) + (0.0 if stored else self.ti[j])

    @cached_property
    def between(self) -> np.ndarray:
        """between[i, j] = forward time of stages i+1..j-1, for 0 <= i < j <= n. O(n^2)."""
        table = np.zeros((self.n + 1, self.n + 1))
        for i in range(self.n):
            elapsed = 0.0
            for j in range(i + 1, self.n + 1):
                table[i, j] = elapsed
                elapsed += self.t[j]
        return table

    def recompute_times(self, j: int, stored: bool) -> np.ndarray:
        """recompute_time(i, j, stored) for every i < j."""
        if not self.has_backward:
            return np.zeros(j)
        return self.between[:j, j] + (0.0 if stored else self.ti[j])

    def model_peak(self, checkpoints: Iterable[int], stored: Collection[int] = ()) -> int:
        """The chain model's peak for a checkpoint set (stage indices; n is always added):
        max over consecutive checkpoints i < j of (bytes of checkpoints <= i) + U(i, j).
        O(n), written apart from segment_costs so that tests can check one with the other."""
        ends = set(checkpoints) | {self.n}
        peak, saved, start, held, worst = 0, 0, 0, 0, 0
        for k in range(1, self.n + 1):
            inside, end = self.stage_costs(start, k, held)
            if k in ends:
                peak = max(peak, saved + worst, saved + end)
                saved += self.held_bytes(k, k in stored)
                start, held, worst = k, 0, 0
            else:
                worst = max(worst, inside)
                held += self.c[k]
        return max(peak, saved)

    def model_time(self, checkpoints: Iterable[int], stored: Collection[int] = ()) -> float:
        """The chain model's recompute time for a checkpoint set."""
        chosen = [0, *sorted(set(checkpoints) | {self.n})]
        return sum(self.recompute_time(i, j, j in stored) for i, j in itertools.pairwise(chosen))


def forward_nodes(graph: Graph, problem: str) -> list[int]:
    """The nodes the chain is made of: training, the forward compute nodes; general,
    every node not labelled backward (all of them in a graph with no labels)."""
    if problem == "training":
        return graph.forward_ids
    return [v.id for v in graph if not v.is_backward and not v.is_resident_input]


def cut_points(graph: Graph, forward: Sequence[int]) -> list[int]:
    """Forward nodes whose output alone is live across them in the reference order: no
    forward edge u -> w with u before and w after them. The last forward node always is."""
    position = {v: p for p, v in enumerate(forward)}
    crossing = [0] * (len(forward) + 1)  # difference array of edges spanning each position
    for v in forward:
        for u in dict.fromkeys(graph[v].inputs):
            if u in position and position[v] - position[u] > 1:
                crossing[position[u] + 1] += 1
                crossing[position[v]] -= 1
    cuts, spanning = [], 0
    for p, v in enumerate(forward):
        spanning += crossing[p]
        if spanning == 0:
            cuts.append(v)
    return cuts


def build_chain(graph: Graph, problem: str) -> Chain:
    """The chain of cut points of the forward graph with the per-stage sizes and times."""
    forward = forward_nodes(graph, problem)
    cuts = cut_points(graph, forward)
    stages, keep = _stages(graph, forward, cuts)
    stage_of = {v: k for k, members in enumerate(stages, start=1) for v in members}
    read = _read_by_backward(graph, stage_of)
    d, a, c, fw, t, ti = [0], [0], [0], [0], [0.0], [0.0]
    for members, kept in zip(stages, keep, strict=True):
        others = [v for v in members if v not in kept and v in read]
        d.append(_storage_bytes(graph, kept))
        a.append(_storage_bytes(graph, [*kept, *others]) - d[-1])
        c.append(_storage_bytes(graph, [v for v in members if v in read]))
        fw.append(_stage_forward_peak(graph, members, kept))
        t.append(sum((graph[v].time for v in members), 0.0))
        ti.append(sum((graph[v].time for v in _ancestors_within(graph, members, others)), 0.0))
    h, reach = _backward_terms(graph, problem, stage_of, keep)
    return Chain(
        cuts=tuple(cuts),
        stages=tuple(stages),
        keep=tuple(keep),
        d=tuple(d),
        a=tuple(a),
        c=tuple(c),
        fw=tuple(fw),
        h=tuple(h),
        t=tuple(t),
        ti=tuple(ti),
        reach=tuple(reach),
        has_backward=bool(graph.backward_ids),
    )


def _stages(
    graph: Graph, forward: Sequence[int], cuts: Sequence[int]
) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]]]:
    """The stages (forward nodes up to each cut) and what a checkpoint at each keeps: the
    cut and the outputs carved from it, which move into the cut's stage (they hold its
    bytes: keeping the cut alone would keep none of them)."""
    carved = graph.carved_outputs
    members_of_forward = set(forward) - set(cuts)  # an output that is a cut stays one
    taken = {u for v in cuts for u in carved.get(v, ()) if u in members_of_forward}
    stages: list[tuple[int, ...]] = []
    keep: list[tuple[int, ...]] = []
    start = 0
    for cut in cuts:
        end = forward.index(cut, start) + 1
        outputs = tuple(u for u in carved.get(cut, ()) if u in members_of_forward)
        members = [v for v in forward[start:end] if v not in taken]
        stages.append((*members, *outputs))
        keep.append((cut, *outputs))
        start = end
    return stages, keep


def _storage_bytes(graph: Graph, nodes: Iterable[int]) -> int:
    """Bytes of the storages that keeping `nodes` holds: each owner once (a view pins its
    owner's), none for resident inputs, and an output carved from a kept owner is part of
    that owner's bytes."""
    owners = {graph.storage_owner[v] for v in nodes}
    return sum(
        graph[o].bytes
        for o in owners
        if not graph[o].is_resident_input
        and not (
            graph[o].carved_from is not None and graph.storage_owner[graph[o].carved_from] in owners
        )
    )


def _read_by_backward(graph: Graph, stage_of: dict[int, int]) -> set[int]:
    """The chain's nodes that some node labelled backward reads."""
    return {v for v in stage_of if any(graph[u].is_backward for u in graph.users[v])}


def _ancestors_within(graph: Graph, members: Sequence[int], targets: Iterable[int]) -> set[int]:
    """`targets` and their ancestors among `members`: what recomputing them runs."""
    inside = set(members)
    found = set(targets)
    for v in sorted(members, reverse=True):
        if v in found:
            found.update(u for u in graph[v].inputs if u in inside)
    return found


def _backward_terms(
    graph: Graph, problem: str, stage_of: dict[int, int], keep: Sequence[tuple[int, ...]]
) -> tuple[list[int], list[bool]]:
    """h and reach per stage. A backward node belongs to the last stage it reads (one
    that reads none to the stage of the node before it, at first the last stage)."""
    n = len(keep)
    h, reach = [0] * (n + 1), [False] * (n + 1)
    live = _live_outside(graph, problem, set(stage_of))
    current = n
    for u in graph.backward_ids:
        inputs = dict.fromkeys(graph[u].inputs)
        read = [stage_of[s] for s in inputs if s in stage_of]
        current = max(read) if read else current
        kept = set(keep[current - 1]) if current else set()
        reach[current] = reach[current] or any(s in stage_of and s not in kept for s in inputs)
        h[current] = max(h[current], live.get(u, 0))
    return h, reach


def _live_outside(graph: Graph, problem: str, chain_nodes: set[int]) -> dict[int, int]:
    """Per node, the bytes of values outside the chain (gradients, the parameter
    gradients made so far, tangents) live just after it runs: the simulator's count on
    the schedule that recomputes nothing, with the chain and resident inputs weighing 0."""
    nodes = tuple(
        dataclasses.replace(v, bytes=0) if v.id in chain_nodes or v.is_resident_input else v
        for v in graph
    )
    weightless = Graph(nodes=nodes, outputs=graph.outputs, name=graph.name)
    if problem == "training":
        schedule = build_schedule(weightless, {})
    else:
        sequence = [v.id for v in graph if not v.is_resident_input]
        schedule = remat.to_schedule(weightless, sequence)
    trace = simulate(weightless, schedule)
    return {
        step.node: live
        for step, live in zip(schedule.steps, trace.live, strict=True)
        if isinstance(step, Compute)
    }


def _stage_forward_peak(graph: Graph, members: Sequence[int], kept: Collection[int]) -> int:
    """Peak bytes of running a stage's nodes in order, each freed after its last read
    inside the stage (the checkpoint's nodes stay). Carved outputs take their bytes out of
    their producer's, so they add none."""
    inside = set(members)
    last_read = {v: v for v in members}
    for v in members:
        for u in graph[v].inputs:
            if u in inside:
                last_read[u] = max(last_read[u], v)
    frees: dict[int, list[int]] = {}
    for v in members:
        if v not in kept:
            frees.setdefault(last_read[v], []).append(v)
    sizes = {v: 0 if graph[v].carved_from is not None else graph[v].bytes for v in members}
    live = peak = 0
    for v in members:
        live += sizes[v]
        peak = max(peak, live)
        live -= sum(sizes[u] for u in frees.get(v, ()))
    return peak


# --- the dynamic programs --------------------------------------------------------------


def least_peak(chain: Chain, upper: list[list[int]]) -> tuple[int, Selection]:
    """Hong et al.'s revised recursion, exact for the chain model (storing a stage never
    lowers a model peak, so stored stages are left out).

    T(i) = least peak from checkpoint i on, counting checkpoints from i:
    T(n) = d_n;  T(i) = d_i + min_{i<j<=n} max(U(i, j), T(j)),  answer T(0) with d_0 = 0.
    Returns the peak and the checkpoints (n included, none stored). O(n^2) given U.
    """
    n = chain.n
    best = [0] * (n + 1)
    nxt = [n] * (n + 1)
    best[n] = chain.d[n]
    for i in range(n - 1, -1, -1):
        value, choice = math.inf, n
        for j in range(i + 1, n + 1):
            candidate = max(upper[i][j], best[j])
            if candidate < value:  # ties go to the nearest j: shorter recomputations
                value, choice = candidate, j
        best[i] = chain.d[i] + int(value)
        nxt[i] = choice
    checkpoints, i = [], 0
    while i < n:
        i = nxt[i]
        checkpoints.append(i)
    return best[0], Selection(tuple(checkpoints))


_NEVER = np.iinfo(np.int64).max  # held bytes of an empty slot in a front: never fits


def least_time(chain: Chain, upper: list[list[int]], budget: int) -> tuple[float, Selection] | None:
    """Least recompute time over checkpoint sets with model peak <= budget.

    F(j) = Pareto front of (H, time) over checkpoint sets ending at checkpoint j, H the
    bytes those checkpoints hold; (H, time) at i extends to j when H + U(i, j) <= budget,
    to (H + d_j, time + recompute_time(i, j)) or, storing stage j, to
    (H + d_j + a_j, time + recompute_time(i, j) without stage j's share). Exact for the
    model while fronts stay under _FRONT_LIMIT, thinned evenly beyond. None if no set
    fits. O(n^2 * front), one numpy pass over the predecessors per checkpoint.
    """
    n = chain.n
    bounds = np.asarray(upper, dtype=np.int64).reshape(n + 1, n + 1)
    held = np.full((n + 1, _FRONT_LIMIT), _NEVER, dtype=np.int64)  # fronts, by held bytes
    spent = np.zeros((n + 1, _FRONT_LIMIT))
    held[0, 0] = 0
    links = [(np.zeros(1, dtype=np.int64), np.zeros(1, dtype=np.int64), np.zeros(1, dtype=bool))]
    for j in range(1, n + 1):
        kinds = (False, True) if chain.has_backward and chain.ti[j] > 0 else (False,)
        offers = [_offers(chain, bounds, held, spent, j, stored, budget) for stored in kinds]
        gained, took, starts, indices, stored = (
            np.concatenate(part) for part in zip(*offers, strict=True)
        )
        kept = _pareto(gained, took, starts, indices, stored)
        held[j, : len(kept)] = gained[kept]
        spent[j, : len(kept)] = took[kept]
        links.append((starts[kept], indices[kept], stored[kept]))
    if held[n, 0] == _NEVER:
        return None
    index = len(links[n][0]) - 1  # the front's last state is its fastest
    total = float(spent[n, index])
    checkpoints, stored_stages, j = [], set(), n
    while j > 0:
        checkpoints.append(j)
        starts, indices, stored = links[j]
        if stored[index]:
            stored_stages.add(j)
        j, index = int(starts[index]), int(indices[index])
    return total, Selection(tuple(sorted(checkpoints)), frozenset(stored_stages))


def _offers(
    chain: Chain,
    bounds: np.ndarray,
    held: np.ndarray,
    spent: np.ndarray,
    j: int,
    stored: bool,
    budget: int,
) -> tuple[np.ndarray, ...]:
    """Every state of the fronts before j that may extend to j (plain or stored): its
    held bytes and time at j, its checkpoint, its index in that front, and `stored`."""
    extra = chain.held_bytes(j, stored)
    room = budget - np.maximum(bounds[:j, j], extra if j == chain.n else 0)
    starts, indices = np.nonzero(held[:j] <= room[:, None])
    cost = chain.recompute_times(j, stored)
    return (
        held[starts, indices] + extra,
        spent[starts, indices] + cost[starts],
        starts,
        indices,
        np.full(len(starts), stored),
    )


def _pareto(
    gained: np.ndarray,
    took: np.ndarray,
    starts: np.ndarray,
    indices: np.ndarray,
    stored: np.ndarray,
) -> np.ndarray:
    """Positions of the offers no other beats on both held bytes and time, by held bytes
    (ties: the earlier start, plain before stored), thinned evenly to _FRONT_LIMIT with
    both ends kept: the fewest bytes and the least time."""
    order = np.lexsort((stored, indices, starts, took, gained))
    times = took[order]
    best = np.minimum.accumulate(times)
    kept = order[np.concatenate(([True], times[1:] < best[:-1]))] if len(order) else order
    if len(kept) > _FRONT_LIMIT:
        step = (len(kept) - 1) / (_FRONT_LIMIT - 1)
        kept = kept[np.round(np.arange(_FRONT_LIMIT) * step).astype(np.int64)]
    return kept


def sweep(chain: Chain, upper: list[list[int]]) -> list[Selection]:
    """The DP's checkpoint sets over a sweep of model budgets, which no budget asked for
    changes: the least-peak set, the set that stores every stage (no recomputation, as
    keep_all), then the fastest set within each bound, from the model peak of storing
    every stage down to the least peak. Each next
    bound is just below the last set's model peak, or 1/_SWEEP of that range lower if
    that is lower still: at most _SWEEP + 1 runs of least_time, and every point of the
    model's peak/time front is visited where the points lie at least that far apart."""
    floor, least = least_peak(chain, upper)
    stages = tuple(range(1, chain.n + 1))
    everything = Selection(stages, frozenset(stages))
    bound = chain.model_peak(everything.checkpoints, everything.stored)
    step = max(1, -(-(bound - floor) // _SWEEP))  # rounded up: at most _SWEEP + 1 steps
    found = [least, everything]
    while bound >= floor:
        fastest = least_time(chain, upper, bound)
        if fastest is None:
            break
        selection = fastest[1]
        found.append(selection)
        peak = chain.model_peak(selection.checkpoints, selection.stored)
        bound = min(peak - 1, bound - step)
    return list(dict.fromkeys(found))


def linear_checkpoints(chain: Chain, cap: int) -> list[int]:
    """One left-to-right pass: extend the current segment while its added bytes stay within
    `cap`, else checkpoint the stage before. O(n) with running sums."""
    n = chain.n
    checkpoints: list[int] = []
    i, held, worst = 0, 0, 0
    k = 1
    while k <= n:
        inside, end = chain.stage_costs(i, k, held)
        if max(worst, end) > cap and k - 1 > i:
            checkpoints.append(k - 1)  # segment (i, k-1] was within the cap
            i, held, worst = k - 1, 0, 0
            continue  # stage k again, now as the first of a new segment
        worst = max(worst, inside)
        held += chain.c[k]
        k += 1
    return [*checkpoints, n]


# --- from checkpoints to a schedule ------------------------------------------------------


def sequence_for_checkpoints(graph: Graph, keep: set[int]) -> list[int]:
    """The general problem's sequence (node ids, repeats are recomputations) that keeps
    only the values in `keep` (and resident inputs and graph outputs) between their uses.

    Every node runs once in reference order. A value not kept is dropped when the
    backward starts (at the first node labelled backward) or, in a graph with no backward
    labels, when a node of `keep` after it is computed; a dropped value that is read again
    is recomputed, with its missing ancestors, just before the read, and the new copy
    stays usable. Copies are freed after their last read by the scoring rules.
    """
    has_backward = any(v.is_backward for v in graph)
    stays = keep | set(graph.outputs)  # an output is never freed, so never recomputed
    available: set[int] = {v.id for v in graph if v.is_resident_input}
    made: list[int] = []  # forward values made since the last drop
    sequence: list[int] = []
    dropping = False
    for node in graph:
        if node.is_resident_input:
            continue
        if has_backward and node.is_backward and not dropping:
            dropping = True
            available.difference_update(v for v in made if v not in stays)
            made = []
        _recompute_inputs(graph, node.id, available, sequence)
        sequence.append(node.id)
        available.add(node.id)
        if not node.is_backward:
            made.append(node.id)
        if not has_backward and node.id in keep:
            available.difference_update(v for v in made if v not in stays)
            made = []
    return sequence


def _recompute_inputs(graph: Graph, target: int, available: set[int], out: list[int]) -> None:
    """Append the recomputations that bring every input of `target` back."""
    out.extend(remat.missing_ancestors(graph, graph[target].inputs, available))


@dataclass(frozen=True)
class ChainPlan:
    """A checkpoint set carried out and judged by the simulator."""

    selection: Selection
    schedule: Schedule
    decisions: dict[int, Decision]
    peak: int
    time: float


def carry_out(
    graph: Graph, chain: Chain, selection: Selection, options: SolverOptions
) -> ChainPlan:
    """Checkpoints -> kept values (a checkpoint's nodes; a stored stage's every node) ->
    the problem's schedule, simulated."""
    chosen = set(selection.checkpoints) | ({chain.n} if chain.n else set())
    selection = Selection(tuple(sorted(chosen)), selection.stored & chosen)
    kept = set()
    for k in selection.checkpoints:
        kept.update(chain.stages[k - 1] if k in selection.stored else chain.keep[k - 1])
    return _plan_for_keep(graph, selection, kept, options)


def _plan_for_keep(
    graph: Graph, selection: Selection, kept: set[int], options: SolverOptions
) -> ChainPlan:
    """The schedule that keeps `kept` (and every node that cannot be recomputed) and
    recomputes the rest. Training: a decision for every saved candidate and every kept
    node, so that a checkpoint the backward does not read is kept all the same."""
    kept |= {v.id for v in graph if not v.recomputable}
    if options.problem == "training":
        decided = set(graph.saved_candidates) | (kept & set(graph.forward_ids))
        decisions = {v: Decision.KEEP if v in kept else Decision.RECOMPUTE for v in sorted(decided)}
        schedule = build_schedule(graph, decisions, bandwidth=None)
    else:
        forward = set(forward_nodes(graph, options.problem))
        decisions = {v: Decision.KEEP if v in kept else Decision.RECOMPUTE for v in sorted(forward)}
        schedule = remat.to_schedule(graph, sequence_for_checkpoints(graph, kept))
    trace = simulate(graph, schedule)
    return ChainPlan(selection, schedule, decisions, trace.peak, trace.time)


def _pick(plans: Sequence[ChainPlan], budget: int, minimize_memory: bool) -> ChainPlan:
    """The fastest plan within the budget (then the least peak); the least peak (then
    the fastest) when minimizing memory or when none fits."""
    fitting = [p for p in plans if p.peak <= budget and not minimize_memory]
    if fitting:
        return min(fitting, key=lambda p: (p.time, p.peak))
    return min(plans, key=lambda p: (p.peak, p.time))


def _result(
    name: str, plan: ChainPlan, budget: int, options: SolverOptions, started: float, note: str
) -> SolveResult:
    """Status from the simulated peak: feasible within the budget, else infeasible. Never
    optimal: the search covers checkpoint sets at cut points, not every schedule, and
    the model that guides it is not the simulator."""
    status = "infeasible" if plan.peak > budget else "feasible"
    stored = len(plan.selection.stored)
    return SolveResult(
        solver=name,
        status=status,
        schedule=plan.schedule,
        objective=float(plan.peak) if options.minimize_memory else plan.time,
        solve_seconds=time.perf_counter() - started,
        decisions=plan.decisions,
        options=options.to_json(),
        message=f"{note}; {len(plan.selection.checkpoints)} checkpoints ({stored} stored), "
        f"simulated peak {plan.peak} B",
    )


# --- the solvers -------------------------------------------------------------------------


def chain_dp(graph: Graph, budget: int, options: SolverOptions) -> SolveResult:
    """Hong et al.'s dynamic program on the chain of cut points, judged by the simulator.

    The DP proposes the checkpoint sets of `sweep` (the same whatever the budget); each
    is carried out and simulated. Returned: the fastest within the budget, else (and with
    minimize_memory) the least simulated peak. So a larger budget never gives a slower
    schedule, and the least-memory schedule is no higher than any budgeted one.
    """
    started = time.perf_counter()
    chain = build_chain(graph, options.problem)
    selections = sweep(chain, chain.segment_costs())
    plans = [carry_out(graph, chain, s, options) for s in selections]
    plan = _pick(plans, budget, options.minimize_memory)
    note = f"best of {len(plans)} DP checkpoint sets over {chain.n} stages"
    return _result("chain_dp", plan, budget, options, started, note)


def linear(graph: Graph, budget: int, options: SolverOptions) -> SolveResult:
    """A linear-time selector on the same chain: one greedy pass per segment cap, for a
    constant number of caps on a geometric grid, plus Chen et al.'s sqrt(n) checkpoints;
    each candidate is simulated and the best kept (least peak when minimizing, else the
    fastest within the budget, else the least peak). O(n) passes, O(1) simulations."""
    started = time.perf_counter()
    chain = build_chain(graph, options.problem)
    low = max((chain.stage_costs(k - 1, k, 0)[1] for k in range(1, chain.n + 1)), default=1)
    low = max(1, low)
    high = max(low, sum(chain.d) + sum(chain.c) + max(chain.h, default=0))
    ratio = (high / low) ** (1 / (_LINEAR_CAPS - 1)) if high > low else 1.0
    caps = sorted({math.ceil(low * ratio**s) for s in range(_LINEAR_CAPS)})
    candidates = sorted({tuple(linear_checkpoints(chain, cap)) for cap in caps})
    plans = [carry_out(graph, chain, Selection(c), options) for c in candidates]
    plans.append(_sqrt_plan(graph, chain, options))
    plan = _pick(plans, budget, options.minimize_memory)
    note = f"greedy segment caps and sqrt(n) checkpoints over {chain.n} stages"
    return _result("linear", plan, budget, options, started, note)


def _sqrt_plan(graph: Graph, chain: Chain, options: SolverOptions) -> ChainPlan:
    """Chen et al.'s sqrt(n) checkpoints, so that linear is never worse than chen_sqrt."""
    if options.problem == "training":
        decisions = sqrt_decisions(graph)
        kept = {v for v, d in decisions.items() if d is Decision.KEEP}
    else:
        stride = max(1, math.isqrt(chain.n))
        kept = {chain.cuts[k - 1] for k in range(stride, chain.n + 1, stride)}
        kept.update(chain.cuts[-1:])
    position = {v: k for k, v in enumerate(chain.cuts, start=1)}
    chosen = tuple(sorted(position[v] for v in kept if v in position))
    return _plan_for_keep(graph, Selection(chosen), kept, options)
