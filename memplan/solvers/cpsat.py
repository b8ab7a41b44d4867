"""Moccasin (Bartan et al., ICML 2023) on OR-Tools CP-SAT for the general problem.

Each node has up to COPIES copies, each an optional interval of residency over a grid of
compute slots; a cumulative constraint bounds memory and an objective counts recomputation.
"""

from __future__ import annotations

import math
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING

from memplan import remat
from memplan.errors import MissingDependency, UnsupportedModel
from memplan.graph import Graph, Schedule, SolveResult
from memplan.planner.simulate import simulate
from memplan.solvers import SolverOptions, releases, warm_start
from memplan.solvers.releases import Effect, Pick, ReleaseModel

if TYPE_CHECKING:
    from ortools.sat.python import cp_model

NAME = "cpsat"
# Copies per node: the first computation plus at most one recomputation, as in Moccasin.
COPIES = 2
# CP-SAT propagates and relaxes best with small coefficients: the memory capacity is
# scaled to at most this many units (bytes are divided by a common quantum).
CAPACITY_UNITS = 1 << 20
# Node times are scaled so that the largest is about this many objective units, unless
# they are already integers small enough to use as they are.
TIME_UNITS = 1 << 20
# One worker, so a seed gives one schedule: with two, CP-SAT's search depends on thread
# timing and a repeated 8-node solve returned another optimal schedule; interleave_search,
# deterministic by design, was far weaker. Two workers found feasible points sooner on
# random_layered_n100 in some runs, but not reliably.
WORKERS = 1


def solve(graph: Graph, budget: int, options: SolverOptions) -> SolveResult:
    """The fastest sequence within `budget` that CP-SAT finds in `options.time_limit`.

    Phase 1 minimizes max(peak, budget) hinted with the director's sequence where it fits
    the budget (memplan/solvers/warm_start.py), else with an order without recomputation,
    so it always has a point and its optimum says whether the budget is feasible; phase 2
    minimizes the recomputation time below the budget, hinted with phase 1's sequence. With
    `minimize_memory`, phase 1 minimizes the peak itself and phase 2 the time at that peak
    (the objective reported is then the peak). Where no point within the budget is found,
    the least-peak schedule found is returned with status infeasible (proven) or timeout.
    With `options.bandwidth`, values may also be paged to host memory: the model on a time
    axis of memplan/solvers/cpsat_paging.py solves instead. Where CP-SAT returns nothing
    faster than the director's sequence, that sequence is the result (its message says so).
    """
    cp_model_module()  # MissingDependency before any work
    if options.problem == "training":
        return releases.solve(graph, budget, options, NAME, _pick_releases)
    if options.bandwidth is not None and options.bandwidth > 0:
        from memplan.solvers import cpsat_paging  # it builds on this module

        return cpsat_paging.solve(graph, budget, options)
    check_general_graph(graph)
    started = time.perf_counter()
    start = warm_start.director_sequence(graph, budget, options)
    result = _solve_remat(graph, budget, options, started, start)
    return warm_start.keep_faster(graph, result, start, budget, options)


