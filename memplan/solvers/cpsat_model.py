"""What cpsat's CP-SAT models share (solvers/cpsat_remat.py, solvers/cpsat_paging.py and
the release model in solvers/cpsat.py): OR-Tools loaded on first use, bytes and times
scaled to small integers, a seeded solver, a starting order, and the SolveResult.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING

from memplan.core import remat
from memplan.core.errors import MissingDependency, UnsupportedModel
from memplan.core.graph import Graph, Schedule, SolveResult
from memplan.solvers import SolverOptions, ordering

if TYPE_CHECKING:
    from ortools.sat.python import cp_model

NAME = "cpsat"
# CP-SAT propagates and relaxes best with small coefficients: the memory capacity is
# scaled to at most this many units (bytes are divided by a common quantum).
CAPACITY_UNITS = 1 << 20
# Node times are scaled so that the largest is about this many objective units, unless
# they are already integers small enough to use as they are.
TIME_UNITS = 1 << 20
# One worker, so a seed gives one schedule: with two, CP-SAT's search depends on thread
# timing and a repeated 8-node solve returned another optimal schedule; interleave_search,
# deterministic by design, was far weaker. Two workers found feasible points sooner on
# random_layered_n100 in some runs, but not reliably.
WORKERS = 1


# --- data: scaled bytes and times --------------------------------------------------------


@dataclass(frozen=True)
class Scale:
    """Bytes and times as the small integers CP-SAT gets.

    Demands are bytes divided by `quantum` and rounded up, the capacity the budget divided
    and rounded down: a schedule within the scaled capacity is within the true budget.
    Costs are times times `per_time`, rounded; `slack` bounds what the rounding can shift
    the recomputation time by, so the reported lower bound stays a bound.
    """

    quantum: int
    demand: tuple[int, ...]
    transient: tuple[int, ...]  # each node's workspace, held while it computes
    capacity: int
    footprint: int  # the largest scaled memory one computation needs: a floor for the peak
    footprint_bytes: int  # the same in bytes: no schedule peaks lower
    total: int  # all demands together: the peak if nothing were ever freed
    cost: tuple[int, ...]
    per_time: float
    slack: float
    exact: bool  # the quantum divides every size: scaled peaks are true peaks / quantum

    @classmethod
    def of(cls, graph: Graph, budget: int | None) -> Scale:
        sizes = [n.bytes for n in graph]
        held = [n.workspace for n in graph]
        reach = budget if budget is not None else sum(sizes) + max(held, default=0)
        quantum = math.gcd(*sizes, *held, reach) or 1
        if reach // quantum > CAPACITY_UNITS:
            quantum = -(-reach // CAPACITY_UNITS)
        demand = tuple(-(-b // quantum) for b in sizes)
        transient = tuple(-(-w // quantum) for w in held)
        footprint = max(
            demand[n.id] + transient[n.id] + sum(demand[u] for u in set(n.inputs)) for n in graph
        )
        footprint_bytes = max(
            n.bytes + n.workspace + sum(sizes[u] for u in set(n.inputs)) for n in graph
        )
        times = [n.time for n in graph]
        largest = max(times, default=0.0)
        if all(t.is_integer() for t in times) and sum(times) <= 2**40:
            per_time = 1.0
        else:
            per_time = TIME_UNITS / largest if largest > 0 else 1.0
        cost = tuple(round(t * per_time) for t in times)
        slack = sum(abs(c / per_time - t) for c, t in zip(cost, times, strict=True))
        return cls(
            quantum=quantum,
            demand=demand,
            transient=transient,
            capacity=(budget // quantum) if budget is not None else 0,
            footprint=footprint,
            footprint_bytes=footprint_bytes,
            total=sum(demand) + max(transient, default=0),
            cost=cost,
            per_time=per_time,
            slack=slack,
            exact=all(b % quantum == 0 for b in (*sizes, *held)),
        )

    def time_bound(self, graph: Graph, bound: float) -> float:
        """A lower bound on the duration from CP-SAT's bound on the recomputation cost."""
        return graph.total_time + max(0.0, bound / self.per_time - self.slack)

    def peak_bound(self, bound: float) -> float | None:
        """A lower bound on the least peak in bytes, when bytes were scaled exactly."""
        return math.ceil(bound) * self.quantum if self.exact else None

    def caveat(self, proven: bool) -> str:
        if not proven or self.exact:
            return ""
        return f" (bytes counted in units of {self.quantum} B, rounded up)"


# --- search --------------------------------------------------------------------------------


def cp_model_module() -> ModuleType:
    """OR-Tools' CP-SAT module, or MissingDependency saying what to install."""
    try:
        from ortools.sat.python import cp_model
    except ImportError as error:
        raise MissingDependency(f"solver {NAME!r} needs OR-Tools: pip install ortools") from error
    return cp_model


def make_solver(deadline: float, options: SolverOptions) -> cp_model.CpSolver:
    """A CP-SAT solver with the seed, the workers and what is left of the time limit."""
    solver = cp_model_module().CpSolver()
    solver.parameters.random_seed = options.seed
    solver.parameters.num_workers = WORKERS
    solver.parameters.max_time_in_seconds = max(0.01, deadline - time.perf_counter())
    return solver


def make_result(
    options: SolverOptions,
    started: float,
    status: str,
    schedule: Schedule | None,
    *,
    objective: float | None = None,
    lower_bound: float | None = None,
    message: str = "",
) -> SolveResult:
    """The SolveResult, with the relative gap where there is a bound."""
    gap = None
    if objective is not None and lower_bound is not None:
        gap = max(0.0, (objective - lower_bound) / objective) if objective else 0.0
    return SolveResult(
        solver=NAME,
        status=status,
        schedule=schedule,
        gap=gap,
        solve_seconds=time.perf_counter() - started,
        options=options.to_json(),
        objective=objective,
        lower_bound=lower_bound,
        message=message,
    )


def check_general_graph(graph: Graph) -> None:
    """The general problem computes every node: resident inputs and shared storages
    (views, carved outputs) belong to the training problem."""
    for node in graph:
        if node.is_resident_input:
            raise UnsupportedModel(node.name, "a resident input cannot be computed")
        if node.alias_of is not None or node.carved_from is not None:
            raise UnsupportedModel(node.name, "shares storage; the general problem has none")


def start_order(
    graph: Graph, target: int | None = None, seed: int = 0, deadline: float = -math.inf
) -> list[int]:
    """The lower-peak of two orders without recomputation: the reference order, and a
    memory-aware one searched for `target` until `deadline` (solvers/ordering.py; with
    the deadline passed, its plain greedy order). A hint within the budget lets phase 1
    stop at once; CP-SAT takes minutes to find one on its own."""
    searched = ordering.searched_order(graph, target, seed, deadline)
    return min(list(range(len(graph))), searched, key=lambda seq: remat.score(graph, seq).peak)
