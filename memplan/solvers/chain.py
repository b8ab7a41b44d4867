"""Checkpoint selection on the chain of cut points (Hong et al. 2025, arXiv 2502.12499).

`chain_dp` is the exact dynamic program over checkpoint sets of the chain model below;
`linear` is a linear-time selector on the same chain. Both are judged by the simulator.
"""

from __future__ import annotations

import itertools
import math
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from memplan import remat
from memplan.graph import Decision, Graph, NodeKind, Schedule, SolveResult
from memplan.planner.simulate import simulate
from memplan.solvers import SolverOptions
from memplan.solvers.baselines import sqrt_decisions
from memplan.solvers.training import build_schedule

# Pareto states kept per checkpoint in the budgeted DP; beyond it the DP is a heuristic
# (and says so) rather than growing without bound on long chains.
_FRONT_LIMIT = 64
# Tightenings of the model budget when the simulator finds the model optimistic.
_CALIBRATION_ROUNDS = 8
# Segment caps the linear selector tries: a constant, so it stays O(n).
_LINEAR_CAPS = 24


# --- the chain ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Chain:
    """The forward graph as a chain of stages 1..n, stage k ending at cut point cuts[k-1].

    Index 0 is a virtual start (nothing held, d=0): a segment (0, j] is recomputed from
    the graph's sources. Per stage k (lists are indexed by k, entry 0 unused):
    d[k]   bytes of the cut value (what a checkpoint at k holds),
    a[k]   bytes of the stage's other forward values,
    fw[k]  peak bytes of running the stage's forward alone (its input not counted),
    h[k]   bytes the backward of stage k holds besides forward values (gradients),
    t[k], ti[k]  forward time of the whole stage, and of the stage without its cut node,
    reach[k]  whether stage k's backward reads a forward value other than its cut, so that
           a segment ending at checkpoint k is recomputed while stage k's backward runs.
    """

    cuts: tuple[int, ...]
    stages: tuple[tuple[int, ...], ...]
    d: tuple[int, ...]
    a: tuple[int, ...]
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
        runs, given `held` = bytes of stages i+1..k-1: (k inside the segment, k its end).

        Forward: stage k's input cut (unless it is checkpoint i) and its work. Backward:
        inside, the recomputed stages i+1..k-1, stage k's values and its gradients; at
        the end, the recomputation has happened only if stage k's backward reaches back.
        """
        forward = (self.d[k - 1] if k - 1 > i else 0) + self.fw[k]
        if not self.has_backward:
            return forward, forward
        inside = held + self.a[k] + self.d[k] + self.h[k]
        end = inside if self.reach[k] else self.d[k] + self.h[k]
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
                held += self.d[k] + self.a[k]
        return upper

    def recompute_time(self, i: int, j: int) -> float:
        """Time the backward spends recomputing segment (i, j]: stages i+1..j-1 whole and
        stage j without its (checkpointed) cut node; nothing without a backward."""
        if not self.has_backward:
            return 0.0
        return sum(self.t[m] for m in range(i + 1, j)) + self.ti[j]

    def model_peak(self, checkpoints: Iterable[int]) -> int:
        """The chain model's peak for a checkpoint set (stage indices; n is always added):
        max over consecutive checkpoints i < j of (bytes of checkpoints <= i) + U(i, j).
        O(n), written apart from segment_costs so that tests can check one with the other."""
        ends = set(checkpoints) | {self.n}
        peak, saved, start, held, worst = 0, 0, 0, 0, 0
        for k in range(1, self.n + 1):
            inside, end = self.stage_costs(start, k, held)
            if k in ends:
                peak = max(peak, saved + worst, saved + end)
                saved += self.d[k]
                start, held, worst = k, 0, 0
            else:
                worst = max(worst, inside)
                held += self.d[k] + self.a[k]
        return max(peak, saved)

    def model_time(self, checkpoints: Iterable[int]) -> float:
        chosen = [0, *sorted(set(checkpoints) | {self.n})]
        return sum(self.recompute_time(i, j) for i, j in itertools.pairwise(chosen))


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
    stages: list[tuple[int, ...]] = []
    start = 0
    for cut in cuts:
        end = forward.index(cut, start) + 1
        stages.append(tuple(forward[start:end]))
        start = end
    stage_of = {v: k for k, members in enumerate(stages, start=1) for v in members}
    d, a, fw, t, ti = [0], [0], [0], [0.0], [0.0]
    for members in stages:
        cut = members[-1]
        d.append(graph[cut].bytes)
        a.append(sum(graph[v].bytes for v in members[:-1]))
        fw.append(_stage_forward_peak(graph, members))
        t.append(sum(graph[v].time for v in members))
        ti.append(sum(graph[v].time for v in members[:-1]))
    backward = [
        u.id for u in graph if u.id not in stage_of and u.kind is NodeKind.COMPUTE and u.is_backward
    ]
    h = [0] * (len(stages) + 1)
    reach = [False] * (len(stages) + 1)
    cut_set = set(cuts)
    current = len(stages)
    for u in backward:
        read = [stage_of[s] for s in graph[u].inputs if s in stage_of]
        current = max(read) if read else current  # gradient-only nodes join the last stage
        reach[current] = reach[current] or any(
            s in stage_of and not (s in cut_set and stage_of[s] == current) for s in graph[u].inputs
        )
        grads = sum(graph[s].bytes for s in dict.fromkeys(graph[u].inputs) if graph[s].is_backward)
        h[current] = max(h[current], graph[u].bytes + grads)
    return Chain(
        cuts=tuple(cuts),
        stages=tuple(stages),
        d=tuple(d),
        a=tuple(a),
        fw=tuple(fw),
        h=tuple(h),
        t=tuple(t),
        ti=tuple(ti),
        reach=tuple(reach),
        has_backward=bool(backward),
    )


def _stage_forward_peak(graph: Graph, members: Sequence[int]) -> int:
    """Peak bytes of running a stage's nodes in order, each freed after its last read
    inside the stage (the cut node stays)."""
    inside = set(members)
    last_read = {v: v for v in members}
    for v in members:
        for u in graph[v].inputs:
            if u in inside:
                last_read[u] = max(last_read[u], v)
    frees: dict[int, list[int]] = {}
    for v in members[:-1]:
        frees.setdefault(last_read[v], []).append(v)
    live = peak = 0
    for v in members:
        live += graph[v].bytes
        peak = max(peak, live)
        live -= sum(graph[u].bytes for u in frees.get(v, ()))
    return peak


# --- the dynamic programs --------------------------------------------------------------


def least_peak(chain: Chain, upper: list[list[int]]) -> tuple[int, list[int]]:
    """Hong et al.'s revised recursion, exact for the chain model.

    T(i) = least peak from checkpoint i on, counting checkpoints from i:
    T(n) = d_n;  T(i) = d_i + min_{i<j<=n} max(U(i, j), T(j)),  answer T(0) with d_0 = 0.
    Returns the peak and the checkpoints (stage indices, n included). O(n^2) given U.
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
    return best[0], checkpoints


