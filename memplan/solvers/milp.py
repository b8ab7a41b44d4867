"""The Checkmate rematerialization MILP (Jain et al., MLSys 2020) for the general problem,
through PuLP with HiGHS (or CBC): exact, but O(T^2) binaries for T computed nodes.

See ../../shared/docs/formulations.md section 2. The model is solved in "stages": stage t
computes node t for the first time, and before it may recompute any earlier node.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from memplan import remat
from memplan.errors import InvalidSchedule, MemplanError, MissingDependency, UnsupportedModel
from memplan.graph import Graph, Schedule, SolveResult
from memplan.planner.simulate import simulate
from memplan.solvers import SolverOptions, releases
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
    solution in time; schedule None). options.time_limit covers building and solving.
    """
    pulp = _import_pulp()
    if options.problem == "training":
        return releases.solve(graph, budget, options, NAME, _pick_releases)
    started = time.perf_counter()
    deadline = started + options.time_limit
    stages = _Stages.of(graph)

    if options.minimize_memory:
        least = _least_peak(pulp, graph, stages, deadline, options)
        return _result(graph, stages, least, budget, options, started, minimized=True)
    if budget < stages.least_peak:  # some node alone with its inputs exceeds the budget
        outcome = _Outcome("infeasible", None, None, None)
    else:
        outcome = _within(pulp, graph, stages, budget, deadline, options)
    if outcome.status == "infeasible":
        least = _least_peak(pulp, graph, stages, deadline, options)
        return _infeasible(graph, stages, least, budget, options, started)
    return _result(graph, stages, outcome, budget, options, started, minimized=False)


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

    @classmethod
    def of(cls, graph: Graph) -> _Stages:
        """UnsupportedModel for views and carved outputs (the literature's memory model
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
        return cls(
            order=order,
            inputs=inputs,
            users=tuple(tuple(r) for r in users),
            outputs=frozenset(position[o] for o in graph.outputs if o in position),
            memory=tuple(s / memory_scale for s in sizes),
            cost=tuple(t / cost_scale for t in times),
            memory_scale=memory_scale,
            cost_scale=cost_scale,
            baseline=baseline,
            least_peak=baseline + least,
        )

    def __len__(self) -> int:
        return len(self.order)


@dataclass(frozen=True)
class _Outcome:
    """What one MILP solve gave: a status, the decoded sequence (node ids) if any, and
    the solver's objective bound and relative gap (scaled units) where it reports them."""

    status: str
    sequence: tuple[int, ...] | None
    bound: float | None
    gap: float | None


# --- model -----------------------------------------------------------------------------


@dataclass
class _Model:
    """The PuLP problem and the variables the extraction reads."""

    problem: Any
    R: dict[tuple[int, int], Any]


def _build(pulp: ModuleType, stages: _Stages, budget: int | None, deadline: float) -> _Model | None:
    """The Checkmate MILP; with budget None, minimize the peak instead of the time.

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
        problem += pulp.lpSum(stages.cost[k] * R[t, k] for t in range(T) for k in range(t + 1))

    for t in range(T):
        if time.perf_counter() > deadline:
            return None
        _add_stage(pulp, problem, stages, t, R, S, limit, peak)
    return _Model(problem=problem, R=R)


def _add_stage(
    pulp: ModuleType,
    problem: Any,
    stages: _Stages,
    t: int,
    R: dict[tuple[int, int], Any],
    S: dict[tuple[int, int], Any],
    limit: float | None,
    peak: Any | None,
) -> None:
    """Stage t's dependency, retention, free and memory constraints."""
    T = len(stages)
    for k in range(t + 1):
        for u in stages.inputs[k]:
            # An output's copy is always there (S fixed to 1): nothing to constrain.
            if u not in stages.outputs and not _is_zero(R[t, k]):
                problem += R[t, k] <= R[t, u] + S[t, u], f"dep_{t}_{u}_{k}"
    if t + 1 < T:
        for v in range(t + 1):
            if v not in stages.outputs:
                problem += S[t + 1, v] <= (S.get((t, v), 0) + R[t, v]), f"keep_{t + 1}_{v}"

    memory = stages.memory
    usage = pulp.lpSum(memory[v] * S[t, v] for v in range(t)) + memory[0] * R[t, 0]
    for k in range(t + 1):
        if k > 0:
            usage = usage + memory[k] * R[t, k] - _freed(pulp, problem, stages, t, k - 1, R, S)
        used = problem.add_variable(f"U_{t}_{k}", 0, limit)
        problem += used == usage, f"mem_{t}_{k}"
        if peak is not None:
            problem += used <= peak, f"peak_{t}_{k}"
        usage = used


def _freed(
    pulp: ModuleType,
    problem: Any,
    stages: _Stages,
    t: int,
    k: int,
    R: dict[tuple[int, int], Any],
    S: dict[tuple[int, int], Any],
) -> Any:
    """The memory freed right after stage t computes k: each of k's inputs and k itself
    that no later node of stage t reads and stage t+1 does not keep (outputs never)."""
    T = len(stages)
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
    """The least peak, then the fastest sequence at that peak in the time left.

    Minimizing the peak alone leaves the time free, and the solver's first optimum is
    often full of useless recomputation; the second solve keeps the first's status and
    bound (both are about the peak) and only replaces its sequence.
    """
    least = _solve_stage(pulp, stages, None, deadline, options)
    if least.sequence is None:
        return least
    peak = _peak(graph, least.sequence)
    fastest = _within(pulp, graph, stages, peak, deadline, options)
    if fastest.sequence is None:
        return least
    if _duration(graph, fastest.sequence) > _duration(graph, least.sequence):
        return least
    return dataclasses.replace(least, sequence=fastest.sequence)


