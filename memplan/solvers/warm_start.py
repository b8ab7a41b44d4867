"""The director's schedule as the exact solvers' starting point on the general problem.

The DELTA-style director finds a sequence within the budget in about a second, where
CP-SAT and HiGHS can spend minutes finding any. cpsat hints its first phase with it and
milp hands it to HiGHS (or CBC) as a MIP start, so their first incumbent is at least as
fast. A start can still be lost: milp's stages cannot express a sequence whose first
computations leave the node order, cpsat keeps at most two copies of a node, and a
solver may time out before using it. `keep_faster` then returns the director's schedule
instead of a slower one, and says so.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from memplan.core import remat
from memplan.core.graph import Graph, SolveResult
from memplan.core.simulate import simulate
from memplan.solvers import SolverOptions

# The share of an exact solver's time limit the director may spend on a start, and the
# most seconds it may take (it needs under two on the 1000-node shared graph).
SHARE = 0.1
MAX_SECONDS = 5.0
# Relative difference below which two durations are equal.
TIE = 1e-9
# How the message of a result that is the director's start begins (general.provenance
# reads it).
STARTING_SCHEDULE = "the director's starting schedule"


def director_sequence(graph: Graph, budget: int | None, options: SolverOptions) -> list[int] | None:
    """The director's sequence for `budget` when it fits; None when it does not, when the
    solve minimizes memory (budget None: the director's sequence is not a least peak), or
    when the graph has resident inputs (the general director computes every node)."""
    if budget is None or graph.resident_inputs:
        return None
    from memplan.solvers import director  # the director imports numpy: load it on use

    seconds = min(MAX_SECONDS, SHARE * options.time_limit)
    found = director.solve(
        graph, budget, dataclasses.replace(options, time_limit=seconds, bandwidth=None)
    )
    if found.status != "feasible" or found.schedule is None:
        return None
    return found.schedule.computes()


def keep_faster(
    graph: Graph,
    result: SolveResult,
    start: Sequence[int] | None,
    budget: int | None,
    options: SolverOptions,
) -> SolveResult:
    """`result`, unless the director's `start` is faster (or `result` has no schedule
    within the budget): then the start, as a feasible result with the solver's name, its
    bound kept where it still bounds the start (a bound of the solver's model, which may
    not contain the start), and a message that says so."""
    if start is None or budget is None:
        return result
    duration = remat.score(graph, start).duration
    # Sums of the same times in another order may differ in the last bit: a tie is a tie.
    tied = duration * (1 + TIE)
    if result.schedule is not None:
        trace = simulate(graph, result.schedule, bandwidth=options.bandwidth)
        if trace.peak <= budget and trace.time <= tied:
            return result
    bound = result.lower_bound
    if bound is not None and not (math.isfinite(bound) and bound <= tied):
        bound = None
    gap = None if bound is None or duration == 0 else (duration - bound) / duration
    return dataclasses.replace(
        result,
        status="feasible",
        schedule=remat.to_schedule(graph, start),
        objective=duration,
        lower_bound=bound,
        gap=gap,
        message=f"{STARTING_SCHEDULE}: {result.solver} found none faster "
        f"within the budget ({result.status}"
        + (f": {result.message}" if result.message else "")
        + ")",
    )