def least_time(
    chain: Chain, upper: list[list[int]], budget: int
) -> tuple[float, list[int], bool] | None:
    """Least recompute time over checkpoint sets with model peak <= budget.

    F(j) = Pareto front of (H, time) over checkpoint sets ending at checkpoint j, H the
    bytes of those checkpoints; (H, time) at i extends to j when H + U(i, j) <= budget, to
    (H + d_j, time + recompute_time(i, j)). Exact while fronts stay under _FRONT_LIMIT
    (the flag says whether one was cut). None if no set fits. O(n^2 * front).
    """
    n = chain.n
    # front[j]: (held bytes, time, predecessor checkpoint, index in its front)
    front: list[list[tuple[int, float, int, int]]] = [[] for _ in range(n + 1)]
    front[0] = [(0, 0.0, -1, -1)]
    exact = True
    for j in range(1, n + 1):
        offers: list[tuple[int, float, int, int]] = []
        for i in range(j):
            cost = chain.recompute_time(i, j) if front[i] else 0.0
            for index, (held, spent, _, _) in enumerate(front[i]):
                if held + upper[i][j] <= budget:
                    offers.append((held + chain.d[j], spent + cost, i, index))
        offers.sort(key=lambda s: (s[0], s[1], s[2]))
        kept: list[tuple[int, float, int, int]] = []
        for state in offers:
            if not kept or state[1] < kept[-1][1]:
                kept.append(state)
        if len(kept) > _FRONT_LIMIT:
            exact = False
            step = len(kept) / _FRONT_LIMIT
            kept = [kept[int(s * step)] for s in range(_FRONT_LIMIT)]
        front[j] = kept
    if not front[n]:
        return None
    index = min(range(len(front[n])), key=lambda s: (front[n][s][1], front[n][s][0]))
    spent = front[n][index][1]
    checkpoints, j = [], n
    while j > 0:
        checkpoints.append(j)
        _, _, i, index = front[j][index]
        j = i
    return spent, sorted(checkpoints), exact


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
        held += chain.d[k] + chain.a[k]
        k += 1
    return [*checkpoints, n]


