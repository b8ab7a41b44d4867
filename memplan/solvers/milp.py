"""The Checkmate rematerialization MILP (Jain et al., MLSys 2020) for the general problem,
with POET's paging (Patil et al., ICML 2022) when a host link is given, through PuLP with
HiGHS (or CBC): exact, but O(T^2) binaries for T computed nodes.

See ../../shared/docs/formulations.md sections 2 and 4. The model is solved in "stages":
stage t computes node t for the first time, and before it may recompute any earlier node.
With paging, a stage may also start page-outs of resident values and page-ins of values
held in host memory; the copy stream runs beside the stage's computations, and the stage
lasts as long as the longer of the two (docs/solvers/milp.md).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import itertools
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from memplan import remat
from memplan.errors import InvalidSchedule, MemplanError, MissingDependency, UnsupportedModel
from memplan.graph import Compute, Free, Graph, Offload, Prefetch, Schedule, SolveResult, Step, Wait
from memplan.planner.simulate import MemoryTrace, simulate
from memplan.solvers import SolverOptions, releases, warm_start
from memplan.solvers.releases import Effect, Pick, ReleaseModel

# The model has about 2 T^2 binaries plus T^2/2 continuous memory and free variables
# (times the mean in-degree) for T computed nodes, and PuLP spends roughly a kilobyte
# of Python objects on each. 300 stages is about 0.5 M variables: a few hundred MB and
# a minute to build. HiGHS proves optimality in seconds only up to ~50 nodes (VGG16,
# 45 nodes) and rarely finds a first solution within a minute above ~100 nodes, so
# larger graphs need a restricted formulation (not this module).
MAX_STAGES = 300

# Feasibility tolerance of the scaled rows: 1e-9 of the largest node is under a byte
# for nodes up to 1 GB. Beyond, a decoded schedule can overshoot the budget by a few
# bytes; solve() then tightens the budget by the overshoot and solves again.
_TOLERANCE = 1e-9
_RETRIES = 3

NAME = "milp"


def solve(graph: Graph, budget: int, options: SolverOptions) -> SolveResult:
    """The fastest sequence (least total compute time) whose peak fits `budget`, or with
    options.minimize_memory the least peak, found by the Checkmate MILP.

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
    stages = _Stages.of(graph, options.bandwidth)

    if options.minimize_memory:
        least = _least_peak(pulp, graph, stages, deadline, options)
        return _result(graph, stages, least, budget, options, started, minimized=True)
    start = None
    if budget < stages.least_peak:  # some node alone with its inputs exceeds the budget
        outcome = _Outcome("infeasible", None, None, None)
    else:
        start = warm_start.director_sequence(graph, budget, options)
        outcome = _within(pulp, graph, stages, budget, deadline, options, start)
    if outcome.status == "infeasible" and start is None:
        least = _least_peak(pulp, graph, stages, deadline, options)
        return _infeasible(graph, stages, least, budget, options, started)
    result = _result(graph, stages, outcome, budget, options, started, minimized=False)
    return warm_start.keep_faster(graph, result, start, budget, options)


