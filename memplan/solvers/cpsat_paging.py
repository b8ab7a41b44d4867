"""Moccasin with paging: retention intervals on a time axis with a compute stream and a
copy stream, on OR-Tools CP-SAT (the `cpsat` solver when a host link is given).

Moccasin's slot grid has no time in it, so transfers, which take time and overlap
compute, cannot be placed on it. Here every interval is in time units instead. Node v's
first copy is computed in [a_v, a_v + c_v) on the compute stream and resident in
[a_v, e_v). An optional second copy is either recomputed (a compute interval of its own)
or paged: a page-out interval [o_v, o_v + d_v) on the copy stream while the first copy is
still resident, then a page-in interval [r_v, r_v + d_v) after it, the second copy
resident from r_v (the allocation is made when the page-in starts) and usable once it
lands. d_v is v's bytes over the link bandwidth. A computation reads, for each input,
one copy that is usable when it starts and resident until it ends. A cumulative
constraint bounds memory, each stream is a no-overlap, and the objective is the end of
the last computation: the step time, stalls included. docs/solvers/cpsat.md has the
details.
"""

from __future__ import annotations

import dataclasses
import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from memplan.core.graph import (
    Compute,
    Free,
    Graph,
    Offload,
    Prefetch,
    Schedule,
    SolveResult,
    Step,
    Wait,
)
from memplan.core.simulate import MemoryTrace, simulate
from memplan.solvers import SolverOptions, cpsat_remat
from memplan.solvers.cpsat_model import (
    Scale,
    check_general_graph,
    cp_model_module,
    make_result,
    make_solver,
    start_order,
)
from memplan.solvers.paging_pass import page_recomputations

if TYPE_CHECKING:
    from ortools.sat.python import cp_model


# Times are scaled so that the longest computation or transfer is about this many units,
# and rounded up: a schedule's makespan in the model is then never below its true time.
TIME_UNITS = 1 << 12
# The share of the time limit Moccasin's model without paging gets first, and the share
# the paging pass over its schedule may take after it. From cpsat_remat.WINDOWS_FROM
# nodes (with a budget), where the paging model finds nothing in useful time, the remat
# search gets LARGE_REMAT_SHARE and the pass the rest.
REMAT_SHARE = 0.3
PASS_SHARE = 0.1
LARGE_REMAT_SHARE = 0.6


@dataclass(frozen=True)
class _Times:
    """Integer durations on the model's time axis: compute and transfer (bytes over the
    bandwidth), each at least 1 so that one stream never starts two things at once."""

    compute: tuple[int, ...]
    transfer: tuple[int, ...]
    horizon: int  # every computation twice and every value paged out and in, end to end

    @classmethod
    def of(cls, graph: Graph, bandwidth: float) -> _Times:
        seconds = [n.time for n in graph]
        moves = [n.bytes / bandwidth for n in graph]
        per_time = TIME_UNITS / (max(*seconds, *moves, 0.0) or 1.0)
        compute = tuple(max(1, math.ceil(t * per_time)) for t in seconds)
        transfer = tuple(max(1, math.ceil(t * per_time)) for t in moves)
        return cls(compute, transfer, horizon=2 * sum(compute) + 2 * sum(transfer) + len(graph))


@dataclass
class _Copy:
    """One copy of a node: residency [start, end), usable from `ready`; `computed` and
    `paged` are the literals saying how it is made (the first copy is always computed)."""

    start: cp_model.IntVar
    end: cp_model.IntVar
    size: cp_model.IntVar  # end - start
    ready: cp_model.IntVar
    present: cp_model.IntVar | bool
    computed: cp_model.IntVar | bool
    paged: cp_model.IntVar | bool = False
    page_out: cp_model.IntVar | None = None  # when the page-out starts, for a paged copy


@dataclass
class _Model:
    """The CP-SAT model and its variables: copies[v] is [first, second?]."""

    model: cp_model.CpModel
    copies: list[list[_Copy]]
    reads: dict[tuple[int, int, int, int], cp_model.IntVar]  # (u, v, i, j): v^i reads u^j
    capacity: cp_model.IntVar
    makespan: cp_model.IntVar
    horizon: int
    variables: list[cp_model.IntVar] = field(default_factory=list)  # in creation order

    def int(self, low: int, high: int, name: str) -> cp_model.IntVar:
        variable = self.model.new_int_var(low, high, name)
        self.variables.append(variable)
        return variable

    def bool(self, name: str) -> cp_model.IntVar:
        variable = self.model.new_bool_var(name)
        self.variables.append(variable)
        return variable