def _solve_remat(
    graph: Graph,
    budget: int,
    options: SolverOptions,
    started: float,
    start: list[int] | None,
) -> SolveResult:
    """The two phases of `solve` without paging; phase 1 is hinted with the director's
    `start` where it has at most COPIES copies of a node, else with start_order."""
    cp = cp_model_module()
    deadline = started + options.time_limit
    scale = Scale.of(graph, None if options.minimize_memory else budget)

    # Phase 1: a feasible point (or the least peak).
    # No schedule peaks below a node with its inputs: a floor CP-SAT can prove at once.
    # (Minimizing memory, the scale has no budget and its capacity is 0.)
    floor = max(scale.capacity, scale.footprint)
    first = _build(graph, scale, capacity=(floor, max(floor, scale.total)))
    first.model.minimize(first.capacity)
    hinted = start if start is not None and _expressible(first, start) else start_order(graph)
    _hint(first, graph, hinted)
    status1, solver1 = _run(first, deadline, options)
    if status1 not in (cp.OPTIMAL, cp.FEASIBLE):
        return make_result(options, started, "timeout", None, message="no point found in time")
    sequence = _decode(first, solver1)
    least_peak = remat.score(graph, sequence).peak
    proven_peak = status1 == cp.OPTIMAL
    if not options.minimize_memory and solver1.value(first.capacity) > scale.capacity:
        status = "infeasible" if proven_peak or scale.footprint_bytes > budget else "timeout"
        message = f"least peak found: {least_peak} B" + scale.caveat(proven_peak)
        return make_result(
            options, started, status, _checked(graph, sequence, None), message=message
        )

    # Phase 2: the least recomputation time within the capacity phase 1 reached.
    limit = solver1.value(first.capacity) if options.minimize_memory else scale.capacity
    second = _build(graph, scale, capacity=(0, limit))
    second.model.minimize(sum(c * p for c, p in zip(second.costs, second.extra, strict=True)))
    _hint(second, graph, sequence)
    status2, solver2 = _run(second, deadline, options)
    bound: float | None = None
    if status2 in (cp.OPTIMAL, cp.FEASIBLE):
        sequence = _decode(second, solver2)
        bound = scale.time_bound(graph, solver2.best_objective_bound)
    result = remat.score(graph, sequence)
    schedule = _checked(graph, sequence, None if options.minimize_memory else budget)
    if options.minimize_memory:
        status = "optimal" if proven_peak else "feasible"
        return make_result(
            options,
            started,
            status,
            schedule,
            objective=float(result.peak),
            lower_bound=scale.peak_bound(solver1.best_objective_bound),
            message=f"duration {result.duration:g}" + scale.caveat(proven_peak),
        )
    status = "optimal" if status2 == cp.OPTIMAL else "feasible"
    return make_result(
        options,
        started,
        status,
        schedule,
        objective=result.duration,
        lower_bound=bound,
        message=f"peak {result.peak} B",
    )


# --- data: scaled bytes and times --------------------------------------------------------


