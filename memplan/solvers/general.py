"""Solving the general problem for a user (the `memplan solve` CLI): the named solver,
the director standing in where an exact solver timed out without a schedule,
InfeasibleBudget with the smallest budget found where no schedule fits, and a line that
says which schedule a solve returned where it is not simply the named solver's answer."""

from __future__ import annotations

import dataclasses
import math

from memplan.errors import InfeasibleBudget, MemplanError
from memplan.graph import Graph, SolveResult
from memplan.planner.simulate import simulate
from memplan.solvers import SolverOptions, get_solver
from memplan.solvers.warm_start import STARTING_SCHEDULE

# The director's time limit where it stands in or finds the least peak: it needs far less.
_DIRECTOR_SECONDS = 30.0
# Solvers that prove optimality; anything less than "optimal" from them is their best
# schedule at the time limit (or the director's, see solvers/warm_start.py).
EXACT = frozenset({"milp", "cpsat"})
# How solve's own messages end where the director stands in.
_STAND_IN = "; this is the director's"


def solve(graph: Graph, budget: int, solver: str, options: SolverOptions) -> SolveResult:
    """`solver`'s result for `budget` on the general problem, its schedule within the budget.

    Where the solver's schedule is over the budget, or it has none (it ran out of time,
    or the budget is beyond what it can meet), the director's schedule is returned
    instead if it fits, and else the director's least-memory schedule if that fits (the
    message says so). Where no schedule found fits, raises InfeasibleBudget with the
    least peak of the schedules found, the least-memory one included.
    """
    options = dataclasses.replace(options, problem="general")
    result = get_solver(solver)(graph, budget, options)
    peak = _peak(graph, result, options)
    if peak <= budget:
        return result
    if result.status == "timeout":
        why = f"in {options.time_limit:g} s"
    elif result.schedule is None:
        why = f"({result.status})"
    else:
        why = f"(its schedule peaks at {peak:.0f} B)"
    director_options = dataclasses.replace(options, time_limit=_DIRECTOR_SECONDS)
    least_by = solver
    if solver != "director":
        stand_in = get_solver("director")(graph, budget, director_options)
        stand_in_peak = _peak(graph, stand_in, options)
        if stand_in_peak <= budget:
            return dataclasses.replace(
                stand_in,
                message=f"{solver} found no schedule within the budget {why}{_STAND_IN} schedule",
            )
        if stand_in_peak < peak:
            peak, least_by = stand_in_peak, "director"
    least = get_solver("director")(
        graph, 0, dataclasses.replace(director_options, minimize_memory=True)
    )
    least_peak = _peak(graph, least, options)
    if least_peak <= budget:  # the director's budgeted search missed what it can reach
        return dataclasses.replace(
            least,
            status="feasible",
            message=f"{solver} found no schedule within the budget {why}"
            f"{_STAND_IN} least-memory schedule",
        )
    if least_peak < peak:
        peak, least_by = least_peak, "director"
    if math.isinf(peak):
        raise MemplanError(f"neither {solver} nor the director found any schedule")
    raise InfeasibleBudget(budget, int(peak), least_by)


def _peak(graph: Graph, result: SolveResult, options: SolverOptions) -> float:
    """The simulated peak of the result's schedule; infinite without one."""
    if result.schedule is None:
        return math.inf
    return simulate(graph, result.schedule, bandwidth=options.bandwidth).peak


def provenance(result: SolveResult, solver: str, options: SolverOptions) -> str | None:
    """One line saying which schedule `result` (of `solve(..., solver, options)`) holds,
    where it is not simply `solver`'s answer: the director's schedule standing in, the
    director's starting schedule an exact solver kept, or an exact solver's best schedule
    found but not proved optimal, with its gap to the solver's lower bound. None where
    the schedule is a heuristic's answer or a proved optimum."""
    if result.gap is None:
        gap = f"no lower bound from {solver}"
    else:
        gap = f"a gap of {result.gap:.2%} to {solver}'s lower bound"
    if result.solver != solver or _STAND_IN in result.message:
        return result.message
    if result.message.startswith(STARTING_SCHEDULE):
        return f"{result.message}; {gap}"
    if solver not in EXACT or result.status == "optimal":
        return None
    return (
        f"{solver} did not prove this schedule optimal within {options.time_limit:g} s: "
        f"it is the best {solver} found ({result.status}), with {gap}"
    )