# --- data ------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Stages:
    """The graph as the MILP sees it, indexed by position 0..T-1 among computed nodes.

    Resident inputs (params, user inputs) are never computed: they are always available
    and add `baseline` bytes to every step. Outputs are computed once and held to the
    end, as the simulator requires. memory[k] and cost[k] are scaled to at most 1 so that
    bytes near 1e10 and times near 1e13 leave the LP well conditioned.
    """

    order: tuple[int, ...]  # position -> node id
    inputs: tuple[tuple[int, ...], ...]  # position -> positions it reads
    users: tuple[tuple[int, ...], ...]  # position -> positions that read it, ascending
    outputs: frozenset[int]  # positions of graph outputs
    memory: tuple[float, ...]
    cost: tuple[float, ...]
    memory_scale: float  # bytes per memory unit
    cost_scale: float
    baseline: int  # bytes of the resident inputs
    least_peak: int  # no schedule peaks lower: a node, its inputs and the resident bytes
    # With paging: position -> time to move it over the host link (scaled as cost), and
    # the positions that may be paged (offloadable, not outputs). None: no paging.
    transfer: tuple[float, ...] | None = None
    pageable: frozenset[int] = frozenset()
    bandwidth: float | None = None  # the host link, for the simulator

    @classmethod
    def of(cls, graph: Graph, bandwidth: float | None = None) -> _Stages:
        """The stages, with paging over a host link of `bandwidth` bytes per time unit when
        given. UnsupportedModel for views and carved outputs (the literature's memory model
        has neither); MemplanError when the graph has more than MAX_STAGES nodes."""
        for node in graph:
            if not node.is_resident_input and (
                node.alias_of is not None or node.carved_from is not None
            ):
                raise UnsupportedModel(
                    node.name, "the milp solver does not model views or carved outputs"
                )
        order = tuple(n.id for n in graph if not n.is_resident_input)
        if len(order) > MAX_STAGES:
            raise MemplanError(
                f"graph {graph.name!r} has {len(order)} computed nodes; the milp solver "
                f"builds O(T^2) variables and takes at most {MAX_STAGES} (a larger model "
                "would not fit in memory or solve in useful time)"
            )
        position = {v: k for k, v in enumerate(order)}
        inputs = tuple(
            tuple(position[u] for u in dict.fromkeys(graph[v].inputs) if u in position)
            for v in order
        )
        users: list[list[int]] = [[] for _ in order]
        for k, reads in enumerate(inputs):
            for u in reads:
                users[u].append(k)
        sizes = [graph[v].bytes for v in order]
        times = [graph[v].time for v in order]
        memory_scale = float(max(sizes, default=0) or 1)
        cost_scale = float(max(times, default=0.0) or 1.0)
        baseline = sum(n.bytes for n in graph if n.is_resident_input and n.alias_of is None)
        least = max(
            (sizes[k] + sum(sizes[u] for u in inputs[k]) for k in range(len(order))),
            default=0,
        )
        outputs = frozenset(position[o] for o in graph.outputs if o in position)
        transfer = None
        if bandwidth is not None and bandwidth > 0:
            transfer = tuple(size / bandwidth / cost_scale for size in sizes)
        return cls(
            order=order,
            inputs=inputs,
            users=tuple(tuple(r) for r in users),
            outputs=outputs,
            memory=tuple(s / memory_scale for s in sizes),
            cost=tuple(t / cost_scale for t in times),
            memory_scale=memory_scale,
            cost_scale=cost_scale,
            baseline=baseline,
            least_peak=baseline + least,
            transfer=transfer,
            bandwidth=bandwidth if transfer is not None else None,
            pageable=frozenset(
                k
                for k, v in enumerate(order)
                if transfer is not None and graph[v].offloadable and k not in outputs
            ),
        )

    def __len__(self) -> int:
        return len(self.order)


@dataclass(frozen=True)
class _Outcome:
    """What one MILP solve gave: a status, the decoded schedule if any, and the solver's
    objective bound and relative gap (scaled units) where it reports them."""

    status: str
    schedule: Schedule | None
    bound: float | None
    gap: float | None


# --- model -----------------------------------------------------------------------------


@dataclass
class _Paging:
    """POET's paging variables. Out[t,k]: page k out during stage t (a copy resident
    entering t); In[t,k]: page k in during stage t (resident from stage t+1); H[t,k]: a
    host copy of k exists entering stage t (continuous: bounded by the page-outs before
    t, it is 1 wherever a page-in needs it)."""

    Out: dict[tuple[int, int], Any]
    In: dict[tuple[int, int], Any]
    H: dict[tuple[int, int], Any]


@dataclass
class _Model:
    """The PuLP problem and the variables the extraction reads."""

    problem: Any
    R: dict[tuple[int, int], Any]
    S: dict[tuple[int, int], Any]
    paging: _Paging | None