def solve(graph: Graph, budget: int | None, options: SolverOptions) -> SolveResult:
    """The schedule with the least simulated step time within `budget`, recomputing or
    paging over a host link of options.bandwidth bytes per time unit.

    First Moccasin's model without paging (memplan/solvers/cpsat_remat.py) runs for a share of
    the time limit. Where its schedule fits, the paging pass (solvers/paging_pass.py)
    replaces recomputations in it by transfers where that is faster, and on graphs of
    cpsat_remat.WINDOWS_FROM nodes or more that is the answer. Otherwise, where the remat
    schedule fits, it is the starting point; where it does not, phase 1
    minimizes max(peak, budget) here (for budget None, the peak itself), hinted
    with the least-peak sequence found. Phase 2 minimizes the step time within the
    capacity reached, hinted with the starting point. Every schedule is simulated, and
    the best the simulator accepts is returned. The model's optimum is over its rounded
    time grid, and the simulator's copy stream can only do better, so a schedule is
    "feasible", never "optimal"; a least peak is proved only where it meets the floor of
    a node with its inputs. Where nothing within the budget is found, the least-peak
    schedule found is returned as infeasible (proved) or timeout.
    """
    cp = cp_model_module()
    check_general_graph(graph)
    assert options.bandwidth is not None
    started = time.perf_counter()
    deadline = started + options.time_limit
    scale = Scale.of(graph, budget)
    times = _Times.of(graph, options.bandwidth)
    best = _Best(graph, options, budget)

    large = cpsat_remat.uses_windows(graph, budget)
    share = LARGE_REMAT_SHARE if large else REMAT_SHARE
    remat_options = dataclasses.replace(
        options, bandwidth=None, time_limit=options.time_limit * share
    )
    remat = cpsat_remat.solve(graph, budget, remat_options)
    best.offer(remat.schedule)
    fits = remat.status in ("optimal", "feasible") and budget is not None
    if fits and remat.schedule is not None:
        assert budget is not None
        until = deadline if large else started + options.time_limit * (share + PASS_SHARE)
        paged = page_recomputations(graph, remat.schedule, budget, options.bandwidth, until)
        best.offer(paged)
    if large:  # the paging model does not solve at this size: the pass is the paging
        return _answer(best, budget, options, started, scale, remat.status == "infeasible")
    start = remat.schedule.computes() if remat.schedule is not None else start_order(graph)
    hints: dict[int, int] = {}  # the last solution's values by variable index, once known

    limit = scale.capacity
    if not fits:  # phase 1: the least capacity, down to the budget
        # No schedule peaks below a node with its inputs: a floor CP-SAT can prove at once.
        # (Minimizing memory, the scale has no budget and its capacity is 0.)
        floor = max(scale.footprint, scale.capacity)
        first = _build(graph, scale, times, (floor, max(floor, scale.total)))
        first.model.minimize(first.capacity)
        _hint(first, _sequence_hints(first, graph, times, start))
        solver1 = make_solver(deadline, options)
        status1 = solver1.solve(first.model)
        if status1 in (cp.OPTIMAL, cp.FEASIBLE):
            best.offer(_decode(first, solver1, graph))
            hints = {v.index: solver1.value(v) for v in (*first.variables, first.makespan)}
            reached = solver1.value(first.capacity)
            limit = reached if budget is None else limit
            if reached > scale.capacity and budget is not None:
                proved = status1 == cp.OPTIMAL or scale.footprint_bytes > budget
                return _unreached(best, budget, options, started, scale, proved)
        elif status1 == cp.INFEASIBLE or best.schedule is None:
            return make_result(options, started, "timeout", None, message="no point found in time")

    second = _build(graph, scale, times, (0, limit))  # phase 2: the least step time
    second.model.minimize(second.makespan)
    _hint(second, hints or _sequence_hints(second, graph, times, start))
    solver2 = make_solver(deadline, options)
    if solver2.solve(second.model) in (cp.OPTIMAL, cp.FEASIBLE):
        best.offer(_decode(second, solver2, graph))
    return _answer(best, budget, options, started, scale)


