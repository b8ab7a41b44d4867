"""The Checkmate MILP's model (Jain et al., MLSys 2020), with POET's paging variables
(Patil et al., ICML 2022) where a host link is given: the graph as stages, the PuLP
variables and constraints, and a sequence's values as the solver's starting point.

See ../../shared/docs/formulations.md sections 2 and 4 and docs/solvers/milp.md.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from memplan.core.errors import MemplanError, UnsupportedModel
from memplan.core.graph import Graph

# The model has about 2 T^2 binaries plus T^2/2 continuous memory and free variables
# (times the mean in-degree) for T computed nodes, and PuLP spends roughly a kilobyte
# of Python objects on each. 300 stages is about 0.5 M variables: a few hundred MB and
# a minute to build. HiGHS proves optimality in seconds only up to ~50 nodes (VGG16,
# 45 nodes) and rarely finds a first solution within a minute above ~100 nodes, so
# larger graphs need a restricted formulation (not this module).
MAX_STAGES = 300


# --- data ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Stages:
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
    workspace: tuple[float, ...]  # held while the node runs (scaled as memory)
    cost: tuple[float, ...]
    memory_scale: float  # bytes per memory unit
    cost_scale: float
    baseline: int  # bytes of the resident inputs
    least_peak: int  # no schedule peaks lower: a node, its inputs, workspace and residents
    # With paging: position -> time to move it over the host link (scaled as cost), and
    # the positions that may be paged (offloadable, not outputs). None: no paging.
    transfer: tuple[float, ...] | None = None
    calls: float = 0.0  # the host calls that start one transfer (Graph.transfer_seconds), scaled
    pageable: frozenset[int] = frozenset()
    bandwidth: float | None = None  # the host link, for the simulator

    @classmethod
    def of(cls, graph: Graph, bandwidth: float | None = None) -> Stages:
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
        held = [graph[v].workspace for v in order]
        least = max(
            (sizes[k] + held[k] + sum(sizes[u] for u in inputs[k]) for k in range(len(order))),
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
            workspace=tuple(w / memory_scale for w in held),
            cost=tuple(t / cost_scale for t in times),
            memory_scale=memory_scale,
            cost_scale=cost_scale,
            baseline=baseline,
            least_peak=baseline + least,
            transfer=transfer,
            calls=graph.transfer_seconds / cost_scale,
            bandwidth=bandwidth if transfer is not None else None,
            pageable=frozenset(
                k
                for k, v in enumerate(order)
                if transfer is not None and graph[v].offloadable and k not in outputs
            ),
        )

    def __len__(self) -> int:
        return len(self.order)


# --- model -----------------------------------------------------------------------------


@dataclass
class Paging:
    """POET's paging variables. Out[t,k]: page k out during stage t (a copy resident
    entering t); In[t,k]: page k in during stage t (resident from stage t+1); H[t,k]: a
    host copy of k exists entering stage t (continuous: bounded by the page-outs before
    t, it is 1 wherever a page-in needs it)."""

    Out: dict[tuple[int, int], Any]
    In: dict[tuple[int, int], Any]
    H: dict[tuple[int, int], Any]


@dataclass
class Model:
    """The PuLP problem and the variables the extraction reads."""

    problem: Any
    R: dict[tuple[int, int], Any]
    S: dict[tuple[int, int], Any]
    paging: Paging | None


def build(pulp: ModuleType, stages: Stages, budget: int | None, deadline: float) -> Model | None:
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
    model = Model(problem=problem, R=R, S=S, paging=_paging_variables(problem, stages, binary))

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


def _paging_variables(problem: Any, stages: Stages, binary: Any) -> Paging | None:
    """Out, In and H for every pageable position k and stage t > k; None without paging."""
    if stages.transfer is None:
        return None
    paging = Paging(Out={}, In={}, H={})
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


def _exposed_transfers(pulp: ModuleType, problem: Any, stages: Stages, model: Model) -> Any:
    """The time transfers add: per stage, what the copy stream's work exceeds its compute
    by (E_t >= transfers - compute, E_t >= 0), and every transfer's host calls, which run
    between the computations and hide under nothing. Zero without paging."""
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
    transfers = pulp.lpSum([*paging.Out.values(), *paging.In.values()])
    return pulp.lpSum(exposed) + stages.calls * transfers


def _add_stage(
    pulp: ModuleType,
    stages: Stages,
    t: int,
    model: Model,
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
        # k's workspace, held while it runs: on top of U, within the same bound.
        running = used + stages.workspace[k] * R[t, k] if stages.workspace[k] else used
        if limit is not None and stages.workspace[k]:
            problem += running <= limit, f"run_{t}_{k}"
        if peak is not None:
            problem += running <= peak, f"peak_{t}_{k}"
        usage = used


def _add_paging(problem: Any, stages: Stages, t: int, model: Model, paging: Paging) -> None:
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


def _freed(pulp: ModuleType, stages: Stages, t: int, k: int, model: Model) -> Any:
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


def is_on(value: Any) -> bool:
    """A binary's value in the solution (a fixed one is a Python int)."""
    return (value if isinstance(value, int) else (value.varValue or 0.0)) > 0.5


# --- a starting point -------------------------------------------------------------------


def set_start(stages: Stages, model: Model, sequence: Sequence[int]) -> bool:
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


def _resident_entering(stages: Stages, per_stage: list[list[int]]) -> list[set[int]]:
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
