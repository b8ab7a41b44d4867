"""The solver registry: name -> lazily imported `solve(graph, budget, options) -> SolveResult`.

Every solver is a pure function over memplan's core (graph, budget, simulate, remat);
none imports torch. `budget` is bytes, or None for the least peak the solver can find.
Options are one frozen dataclass shared by all solvers; each reads the fields it
understands.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

from memplan.core.errors import UnknownSolver, UnsupportedProblem
from memplan.core.graph import Graph, SolveResult

PROBLEMS = ("training", "general")


@dataclass(frozen=True)
class SolverOptions:
    """Options every solver accepts; the same fields are CLI flags and part of a plan's key."""

    seed: int = 0
    time_limit: float = 60.0
    bandwidth: float | None = None  # host link bytes/s; None forbids offloading
    # "training": a joint graph from the pipeline; the forward runs once and each saved
    # tensor is kept, recomputed before its backward use or offloaded (solvers/training.py).
    # "general": the literature's problem on any DAG: a node may be recomputed at any
    # point; the schedule is remat.to_schedule(sequence) (memplan/core/remat.py).
    problem: str = "training"

    def __post_init__(self) -> None:
        if self.problem not in PROBLEMS:
            raise ValueError(f"problem must be one of {PROBLEMS}, got {self.problem!r}")
        # `not x > 0` also refuses NaN.
        if not self.time_limit > 0:
            raise ValueError(
                f"time_limit must be a positive number of seconds, got {self.time_limit}"
            )
        if self.bandwidth is not None and not self.bandwidth > 0:
            raise ValueError(f"bandwidth must be a positive number, got {self.bandwidth}")

    def to_json(self) -> dict[str, object]:
        return dict(self.__dict__)


# (graph, budget in bytes or None for the least peak, options) -> result
Solver = Callable[[Graph, int | None, SolverOptions], SolveResult]

BOTH = ("training", "general")

# name -> ("module:function", the problems it solves); imported on first use so that
# optional libraries stay optional.
REGISTRY: dict[str, tuple[str, tuple[str, ...]]] = {
    "keep_all": ("memplan.solvers.baselines:keep_all", BOTH),
    "chen_sqrt": ("memplan.solvers.baselines:chen_sqrt", ("training",)),
    "greedy": ("memplan.solvers.greedy:solve", ("training",)),
    "chain_dp": ("memplan.solvers.chain_dp:chain_dp", BOTH),
    "linear": ("memplan.solvers.chain_dp:linear", BOTH),
    "director": ("memplan.solvers.director:solve", BOTH),
    "milp": ("memplan.solvers.milp:solve", BOTH),
    "cpsat": ("memplan.solvers.cpsat:solve", BOTH),
}


def available(problem: str | None = None) -> list[str]:
    """Registered solver names, or those that solve `problem` ("training" or "general")."""
    return sorted(n for n, (_, problems) in REGISTRY.items() if problem in (None, *problems))


def check_known(name: str) -> None:
    """UnknownSolver unless `name` is registered; imports no solver."""
    if name not in REGISTRY:
        raise UnknownSolver(f"unknown solver {name!r}; available: {', '.join(available())}")


def problems(name: str) -> tuple[str, ...]:
    """The problems the solver registered under `name` solves."""
    check_known(name)
    return REGISTRY[name][1]


def get_solver(name: str) -> Solver:
    """The solve function registered under `name`."""
    check_known(name)
    module_name, function_name = REGISTRY[name][0].split(":")
    solver: Solver = getattr(importlib.import_module(module_name), function_name)
    return solver


def require_problem(solver: str, options: SolverOptions, *supported: str) -> None:
    """Raise UnsupportedProblem unless `options.problem` is one `solver` solves."""
    if options.problem not in supported:
        raise UnsupportedProblem(
            f"solver {solver!r} solves the {' and '.join(supported)} problem only, "
            f"not the {options.problem} one"
        )