def _build(pulp: ModuleType, stages: _Stages, budget: int | None, deadline: float) -> _Model | None:
    """The Checkmate MILP, with POET's paging where stages.transfer is set; with budget
    None, minimize the peak instead of the time.

    R[t,k]: compute k in stage t. S[t,k]: k resident entering stage t. F[t,u,k]: free u
    right after computing k in stage t (continuous: its upper bounds force it to 0 or 1
    once R and S are integral, and freeing only lowers memory, so it is 1 when allowed).
    U[t,k]: memory (scaled, resident inputs excluded) while stage t computes k. None when
    the deadline passes while building.
    """
    T = len(stages)
    problem = pulp.LpProblem("checkmate", pulp.LpMinimize)
    R: dict[tuple[int, int], Any] = {}
    S: dict[tuple[int, int], Any] = {}
    binary = pulp.LpBinary
    for t in range(T):
        for k in range(t + 1):
            # Frontier: stage t computes t; an output is computed once, in its own stage.
            fixed = 1 if k == t else 0 if k in stages.outputs else None
            R[t, k] = problem.add_variable(f"R_{t}_{k}", 0, 1, binary) if fixed is None else fixed
        for k in range(t):
            fixed = 1 if k in stages.outputs else None
            S[t, k] = problem.add_variable(f"S_{t}_{k}", 0, 1, binary) if fixed is None else fixed
    model = _Model(problem=problem, R=R, S=S, paging=_paging_variables(problem, stages, binary))

    peak = None
    if budget is None:
        # The trivial bound (a node with its inputs) lets the solver stop as soon as a
        # schedule reaches it; the LP relaxation alone is far weaker.
        peak = problem.add_variable(
            "peak", (stages.least_peak - stages.baseline) / stages.memory_scale
        )
        limit = None
        problem += peak
    else:
        # Bytes are whole: half a byte of room admits a peak exactly at the budget.
        limit = (budget - stages.baseline + 0.5) / stages.memory_scale
        compute = pulp.lpSum(stages.cost[k] * R[t, k] for t in range(T) for k in range(t + 1))
        problem += compute + _exposed_transfers(pulp, problem, stages, model)

    for t in range(T):
        if time.perf_counter() > deadline:
            return None
        _add_stage(pulp, stages, t, model, limit, peak)
    return model


def _paging_variables(problem: Any, stages: _Stages, binary: Any) -> _Paging | None:
    """Out, In and H for every pageable position k and stage t > k; None without paging."""
    if stages.transfer is None:
        return None
    paging = _Paging(Out={}, In={}, H={})
    pageable = sorted(stages.pageable)
    for t in range(len(stages)):
        for k in pageable:
            if k >= t:
                break
            paging.Out[t, k] = problem.add_variable(f"Out_{t}_{k}", 0, 1, binary)
            paging.In[t, k] = problem.add_variable(f"In_{t}_{k}", 0, 1, binary)
            # No host copy before a page-out: entering stage k+1 there is none yet.
            paging.H[t, k] = 0 if t == k + 1 else problem.add_variable(f"H_{t}_{k}", 0, 1)
    return paging


def _exposed_transfers(pulp: ModuleType, problem: Any, stages: _Stages, model: _Model) -> Any:
    """The time transfers add: per stage, what the copy stream's work exceeds its compute
    by (E_t >= transfers - compute, E_t >= 0). Zero without paging."""
    paging = model.paging
    if paging is None or stages.transfer is None:
        return 0
    exposed = []
    for t in range(len(stages)):
        moves = [
            stages.transfer[k] * (paging.Out[t, k] + paging.In[t, k])
            for k in range(t)
            if (t, k) in paging.Out
        ]
        if not moves:
            continue
        late = problem.add_variable(f"E_{t}", 0)
        compute = pulp.lpSum(stages.cost[k] * model.R[t, k] for k in range(t + 1))
        problem += late >= pulp.lpSum(moves) - compute, f"exposed_{t}"
        exposed.append(late)
    return pulp.lpSum(exposed)


def _add_stage(
    pulp: ModuleType,
    stages: _Stages,
    t: int,
    model: _Model,
    limit: float | None,
    peak: Any | None,
) -> None:
    """Stage t's dependency, retention, paging, free and memory constraints."""
    T = len(stages)
    problem, R, S, paging = model.problem, model.R, model.S, model.paging
    for k in range(t + 1):
        for u in stages.inputs[k]:
            # An output's copy is always there (S fixed to 1): nothing to constrain.
            if u not in stages.outputs and not _is_zero(R[t, k]):
                problem += R[t, k] <= R[t, u] + S[t, u], f"dep_{t}_{u}_{k}"
    # Stage t's page-in variables by position (a dict: the keep rows below look them up).
    page_ins = (
        {} if paging is None else {k: paging.In[t, k] for k in range(t) if (t, k) in paging.In}
    )
    if t + 1 < T:
        for v in range(t + 1):
            if v not in stages.outputs:
                kept = S.get((t, v), 0) + R[t, v] + page_ins.get(v, 0)
                problem += S[t + 1, v] <= kept, f"keep_{t + 1}_{v}"
    if paging is not None:
        _add_paging(problem, stages, t, model, paging)

    memory = stages.memory
    usage = pulp.lpSum(memory[v] * S[t, v] for v in range(t)) + memory[0] * R[t, 0]
    # A page-in allocates when it starts, at the stage's start.
    usage = usage + pulp.lpSum(memory[k] * x for k, x in page_ins.items())
    for k in range(t + 1):
        if k > 0:
            usage = usage + memory[k] * R[t, k] - _freed(pulp, stages, t, k - 1, model)
        used = problem.add_variable(f"U_{t}_{k}", 0, limit)
        problem += used == usage, f"mem_{t}_{k}"
        if peak is not None:
            problem += used <= peak, f"peak_{t}_{k}"
        usage = used


