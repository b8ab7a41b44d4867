"""Reference solvers: keep everything, the step as the model is written (the unplanned
peak), and Chen et al.'s sqrt(n) segments."""

from __future__ import annotations

import math
import time

from memplan.core import remat
from memplan.core.graph import Decision, Graph, SolveResult
from memplan.solvers import SolverOptions, require_problem
from memplan.solvers.result import judged, within
from memplan.solvers.training import simulate_decisions


def keep_all(graph: Graph, budget: int | None, options: SolverOptions) -> SolveResult:
    """Keep every tensor the backward reads: no recomputation, no offload. On the general
    problem: the graph's reference order, each node computed once."""
    started = time.perf_counter()
    if options.problem == "general":
        schedule = remat.to_schedule(graph, range(len(graph)))
        reference = remat.reference(graph)
        return SolveResult(
            solver="keep_all",
            status="feasible" if within(reference.peak, budget) else "infeasible",
            schedule=schedule,
            objective=reference.duration,
            solve_seconds=time.perf_counter() - started,
            options=options.to_json(),
        )
    decisions = {v: Decision.KEEP for v in graph.saved_candidates}
    return _result("keep_all", graph, budget, decisions, started, options)


def as_written(graph: Graph, budget: int | None, options: SolverOptions) -> SolveResult:
    """The step as the model is written: what its own activation checkpointing recomputes
    (Node.checkpointed) recomputed, every other tensor the backward reads kept. Without
    checkpointing (and on the general problem), keep_all."""
    if options.problem == "general" or not any(node.checkpointed for node in graph):
        return keep_all(graph, budget, options)
    started = time.perf_counter()
    decisions = {
        v: Decision.RECOMPUTE if graph[v].checkpointed and graph[v].recomputable else Decision.KEEP
        for v in graph.saved_candidates
    }
    return _result("as_written", graph, budget, decisions, started, options)


def chen_sqrt(graph: Graph, budget: int | None, options: SolverOptions) -> SolveResult:
    """Chen et al. 2016's sqrt(n) checkpoints (see sqrt_decisions). Ignores the budget."""
    require_problem("chen_sqrt", options, "training")
    started = time.perf_counter()
    return _result("chen_sqrt", graph, budget, sqrt_decisions(graph), started, options)


def sqrt_decisions(graph: Graph) -> dict[int, Decision]:
    """Split the forward into about sqrt(n) segments of equal compute time and keep only
    the saved tensors at segment ends; the backward recomputes each segment from its
    checkpoint. Tensors that cannot be recomputed are kept."""
    candidates = graph.saved_candidates
    segments = max(1, math.isqrt(len(candidates)))
    forward = graph.forward_ids
    # Without profiled times every node counts as one unit of work.
    weight = {v: graph[v].time for v in forward}
    if not any(weight.values()):
        weight = dict.fromkeys(forward, 1.0)
    forward_time = sum(weight.values()) or 1.0
    candidate_set = set(candidates)
    elapsed, next_cut, cut_pending = 0.0, forward_time / segments, False
    checkpoints: set[int] = set()
    for v in forward:
        elapsed += weight[v]
        cut_pending = cut_pending or elapsed >= next_cut
        if cut_pending and v in candidate_set:  # the first saved tensor after each cut
            checkpoints.add(v)
            cut_pending = False
            next_cut += forward_time / segments
    return {
        v: Decision.KEEP if v in checkpoints or not graph[v].recomputable else Decision.RECOMPUTE
        for v in candidates
    }


def _result(
    name: str,
    graph: Graph,
    budget: int | None,
    decisions: dict[int, Decision],
    started: float,
    options: SolverOptions,
) -> SolveResult:
    schedule, trace = simulate_decisions(graph, decisions, options.bandwidth)
    return judged(
        name, schedule, trace, budget, options, started, objective=trace.time, decisions=decisions
    )