def _answer(
    best: _Best,
    budget: int | None,
    options: SolverOptions,
    started: float,
    scale: Scale,
    proved: bool = False,
) -> SolveResult:
    """The best schedule offered, as the solve's result; `proved` where a budget it does
    not meet is known to be infeasible."""
    if best.schedule is None or best.trace is None:
        return make_result(options, started, "timeout", None, message="no schedule found in time")
    if budget is not None and best.trace.peak > budget:
        return _unreached(best, budget, options, started, scale, proved=proved)
    trace = best.trace
    if budget is None:
        floor_reached = trace.peak <= scale.footprint_bytes
        return make_result(
            options, started, "optimal" if floor_reached else "feasible",
            best.schedule, objective=float(trace.peak), message=f"duration {trace.time:g}",
        )  # fmt: skip
    return make_result(
        options, started, "feasible", best.schedule, objective=trace.time,
        message=f"peak {trace.peak} B, stall {trace.stall:g}",
    )  # fmt: skip


class _Best:
    """The best schedule offered so far by the simulator's verdict: the fastest within
    `budget`, else the least peak; with budget None, the least peak, then the fastest."""

    def __init__(self, graph: Graph, options: SolverOptions, budget: int | None) -> None:
        self.graph, self.options, self.budget = graph, options, budget
        self.schedule: Schedule | None = None
        self.trace: MemoryTrace | None = None

    def _key(self, trace: MemoryTrace) -> tuple[float, ...]:
        if self.budget is not None and trace.peak <= self.budget:
            return (0, trace.time, trace.peak)
        return (1, trace.peak, trace.time)

    def offer(self, schedule: Schedule | None) -> None:
        if schedule is None:
            return
        trace = simulate(self.graph, schedule, bandwidth=self.options.bandwidth)
        if self.trace is None or self._key(trace) < self._key(self.trace):
            self.schedule, self.trace = schedule, trace


def _unreached(
    best: _Best,
    budget: int | None,
    options: SolverOptions,
    started: float,
    scale: Scale,
    proved: bool,
) -> SolveResult:
    """No schedule within the budget: the least-peak one found, infeasible if proved."""
    assert best.trace is not None
    message = f"least peak found: {best.trace.peak} B" + scale.caveat(proved)
    status = "infeasible" if proved else "timeout"
    return make_result(options, started, status, best.schedule, message=message)


# --- model -------------------------------------------------------------------------------


def _build(graph: Graph, scale: Scale, times: _Times, capacity: tuple[int, int]) -> _Model:
    """The model with the memory capacity a variable in the closed range `capacity`."""
    model = cp_model_module().CpModel()
    horizon = times.horizon
    m = _Model(
        model=model,
        copies=[],
        reads={},
        capacity=model.new_int_var(capacity[0], capacity[1], "capacity"),
        makespan=model.new_int_var(0, horizon, "makespan"),
        horizon=horizon,
    )
    resident: list[cp_model.IntervalVar] = []
    demands: list[int] = []
    computing: list[cp_model.IntervalVar] = []
    moving: list[cp_model.IntervalVar] = []
    outputs = set(graph.outputs)
    for node in graph:
        v, compute = node.id, times.compute[node.id]
        first = _first_copy(m, v, compute, resident, computing)
        if v in outputs:
            model.add(first.end == horizon)  # held to the end of the step
        elif not graph.users[v]:
            model.add(first.end == first.start + compute)
        else:  # freed, and transfers done, by the time the step ends
            model.add(first.end <= m.makespan)
        copies = [first]
        if graph.users[v] and v not in outputs:
            transfer = times.transfer[v] if node.offloadable else None
            copies.append(_second_copy(m, v, first, compute, transfer, resident, computing, moving))
            model.add(copies[1].end <= m.makespan)
        m.copies.append(copies)
        demands.extend(scale.demand[v] for _ in copies)
        if scale.transient[v]:  # held while each computed copy runs
            resident.append(model.new_fixed_size_interval_var(first.start, compute, f"work_{v}"))
            demands.append(scale.transient[v])
            if len(copies) > 1 and not isinstance(copies[1].computed, bool):
                again = model.new_optional_fixed_size_interval_var(
                    copies[1].start, compute, copies[1].computed, f"work2_{v}"
                )
                resident.append(again)
                demands.append(scale.transient[v])
    model.add_cumulative(resident, demands, m.capacity)
    model.add_no_overlap(computing)
    model.add_no_overlap(moving)
    _add_reads(graph, times, m)
    return m