def _add_paging(problem: Any, stages: _Stages, t: int, model: _Model, paging: _Paging) -> None:
    """POET's paging rows for stage t: a page-out reads a resident copy, a page-in a host
    copy, and a host copy persists once made. Beyond POET, as the simulator requires: no
    page-in of a value already resident, and neither kind of transfer of a value the
    stage recomputes (its old copy would still be in use)."""
    R, S = model.R, model.S
    for k in range(t):
        if (t, k) not in paging.Out:
            continue
        out, page_in = paging.Out[t, k], paging.In[t, k]
        problem += out <= S[t, k], f"out_resident_{t}_{k}"
        problem += page_in <= paging.H[t, k], f"in_host_{t}_{k}"
        problem += page_in + S[t, k] <= 1, f"in_absent_{t}_{k}"
        problem += page_in + out + R[t, k] <= 1, f"move_or_compute_{t}_{k}"
        if (t + 1, k) in paging.H:
            problem += paging.H[t + 1, k] <= paging.H[t, k] + out, f"host_{t + 1}_{k}"


def _freed(pulp: ModuleType, stages: _Stages, t: int, k: int, model: _Model) -> Any:
    """The memory freed right after stage t computes k: each of k's inputs and k itself
    that no later node of stage t reads and stage t+1 does not keep (outputs never), and
    that stage t does not page out (a copy being read by the copy stream stays)."""
    T = len(stages)
    problem, R, S, paging = model.problem, model.R, model.S, model.paging
    freed = []
    for u in (*stages.inputs[k], k):
        later = [R[t, j] for j in stages.users[u] if k < j <= t]
        # Never freed here: outputs, nodes not computed, and inputs that node t (always
        # computed in stage t) still reads.
        if u in stages.outputs or _is_zero(R[t, k]) or any(_is_one(r) for r in later):
            continue
        free = problem.add_variable(f"F_{t}_{u}_{k}", 0, 1)
        if not _is_one(R[t, k]):
            problem += free <= R[t, k], f"free_run_{t}_{u}_{k}"
        if t + 1 < T:
            problem += free <= 1 - S[t + 1, u], f"free_kept_{t}_{u}_{k}"
        if paging is not None and (t, u) in paging.Out:
            problem += free <= 1 - paging.Out[t, u], f"free_paged_{t}_{u}_{k}"
        for j, r in zip((j for j in stages.users[u] if k < j <= t), later, strict=True):
            if not _is_zero(r):
                problem += free <= 1 - r, f"free_read_{t}_{u}_{k}_{j}"
        freed.append(stages.memory[u] * free)
    return pulp.lpSum(freed)


# A variable fixed by the frontier or an output is the Python int itself, not a column.
def _is_zero(value: Any) -> bool:
    return isinstance(value, int) and value == 0


def _is_one(value: Any) -> bool:
    return isinstance(value, int) and value == 1


def _on(value: Any) -> bool:
    """A binary's value in the solution (a fixed one is a Python int)."""
    return (value if isinstance(value, int) else (value.varValue or 0.0)) > 0.5


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
    pulp: ModuleType, graph: Graph, stages: _Stages, deadline: float, options: SolverOptions
) -> _Outcome:
    """The least peak, then the fastest schedule at that peak in the time left.

    Minimizing the peak alone leaves the time free, and the solver's first optimum is
    often full of useless recomputation; the second solve keeps the first's status and
    bound (both are about the peak) and only replaces its schedule.
    """
    least = _solve_stage(pulp, graph, stages, None, deadline, options)
    if least.schedule is None:
        return least
    first = _trace(graph, stages, least.schedule)
    fastest = _within(pulp, graph, stages, first.peak, deadline, options)
    if fastest.schedule is None or _trace(graph, stages, fastest.schedule).time > first.time:
        return least
    return dataclasses.replace(least, schedule=fastest.schedule)


