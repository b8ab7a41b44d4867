"""The Checkmate rematerialization MILP (Jain et al., MLSys 2020) for the general problem,
with POET's paging (Patil et al., ICML 2022) when a host link is given, through PuLP with
HiGHS (or CBC): exact, but O(T^2) binaries for T computed nodes.

See ../../shared/docs/formulations.md sections 2 and 4. The model is solved in "stages":
stage t computes node t for the first time, and before it may recompute any earlier node.
With paging, a stage may also start page-outs of resident values and page-ins of values
held in host memory; the copy stream runs beside the stage's computations, and the stage
lasts as long as the longer of the two (docs/solvers/milp.md). The model is built by
milp_model.py and read back by milp_extract.py; this module solves it, and the training
problem's release model (solvers/releases.py) as a MILP.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import math
import time
from collections.abc import Sequence
from types import ModuleType
from typing import Any

from memplan.core.errors import InvalidSchedule, MissingDependency
from memplan.core.graph import Graph, SolveResult
from memplan.solvers import SolverOptions, releases, warm_start
from memplan.solvers.milp_extract import (
    NAME,
    Outcome,
    decode,
    infeasible_result,
    make_result,
    simulated,
)
from memplan.solvers.milp_model import Stages, build, set_start
from memplan.solvers.releases import Effect, Pick, ReleaseModel

# Feasibility tolerance of the scaled rows: 1e-9 of the largest node is under a byte
# for nodes up to 1 GB. Beyond, a decoded schedule can overshoot the budget by a few
# bytes; solve() then tightens the budget by the overshoot and solves again.
_TOLERANCE = 1e-9
_RETRIES = 3


def solve(graph: Graph, budget: int | None, options: SolverOptions) -> SolveResult:
    """The fastest sequence (least total compute time) whose peak fits `budget`, or for
    budget None the least peak, found by the Checkmate MILP.

    Status: "optimal" (proved), "feasible" (time limit hit with a solution, see gap),
    "infeasible" (proved: no sequence fits; the schedule returned is then the least-peak
    one found in the time left, and the message names its peak), or "timeout" (no
    solution in time; schedule None). HiGHS starts from the director's sequence where it
    fits the budget and the stages express it, and where milp returns nothing faster that
    sequence is the result ("feasible", memplan/solvers/warm_start.py).
    options.time_limit covers the director, building and solving.
    """
    pulp = _import_pulp()
    if options.problem == "training":
        return releases.solve(graph, budget, options, NAME, _pick_releases)
    started = time.perf_counter()
    deadline = started + options.time_limit
    stages = Stages.of(graph, options.bandwidth)

    if budget is None:
        least = _least_peak(pulp, graph, stages, deadline, options)
        return make_result(graph, stages, least, None, options, started)
    start = None
    if budget < stages.least_peak:  # some node alone with its inputs exceeds the budget
        outcome = Outcome("infeasible", None, None, None)
    else:
        start = warm_start.director_sequence(graph, budget, options)
        outcome = _within(pulp, graph, stages, budget, deadline, options, start)
    if outcome.status == "infeasible" and start is None:
        least = _least_peak(pulp, graph, stages, deadline, options)
        return infeasible_result(graph, stages, least, budget, options, started)
    result = make_result(graph, stages, outcome, budget, options, started)
    return warm_start.keep_faster(graph, result, start, budget, options)


# --- solve and extract -----------------------------------------------------------------


def _import_pulp() -> ModuleType:
    """PuLP, imported on first use so that memplan runs without it."""
    try:
        import pulp
    except ImportError as error:
        raise MissingDependency(
            "the milp solver needs PuLP: pip install pulp highspy "
            "(highspy gives the HiGHS backend; without it CBC, bundled with PuLP, is used)"
        ) from error
    return pulp


def _least_peak(
    pulp: ModuleType, graph: Graph, stages: Stages, deadline: float, options: SolverOptions
) -> Outcome:
    """The least peak, then the fastest schedule at that peak in the time left.

    Minimizing the peak alone leaves the time free, and the solver's first optimum is
    often full of useless recomputation; the second solve keeps the first's status and
    bound (both are about the peak) and only replaces its schedule.
    """
    least = _solve_stage(pulp, graph, stages, None, deadline, options)
    if least.schedule is None:
        return least
    first = simulated(graph, stages, least.schedule)
    fastest = _within(pulp, graph, stages, first.peak, deadline, options)
    if fastest.schedule is None or simulated(graph, stages, fastest.schedule).time > first.time:
        return least
    return dataclasses.replace(least, schedule=fastest.schedule)


def _within(
    pulp: ModuleType,
    graph: Graph,
    stages: Stages,
    budget: int,
    deadline: float,
    options: SolverOptions,
    start: Sequence[int] | None = None,
) -> Outcome:
    """The fastest schedule whose simulated peak fits `budget`, the solver started from
    the sequence `start` where the stages can express it.

    The scaled model is trusted only as far as the simulator agrees: a schedule over the
    budget (by the solver's tolerance) is answered by solving again with the budget
    tightened by the overshoot.
    """
    target = budget
    for _ in range(_RETRIES):
        outcome = _solve_stage(pulp, graph, stages, target, deadline, options, start)
        if outcome.schedule is None:
            return outcome
        over = simulated(graph, stages, outcome.schedule).peak - budget
        if over <= 0:
            return outcome
        target -= over
    raise InvalidSchedule(
        f"milp: the decoded schedule stays over the budget of {budget} B after "
        f"{_RETRIES} solves (a numerical tolerance of the MILP; please report this graph)"
    )


def _highs_available() -> bool:
    return importlib.util.find_spec("highspy") is not None


def _solve_stage(
    pulp: ModuleType,
    graph: Graph,
    stages: Stages,
    budget: int | None,
    deadline: float,
    options: SolverOptions,
    start: Sequence[int] | None = None,
) -> Outcome:
    """Build and solve one model within the deadline, from `start` where the stages can
    express it; budget None minimizes the peak."""
    model = build(pulp, stages, budget, deadline)
    remaining = deadline - time.perf_counter()
    if model is None or remaining <= 0:
        return Outcome("timeout", None, None, None)
    started = start is not None and set_start(stages, model, start)
    model.problem.solve(backend(pulp, remaining, options, started))
    status, bound, gap = _read_status(pulp, model.problem)
    schedule = decode(graph, stages, model) if status in ("optimal", "feasible") else None
    return Outcome(status, schedule, bound, gap)


def backend(pulp: ModuleType, remaining: float, options: SolverOptions, started: bool) -> Any:
    """HiGHS if highspy is installed, else CBC: one thread, seeded, tight tolerances, and
    started from the variables' initial values where `started`."""
    if _highs_available():
        return _started_highs(pulp)(
            msg=False, timeLimit=remaining, threads=1, random_seed=options.seed % 2**31,
            mip_feasibility_tolerance=_TOLERANCE, primal_feasibility_tolerance=_TOLERANCE,
        )  # fmt: skip
    return pulp.PULP_CBC_CMD(
        msg=False, timeLimit=max(1, math.ceil(remaining)), threads=1, warmStart=started,
        options=[f"randomCbcSeed {options.seed}", f"primalTolerance {_TOLERANCE}"],
    )  # fmt: skip


@functools.cache  # one class per process, not one per solve
def _started_highs(pulp: ModuleType) -> type:
    """PuLP's HiGHS interface, handing the variables' initial values to HiGHS as a
    (partial) MIP start, which PuLP itself does not: HiGHS completes the continuous
    columns and keeps the start as its first incumbent if it is feasible."""
    import numpy as np

    class StartedHiGHS(pulp.HiGHS):  # type: ignore[misc, name-defined]
        def callSolver(self, lp: Any) -> None:
            given = [(v.index, v.varValue) for v in lp.variables() if v.varValue is not None]
            if given:
                index, value = zip(*given, strict=True)
                lp.solverModel.setSolution(
                    len(given), np.array(index, np.int32), np.array(value, np.float64)
                )
            super().callSolver(lp)

    return StartedHiGHS


def _read_status(pulp: ModuleType, problem: Any) -> tuple[str, float | None, float | None]:
    """(status, objective bound, relative gap) of a solved problem.

    PuLP reports a time limit with an incumbent as LpStatusOptimal; sol_status tells a
    proved optimum (LpSolutionOptimal) from a mere incumbent (LpSolutionIntegerFeasible).
    Only HiGHS exposes the dual bound; CBC through its command line does not.
    """
    if problem.status == pulp.LpStatusInfeasible:
        return "infeasible", None, None
    if problem.status != pulp.LpStatusOptimal:
        return "timeout", None, None
    proved = problem.sol_status == pulp.LpSolutionOptimal
    solver_model = getattr(problem, "solverModel", None)
    if solver_model is None or not hasattr(solver_model, "getInfo"):
        return ("optimal" if proved else "feasible"), None, None
    # HiGHS is given the objective without PuLP's constant (the frontier's fixed R terms).
    bound = float(solver_model.getInfo().mip_dual_bound) + problem.objective.constant
    if not math.isfinite(bound):
        return ("optimal" if proved else "feasible"), None, None
    value = pulp.value(problem.objective)
    gap = max(0.0, value - bound) / abs(value) if value else 0.0
    return ("optimal" if proved else "feasible"), bound, gap


# --- the training problem: the release model (memplan/solvers/releases.py) -------------


def _pick_releases(
    model: ReleaseModel,
    cap: int | None,
    hint: frozenset[int],
    deadline: float,
    options: SolverOptions,
) -> Pick:
    """The release model as a MILP: a binary per release, their product per interaction,
    a row per position, and the cuts. Bytes are in MiB and times relative to keep-all's,
    to keep HiGHS well scaled. The releases in `hint` are the solver's start."""
    pulp = _import_pulp()
    problem = pulp.LpProblem("releases", pulp.LpMinimize)
    picked = [
        problem.add_variable(f"r{i}", 0, 1, pulp.LpBinary) for i in range(len(model.releases))
    ]
    for i, x in enumerate(picked):
        x.setInitialValue(int(i in hint))
    for group in model.groups:
        problem += pulp.lpSum(picked[i] for i in group) <= 1
    chosen: dict[Effect, Any] = {(i,): x for i, x in enumerate(picked)}
    for i, j in (x.pair for x in model.interactions):
        both = chosen[i, j] = problem.add_variable(f"r{i}_{j}", 0, 1)
        problem += both >= picked[i] + picked[j] - 1
        problem += both <= picked[i]
        problem += both <= picked[j]
    mib = float(1 << 20)
    rows = model.rows(cap)
    if cap is None:
        peak = problem.add_variable("peak", 0)
        problem += peak
        for row in rows:
            changes = pulp.lpSum(c / mib * chosen[e] for e, c in row.terms)
            problem += row.constant / mib + changes <= peak
    else:
        unit = model.base_time or 1.0
        problem += pulp.lpSum(t / unit * chosen[e] for e, _, t in model.effects)
        for row in rows:
            changes = pulp.lpSum(c / mib * chosen[e] for e, c in row.terms)
            problem += changes <= (cap - row.constant) / mib
    for cut in model.cuts:
        problem += (
            pulp.lpSum(1 - picked[i] for i in cut)
            + pulp.lpSum(x for i, x in enumerate(picked) if i not in cut)
            >= 1
        )
    remaining = deadline - time.perf_counter()
    if remaining <= 0:
        return Pick("timeout", None)
    problem.solve(backend(pulp, remaining, options, started=True))
    status, _, _ = _read_status(pulp, problem)
    if status not in ("optimal", "feasible"):
        return Pick(status, None)
    return Pick(status, frozenset(i for i, x in enumerate(picked) if (x.value() or 0) > 0.5))
