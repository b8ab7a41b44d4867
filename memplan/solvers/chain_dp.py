"""Checkpoint selection on the chain of cut points (Hong et al. 2025, arXiv 2502.12499).

`chain_dp` runs the dynamic program over checkpoint sets of the chain model (the chain
is built by solvers/chain.py) at a sweep of model budgets that does not depend on the
budget asked for, and lets the simulator judge every set it finds; `linear` is a
linear-time selector on the same chain. The model only proposes: peaks, times and
statuses all come from the simulator.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from memplan.core import remat
from memplan.core.graph import Decision, Graph, Schedule, SolveResult
from memplan.core.simulate import simulate
from memplan.solvers import SolverOptions
from memplan.solvers.baselines import sqrt_decisions
from memplan.solvers.chain import Chain, Selection, build_chain, forward_nodes
from memplan.solvers.result import within
from memplan.solvers.training import build_schedule

# Pareto states kept per checkpoint in the budgeted DP; beyond it the DP thins its fronts
# rather than growing without bound on long chains.
_FRONT_LIMIT = 64
# Sets chain_dp's sweep finds at most, less one (besides its least-peak set and the set
# that stores every stage): each is simulated, so this bounds the solve time.
_SWEEP = 32
# Segment caps the linear selector tries: a constant, so it stays O(n).
_LINEAR_CAPS = 24


# --- the dynamic programs --------------------------------------------------------------


def least_peak(chain: Chain, upper: list[list[int]]) -> tuple[int, Selection]:
    """Hong et al.'s revised recursion, exact for the chain model (storing a stage never
    lowers a model peak, so stored stages are left out).

    T(i) = least peak from checkpoint i on, counting checkpoints from i:
    T(n) = d_n;  T(i) = d_i + min_{i<j<=n} max(U(i, j), T(j)),  answer T(0) with d_0 = 0.
    Returns the peak and the checkpoints (n included, none stored). O(n^2) given U.
    """
    n = chain.n
    best = [0] * (n + 1)
    nxt = [n] * (n + 1)
    best[n] = chain.d[n]
    for i in range(n - 1, -1, -1):
        value, choice = math.inf, n
        for j in range(i + 1, n + 1):
            candidate = max(upper[i][j], best[j])
            if candidate < value:  # ties go to the nearest j: shorter recomputations
                value, choice = candidate, j
        best[i] = chain.d[i] + int(value)
        nxt[i] = choice
    checkpoints, i = [], 0
    while i < n:
        i = nxt[i]
        checkpoints.append(i)
    return best[0], Selection(tuple(checkpoints))


_NEVER = np.iinfo(np.int64).max  # held bytes of an empty slot in a front: never fits


def least_time(chain: Chain, upper: list[list[int]], budget: int) -> tuple[float, Selection] | None:
    """Least recompute time over checkpoint sets with model peak <= budget.

    F(j) = Pareto front of (H, time) over checkpoint sets ending at checkpoint j, H the
    bytes those checkpoints hold; (H, time) at i extends to j when H + U(i, j) <= budget,
    to (H + d_j, time + recompute_time(i, j)) or, storing stage j, to
    (H + d_j + a_j, time + recompute_time(i, j) without stage j's share). Exact for the
    model while fronts stay under _FRONT_LIMIT, thinned evenly beyond. None if no set
    fits. O(n^2 * front), one numpy pass over the predecessors per checkpoint.
    """
    n = chain.n
    bounds = np.asarray(upper, dtype=np.int64).reshape(n + 1, n + 1)
    held = np.full((n + 1, _FRONT_LIMIT), _NEVER, dtype=np.int64)  # fronts, by held bytes
    spent = np.zeros((n + 1, _FRONT_LIMIT))
    held[0, 0] = 0
    links = [(np.zeros(1, dtype=np.int64), np.zeros(1, dtype=np.int64), np.zeros(1, dtype=bool))]
    for j in range(1, n + 1):
        kinds = (False, True) if chain.has_backward and chain.ti[j] > 0 else (False,)
        offers = [_offers(chain, bounds, held, spent, j, stored, budget) for stored in kinds]
        gained, took, starts, indices, stored = (
            np.concatenate(part) for part in zip(*offers, strict=True)
        )
        kept = _pareto(gained, took, starts, indices, stored)
        held[j, : len(kept)] = gained[kept]
        spent[j, : len(kept)] = took[kept]
        links.append((starts[kept], indices[kept], stored[kept]))
    if held[n, 0] == _NEVER:
        return None
    index = len(links[n][0]) - 1  # the front's last state is its fastest
    total = float(spent[n, index])
    checkpoints, stored_stages, j = [], set(), n
    while j > 0:
        checkpoints.append(j)
        starts, indices, stored = links[j]
        if stored[index]:
            stored_stages.add(j)
        j, index = int(starts[index]), int(indices[index])
    return total, Selection(tuple(sorted(checkpoints)), frozenset(stored_stages))


def _offers(
    chain: Chain,
    bounds: np.ndarray,
    held: np.ndarray,
    spent: np.ndarray,
    j: int,
    stored: bool,
    budget: int,
) -> tuple[np.ndarray, ...]:
    """Every state of the fronts before j that may extend to j (plain or stored): its
    held bytes and time at j, its checkpoint, its index in that front, and `stored`."""
    extra = chain.held_bytes(j, stored)
    room = budget - np.maximum(bounds[:j, j], extra if j == chain.n else 0)
    starts, indices = np.nonzero(held[:j] <= room[:, None])
    cost = chain.recompute_times(j, stored)
    return (
        held[starts, indices] + extra,
        spent[starts, indices] + cost[starts],
        starts,
        indices,
        np.full(len(starts), stored),
    )


def _pareto(
    gained: np.ndarray,
    took: np.ndarray,
    starts: np.ndarray,
    indices: np.ndarray,
    stored: np.ndarray,
) -> np.ndarray:
    """Positions of the offers no other beats on both held bytes and time, by held bytes
    (ties: the earlier start, plain before stored), thinned evenly to _FRONT_LIMIT with
    both ends kept: the fewest bytes and the least time."""
    order = np.lexsort((stored, indices, starts, took, gained))
    times = took[order]
    best = np.minimum.accumulate(times)
    kept = order[np.concatenate(([True], times[1:] < best[:-1]))] if len(order) else order
    if len(kept) > _FRONT_LIMIT:
        step = (len(kept) - 1) / (_FRONT_LIMIT - 1)
        kept = kept[np.round(np.arange(_FRONT_LIMIT) * step).astype(np.int64)]
    return kept


def sweep(chain: Chain, upper: list[list[int]]) -> list[Selection]:
    """The DP's checkpoint sets over a sweep of model budgets, which no budget asked for
    changes: the least-peak set, the set that stores every stage (no recomputation, as
    keep_all), then the fastest set within each bound from the model peak of storing
    every stage down to the least peak.

    Where the model's peak/time front has at most _SWEEP + 1 points, the bounds visit
    every one, so that the sets hold the model's fastest at every budget. On a longer
    front, a grid: each next bound just below the last set's model peak, or 1/_SWEEP of
    the range lower if that is lower still, which visits every point where the points
    lie at least that far apart. At most 2 * _SWEEP + 3 runs of least_time.
    """
    floor, least = least_peak(chain, upper)
    stages = tuple(range(1, chain.n + 1))
    everything = Selection(stages, frozenset(stages))
    top = chain.model_peak(everything.checkpoints, everything.stored)
    front = _descend(chain, upper, top, floor, 1)
    if len(front) > _SWEEP + 1:
        grid = max(1, -(-(top - floor) // _SWEEP))  # rounded up: at most _SWEEP + 1 bounds
        front = _descend(chain, upper, top, floor, grid)
    return list(dict.fromkeys([least, everything, *front]))


def _descend(
    chain: Chain, upper: list[list[int]], bound: int, floor: int, step: int
) -> list[Selection]:
    """The fastest set within each model bound from `bound` down to `floor`: each next
    bound just below the last set's model peak, or `step` lower if that is lower still
    (step 1: every point of the front). It stops at _SWEEP + 2 sets, one more than the
    sweep keeps, which tells a longer front."""
    found: list[Selection] = []
    while bound >= floor and len(found) <= _SWEEP + 1:
        fastest = least_time(chain, upper, bound)
        if fastest is None:
            break
        selection = fastest[1]
        found.append(selection)
        peak = chain.model_peak(selection.checkpoints, selection.stored)
        bound = min(peak - 1, bound - step)
    return found


def linear_checkpoints(chain: Chain, cap: int) -> list[int]:
    """One left-to-right pass: extend the current segment while its added bytes stay within
    `cap`, else checkpoint the stage before. O(n) with running sums."""
    n = chain.n
    checkpoints: list[int] = []
    i, held, worst = 0, 0, 0
    k = 1
    while k <= n:
        inside, end = chain.stage_costs(i, k, held)
        if max(worst, end) > cap and k - 1 > i:
            checkpoints.append(k - 1)  # segment (i, k-1] was within the cap
            i, held, worst = k - 1, 0, 0
            continue  # stage k again, now as the first of a new segment
        worst = max(worst, inside)
        held += chain.c[k]
        k += 1
    return [*checkpoints, n]


# --- from checkpoints to a schedule ------------------------------------------------------


def sequence_for_checkpoints(graph: Graph, keep: set[int]) -> list[int]:
    """The general problem's sequence (node ids, repeats are recomputations) that keeps
    only the values in `keep` (and resident inputs and graph outputs) between their uses.

    Every node runs once in reference order. A value not kept is dropped when the
    backward starts (at the first node labelled backward) or, in a graph with no backward
    labels, when a node of `keep` after it is computed; a dropped value that is read again
    is recomputed, with its missing ancestors, just before the read, and the new copy
    stays usable. Copies are freed after their last read by the scoring rules.
    """
    has_backward = any(v.is_backward for v in graph)
    stays = keep | set(graph.outputs)  # an output is never freed, so never recomputed
    available: set[int] = {v.id for v in graph if v.is_resident_input}
    made: list[int] = []  # forward values made since the last drop
    sequence: list[int] = []
    dropping = False
    for node in graph:
        if node.is_resident_input:
            continue
        if has_backward and node.is_backward and not dropping:
            dropping = True
            available.difference_update(v for v in made if v not in stays)
            made = []
        _recompute_inputs(graph, node.id, available, sequence)
        sequence.append(node.id)
        available.add(node.id)
        if not node.is_backward:
            made.append(node.id)
        if not has_backward and node.id in keep:
            available.difference_update(v for v in made if v not in stays)
            made = []
    return sequence


def _recompute_inputs(graph: Graph, target: int, available: set[int], out: list[int]) -> None:
    """Append the recomputations that bring every input of `target` back."""
    out.extend(remat.missing_ancestors(graph, graph[target].inputs, available))


@dataclass(frozen=True)
class ChainPlan:
    """A checkpoint set carried out and judged by the simulator."""

    selection: Selection
    schedule: Schedule
    decisions: dict[int, Decision]
    peak: int
    time: float


def carry_out(
    graph: Graph, chain: Chain, selection: Selection, options: SolverOptions
) -> ChainPlan:
    """Checkpoints -> kept values (a checkpoint's nodes; a stored stage's every node) ->
    the problem's schedule, simulated."""
    chosen = set(selection.checkpoints) | ({chain.n} if chain.n else set())
    selection = Selection(tuple(sorted(chosen)), selection.stored & chosen)
    kept = set()
    for k in selection.checkpoints:
        kept.update(chain.stages[k - 1] if k in selection.stored else chain.keep[k - 1])
    return _plan_for_keep(graph, selection, kept, options)


def _plan_for_keep(
    graph: Graph, selection: Selection, kept: set[int], options: SolverOptions
) -> ChainPlan:
    """The schedule that keeps `kept` (and every node that cannot be recomputed) and
    recomputes the rest. Training: a decision for every saved candidate and every kept
    node, so that a checkpoint the backward does not read is kept all the same."""
    kept |= {v.id for v in graph if not v.recomputable}
    if options.problem == "training":
        decided = set(graph.saved_candidates) | (kept & set(graph.forward_ids))
        decisions = {v: Decision.KEEP if v in kept else Decision.RECOMPUTE for v in sorted(decided)}
        schedule = build_schedule(graph, decisions, bandwidth=None)
    else:
        forward = set(forward_nodes(graph, options.problem))
        decisions = {v: Decision.KEEP if v in kept else Decision.RECOMPUTE for v in sorted(forward)}
        schedule = remat.to_schedule(graph, sequence_for_checkpoints(graph, kept))
    trace = simulate(graph, schedule)
    return ChainPlan(selection, schedule, decisions, trace.peak, trace.time)


def _pick(plans: Sequence[ChainPlan], budget: int | None) -> ChainPlan:
    """The fastest plan within the budget (then the least peak); the least peak (then
    the fastest) when the budget is None or none fits."""
    fitting = [p for p in plans if budget is not None and p.peak <= budget]
    if fitting:
        return min(fitting, key=lambda p: (p.time, p.peak))
    return min(plans, key=lambda p: (p.peak, p.time))


def _result(
    name: str,
    plan: ChainPlan,
    budget: int | None,
    options: SolverOptions,
    started: float,
    note: str,
) -> SolveResult:
    """Status from the simulated peak: feasible within the budget, else infeasible. Never
    optimal: the search covers checkpoint sets at cut points, not every schedule, and
    the model that guides it is not the simulator."""
    status = "feasible" if within(plan.peak, budget) else "infeasible"
    stored = len(plan.selection.stored)
    return SolveResult(
        solver=name,
        status=status,
        schedule=plan.schedule,
        objective=float(plan.peak) if budget is None else plan.time,
        solve_seconds=time.perf_counter() - started,
        decisions=plan.decisions,
        options=options.to_json(),
        message=f"{note}; {len(plan.selection.checkpoints)} checkpoints ({stored} stored), "
        f"simulated peak {plan.peak} B",
    )


# --- the solvers -------------------------------------------------------------------------


def chain_dp(graph: Graph, budget: int | None, options: SolverOptions) -> SolveResult:
    """Hong et al.'s dynamic program on the chain of cut points, judged by the simulator.

    The DP proposes the checkpoint sets of `sweep` (the same whatever the budget); each
    is carried out and simulated. Returned: the fastest within the budget, else (and for
    budget None) the least simulated peak. So a larger budget never gives a slower
    schedule, and the least-memory schedule is no higher than any budgeted one.
    """
    started = time.perf_counter()
    chain = build_chain(graph, options.problem)
    selections = sweep(chain, chain.segment_costs())
    plans = [carry_out(graph, chain, s, options) for s in selections]
    plan = _pick(plans, budget)
    note = f"best of {len(plans)} DP checkpoint sets over {chain.n} stages"
    return _result("chain_dp", plan, budget, options, started, note)


def linear(graph: Graph, budget: int | None, options: SolverOptions) -> SolveResult:
    """A linear-time selector on the same chain: one greedy pass per segment cap, for a
    constant number of caps on a geometric grid, plus Chen et al.'s sqrt(n) checkpoints;
    each candidate is simulated and the best kept (least peak when minimizing, else the
    fastest within the budget, else the least peak). O(n) passes, O(1) simulations."""
    started = time.perf_counter()
    chain = build_chain(graph, options.problem)
    low = max((chain.stage_costs(k - 1, k, 0)[1] for k in range(1, chain.n + 1)), default=1)
    low = max(1, low)
    high = max(low, sum(chain.d) + sum(chain.c) + max(chain.h, default=0))
    ratio = (high / low) ** (1 / (_LINEAR_CAPS - 1)) if high > low else 1.0
    caps = sorted({math.ceil(low * ratio**s) for s in range(_LINEAR_CAPS)})
    candidates = sorted({tuple(linear_checkpoints(chain, cap)) for cap in caps})
    plans = [carry_out(graph, chain, Selection(c), options) for c in candidates]
    plans.append(_sqrt_plan(graph, chain, options))
    plan = _pick(plans, budget)
    note = f"greedy segment caps and sqrt(n) checkpoints over {chain.n} stages"
    return _result("linear", plan, budget, options, started, note)


def _sqrt_plan(graph: Graph, chain: Chain, options: SolverOptions) -> ChainPlan:
    """Chen et al.'s sqrt(n) checkpoints, so that linear is never worse than chen_sqrt."""
    if options.problem == "training":
        decisions = sqrt_decisions(graph)
        kept = {v for v, d in decisions.items() if d is Decision.KEEP}
    else:
        stride = max(1, math.isqrt(chain.n))
        kept = {chain.cuts[k - 1] for k in range(stride, chain.n + 1, stride)}
        kept.update(chain.cuts[-1:])
    position = {v: k for k, v in enumerate(chain.cuts, start=1)}
    chosen = tuple(sorted(position[v] for v in kept if v in position))
    return _plan_for_keep(graph, Selection(chosen), kept, options)
