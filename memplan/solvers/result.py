"""A solver's SolveResult where the simulator's verdict decides the status.

Heuristics (and exact engines on models whose optimum is no proof about the simulator)
call a schedule feasible only where its simulated peak meets the budget; a budget of None
asks for the least peak, which every peak meets.
"""

from __future__ import annotations

import time

from memplan.core.graph import Decision, Schedule, SolveResult
from memplan.core.simulate import MemoryTrace
from memplan.solvers import SolverOptions


def within(peak: float, budget: int | None) -> bool:
    """Whether a peak meets a solve's budget; every peak meets None (the least peak)."""
    return budget is None or peak <= budget


def peak_message(peak: int, budget: int | None) -> str:
    """A result's message about its simulated peak and the budget it was for."""
    if budget is None:
        return f"least peak found: {peak} B"
    return f"peak {peak} B for a budget of {budget} B"


def judged(
    solver: str,
    schedule: Schedule,
    trace: MemoryTrace,
    budget: int | None,
    options: SolverOptions,
    started: float,
    *,
    objective: float,
    unfit: str = "infeasible",
    decisions: dict[int, Decision] | None = None,
    message: str = "",
) -> SolveResult:
    """The result of a schedule the simulator traced: "feasible" where its peak meets the
    budget, else `unfit` ("infeasible", or "timeout" where the time limit cut the search
    short)."""
    return SolveResult(
        solver=solver,
        status="feasible" if within(trace.peak, budget) else unfit,
        schedule=schedule,
        objective=objective,
        solve_seconds=time.perf_counter() - started,
        decisions=decisions or {},
        options=options.to_json(),
        message=message,
    )