# --- from checkpoints to a schedule ------------------------------------------------------


def sequence_for_checkpoints(graph: Graph, keep: set[int]) -> list[int]:
    """The general problem's sequence (node ids, repeats are recomputations) that keeps
    only the values in `keep` (and resident inputs) between their uses.

    Every node runs once in reference order. A value not in `keep` is dropped when the
    backward starts (at the first node labelled backward) or, in a graph with no backward
    labels, when a node of `keep` after it is computed; a dropped value that is read again
    is recomputed, with its missing ancestors, just before the read, and the new copy
    stays usable. Copies are freed after their last read by the scoring rules.
    """
    has_backward = any(v.is_backward for v in graph)
    available: set[int] = {v.id for v in graph if v.is_resident_input}
    made: list[int] = []  # forward values made since the last drop
    sequence: list[int] = []
    dropping = False
    for node in graph:
        if node.is_resident_input:
            continue
        if has_backward and node.is_backward and not dropping:
            dropping = True
            available.difference_update(v for v in made if v not in keep)
            made = []
        _recompute_inputs(graph, node.id, available, sequence)
        sequence.append(node.id)
        available.add(node.id)
        if not node.is_backward:
            made.append(node.id)
        if not has_backward and node.id in keep:
            available.difference_update(v for v in made if v not in keep)
            made = []
    return sequence


def _recompute_inputs(graph: Graph, target: int, available: set[int], out: list[int]) -> None:
    """Append the recomputations that bring every input of `target` back."""
    out.extend(remat.missing_ancestors(graph, graph[target].inputs, available))


@dataclass(frozen=True)
class _Plan:
    """A checkpoint set carried out and judged by the simulator."""

    checkpoints: tuple[int, ...]  # stage indices
    schedule: Schedule
    decisions: dict[int, Decision]
    peak: int
    time: float


def _carry_out(
    graph: Graph, chain: Chain, checkpoints: Iterable[int], options: SolverOptions
) -> _Plan:
    """Checkpoints -> kept values -> the problem's schedule, simulated."""
    chosen = tuple(sorted(set(checkpoints) | ({chain.n} if chain.n else set())))
    kept = {chain.cuts[k - 1] for k in chosen}
    return _plan_for_keep(graph, chosen, kept, options)


def _plan_for_keep(
    graph: Graph, chosen: tuple[int, ...], kept: set[int], options: SolverOptions
) -> _Plan:
    kept |= {v.id for v in graph if not v.recomputable}
    if options.problem == "training":
        decisions = {
            v: Decision.KEEP if v in kept else Decision.RECOMPUTE for v in graph.saved_candidates
        }
        schedule = build_schedule(graph, decisions, bandwidth=None)
    else:
        forward = set(forward_nodes(graph, options.problem))
        decisions = {v: Decision.KEEP if v in kept else Decision.RECOMPUTE for v in sorted(forward)}
        schedule = remat.to_schedule(graph, sequence_for_checkpoints(graph, kept))
    trace = simulate(graph, schedule)
    return _Plan(chosen, schedule, decisions, trace.peak, trace.time)