def _within(
    pulp: ModuleType,
    graph: Graph,
    stages: _Stages,
    budget: int,
    deadline: float,
    options: SolverOptions,
    start: Sequence[int] | None = None,
) -> _Outcome:
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
        over = _trace(graph, stages, outcome.schedule).peak - budget
        if over <= 0:
            return outcome
        target -= over
    raise InvalidSchedule(
        f"milp: the decoded schedule stays over the budget of {budget} B after "
        f"{_RETRIES} solves (a numerical tolerance of the MILP; please report this graph)"
    )


def _trace(graph: Graph, stages: _Stages, schedule: Schedule) -> MemoryTrace:
    """The simulator's verdict on a decoded schedule (over the host link when paging)."""
    return simulate(graph, schedule, bandwidth=stages.bandwidth)


def _highs_available() -> bool:
    return importlib.util.find_spec("highspy") is not None


def _solve_stage(
    pulp: ModuleType,
    graph: Graph,
    stages: _Stages,
    budget: int | None,
    deadline: float,
    options: SolverOptions,
    start: Sequence[int] | None = None,
) -> _Outcome:
    """Build and solve one model within the deadline, from `start` where the stages can
    express it; budget None minimizes the peak."""
    model = _build(pulp, stages, budget, deadline)
    remaining = deadline - time.perf_counter()
    if model is None or remaining <= 0:
        return _Outcome("timeout", None, None, None)
    started = start is not None and _set_start(stages, model, start)
    model.problem.solve(_backend(pulp, remaining, options, started))
    status, bound, gap = _read_status(pulp, model.problem)
    schedule = _decode(graph, stages, model) if status in ("optimal", "feasible") else None
    return _Outcome(status, schedule, bound, gap)


def _backend(pulp: ModuleType, remaining: float, options: SolverOptions, started: bool) -> Any:
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


def _set_start(stages: _Stages, model: _Model, sequence: Sequence[int]) -> bool:
    """Set R and S (and the page-outs and page-ins, to 0) to the values of `sequence` as
    initial values, and say whether the stages could express it: its first computations
    must follow stages.order, and each stage recomputes a node at most once (run in
    position order, which may peak differently: HiGHS then rejects the start)."""
    position = {v: k for k, v in enumerate(stages.order)}
    per_stage: list[list[int]] = []
    pending: list[int] = []
    for v in sequence:
        k = position.get(v)
        if k is None or k > len(per_stage):
            return False
        if k < len(per_stage):
            pending.append(k)
            continue
        if len(set(pending)) != len(pending):
            return False
        per_stage.append([*sorted(pending), k])
        pending = []
    if pending or len(per_stage) != len(stages):
        return False
    resident = _resident_entering(stages, per_stage)
    # Pairs, not a dict: a fixed entry is a plain 0 or 1, and PuLP overloads == .
    values = [(r, int(k in per_stage[t])) for (t, k), r in model.R.items()]
    values += [(kept, int(k in resident[t])) for (t, k), kept in model.S.items()]
    if model.paging is not None:
        values += [(x, 0) for moves in (model.paging.Out, model.paging.In) for x in moves.values()]
    if any(isinstance(x, int) and x != value for x, value in values):
        return False
    for x, value in values:
        if not isinstance(x, int):
            x.setInitialValue(value)
    return True


def _resident_entering(stages: _Stages, per_stage: list[list[int]]) -> list[set[int]]:
    """Per stage t, the positions whose copy is resident entering it when the stages run
    `per_stage` and free each copy after its last read (outputs stay to the end)."""
    steps = [k for computed in per_stage for k in computed]
    stage_start = list(itertools.accumulate((len(c) for c in per_stage), initial=0))
    made: dict[int, int] = {}  # position -> step of its most recent copy
    until: dict[int, int] = {}  # step of a copy -> the last step it is needed
    for step, k in enumerate(steps):
        for u in stages.inputs[k]:
            until[made[u]] = max(until[made[u]], step)  # an output's copy stays to the end
        made[k] = step
        until[step] = len(steps) if k in stages.outputs else step
    resident: list[set[int]] = []
    for t in range(len(per_stage)):
        boundary = stage_start[t]
        resident.append(
            {k for step, k in enumerate(steps[:boundary]) if until[step] >= boundary and k < t}
        )
    return resident


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