def _first_copy(
    m: _Model,
    v: int,
    compute: int,
    resident: list[cp_model.IntervalVar],
    computing: list[cp_model.IntervalVar],
) -> _Copy:
    """v's first computation: resident from its start, at least through its end."""
    model, horizon = m.model, m.horizon
    start = m.int(0, horizon - compute, f"a_{v}")
    end, size = m.int(1, horizon, f"e_{v}"), m.int(1, horizon, f"len_{v}")
    ready = m.int(0, horizon, f"ready_{v}")
    model.add(ready == start + compute)
    model.add(end >= ready)
    model.add(m.makespan >= ready)
    resident.append(model.new_interval_var(start, size, end, f"resident_{v}"))
    computing.append(model.new_fixed_size_interval_var(start, compute, f"compute_{v}"))
    return _Copy(start=start, end=end, size=size, ready=ready, present=True, computed=True)


def _second_copy(
    m: _Model,
    v: int,
    first: _Copy,
    compute: int,
    transfer: int | None,
    resident: list[cp_model.IntervalVar],
    computing: list[cp_model.IntervalVar],
    moving: list[cp_model.IntervalVar],
) -> _Copy:
    """v's optional second copy, recomputed or (with a `transfer` time) paged, made only
    after the first is gone; an absent copy is pinned so that it adds no symmetry."""
    model, horizon = m.model, m.horizon
    recomputed = m.bool(f"recompute_{v}")
    start, end = m.int(0, horizon, f"s_{v}"), m.int(1, horizon, f"f_{v}")
    size, ready = m.int(1, horizon, f"len2_{v}"), m.int(0, horizon, f"ready2_{v}")
    present = m.bool(f"present_{v}")
    copy = _Copy(start, end, size, ready, present, recomputed)
    resident.append(model.new_optional_interval_var(start, size, end, present, f"resident2_{v}"))
    computing.append(
        model.new_optional_fixed_size_interval_var(start, compute, recomputed, f"compute2_{v}")
    )
    model.add(ready == start + compute).only_enforce_if(recomputed)
    model.add(m.makespan >= ready).only_enforce_if(recomputed)
    model.add(start >= first.end).only_enforce_if(present)
    model.add(end >= ready).only_enforce_if(present)
    for pinned, value in _absent_values(copy):
        model.add(pinned == value).only_enforce_if(present.Not())
    if transfer is None:
        model.add(present == recomputed)
        return copy
    paged, page_out = m.bool(f"paged_{v}"), m.int(1, horizon, f"o_{v}")
    copy.paged, copy.page_out = paged, page_out
    model.add(present == recomputed + paged)
    for name, begin in ((f"out_{v}", page_out), (f"in_{v}", start)):
        moving.append(model.new_optional_fixed_size_interval_var(begin, transfer, paged, name))
        # A transfer is issued between two computations (as a step of the schedule), so
        # none may be running when it starts: a unit of idle compute stream marks it.
        marker = model.new_optional_fixed_size_interval_var(begin - 1, 1, paged, f"{name}_issue")
        computing.append(marker)
    # The page-out reads the first copy after it is computed, and keeps it until done;
    # the page-in starts after the page-out, and the copy is usable once it lands.
    model.add(page_out >= first.ready).only_enforce_if(paged)
    model.add(first.end >= page_out + transfer).only_enforce_if(paged)
    model.add(start >= page_out + transfer).only_enforce_if(paged)
    model.add(ready == start + transfer).only_enforce_if(paged)
    model.add(page_out == 1).only_enforce_if(paged.Not())
    return copy


