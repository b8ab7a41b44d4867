"""The one driver that holds a solve to its budget, for the API, the torch.compile backend
and both CLI commands (`memplan plan` and `memplan solve`).

The named solver runs first. Where its simulated peak is over the budget (or it found no
schedule), the problem's fallback stands in: greedy on the training problem, the director
on the general one, first at the budget and then for its least peak; the note says
which schedule was returned. The step as the model is written (`as_written`, where the
caller has it) stands in next, so that a budget at its peak (100%) always holds. Where
nothing found fits: with best_effort, the least peak found becomes the budget, with a
warning (what torch.compile does per graph); else InfeasibleBudget names the least peak
and who found it. No torch here.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from dataclasses import dataclass

from memplan.core.collector import collector_paused
from memplan.core.errors import InfeasibleBudget, InfeasibleBudgetWarning, MemplanError
from memplan.core.graph import Graph, SolveResult
from memplan.core.simulate import MemoryTrace, simulate
from memplan.core.units import format_bytes
from memplan.solvers import SolverOptions, get_solver
from memplan.solvers.bounds import peak_lower_bound
from memplan.solvers.warm_start import STARTING_SCHEDULE

# Solvers that prove optimality; anything less than "optimal" from them is their best
# schedule at the time limit (or the director's, see solvers/warm_start.py).
EXACT = frozenset({"milp", "cpsat"})


@dataclass(frozen=True)
class _Fallback:
    """The solver that stands in on a problem, and its time limit (None: the solve's)."""

    solver: str
    seconds: float | None


# The director needs a few seconds on the literature's largest graphs; greedy on a model
# gets the plan's own limit.
FALLBACKS = {"training": _Fallback("greedy", None), "general": _Fallback("director", 30.0)}


@dataclass(frozen=True)
class Solved:
    """A solve held to its budget: the result, the simulator's trace of its schedule, the
    bytes the schedule is held to (the budget asked for, or in best-effort mode the least
    peak found), a note saying which schedule it is where it is not simply the named
    solver's answer ("" where it is), and whether any solve run for it reached its own
    time limit (`cut_short`: then how far it searched depended on how busy the machine
    was)."""

    result: SolveResult
    trace: MemoryTrace
    budget: int
    note: str = ""
    cut_short: bool = False


@dataclass(frozen=True)
class _Found:
    result: SolveResult
    trace: MemoryTrace | None

    @property
    def peak(self) -> float:
        return math.inf if self.trace is None else self.trace.peak


def solve_within_budget(
    graph: Graph,
    budget: int,
    solver: str,
    options: SolverOptions,
    *,
    best_effort: bool = False,
    first: SolveResult | None = None,
    as_written: SolveResult | None = None,
) -> Solved:
    """`solver`'s schedule for `budget`, or the fallback's (see the module). `first` is the
    named solver's result where the caller already has it (a re-applied plan);
    `as_written`, the step as the model is written (solvers.baselines.as_written). The
    cyclic collector is paused meanwhile (core/collector.py)."""
    with collector_paused():
        return _solve_within_budget(
            graph, budget, solver, options, best_effort, first=first, as_written=as_written
        )


def _solve_within_budget(
    graph: Graph,
    budget: int,
    solver: str,
    options: SolverOptions,
    best_effort: bool,
    *,
    first: SolveResult | None,
    as_written: SolveResult | None,
) -> Solved:
    named = _found(graph, first or get_solver(solver)(graph, budget, options), options)
    cut_short = first is None and ran_out(named.result, options)
    if named.peak <= budget:
        assert named.trace is not None
        # A best-effort plan re-applied (`first`) under a budget that holds it is a plan for
        # that budget: its status was the budget it was made for.
        result = named.result
        if result.status == "best-effort":
            result = dataclasses.replace(result, status="feasible")
        return Solved(result, named.trace, budget, cut_short=cut_short)
    if named.result.status == "timeout":
        why = f"in {options.time_limit:g} s"
    elif named.trace is None:
        why = f"({named.result.status})"
    else:
        why = f"(its schedule peaks at {named.peak:.0f} B)"
    fallback = FALLBACKS[options.problem]
    fallback_options = options
    if fallback.seconds is not None:
        fallback_options = dataclasses.replace(options, time_limit=fallback.seconds)
    missed_by = f"{solver} found no schedule within the budget {why}"
    missed = f"{missed_by}; this is the {fallback.solver}'s"
    least, least_by = named, solver
    if solver != fallback.solver:
        stand_in = _found(
            graph, get_solver(fallback.solver)(graph, budget, fallback_options), options
        )
        cut_short = cut_short or ran_out(stand_in.result, fallback_options)
        if stand_in.peak <= budget:
            assert stand_in.trace is not None
            note = f"{missed} schedule"
            return Solved(stand_in.result, stand_in.trace, budget, note, cut_short)
        if stand_in.peak < least.peak:
            least, least_by = stand_in, fallback.solver
    # The solvers search from keep-all: they can miss the peak of a model's own
    # checkpointing by a few bytes (greedy's least did, on checkpointed blocks), and a
    # budget of 100% of that step must hold.
    written = None if as_written is None else _found(graph, as_written, options)
    if written is not None and written.peak <= budget:
        assert written.trace is not None
        result = dataclasses.replace(written.result, status="feasible")
        note = f"{missed_by}; this is the step as written"
        return Solved(result, written.trace, budget, note, cut_short)
    lowest = _found(graph, get_solver(fallback.solver)(graph, None, fallback_options), options)
    cut_short = cut_short or ran_out(lowest.result, fallback_options)
    if lowest.peak <= budget:  # the fallback's budgeted search missed what it can reach
        assert lowest.trace is not None
        result = dataclasses.replace(lowest.result, status="feasible")
        note = f"{missed} least-memory schedule"
        return Solved(result, lowest.trace, budget, note, cut_short)
    if lowest.peak < least.peak:
        least, least_by = lowest, fallback.solver
    if least.trace is None:
        raise MemplanError(f"neither {solver} nor the {fallback.solver} found any schedule")
    peak = least.trace.peak
    if not best_effort:
        bound = peak_lower_bound(graph) if options.problem == "general" else None
        raise InfeasibleBudget(budget, peak, least_by, lower_bound=bound)
    note = (
        f"{graph.name}: budget {format_bytes(budget)} is infeasible; planned for "
        f"its smallest feasible peak {format_bytes(peak)} instead"
    )
    warnings.warn(note, InfeasibleBudgetWarning, stacklevel=3)  # past the wrapper
    result = dataclasses.replace(least.result, status="best-effort")
    return Solved(result, least.trace, peak, note, cut_short)


def ran_out(result: SolveResult, options: SolverOptions) -> bool:
    """Whether a solve ran to the time limit it was given: its schedule is then the best
    found by that time, and another run on a quieter machine may find a better one."""
    return result.solve_seconds >= options.time_limit


def _found(graph: Graph, result: SolveResult, options: SolverOptions) -> _Found:
    """The result with the simulator's trace of its schedule (None without one)."""
    if result.schedule is None:
        return _Found(result, None)
    return _Found(result, simulate(graph, result.schedule, bandwidth=options.bandwidth))


def provenance(solved: Solved, solver: str, options: SolverOptions) -> str | None:
    """One line saying which schedule `solved` holds, where it is not simply `solver`'s
    answer: the note of a fallback standing in, the director's starting schedule an
    exact solver kept, or an exact solver's best schedule found but not proved optimal,
    with its gap to the solver's lower bound. None where the schedule is a heuristic's
    answer or a proved optimum."""
    result = solved.result
    if solved.note:
        return solved.note
    if result.gap is None:
        gap = f"no lower bound from {solver}"
    else:
        gap = f"a gap of {result.gap:.2%} to {solver}'s lower bound"
    if result.message.startswith(STARTING_SCHEDULE):
        return f"{result.message}; {gap}"
    if solver not in EXACT or result.status == "optimal":
        return None
    return (
        f"{solver} did not prove this schedule optimal within {options.time_limit:g} s: "
        f"it is the best {solver} found ({result.status}), with {gap}"
    )