def _result(
    name: str,
    plan: _Plan,
    budget: int,
    options: SolverOptions,
    started: float,
    exact: bool,
    note: str,
) -> SolveResult:
    """Status from the simulated peak: never feasible above the budget; optimal only
    where the DP was exact and its model agreed with the simulator."""
    status = "infeasible" if plan.peak > budget else "optimal" if exact else "feasible"
    return SolveResult(
        solver=name,
        status=status,
        schedule=plan.schedule,
        objective=float(plan.peak) if options.minimize_memory else plan.time,
        solve_seconds=time.perf_counter() - started,
        decisions=plan.decisions,
        options=options.to_json(),
        message=f"{note}; {len(plan.checkpoints)} checkpoints, simulated peak {plan.peak} B",
    )


# --- the solvers -------------------------------------------------------------------------


def chain_dp(graph: Graph, budget: int, options: SolverOptions) -> SolveResult:
    """Hong et al.'s dynamic program on the chain of cut points.

    minimize_memory: the least model peak (then the least recompute time at that peak).
    Otherwise: the least recompute time with model peak <= budget. The model leaves out
    what every checkpoint set holds alike (parameters, outputs); that offset is measured
    on the least-peak plan, and the model budget is tightened while the simulator finds a
    plan over the real budget. Falls back to the least-peak plan (infeasible if over).
    """
    started = time.perf_counter()
    chain = build_chain(graph, options.problem)
    upper = chain.segment_costs()
    floor, floor_set = least_peak(chain, upper)
    floor_plan = _carry_out(graph, chain, floor_set, options)
    offset = floor_plan.peak - floor
    if options.minimize_memory:
        found = least_time(chain, upper, floor)
        plan = floor_plan
        exact = offset == 0
        if found is not None:
            candidate = _carry_out(graph, chain, found[1], options)
            if candidate.peak <= floor_plan.peak:
                plan = candidate
                exact = exact and found[2] and candidate.peak == floor_plan.peak
        note = f"least model peak {floor} B over {chain.n} stages"
        return _result("chain_dp", plan, budget, options, started, exact, note)

    target = budget - offset
    for _ in range(_CALIBRATION_ROUNDS):
        if target < floor:
            break
        found = least_time(chain, upper, target)
        if found is None:
            break
        plan = _carry_out(graph, chain, found[1], options)
        if plan.peak <= budget:
            exact = found[2] and plan.peak - offset == chain.model_peak(found[1])
            exact = exact and target == budget - offset
            note = f"least recompute time for model budget {target} B over {chain.n} stages"
            return _result("chain_dp", plan, budget, options, started, exact, note)
        target -= plan.peak - budget  # the model was optimistic by at least this much
    note = f"no checkpoint set fits; least peak plan over {chain.n} stages"
    return _result("chain_dp", floor_plan, budget, options, started, False, note)


def linear(graph: Graph, budget: int, options: SolverOptions) -> SolveResult:
    """A linear-time selector on the same chain: one greedy pass per segment cap, for a
    constant number of caps on a geometric grid, plus Chen et al.'s sqrt(n) checkpoints;
    each candidate is simulated and the best kept (least peak when minimizing, else the
    fastest within the budget, else the least peak). O(n) passes, O(1) simulations."""
    started = time.perf_counter()
    chain = build_chain(graph, options.problem)
    low = max((chain.stage_costs(k - 1, k, 0)[1] for k in range(1, chain.n + 1)), default=1)
    low = max(1, low)
    high = max(low, sum(chain.d) + sum(chain.a) + max(chain.h, default=0))
    ratio = (high / low) ** (1 / (_LINEAR_CAPS - 1)) if high > low else 1.0
    caps = sorted({math.ceil(low * ratio**s) for s in range(_LINEAR_CAPS)})
    candidates = {tuple(linear_checkpoints(chain, cap)) for cap in caps}
    plans = [_carry_out(graph, chain, c, options) for c in sorted(candidates)]
    plans.append(_sqrt_plan(graph, chain, options))
    fitting = [p for p in plans if p.peak <= budget and not options.minimize_memory]
    if fitting:
        plan = min(fitting, key=lambda p: (p.time, p.peak))
    else:
        plan = min(plans, key=lambda p: (p.peak, p.time))
    note = f"greedy segment caps and sqrt(n) checkpoints over {chain.n} stages"
    return _result("linear", plan, budget, options, started, False, note)


def _sqrt_plan(graph: Graph, chain: Chain, options: SolverOptions) -> _Plan:
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
    return _plan_for_keep(graph, chosen, kept, options)
