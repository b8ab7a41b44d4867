"""Reading the Checkmate MILP's solution back (memplan/solvers/milp_model.py): the
schedule of its stages, with POET's page-outs and page-ins as transfer steps where it
pages, checked by the simulator, and the SolveResult with the solver's bound.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from memplan.core import remat
from memplan.core.errors import InvalidSchedule
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
from memplan.solvers import SolverOptions
from memplan.solvers.milp_model import Model, Paging, Stages, is_on

NAME = "milp"


@dataclass(frozen=True)
class Outcome:
    """What one MILP solve gave: a status, the decoded schedule if any, and the solver's
    objective bound and relative gap (scaled units) where it reports them."""

    status: str
    schedule: Schedule | None
    bound: float | None
    gap: float | None


def decode(graph: Graph, stages: Stages, model: Model) -> Schedule:
    """The solution as a Schedule: without paging, the computed nodes stage by stage in
    topological order, each copy freed after its last read; with paging, _paged_steps."""
    if model.paging is None:
        T = len(stages)
        sequence = [stages.order[k] for t in range(T) for k in range(t + 1) if is_on(model.R[t, k])]
        return remat.to_schedule(graph, sequence)
    return Schedule(steps=tuple(_paged_steps(stages, model, model.paging)))


def _paged_steps(stages: Stages, model: Model, paging: Paging) -> list[Step]:
    """Stage by stage: the stage's page-outs and page-ins start it (so the copy stream
    runs beside its computations); each computation follows, and a copy is freed after
    its last read in the stage unless stage t+1 keeps it or the stage pages it out; the
    stage ends waiting for its page-ins and freeing what stage t+1 does not keep. Memory
    never exceeds the model's U, and the simulated time never exceeds its objective."""
    T, node = len(stages), stages.order
    steps: list[Step] = []
    resident: set[int] = set()
    for t in range(T):
        computed = [k for k in range(t + 1) if is_on(model.R[t, k])]
        kept = {
            k
            for k in range(t + 1)
            if k in stages.outputs or (t + 1 < T and is_on(model.S[t + 1, k]))
        }
        leaving = sorted(k for k in resident if is_on(paging.Out.get((t, k), 0)))
        arriving = [k for k in range(t) if is_on(paging.In.get((t, k), 0))]
        steps += [Offload(node[k]) for k in leaving] + [Prefetch(node[k]) for k in arriving]
        last_read = {u: k for k in computed for u in stages.inputs[k]}
        held = kept | set(leaving)
        # An old copy of a node recomputed here, and a copy nothing here reads or holds.
        idle = sorted(
            k for k in resident if k in computed or (k not in held and k not in last_read)
        )
        steps += [Free(node[k]) for k in idle]
        resident.difference_update(idle)
        for k in computed:
            steps.append(Compute(node[k]))
            resident.add(k)
            for u in dict.fromkeys((*stages.inputs[k], k)):
                done = last_read.get(u) == k or (u == k and k not in last_read)
                if done and u not in held and u in resident:
                    steps.append(Free(node[u]))
                    resident.discard(u)
        steps += [Wait(node[k]) for k in arriving]
        resident.update(arriving)
        ending = sorted(resident - kept)
        steps += [Free(node[k]) for k in ending]
        resident.difference_update(ending)
    return steps


def make_result(
    graph: Graph,
    stages: Stages,
    outcome: Outcome,
    budget: int | None,
    options: SolverOptions,
    started: float,
) -> SolveResult:
    """The SolveResult of a time-minimizing solve, or of a peak-minimizing one (budget
    None: objective and bound then in bytes).

    With paging the model charges each stage the longer of its compute and its transfers,
    which the simulator's copy stream can only beat: an optimum of the model is not a
    proved optimum of the simulated time, so the status is then "feasible" and no time
    bound is given (a least peak at the trivial floor is still proved)."""
    if outcome.schedule is None:
        return SolveResult(
            solver=NAME,
            status=outcome.status,
            schedule=None,
            solve_seconds=time.perf_counter() - started,
            options=options.to_json(),
            message=f"no solution within {options.time_limit:g} s"
            if outcome.status == "timeout"
            else "",
        )
    trace = checked(graph, stages, outcome.schedule, budget)
    status = outcome.status
    if budget is None:
        objective = float(trace.peak)
        bound = _bytes(stages, outcome.bound)
        if stages.transfer is not None and trace.peak > stages.least_peak:
            status, bound = _model_only(status), None
    else:
        objective = trace.time
        bound = None if outcome.bound is None else outcome.bound * stages.cost_scale
        if stages.transfer is not None:
            status, bound = _model_only(status), None
    return SolveResult(
        solver=NAME,
        status=status,
        schedule=outcome.schedule,
        objective=objective,
        lower_bound=bound,
        gap=None if bound is None else outcome.gap,
        solve_seconds=time.perf_counter() - started,
        options=options.to_json(),
        message=f"peak {trace.peak} B, duration {trace.time:g}"
        + (" (optimal for the stage model of transfers)" if status != outcome.status else ""),
    )


def _model_only(status: str) -> str:
    """A status about the paging model, as a status about the simulated schedule."""
    return "feasible" if status == "optimal" else status


def checked(graph: Graph, stages: Stages, schedule: Schedule, budget: int | None) -> MemoryTrace:
    """The schedule's trace; InvalidSchedule if it is over `budget`, which would mean the
    scaled model hid a violation."""
    trace = simulated(graph, stages, schedule)
    if budget is not None and trace.peak > budget:
        raise InvalidSchedule(
            f"milp: decoded schedule peaks at {trace.peak} B, over the budget of {budget} B "
            "(a numerical tolerance of the MILP; please report this graph)"
        )
    return trace


def _bytes(stages: Stages, scaled: float | None) -> float | None:
    """A peak bound in scaled units, as bytes including the resident inputs."""
    return None if scaled is None else scaled * stages.memory_scale + stages.baseline


def infeasible_result(
    graph: Graph,
    stages: Stages,
    least: Outcome,
    budget: int,
    options: SolverOptions,
    started: float,
) -> SolveResult:
    """No schedule fits `budget`: return the least-peak schedule found in the time left
    (none if time ran out) and say how low a budget can go."""
    if least.schedule is not None:
        peak = checked(graph, stages, least.schedule, None).peak
        proved = "the least possible" if least.status == "optimal" else "the least found"
        if peak <= stages.least_peak:
            proved = "the least possible"
        message = f"no schedule fits {budget} B; {proved} peak is {peak} B"
    else:
        message = f"no schedule fits {budget} B (at least {stages.least_peak} B needed)"
    return SolveResult(
        solver=NAME,
        status="infeasible",
        schedule=least.schedule,
        solve_seconds=time.perf_counter() - started,
        options=options.to_json(),
        message=message,
    )


def simulated(graph: Graph, stages: Stages, schedule: Schedule) -> MemoryTrace:
    """The simulator's verdict on a decoded schedule (over the host link when paging)."""
    return simulate(graph, schedule, bandwidth=stages.bandwidth)
