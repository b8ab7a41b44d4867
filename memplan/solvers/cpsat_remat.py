"""Moccasin (Bartan et al., ICML 2023) on OR-Tools CP-SAT for the general problem, without
paging: each node has up to COPIES copies, each an optional interval of residency over a
grid of compute slots; a cumulative constraint bounds memory and an objective counts
recomputation.
"""

from __future__ import annotations

import dataclasses
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from memplan.core import remat
from memplan.core.graph import Graph, Schedule, SolveResult
from memplan.core.simulate import simulate
from memplan.solvers import SolverOptions, lns, warm_start
from memplan.solvers.cpsat_model import (
    Scale,
    check_general_graph,
    cp_model_module,
    make_result,
    make_solver,
    start_order,
)

if TYPE_CHECKING:
    from ortools.sat.python import cp_model

# Copies per node: the first computation plus at most one recomputation, as in Moccasin.
COPIES = 2


# From this many nodes the whole model is too big to improve on its hint within a
# minute (on the bundled 500- and 1,000-node graphs it returned the director's sequence
# unchanged, and at 250 nodes and 0.7 it ended slower than the director alone): the
# director's sequence is improved window by window instead (solvers/lns.py), the
# director taking DIRECTOR_SHARE of the time limit.
WINDOWS_FROM = 200
DIRECTOR_SHARE = 0.5


def solve(graph: Graph, budget: int | None, options: SolverOptions) -> SolveResult:
    """Moccasin's two phases (see solve_remat), hinted with the director's sequence where
    it fits the budget; where CP-SAT returns nothing faster than that sequence, the
    sequence is the result (its message says so). From WINDOWS_FROM nodes, with a budget,
    the director's sequence re-solved window by window instead."""
    check_general_graph(graph)
    started = time.perf_counter()
    if uses_windows(graph, budget):
        assert budget is not None
        return _solve_by_windows(graph, budget, options, started)
    start = warm_start.director_sequence(graph, budget, options)
    result = _solve_remat(graph, budget, options, started, start)
    return warm_start.keep_faster(graph, result, start, budget, options)


def uses_windows(graph: Graph, budget: int | None) -> bool:
    """Whether `solve` re-solves the director's sequence window by window (a graph of
    WINDOWS_FROM nodes or more, a budget, no resident inputs) instead of solving whole."""
    return budget is not None and len(graph) >= WINDOWS_FROM and not graph.resident_inputs


def _solve_remat(
    graph: Graph,
    budget: int | None,
    options: SolverOptions,
    started: float,
    start: list[int] | None,
) -> SolveResult:
    """The two phases of `solve` without paging; phase 1 is hinted with the director's
    `start` where it has at most COPIES copies of a node, else with a searched start_order."""
    cp = cp_model_module()
    deadline = started + options.time_limit
    scale = Scale.of(graph, budget)

    # Phase 1: a feasible point (or the least peak).
    # No schedule peaks below a node with its inputs: a floor CP-SAT can prove at once.
    # (Minimizing memory, the scale has no budget and its capacity is 0.)
    floor = max(scale.capacity, scale.footprint)
    first = _build(graph, scale, capacity=(floor, max(floor, scale.total)))
    first.model.minimize(first.capacity)
    if start is not None and _expressible(first, start):
        hinted = start
    else:
        search = min(warm_start.MAX_SECONDS, warm_start.SHARE * options.time_limit)
        hinted = start_order(graph, budget, options.seed, time.perf_counter() + search)
    _hint(first, graph, hinted)
    status1, solver1 = _run(first, deadline, options)
    if status1 not in (cp.OPTIMAL, cp.FEASIBLE):
        return make_result(options, started, "timeout", None, message="no point found in time")
    sequence = _decode(first, solver1)
    least_peak = remat.score(graph, sequence).peak
    proven_peak = status1 == cp.OPTIMAL
    if budget is not None and solver1.value(first.capacity) > scale.capacity:
        status = "infeasible" if proven_peak or scale.footprint_bytes > budget else "timeout"
        message = f"least peak found: {least_peak} B" + scale.caveat(proven_peak)
        return make_result(
            options, started, status, _checked(graph, sequence, None), message=message
        )

    # Phase 2: the least recomputation time within the capacity phase 1 reached.
    limit = solver1.value(first.capacity) if budget is None else scale.capacity
    second = _build(graph, scale, capacity=(0, limit))
    second.model.minimize(sum(c * p for c, p in zip(second.costs, second.extra, strict=True)))
    _hint(second, graph, sequence)
    status2, solver2 = _run(second, deadline, options)
    bound: float | None = None
    if status2 in (cp.OPTIMAL, cp.FEASIBLE):
        sequence = _decode(second, solver2)
        bound = scale.time_bound(graph, solver2.best_objective_bound)
    result = remat.score(graph, sequence)
    schedule = _checked(graph, sequence, budget)
    if budget is None:
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


def _solve_by_windows(
    graph: Graph, budget: int, options: SolverOptions, started: float
) -> SolveResult:
    """The director's sequence within `budget`, then large-neighbourhood search: CP-SAT
    re-solves windows of it for the rest of the time limit (solvers/lns.py). Where the
    director finds none within the budget, its least-peak sequence, as a timeout."""
    from memplan.solvers import director  # the director imports numpy: load it on use

    share = dataclasses.replace(
        options, time_limit=DIRECTOR_SHARE * options.time_limit, bandwidth=None
    )
    found = director.solve(graph, budget, share)
    if found.status != "feasible" or found.schedule is None:
        return make_result(
            options,
            started,
            "timeout",
            found.schedule,
            message=f"the director found no sequence within the budget to start the "
            f"window search from ({found.status}: {found.message})",
        )
    deadline = started + options.time_limit
    improved, search = lns.improve(graph, found.schedule.computes(), budget, deadline, options.seed)
    result = remat.score(graph, improved)
    # Every node is computed at least once: no sequence is faster than the reference
    # order's duration, a bound of the general problem itself (not of a model of it).
    bound = remat.reference(graph).duration
    optimal = result.duration <= bound * (1 + warm_start.TIE)
    return make_result(
        options,
        started,
        "optimal" if optimal else "feasible",
        _checked(graph, improved, budget),
        objective=result.duration,
        lower_bound=bound,
        message=f"peak {result.peak} B; the director's sequence with {search.improved} of "
        f"{search.windows} windows re-solved faster (large-neighbourhood search)",
    )


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
            if scale.transient[v]:  # held in the copy's own slot, as it computes
                intervals.append(slot)
                demands.append(scale.transient[v])
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


# --- search and extraction ---------------------------------------------------------------


def _run(m: _Model, deadline: float, options: SolverOptions) -> tuple[int, cp_model.CpSolver]:
    """Solve with the seed, workers and what is left of the time limit."""
    solver = make_solver(deadline, options)
    return solver.solve(m.model), solver


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