def _add_reads(graph: Graph, times: _Times, m: _Model) -> None:
    """Each computed copy of v reads, for each input u, one copy of u usable when v starts
    and resident until v ends, chosen by the literal reads[u, v, i, j]."""
    model = m.model
    for node in graph:
        v = node.id
        for u in dict.fromkeys(node.inputs):
            model.add(m.copies[u][0].ready <= m.copies[v][0].start)  # a redundant cut
            for i, reader in enumerate(m.copies[v]):
                choices = []
                for j, source in enumerate(m.copies[u]):
                    z = m.bool(f"r_{u}_{v}_{i}_{j}")
                    m.reads[u, v, i, j] = z
                    model.add(source.ready <= reader.start).only_enforce_if(z)
                    model.add(source.end >= reader.start + times.compute[v]).only_enforce_if(z)
                    if not isinstance(source.present, bool):
                        model.add_implication(z, source.present)
                    choices.append(z)
                if isinstance(reader.computed, bool):
                    model.add_bool_or(choices)
                else:
                    model.add_bool_or([reader.computed.Not(), *choices])


def _absent_values(copy: _Copy) -> tuple[tuple[cp_model.IntVar, int], ...]:
    """The values an absent second copy is pinned to."""
    return ((copy.start, 0), (copy.end, 1), (copy.size, 1), (copy.ready, 0))


def _sequence_hints(m: _Model, graph: Graph, times: _Times, sequence: list[int]) -> dict[int, int]:
    """Values for every variable (by index) from a sequence without paging, computations
    back to back; an order without recomputation where the sequence has more copies of a
    node than the model."""
    clock = 0
    made: dict[tuple[int, int], int] = {}  # (node, copy) -> start
    last_read: dict[tuple[int, int], int] = {}  # (node, copy) -> end of its last reader
    latest: dict[int, int] = {}  # node -> its most recent copy
    reads: set[tuple[int, int, int, int]] = set()
    for w in sequence:
        i = latest[w] + 1 if w in latest else 0
        if i >= len(m.copies[w]):
            return _sequence_hints(m, graph, times, start_order(graph))
        made[w, i], clock = clock, clock + times.compute[w]
        for u in dict.fromkeys(graph[w].inputs):
            reads.add((u, w, i, latest[u]))
            last_read[u, latest[u]] = clock
        latest[w] = i
    outputs = set(graph.outputs)
    hints = {m.makespan.index: clock}
    for v, copies in enumerate(m.copies):
        for i, copy in enumerate(copies):
            if (v, i) in made:
                begin = made[v, i]
                ready = begin + times.compute[v]
                end = m.horizon if v in outputs else max(ready, last_read.get((v, i), ready))
                values = ((copy.start, begin), (copy.end, end), (copy.size, end - begin),
                          (copy.ready, ready))  # fmt: skip
            else:
                values = _absent_values(copy)
            hints.update((variable.index, value) for variable, value in values)
            for literal, value in ((copy.present, 1), (copy.computed, 1), (copy.paged, 0)):
                if not isinstance(literal, bool):
                    hints[literal.index] = value if (v, i) in made else 0
            if copy.page_out is not None:
                hints[copy.page_out.index] = 1
    for key, z in m.reads.items():
        hints[z.index] = int(key in reads)
    return hints


def _hint(m: _Model, hints: dict[int, int]) -> None:
    """Hint the model's variables (and its makespan) with values by variable index."""
    for variable in (*m.variables, m.makespan):
        if variable.index in hints:
            m.model.add_hint(variable, hints[variable.index])


# --- extraction ----------------------------------------------------------------------------


def _decode(m: _Model, solver: cp_model.CpSolver, graph: Graph) -> Schedule:
    """The solution's events in time order, as steps. At one instant: waits (a landed
    page-in), frees (an interval ends where the next begins), page-outs and page-ins (the
    model starts them between computations), then the computation that starts there."""
    outputs = set(graph.outputs)
    events: list[tuple[int, int, int, Step]] = []
    for v, copies in enumerate(m.copies):
        for copy in copies:
            if not _true(solver, copy.present):
                continue
            if _true(solver, copy.computed):
                events.append((solver.value(copy.start), 4, v, Compute(v)))
            else:
                assert copy.page_out is not None
                events.append((solver.value(copy.page_out), 2, v, Offload(v)))
                events.append((solver.value(copy.start), 3, v, Prefetch(v)))
                events.append((solver.value(copy.ready), 0, v, Wait(v)))
            if v not in outputs:
                events.append((solver.value(copy.end), 1, v, Free(v)))
    return Schedule(steps=tuple(step for *_, step in sorted(events, key=lambda e: e[:3])))


def _true(solver: cp_model.CpSolver, literal: cp_model.IntVar | bool) -> bool:
    return literal if isinstance(literal, bool) else solver.boolean_value(literal)