@dataclass(frozen=True)
class Scale:
    """Bytes and times as the small integers CP-SAT gets.

    Demands are bytes divided by `quantum` and rounded up, the capacity the budget divided
    and rounded down: a schedule within the scaled capacity is within the true budget.
    Costs are times times `per_time`, rounded; `slack` bounds what the rounding can shift
    the recomputation time by, so the reported lower bound stays a bound.
    """

    quantum: int
    demand: tuple[int, ...]
    capacity: int
    footprint: int  # the largest scaled memory one computation needs: a floor for the peak
    footprint_bytes: int  # the same in bytes: no schedule peaks lower
    total: int  # all demands together: the peak if nothing were ever freed
    cost: tuple[int, ...]
    per_time: float
    slack: float
    exact: bool  # the quantum divides every size: scaled peaks are true peaks / quantum

    @classmethod
    def of(cls, graph: Graph, budget: int | None) -> Scale:
        sizes = [n.bytes for n in graph]
        reach = budget if budget is not None else sum(sizes)
        quantum = math.gcd(*sizes, reach) or 1
        if reach // quantum > CAPACITY_UNITS:
            quantum = -(-reach // CAPACITY_UNITS)
        demand = tuple(-(-b // quantum) for b in sizes)
        footprint = max(demand[n.id] + sum(demand[u] for u in set(n.inputs)) for n in graph)
        footprint_bytes = max(n.bytes + sum(sizes[u] for u in set(n.inputs)) for n in graph)
        times = [n.time for n in graph]
        largest = max(times, default=0.0)
        if all(t.is_integer() for t in times) and sum(times) <= 2**40:
            per_time = 1.0
        else:
            per_time = TIME_UNITS / largest if largest > 0 else 1.0
        cost = tuple(round(t * per_time) for t in times)
        slack = sum(abs(c / per_time - t) for c, t in zip(cost, times, strict=True))
        return cls(
            quantum=quantum,
            demand=demand,
            capacity=(budget // quantum) if budget is not None else 0,
            footprint=footprint,
            footprint_bytes=footprint_bytes,
            total=sum(demand),
            cost=cost,
            per_time=per_time,
            slack=slack,
            exact=all(b % quantum == 0 for b in sizes),
        )

    def time_bound(self, graph: Graph, bound: float) -> float:
        """A lower bound on the duration from CP-SAT's bound on the recomputation cost."""
        return graph.total_time + max(0.0, bound / self.per_time - self.slack)

    def peak_bound(self, bound: float) -> float | None:
        """A lower bound on the least peak in bytes, when bytes were scaled exactly."""
        return math.ceil(bound) * self.quantum if self.exact else None

    def caveat(self, proven: bool) -> str:
        if not proven or self.exact:
            return ""
        return f" (bytes counted in units of {self.quantum} B, rounded up)"


# --- model: variables and constraints ----------------------------------------------------


@dataclass
class _Model:
    """The CP-SAT model and its variables, indexed as in the paper: [v][i] is copy i of v."""

    model: cp_model.CpModel
    start: list[list[cp_model.IntVar]]
    end: list[list[cp_model.IntVar]]
    present: list[list[cp_model.IntVar | bool]]
    reads: dict[tuple[int, int, int, int], cp_model.IntVar]  # (u, v, i, j): v^i reads u^j
    capacity: cp_model.IntVar
    slots: cp_model.IntVar  # how many copies are computed: the sequence's length
    extra: list[cp_model.IntVar] = field(default_factory=list)  # p_v^1 for each recomputable v
    costs: list[int] = field(default_factory=list)


def _build(graph: Graph, scale: Scale, capacity: tuple[int, int]) -> _Model:
    """Moccasin's model with the memory capacity a variable in the closed range `capacity`."""
    model = cp_model_module().CpModel()
    n = len(graph)
    outputs = set(graph.outputs)
    # A node nothing reads gains nothing from a second copy; an output's single copy stays
    # to the end, as the simulator keeps outputs resident.
    copies = [1 if (not graph.users[v] or v in outputs) else COPIES for v in range(n)]
    horizon = sum(copies)
    m = _Model(
        model=model,
        start=[],
        end=[],
        present=[],
        reads={},
        capacity=model.new_int_var(capacity[0], capacity[1], "capacity"),
        slots=model.new_int_var(n, horizon, "slots"),
    )
    intervals, demands, unit_slots = [], [], []
    for v in range(n):
        starts, ends, present = [], [], []
        for i in range(copies[v]):
            s = model.new_int_var(0, horizon - 1, f"s_{v}_{i}")
            e = model.new_int_var(1, horizon, f"e_{v}_{i}")
            size = model.new_int_var(1, horizon, f"len_{v}_{i}")
            p: cp_model.IntVar | bool = True if i == 0 else model.new_bool_var(f"p_{v}_{i}")
            if i == 0:
                interval = model.new_interval_var(s, size, e, f"x_{v}_{i}")
                slot = model.new_fixed_size_interval_var(s, 1, f"slot_{v}_{i}")
            else:
                assert not isinstance(p, bool)
                interval = model.new_optional_interval_var(s, size, e, p, f"x_{v}_{i}")
                slot = model.new_optional_fixed_size_interval_var(s, 1, p, f"slot_{v}_{i}")
                # copy i follows copy i-1; an absent copy is pinned so it adds no symmetry
                model.add(ends[i - 1] <= s).only_enforce_if(p)
                model.add(s == 0).only_enforce_if(~p)
                model.add(e == 1).only_enforce_if(~p)
                m.extra.append(p)
                m.costs.append(scale.cost[v])
            # no gaps: the present copies fill slots 0..slots-1 exactly
            _enforce(model.add(s <= m.slots - 1), p)
            if v in outputs:
                model.add(e == m.slots)
            else:
                _enforce(model.add(e <= m.slots), p)
            starts.append(s)
            ends.append(e)
            present.append(p)
            intervals.append(interval)
            demands.append(scale.demand[v])
            unit_slots.append(slot)
        m.start.append(starts)
        m.end.append(ends)
        m.present.append(present)
    model.add(m.slots == n + sum(m.extra))
    # memory: the resident copies never exceed the capacity
    model.add_cumulative(intervals, demands, m.capacity)
    # one computation per time step
    model.add_no_overlap(unit_slots)
    _add_precedence(graph, m)
    return m


def _enforce(constraint: cp_model.Constraint, literal: cp_model.IntVar | bool) -> None:
    if not isinstance(literal, bool):
        constraint.only_enforce_if(literal)


def _add_precedence(graph: Graph, m: _Model) -> None:
    """When copy i of v starts, some copy j of each input u started before and is resident:
    s_u^j < s_v^i < e_u^j, chosen by the literal reads[u, v, i, j]."""
    model = m.model
    for node in graph:
        v = node.id
        for u in dict.fromkeys(node.inputs):
            # the first copy of u precedes the first of v in any schedule: a redundant cut
            model.add(m.start[u][0] < m.start[v][0])
            for i, s_v in enumerate(m.start[v]):
                choices = []
                for j, (s_u, e_u) in enumerate(zip(m.start[u], m.end[u], strict=True)):
                    z = model.new_bool_var(f"r_{u}_{v}_{i}_{j}")
                    m.reads[u, v, i, j] = z
                    model.add(s_u < s_v).only_enforce_if(z)
                    model.add(s_v < e_u).only_enforce_if(z)
                    if not isinstance(m.present[u][j], bool):
                        model.add_implication(z, m.present[u][j])
                    choices.append(z)
                p_v = m.present[v][i]
                model.add_bool_or(choices if isinstance(p_v, bool) else [~p_v, *choices])


def _hint(m: _Model, graph: Graph, sequence: Sequence[int]) -> None:
    """Hint every variable from a valid sequence: copies by occurrence, each resident from
    its slot through its last read, outputs to the end."""
    sequence = list(sequence)
    latest: dict[int, tuple[int, int]] = {}  # node -> (copy, slot) of its most recent copy
    slot_of: dict[tuple[int, int], int] = {}
    last_read: dict[tuple[int, int], int] = {}
    read: set[tuple[int, int, int, int]] = set()
    for t, v in enumerate(sequence):
        i = latest[v][0] + 1 if v in latest else 0
        for u in dict.fromkeys(graph[v].inputs):
            j = latest[u][0]
            last_read[u, j] = t
            read.add((u, v, i, j))
        latest[v] = (i, t)
        slot_of[v, i] = t
    outputs = set(graph.outputs)
    for v, starts in enumerate(m.start):
        for i, s in enumerate(starts):
            p = m.present[v][i]
            here = (v, i) in slot_of
            if not isinstance(p, bool):
                m.model.add_hint(p, here)
            if here:
                t = slot_of[v, i]
                m.model.add_hint(s, t)
                m.model.add_hint(
                    m.end[v][i],
                    len(sequence) if v in outputs else max(t, last_read.get((v, i), t)) + 1,
                )
            else:
                m.model.add_hint(s, 0)
                m.model.add_hint(m.end[v][i], 1)
    for key, z in m.reads.items():
        m.model.add_hint(z, key in read)
    m.model.add_hint(m.slots, len(sequence))


def _expressible(m: _Model, sequence: Sequence[int]) -> bool:
    """Whether the model has a copy for each computation of each node in `sequence`."""
    return all(n <= len(m.start[v]) for v, n in Counter(sequence).items())


def start_order(graph: Graph) -> list[int]:
    """The lower-peak of two orders without recomputation: the reference order, and one
    that greedily runs the ready node that leaves the least memory resident. A hint within
    the budget lets phase 1 stop at once; CP-SAT takes minutes to find one on its own."""
    n = len(graph)
    pending = [len(set(graph.users[v])) for v in range(n)]  # unread users per node
    waiting = [len(set(node.inputs)) for node in graph]  # inputs not yet computed
    ready = {v for v in range(n) if not waiting[v]}
    order: list[int] = []
    while ready:

        def change(v: int) -> int:
            freed = sum(graph[u].bytes for u in set(graph[v].inputs) if pending[u] == 1)
            return (graph[v].bytes if graph.users[v] or v in graph.outputs else 0) - freed

        v = min(ready, key=lambda u: (change(u), graph[u].bytes, u))
        ready.remove(v)
        order.append(v)
        for u in set(graph[v].inputs):
            pending[u] -= 1
        for w in graph.users[v]:
            waiting[w] -= 1
            if not waiting[w]:
                ready.add(w)
    reference = list(range(n))
    return min(reference, order, key=lambda seq: remat.score(graph, seq).peak)


# --- search and extraction ---------------------------------------------------------------


def cp_model_module() -> ModuleType:
    """OR-Tools' CP-SAT module, or MissingDependency saying what to install."""
    try:
        from ortools.sat.python import cp_model
    except ImportError as error:
        raise MissingDependency(f"solver {NAME!r} needs OR-Tools: pip install ortools") from error
    return cp_model


def _run(m: _Model, deadline: float, options: SolverOptions) -> tuple[int, cp_model.CpSolver]:
    """Solve with the seed, workers and what is left of the time limit."""
    solver = make_solver(deadline, options)
    return solver.solve(m.model), solver


def make_solver(deadline: float, options: SolverOptions) -> cp_model.CpSolver:
    """A CP-SAT solver with the seed, the workers and what is left of the time limit."""
    solver = cp_model_module().CpSolver()
    solver.parameters.random_seed = options.seed
    solver.parameters.num_workers = WORKERS
    solver.parameters.max_time_in_seconds = max(0.01, deadline - time.perf_counter())
    return solver


def _decode(m: _Model, solver: cp_model.CpSolver) -> list[int]:
    """The computed copies ordered by start slot, as a sequence of node ids."""
    slots = []
    for v, starts in enumerate(m.start):
        for i, s in enumerate(starts):
            p = m.present[v][i]
            if isinstance(p, bool) or solver.boolean_value(p):
                slots.append((solver.value(s), v))
    return [v for _, v in sorted(slots)]


def _checked(graph: Graph, sequence: Sequence[int], budget: int | None) -> Schedule:
    """The sequence's schedule, judged by the simulator: InvalidSchedule (a bug here) if
    the decoded sequence is invalid or over `budget`. score must agree on the peak where
    no outputs are held to the end (score does not hold them)."""
    schedule = remat.to_schedule(graph, sequence)
    trace = simulate(graph, schedule, budget=budget)
    assert graph.outputs or trace.peak == remat.score(graph, sequence).peak
    return schedule


def make_result(
    options: SolverOptions,
    started: float,
    status: str,
    schedule: Schedule | None,
    *,
    objective: float | None = None,
    lower_bound: float | None = None,
    message: str = "",
) -> SolveResult:
    """The SolveResult, with the relative gap where there is a bound."""
    gap = None
    if objective is not None and lower_bound is not None:
        gap = max(0.0, (objective - lower_bound) / objective) if objective else 0.0
    return SolveResult(
        solver=NAME,
        status=status,
        schedule=schedule,
        gap=gap,
        solve_seconds=time.perf_counter() - started,
        options=options.to_json(),
        objective=objective,
        lower_bound=lower_bound,
        message=message,
    )


def check_general_graph(graph: Graph) -> None:
    """The general problem computes every node: resident inputs and shared storages
    (views, carved outputs) belong to the training problem."""
    for node in graph:
        if node.is_resident_input:
            raise UnsupportedModel(node.name, "a resident input cannot be computed")
        if node.alias_of is not None or node.carved_from is not None:
            raise UnsupportedModel(node.name, "shares storage; the general problem has none")


# --- the training problem: the release model (memplan/solvers/releases.py) -------------


def _pick_releases(
    model: ReleaseModel,
    cap: int | None,
    hint: frozenset[int],
    deadline: float,
    options: SolverOptions,
) -> Pick:
    """The release model in CP-SAT: a Boolean per release and per interaction (their
    product), a linear row per position in exact bytes, the cuts as clauses, and `hint`
    as the starting point. Times are scaled to integers, the largest term at TIME_UNITS."""
    cp = cp_model_module()
    m = cp.CpModel()
    picked = [m.new_bool_var(f"r{i}") for i in range(len(model.releases))]
    for group in model.groups:
        m.add_at_most_one(picked[i] for i in group)
    chosen: dict[Effect, cp_model.IntVar] = {(i,): x for i, x in enumerate(picked)}
    for i, j in (x.pair for x in model.interactions):
        both = chosen[i, j] = m.new_bool_var(f"r{i}_{j}")
        m.add_multiplication_equality(both, [picked[i], picked[j]])
    rows = model.rows(cap)
    if cap is None:
        top = max((r.constant + sum(max(c, 0) for _, c in r.terms) for r in rows), default=0)
        peak = m.new_int_var(0, top, "peak")
        for row in rows:
            m.add(row.constant + sum(c * chosen[e] for e, c in row.terms) <= peak)
        m.minimize(peak)
    else:
        for row in rows:
            m.add(sum(c * chosen[e] for e, c in row.terms) <= cap - row.constant)
        effects = model.effects
        largest = max((abs(t) for _, _, t in effects), default=0.0) or 1.0
        m.minimize(sum(round(t / largest * TIME_UNITS) * chosen[e] for e, _, t in effects))
    for cut in model.cuts:
        m.add_bool_or(
            [picked[i].Not() for i in cut] + [x for i, x in enumerate(picked) if i not in cut]
        )
    for i, x in enumerate(picked):
        m.add_hint(x, i in hint)
    solver = make_solver(deadline, options)
    status = solver.solve(m)
    if status not in (cp.OPTIMAL, cp.FEASIBLE):
        return Pick("infeasible" if status == cp.INFEASIBLE else "timeout", None)
    chosen = frozenset(i for i, x in enumerate(picked) if solver.boolean_value(x))
    return Pick("optimal" if status == cp.OPTIMAL else "feasible", chosen)
