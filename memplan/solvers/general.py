"""Solving the general problem for a user (the `memplan solve` CLI): the named solver,
the director standing in where an exact solver timed out without a schedule, and
InfeasibleBudget with the smallest budget found where no schedule fits."""

from __future__ import annotations

import dataclasses
import math

from memplan.errors import InfeasibleBudget
from memplan.graph import Graph, SolveResult
from memplan.planner.simulate import simulate
from memplan.solvers import SolverOptions, get_solver

# The director's time limit where it stands in or finds the least peak: it needs far less.
_DIRECTOR_SECONDS = 30.0


def solve(graph: Graph, budget: int, solver: str, options: SolverOptions) -> SolveResult:
    """`solver`'s result for `budget` on the general problem, its schedule within the budget.

    Where the solver ran out of time without a schedule within the budget, the
    director's schedule is returned instead if it fits (its message says so). Where no
    schedule found fits, raises InfeasibleBudget with the least peak of the schedules
    found and of a least-memory solve by the director.
    """
    options = dataclasses.replace(options, problem="general")
    result = get_solver(solver)(graph, budget, options)
    peak = _peak(graph, result, options)
    director_options = dataclasses.replace(options, time_limit=_DIRECTOR_SECONDS)
    if result.status == "timeout" and peak > budget and solver != "director":
        stand_in = get_solver("director")(graph, budget, director_options)
        stand_in_peak = _peak(graph, stand_in, options)
        if stand_in_peak <= budget:
            return dataclasses.replace(
                stand_in,
                message=f"{solver} found no schedule within the budget in "
                f"{options.time_limit:g} s; this is the director's schedule",
            )
        peak = min(peak, stand_in_peak)
    if peak > budget:
        least = get_solver("director")(
            graph, 0, dataclasses.replace(director_options, minimize_memory=True)
        )
        raise InfeasibleBudget(budget, min(peak, _peak(graph, least, options)), solver)
    return result


def _peak(graph: Graph, result: SolveResult, options: SolverOptions) -> float:
    """The simulated peak of the result's schedule; infinite without one."""
    if result.schedule is None:
        return math.inf
    return simulate(graph, result.schedule, bandwidth=options.bandwidth).peak
