"""The DELTA-style director on the training problem: saved forward storages, ranked by
bytes times idle time between their last forward and first backward use, are released by
offload where the transfer hides, else by recompute, until a predicted memory profile fits
the budget; the simulator then confirms (a few fix-up rounds release more where the
prediction was short).
"""

from __future__ import annotations

import math
import random
import time
from bisect import bisect_right
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from memplan.core.errors import InvalidSchedule
from memplan.core.graph import Decision, Graph, NodeKind, SolveResult
from memplan.core.simulate import MemoryTrace
from memplan.solvers import SolverOptions
from memplan.solvers.baselines import sqrt_decisions
from memplan.solvers.result import judged, peak_message
from memplan.solvers.training import (
    build_schedule,
    decider,
    exposed_round_trip,
    position_profile,
    recompute_chain_time,
    saved_storages,
    simulate_decisions,
)

# Fix-up rounds after the first prediction: each costs one build and one simulation.
_ROUNDS = 12
# Direct-then-restore cycles (see solve).
_CYCLES = 4


@dataclass(frozen=True)
class _Storage:
    """A forward storage the backward reads: released as one (its saved views pin it).

    Idle from after position `last_forward` (its last forward read) to `first_backward`
    (its first backward read), in node ids, which the schedule follows.
    """

    owner: int
    members: tuple[int, ...]
    last_forward: int
    first_backward: int
    idle: float  # compute time between the two


def solve(
    graph: Graph, budget: int | None, options: SolverOptions, started: float, deadline: float
) -> SolveResult:
    """Direct from keep-all; where that ends over the target, keep some released storages
    again (_restore) and direct once more from there, the kept ones now checkpoints. If
    that still ends over the target, do the same from Chen's sqrt(n) checkpoints, which
    break recompute cascades from the start."""
    # The least peak (budget None) is sought as a target no schedule meets.
    target = 0 if budget is None else budget
    prefix = [0.0]
    for node in graph:
        prefix.append(prefix[-1] + (node.time if node.kind is NodeKind.COMPUTE else 0.0))
    storages = _rank_storages(graph, prefix, options.seed)
    keep_all = {v: Decision.KEEP for v in graph.saved_candidates}
    best: tuple[MemoryTrace, dict[int, Decision]] | None = None
    timed_out = False
    for start in (keep_all, {**keep_all, **sqrt_decisions(graph)}):
        trace, decisions, timed_out = _cycles(
            graph, storages, start, target, prefix, deadline, options
        )
        if best is None or _better(trace, best[0], target):
            best = (trace, decisions)
        if best[0].peak <= target or timed_out:
            break
    assert best is not None
    trace, decisions = best
    schedule = build_schedule(graph, decisions, bandwidth=options.bandwidth)
    return judged(
        "director", schedule, trace, budget, options, started, objective=trace.time,
        unfit="timeout" if timed_out else "infeasible", decisions=decisions,
        message=peak_message(trace.peak, budget),
    )  # fmt: skip


def _cycles(
    graph: Graph,
    storages: list[_Storage],
    start: dict[int, Decision],
    target: int,
    prefix: Sequence[float],
    deadline: float,
    options: SolverOptions,
) -> tuple[MemoryTrace, dict[int, Decision], bool]:
    """Direct-then-restore cycles from `start`: the best state reached, and whether the
    deadline cut them short."""
    decisions = dict(start)
    _, trace = simulate_decisions(graph, decisions, options.bandwidth)
    # Storages the director has decided on (released, or kept again by _restore).
    released = {graph.storage_owner[v] for v, d in start.items() if d is not Decision.KEEP}
    best = (trace, dict(decisions))
    timed_out = False
    for _ in range(_CYCLES):
        trace, decisions, timed_out = _direct_rounds(
            graph, storages, trace, decisions, released, target, prefix, deadline, options
        )
        if _better(trace, best[0], target):
            best = (trace, dict(decisions))
        if trace.peak <= target or timed_out:
            break
        restored = _restore(graph, storages, trace, decisions, deadline, options)
        if restored is None:
            break
        trace, decisions, timed_out = restored
        if _better(trace, best[0], target):
            best = (trace, dict(decisions))
    return best[0], best[1], timed_out


def _better(new: MemoryTrace, old: MemoryTrace, budget: int) -> bool:
    """A lower (peak, time); or, both within the budget, the faster."""
    return (new.peak, new.time) < (old.peak, old.time) or (
        new.peak <= budget and old.peak <= budget and new.time < old.time
    )


def _direct_rounds(
    graph: Graph,
    storages: list[_Storage],
    trace: MemoryTrace,
    decisions: dict[int, Decision],
    released: set[int],
    target: int,
    prefix: Sequence[float],
    deadline: float,
    options: SolverOptions,
) -> tuple[MemoryTrace, dict[int, Decision], bool]:
    """Release ranked storages where the predicted profile is over the target, simulate,
    and repeat with the simulated profile until it fits or nothing is left to release."""
    schedule = build_schedule(graph, decisions, bandwidth=options.bandwidth)
    mem = position_profile(graph, schedule, trace)
    for _ in range(_ROUNDS):
        if trace.peak <= target:
            break
        if time.perf_counter() > deadline:
            return trace, decisions, True
        changes = _direct(graph, storages, decisions, released, mem, target, prefix, options)
        if not changes:
            break
        proposal = {**decisions, **changes}
        try:
            schedule, new_trace = simulate_decisions(graph, proposal, options.bandwidth)
        except InvalidSchedule:
            break  # a chain the estimate thought possible is not: keep what we had
        decisions, trace = proposal, new_trace
        mem = position_profile(graph, schedule, trace)
    return trace, decisions, False


