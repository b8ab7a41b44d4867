"""Moccasin (Bartan et al., ICML 2023) on OR-Tools CP-SAT: the `cpsat` solver.

On the general problem, Moccasin's retention intervals over a slot grid
(solvers/cpsat_remat.py), or with a host link the same on a time axis with a copy stream
(solvers/cpsat_paging.py); on the training problem, the release model of
solvers/releases.py as a CP-SAT model (here).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from memplan.core.graph import Graph, SolveResult
from memplan.solvers import SolverOptions, cpsat_paging, cpsat_remat, releases
from memplan.solvers.cpsat_model import NAME, TIME_UNITS, cp_model_module, make_solver
from memplan.solvers.releases import Effect, Pick, ReleaseModel

if TYPE_CHECKING:
    from ortools.sat.python import cp_model


def solve(graph: Graph, budget: int | None, options: SolverOptions) -> SolveResult:
    """The fastest sequence within `budget` that CP-SAT finds in `options.time_limit`.

    Phase 1 minimizes max(peak, budget) hinted with the director's sequence where it fits
    the budget (memplan/solvers/warm_start.py), else with an order without recomputation,
    so it always has a point and its optimum says whether the budget is feasible; phase 2
    minimizes the recomputation time below the budget, hinted with phase 1's sequence. For
    budget None, phase 1 minimizes the peak itself and phase 2 the time at that peak (the
    objective reported is then the peak). Where no point within the budget is found, the
    least-peak schedule found is returned with status infeasible (proven) or timeout.
    With `options.bandwidth`, values may also be paged to host memory: the model on a time
    axis of memplan/solvers/cpsat_paging.py solves instead. Where CP-SAT returns nothing
    faster than the director's sequence, that sequence is the result (its message says so).
    """
    cp_model_module()  # MissingDependency before any work
    if options.problem == "training":
        return releases.solve(graph, budget, options, NAME, _pick_releases)
    if options.bandwidth is not None and options.bandwidth > 0:
        return cpsat_paging.solve(graph, budget, options)
    return cpsat_remat.solve(graph, budget, options)


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
