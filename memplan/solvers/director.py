"""A DELTA-style director (Tang et al. 2022): a fast filter-and-director heuristic.

Tensors (training, solvers/director_training.py) or idle intervals between uses
(general, solvers/director_general.py) are ranked by bytes freed times idle time;
walking that rank, each is released by offload where the transfer hides, else by
recompute, until a predicted memory profile fits the budget, which the simulator then
confirms (a few fix-up rounds release more where the prediction was short).
"""

from __future__ import annotations

import time

from memplan.core.graph import Graph, SolveResult
from memplan.solvers import SolverOptions, director_general, director_training


def solve(graph: Graph, budget: int | None, options: SolverOptions) -> SolveResult:
    """Release the best-ranked tensors until the simulated peak fits `budget` (None: the
    least peak the director reaches).

    "feasible" only when the simulator's peak is within the budget; otherwise
    "infeasible" with the least peak reached (or "timeout" if the time limit cut the
    search short). The objective is the simulated step time (training) or the sequence's
    duration (general).
    """
    started = time.perf_counter()
    deadline = started + options.time_limit
    if options.problem == "general":
        return director_general.solve(graph, budget, options, started, deadline)
    return director_training.solve(graph, budget, options, started, deadline)