def _restore(
    graph: Graph,
    storages: list[_Storage],
    trace: MemoryTrace,
    decisions: dict[int, Decision],
    deadline: float,
    options: SolverOptions,
) -> tuple[MemoryTrace, dict[int, Decision], bool] | None:
    """Keep released storages again, lowest ranked first, wherever that lowers the peak;
    None if none does.

    Releasing a run of neighbouring storages by recompute makes each chain recompute the
    next, so the whole run comes back at once in the backward: past some point, releasing
    more raises the peak. Keeping some of them again (checkpoints) breaks the cascade.
    """
    changed = False
    for storage in reversed(storages):
        if decisions.get(storage.owner, Decision.KEEP) is Decision.KEEP:
            continue
        if time.perf_counter() > deadline:
            return trace, decisions, True
        proposal = {**decisions, **dict.fromkeys(storage.members, Decision.KEEP)}
        try:
            _, new_trace = simulate_decisions(graph, proposal, options.bandwidth)
        except InvalidSchedule:
            continue
        if (new_trace.peak, new_trace.time) < (trace.peak, trace.time):
            trace, decisions, changed = new_trace, proposal, True
    return (trace, decisions, False) if changed else None


def _rank_storages(graph: Graph, prefix: Sequence[float], seed: int) -> list[_Storage]:
    """Saved forward storages, best first by bytes x idle time (seeded ties)."""
    groups = saved_storages(graph)
    order = list(range(len(graph)))
    random.Random(seed).shuffle(order)
    storages = []
    for owner, members in groups.items():
        reads = [u for m in (owner, *members) for u in graph.users[m]]
        last_forward = max([owner, *members, *(u for u in reads if not graph[u].is_backward)])
        first_backward = min(u for u in reads if graph[u].is_backward)
        idle = prefix[first_backward] - prefix[last_forward + 1]
        storages.append(_Storage(owner, tuple(members), last_forward, first_backward, idle))
    storages.sort(
        key=lambda s: (-graph[s.owner].bytes * s.idle, -graph[s.owner].bytes, order[s.owner])
    )
    return storages


def _direct(
    graph: Graph,
    storages: list[_Storage],
    decisions: dict[int, Decision],
    released: set[int],
    mem: np.ndarray,
    target: int,
    prefix: Sequence[float],
    options: SolverOptions,
) -> dict[int, Decision]:
    """The director: walk the ranked storages and release each that spans a position the
    predicted profile puts over `target`: offload if its round trip hides under its idle
    compute, else the cheaper of the exposed transfer and the recompute chain. Updates
    `mem` and `released` in place; returns the decisions changed."""
    changes: dict[int, Decision] = {}
    merged = dict(decisions)  # what decide() reads: the decisions with changes so far
    decide = decider(graph, merged)
    bandwidth = options.bandwidth
    for storage in storages:
        if mem.max() <= target:
            break
        lo, hi = storage.last_forward + 1, storage.first_backward
        if storage.owner in released or hi <= lo or mem[lo:hi].max() <= target:
            continue
        owner = graph[storage.owner]
        recompute = recompute_chain_time(graph, list(storage.members), decide)
        offload = bandwidth is not None and owner.offloadable
        views = [v for v in storage.members if v != storage.owner]
        view_time = recompute_chain_time(graph, views, decide, stop_at=storage.owner)
        offload = offload and math.isfinite(view_time)
        exposed = (
            exposed_round_trip(graph, storage.owner, storage.idle, bandwidth)
            if bandwidth
            else math.inf
        )
        if offload and (exposed == 0 or not math.isfinite(recompute) or exposed < recompute):
            changes.update(dict.fromkeys(views, Decision.RECOMPUTE))
            changes[storage.owner] = Decision.OFFLOAD
            # The prefetch lands a transfer's worth of compute before the first use.
            assert bandwidth is not None
            hi = _prefetch_position(prefix, hi, owner.bytes / bandwidth, lo)
        elif math.isfinite(recompute):
            changes.update(dict.fromkeys(storage.members, Decision.RECOMPUTE))
        else:
            continue  # neither: keep it
        merged.update(changes)
        released.add(storage.owner)
        mem[lo:hi] -= owner.bytes
    return changes


def _prefetch_position(prefix: Sequence[float], use: int, transfer: float, floor: int) -> int:
    """The position a prefetch for a use at `use` is issued at: the latest whose compute
    up to `use` covers `transfer` (not before `floor`)."""
    position = bisect_right(prefix, prefix[use] - transfer) - 1
    return max(floor, min(use, position))