def _decode(graph: Graph, stages: _Stages, model: _Model) -> Schedule:
    """The solution as a Schedule: without paging, the computed nodes stage by stage in
    topological order, each copy freed after its last read; with paging, _paged_steps."""
    if model.paging is None:
        T = len(stages)
        sequence = [stages.order[k] for t in range(T) for k in range(t + 1) if _on(model.R[t, k])]
        return remat.to_schedule(graph, sequence)
    return Schedule(steps=tuple(_paged_steps(stages, model, model.paging)))


def _paged_steps(stages: _Stages, model: _Model, paging: _Paging) -> list[Step]:
    """Stage by stage: the stage's page-outs and page-ins start it (so the copy stream
    runs beside its computations); each computation follows, and a copy is freed after
    its last read in the stage unless stage t+1 keeps it or the stage pages it out; the
    stage ends waiting for its page-ins and freeing what stage t+1 does not keep. Memory
    never exceeds the model's U, and the simulated time never exceeds its objective."""
    T, node = len(stages), stages.order
    steps: list[Step] = []
    resident: set[int] = set()
    for t in range(T):
        computed = [k for k in range(t + 1) if _on(model.R[t, k])]
        kept = {
            k for k in range(t + 1) if k in stages.outputs or (t + 1 < T and _on(model.S[t + 1, k]))
        }
        leaving = sorted(k for k in resident if _on(paging.Out.get((t, k), 0)))
        arriving = [k for k in range(t) if _on(paging.In.get((t, k), 0))]
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


def _result(
    graph: Graph,
    stages: _Stages,
    outcome: _Outcome,
    budget: int,
    options: SolverOptions,
    started: float,
    *,
    minimized: bool,
) -> SolveResult:
    """The SolveResult of a time-minimizing solve, or of a peak-minimizing one (objective
    and bound then in bytes, and the status says nothing about `budget`).

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
    trace = _checked(graph, stages, outcome.schedule, None if minimized else budget)
    status = outcome.status
    if minimized:
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


def _checked(graph: Graph, stages: _Stages, schedule: Schedule, budget: int | None) -> MemoryTrace:
    """The schedule's trace; InvalidSchedule if it is over `budget`, which would mean the
    scaled model hid a violation."""
    trace = _trace(graph, stages, schedule)
    if budget is not None and trace.peak > budget:
        raise InvalidSchedule(
            f"milp: decoded schedule peaks at {trace.peak} B, over the budget of {budget} B "
            "(a numerical tolerance of the MILP; please report this graph)"
        )
    return trace


def _bytes(stages: _Stages, scaled: float | None) -> float | None:
    """A peak bound in scaled units, as bytes including the resident inputs."""
    return None if scaled is None else scaled * stages.memory_scale + stages.baseline


def _infeasible(
    graph: Graph,
    stages: _Stages,
    least: _Outcome,
    budget: int,
    options: SolverOptions,
    started: float,
) -> SolveResult:
    """No schedule fits `budget`: return the least-peak schedule found in the time left
    (none if time ran out) and say how low a budget can go."""
    if least.schedule is not None:
        peak = _checked(graph, stages, least.schedule, None).peak
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
    picked = [pulp.LpVariable(f"r{i}", cat="Binary") for i in range(len(model.releases))]
    for i, x in enumerate(picked):
        x.setInitialValue(int(i in hint))
    for group in model.groups:
        problem += pulp.lpSum(picked[i] for i in group) <= 1
    chosen: dict[Effect, Any] = {(i,): x for i, x in enumerate(picked)}
    for i, j in (x.pair for x in model.interactions):
        both = chosen[i, j] = pulp.LpVariable(f"r{i}_{j}", lowBound=0, upBound=1)
        problem += both >= picked[i] + picked[j] - 1
        problem += both <= picked[i]
        problem += both <= picked[j]
    mib = float(1 << 20)
    rows = model.rows(cap)
    if cap is None:
        peak = pulp.LpVariable("peak", lowBound=0)
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
    problem.solve(_backend(pulp, remaining, options, started=True))
    status, _, _ = _read_status(pulp, problem)
    if status not in ("optimal", "feasible"):
        return Pick(status, None)
    return Pick(status, frozenset(i for i, x in enumerate(picked) if (x.value() or 0) > 0.5))