def _within(
    pulp: ModuleType,
    graph: Graph,
    stages: _Stages,
    budget: int,
    deadline: float,
    options: SolverOptions,
) -> _Outcome:
    """The fastest sequence whose simulated peak fits `budget`.

    The scaled model is trusted only as far as the simulator agrees: a sequence over the
    budget (by the solver's tolerance) is answered by solving again with the budget
    tightened by the overshoot.
    """
    target = budget
    for _ in range(_RETRIES):
        outcome = _solve_stage(pulp, stages, target, deadline, options)
        if outcome.sequence is None:
            return outcome
        over = _peak(graph, outcome.sequence) - budget
        if over <= 0:
            return outcome
        target -= over
    raise InvalidSchedule(
        f"milp: the decoded schedule stays over the budget of {budget} B after "
        f"{_RETRIES} solves (a numerical tolerance of the MILP; please report this graph)"
    )


def _peak(graph: Graph, sequence: Sequence[int]) -> int:
    return simulate(graph, remat.to_schedule(graph, sequence)).peak


def _duration(graph: Graph, sequence: Sequence[int]) -> float:
    return sum(graph[v].time for v in sequence)


def _highs_available() -> bool:
    return importlib.util.find_spec("highspy") is not None


def _solve_stage(
    pulp: ModuleType,
    stages: _Stages,
    budget: int | None,
    deadline: float,
    options: SolverOptions,
) -> _Outcome:
    """Build and solve one model within the deadline; budget None minimizes the peak."""
    model = _build(pulp, stages, budget, deadline)
    remaining = deadline - time.perf_counter()
    if model is None or remaining <= 0:
        return _Outcome("timeout", None, None, None)
    model.problem.solve(_backend(pulp, remaining, options))
    status, bound, gap = _read_status(pulp, model.problem)
    sequence = _sequence(stages, model.R) if status in ("optimal", "feasible") else None
    return _Outcome(status, sequence, bound, gap)


def _backend(pulp: ModuleType, remaining: float, options: SolverOptions) -> Any:
    """HiGHS if highspy is installed, else CBC: one thread, seeded, tight tolerances."""
    if _highs_available():
        return pulp.HiGHS(
            msg=False, timeLimit=remaining, threads=1, random_seed=options.seed % 2**31,
            mip_feasibility_tolerance=_TOLERANCE, primal_feasibility_tolerance=_TOLERANCE,
        )  # fmt: skip
    return pulp.PULP_CBC_CMD(
        msg=False, timeLimit=max(1, math.ceil(remaining)), threads=1,
        options=[f"randomCbcSeed {options.seed}", f"primalTolerance {_TOLERANCE}"],
    )  # fmt: skip


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


def _sequence(stages: _Stages, R: dict[tuple[int, int], Any]) -> tuple[int, ...]:
    """Stage by stage, the nodes computed in it in topological order, as node ids."""
    T = len(stages)
    return tuple(
        stages.order[k]
        for t in range(T)
        for k in range(t + 1)
        if (R[t, k] if isinstance(R[t, k], int) else (R[t, k].varValue or 0.0)) > 0.5
    )


def _schedule(graph: Graph, sequence: Sequence[int], budget: int | None) -> tuple[Schedule, int]:
    """The sequence as a Schedule and its simulated peak; InvalidSchedule if it is over
    `budget`, which would mean the scaled model hid a violation."""
    schedule = remat.to_schedule(graph, sequence)
    trace = simulate(graph, schedule)
    if budget is not None and trace.peak > budget:
        raise InvalidSchedule(
            f"milp: decoded schedule peaks at {trace.peak} B, over the budget of {budget} B "
            "(a numerical tolerance of the MILP; please report this graph)"
        )
    return schedule, trace.peak


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
    and bound then in bytes, and the status says nothing about `budget`)."""
    if outcome.sequence is None:
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
    schedule, peak = _schedule(graph, outcome.sequence, None if minimized else budget)
    duration = _duration(graph, outcome.sequence)
    if minimized:
        objective = float(peak)
        bound = _bytes(stages, outcome.bound)
    else:
        objective = duration
        bound = None if outcome.bound is None else outcome.bound * stages.cost_scale
    return SolveResult(
        solver=NAME,
        status=outcome.status,
        schedule=schedule,
        objective=objective,
        lower_bound=bound,
        gap=outcome.gap,
        solve_seconds=time.perf_counter() - started,
        options=options.to_json(),
        message=f"peak {peak} B, duration {duration:g}",
    )


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
    """No sequence fits `budget`: return the least-peak sequence found in the time left
    (none if time ran out) and say how low a budget can go."""
    schedule = None
    if least.sequence is not None:
        schedule, peak = _schedule(graph, least.sequence, None)
        proved = "the least possible" if least.status == "optimal" else "the least found"
        if peak <= stages.least_peak:
            proved = "the least possible"
        message = f"no schedule fits {budget} B; {proved} peak is {peak} B"
    else:
        message = f"no schedule fits {budget} B (at least {stages.least_peak} B needed)"
    return SolveResult(
        solver=NAME,
        status="infeasible",
        schedule=schedule,
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
    to keep HiGHS well scaled. PuLP passes no starting point to HiGHS, so `hint` is not
    used: the director's schedule still competes as the incumbent in releases.solve."""
    del hint
    pulp = _import_pulp()
    problem = pulp.LpProblem("releases", pulp.LpMinimize)
    picked = [pulp.LpVariable(f"r{i}", cat="Binary") for i in range(len(model.releases))]
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
    problem.solve(_backend(pulp, remaining, options))
    status, _, _ = _read_status(pulp, problem)
    if status not in ("optimal", "feasible"):
        return Pick(status, None)
    return Pick(status, frozenset(i for i, x in enumerate(picked) if (x.value() or 0) > 0.5))
