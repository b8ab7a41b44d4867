"""A greedy planner that meets a byte budget by cost per byte saved.

Repeatedly: simulate, look at the storages live at the peak, and for each saved storage
there estimate the cheapest way to release it between forward and backward: recompute
(the time of the chain that must run again) or offload (the transfer time that does not
hide under compute); apply the lowest cost per byte, keep it if the peak did not rise.
Stops when the peak fits the budget or nothing live at the peak can be released.

On big graphs (from BULK_FROM nodes: a real-size model of repeated layers), a release
also releases the storages alike to it in other blocks (solvers/repeats.py), as many as
the gap to the budget can use: one simulation instead of one per layer while the peak is
far above the budget, one storage at a time close to it.

Within a budget, the fastest state found is refined: released storages are kept again
where the budget has room for them and the step gets faster (_kept_again). Last, storages
that cost nothing to recompute are released where the peak has room (_recomputed_for_free).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from memplan.core.errors import InvalidSchedule
from memplan.core.graph import Decision, Graph, SolveResult
from memplan.solvers import SolverOptions, director_training, require_problem
from memplan.solvers.baselines import sqrt_decisions
from memplan.solvers.repeats import classes
from memplan.solvers.result import judged
from memplan.solvers.training import (
    decider,
    exposed_round_trip,
    recompute_chain_time,
    saved_storages,
    simulate_decisions,
)

# Storages live at the peak that are scored per round, largest first: bounds the work
# per round on big graphs, where the largest storages are the ones worth releasing.
_CANDIDATES_PER_ROUND = 64
# Whether a descent prices a recompute chain as reading the values kept views pin
# (training.pinned_owners) or as running them again. The schedule reads them either way
# while it can at no memory; the cheaper estimates lead a descent elsewhere, not always
# lower (ResNet's least is 1 MiB higher by them alone), so descents run both ways.
PINNED_ESTIMATES = (True, False)
# From this many nodes, alike storages are released together (see the module). Below it a
# descent's path does not depend on the budget: a larger one only stops it sooner.
BULK_FROM = 3000
# How many graphs, the latest solved, keep their simulations and director's decisions
# after a solve (_Kept). The planner solves a graph at its budget and, where that misses,
# again for its least peak (planner/solve.py); the backend's rounds may solve it again at
# another aim. Their descents pass through the same states: on the zoo's ResNet under
# Inductor (1,107 nodes) the least solve after a missed budgeted one took 9.9 s alone,
# 0.27 s with what the first one kept.
_KEPT_GRAPHS = 2


def solve(graph: Graph, budget: int | None, options: SolverOptions) -> SolveResult:
    """Descend from two starting points, keep-all and Chen's sqrt(n) checkpoints, each
    way of PINNED_ESTIMATES, and return the fastest state any descent passed through
    within the budget (or the least peak, when the budget is None or none fits).

    Each descent releases storages cheapest per byte first. Where that does not reach the
    budget (or when minimizing), descents that release the largest storages first run
    too: cheap releases can strand the peak where only costly ones remain, and which of
    the two orders gets lower depends on the profiled times. With a host link (offloading
    allowed) and a budget, every descent a solve without a link would make also runs,
    recomputing only: an offload's estimated cost can be too low when many share the link.
    Where no descent reaches the budget (or when minimizing), descents start from the
    director's least state too: a descent keeps a release only if the peak does not rise,
    so it can stop where only releases made together lower the peak (ResNet, 2026-11-29:
    greedy's least 0.596 of the unplanned peak with 25 of 68 storages released, the
    director's 0.551 with 48).

    Within a budget, the fastest state of each way is then refined (_kept_again): the
    storages it released are kept again, one at a time, wherever the peak stays within
    the budget and the time falls. The refined state uses the room the budget leaves, so
    a lower budget can give a higher peak than a larger one; the refinement never makes
    the returned state slower or its peak higher than the budget.
    """
    require_problem("greedy", options, "training")
    started = time.perf_counter()
    deadline = started + options.time_limit
    target = 0 if budget is None else budget
    starts = [{v: Decision.KEEP for v in graph.saved_candidates}, sqrt_decisions(graph)]
    orders = [_cost_per_byte] + ([_largest_first] if budget is None else [])
    twins = classes(graph, list(saved_storages(graph))) if len(graph) >= BULK_FROM else {}
    # Offloads estimated to hide under compute may not, once many share the host link:
    # within a budget, the descents a solve without a link makes run too, so that allowing
    # offload does not end slower than not (where the deadline lets every descent run).
    ways = [options]
    if options.bandwidth and budget is not None:
        ways.append(dataclasses.replace(options, bandwidth=None))

    simulations = _Simulations(graph)
    by_way: list[tuple[SolverOptions, list[_Run]]] = []
    for way in ways:
        made = [
            _descend(graph, simulations, s, target, deadline, way, o, twins, pins)
            for o in orders
            for s in starts
            for pins in PINNED_ESTIMATES
        ]
        if budget is not None and all(r.least.peak > budget for r in made):
            made += [
                _descend(graph, simulations, s, target, deadline, way, _largest_first, twins, pins)
                for s in starts
                for pins in PINNED_ESTIMATES
            ]
        if budget is None or all(r.least.peak > budget for r in made):
            directed = simulations.least_directed(way, deadline)
            made += [
                _descend(graph, simulations, directed, target, deadline, way, o, twins, pins)
                for o in orders
                for pins in PINNED_ESTIMATES
            ]
        by_way.append((way, made))
    # The refinements run after every descent, so that they never take a descent's time,
    # and each makes at most as many simulations as the descents did: a bound on the
    # solve's work whatever the machine's speed (a solve cut by the clock is not kept,
    # planner/plan_cache.py).
    tries = len(simulations.asked)
    refined: list[_State] = []
    fits: list[_State] = []
    for way, made in by_way:
        way_fits = [s for r in made for s in r.states if budget is not None and s.peak <= budget]
        if way_fits:
            assert budget is not None
            fastest = min(way_fits, key=lambda s: (s.time, s.peak))
            refined.append(
                _kept_again(graph, simulations, fastest, budget, deadline, way, twins, tries)
            )
            fits += way_fits
    fitting = refined + fits
    runs = [run for _, made in by_way for run in made]
    passed = [state for run in runs for state in run.states]
    if fitting:
        chosen = min(fitting, key=lambda s: (s.time, s.peak))
    else:
        chosen = min(passed, key=lambda s: (s.peak, s.time))
    # Within the budget, or where none fits no higher than the least peak found.
    room = budget if fitting and budget is not None else chosen.peak
    chosen = _recomputed_for_free(graph, simulations, chosen, room, deadline, options)
    schedule, trace = simulate_decisions(graph, chosen.decisions, options.bandwidth)
    return judged(
        "greedy",
        schedule,
        trace,
        budget,
        options,
        started,
        objective=trace.time,
        unfit="timeout" if any(r.timed_out for r in runs) else "infeasible",
        decisions=chosen.decisions,
        message=f"least peak found: {min(s.peak for s in passed)} B",
    )


class _Simulated(NamedTuple):
    """What a descent reads of a simulation."""

    time: float
    peak: int
    live_at_peak: frozenset[int]


_Key = tuple[float | None, frozenset[tuple[int, Decision]]]


@dataclass
class _Kept:
    """What solves of one graph keep for the next (_KEPT_GRAPHS): each simulation, and
    the director's least-memory decisions per way of solving, where it ran in full."""

    simulations: dict[_Key, _Simulated | InvalidSchedule] = field(default_factory=dict)
    directed: dict[SolverOptions, dict[int, Decision]] = field(default_factory=dict)


@functools.lru_cache(maxsize=_KEPT_GRAPHS)
def _kept(graph: Graph) -> _Kept:
    """What the solves of `graph` keep, for the _KEPT_GRAPHS latest graphs solved."""
    return _Kept()


class _Simulations:
    """The simulations of `graph`, each distinct set of decisions run once: descents from
    other starts, orders and estimates pass through many of the same states (about two in
    five of a solve's simulations, on the zoo's ResNet), and so do later solves of the
    same graph (_KEPT_GRAPHS). Only what a descent reads is kept, so that memory grows by
    a few hundred node ids per state. `asked` holds the states this solve asked for."""

    def __init__(self, graph: Graph) -> None:
        self.graph = graph
        self.kept = _kept(graph)
        self.asked: set[_Key] = set()

    def least_directed(self, options: SolverOptions, deadline: float) -> dict[int, Decision]:
        """The director's least-memory decisions (the same for every solve of the graph,
        unless the deadline cuts the director short)."""
        found = self.kept.directed.get(options)
        if found is None:
            result = director_training.solve(
                self.graph, None, options, time.perf_counter(), deadline
            )
            found = result.decisions
            if result.status != "timeout":
                self.kept.directed[options] = found
        return found

    def __call__(self, decisions: dict[int, Decision], bandwidth: float | None) -> _Simulated:
        """The simulation of `decisions`; raises InvalidSchedule where they make none."""
        key = (bandwidth, frozenset(decisions.items()))
        self.asked.add(key)
        found = self.kept.simulations.get(key)
        if found is None:
            try:
                _, trace = simulate_decisions(self.graph, decisions, bandwidth)
                found = _Simulated(trace.time, trace.peak, trace.live_at_peak)
            except InvalidSchedule as invalid:
                found = invalid
            self.kept.simulations[key] = found
        if isinstance(found, InvalidSchedule):
            raise found.with_traceback(None)  # not the traceback of every raise before
        return found


class _State(NamedTuple):
    """A set of decisions a descent passed through, with its simulated time and peak."""

    time: float
    peak: int
    decisions: dict[int, Decision]


@dataclass
class _Run:
    """The states one descent passed through, in order, and whether time ran out."""

    states: list[_State]
    timed_out: bool

    @property
    def least(self) -> _State:
        return min(self.states, key=lambda s: (s.peak, s.time))


def _descend(
    graph: Graph,
    simulate: _Simulations,
    start: dict[int, Decision],
    target: int,
    deadline: float,
    options: SolverOptions,
    order: _Order,
    twins: dict[int, list[int]],
    read_pinned: bool,
) -> _Run:
    """Release the cheapest storage live at the peak until the peak is within `target`;
    with `twins` (owner -> the owners alike to it), alike storages too (see the module)."""
    groups = saved_storages(graph)
    window = hiding_windows(graph) if options.bandwidth else {}
    decisions = dict(start)
    trace = simulate(decisions, options.bandwidth)
    run = _Run([_State(trace.time, trace.peak, dict(decisions))], timed_out=False)
    tried: set[int] = set()
    while trace.peak > target:
        if time.perf_counter() > deadline:
            run.timed_out = True
            break
        move = _cheapest_release(
            graph, decisions, trace, groups, tried, window, options, order, read_pinned
        )
        if move is None:
            break
        owner, changes = move
        tried.add(owner)
        gap = trace.peak - target
        alike = _alike_releases(
            graph, owner, changes, twins, groups, decisions, trace, gap, read_pinned
        )
        tries = [{**changes, **alike}, changes] if alike else [changes]
        found = _first_accepted(simulate, decisions, tries, trace.peak, options)
        if found is not None:
            decisions, trace = found
            run.states.append(_State(trace.time, trace.peak, dict(decisions)))
            # A release that raised the peak before may not now: the peak has moved.
            tried = {o for o in tried if not _all_kept(groups[o], decisions)}
    return run


def _kept_again(
    graph: Graph,
    simulate: _Simulations,
    state: _State,
    budget: int,
    deadline: float,
    options: SolverOptions,
    twins: dict[int, list[int]],
    tries: int,
) -> _State:
    """`state` with storages it released kept again, the costliest per byte first, each
    where the peak stays within `budget` and the time falls, pass after pass until a pass
    keeps none, `tries` simulations are spent or time runs out. A descent releases the
    cheapest per byte first and stops once the peak fits: a later, larger release (or the
    alike ones released with it) can leave an earlier one needed no more, and the last
    release can leave room. With `twins` (big graphs, see the module), a storage is first
    tried kept together with the released storages alike to it: one simulation per kind
    of tensor where the room takes them all."""
    groups = saved_storages(graph)
    window = hiding_windows(graph) if options.bandwidth else {}
    kept_one = True
    while kept_one:
        kept_one = False
        for owner in _released_costliest_first(graph, state.decisions, groups, window, options):
            if _all_kept(groups[owner], state.decisions):
                continue  # kept again with a storage alike to it
            alike = [
                t
                for t in twins.get(owner, [])
                if t != owner and not _all_kept(groups[t], state.decisions)
            ]
            for owners in ([owner, *alike], [owner]) if alike else ([owner],):
                if tries <= 0 or time.perf_counter() > deadline:
                    return state
                tries -= 1
                proposal = {**state.decisions}
                proposal.update((v, Decision.KEEP) for o in owners for v in groups[o])
                try:
                    trace = simulate(proposal, options.bandwidth)
                except InvalidSchedule:
                    continue
                if trace.peak <= budget and trace.time < state.time:
                    state, kept_one = _State(trace.time, trace.peak, proposal), True
                    break
    return state


def _recomputed_for_free(
    graph: Graph,
    simulate: _Simulations,
    state: _State,
    room: int,
    deadline: float,
    options: SolverOptions,
) -> _State:
    """`state` with each kept storage that costs no time to recompute released, where the
    peak stays within `room` and the step is no slower. The node times price such a
    storage the same kept or recomputed, and keeping it costs what they do not show:
    a node priced at 0 s is one Inductor inlines into every kernel that reads it
    (planner/fusion.py), and kept, the forward must write it out and the backward read it
    back. On CNN's last block a kept ReLU read only by a mean and by its own backward made
    the compiled step 3.5% slower than recomputing it (docs/measurement.md)."""
    for owner, members in saved_storages(graph).items():
        if graph[owner].time > 0 or not _all_kept(members, state.decisions):
            continue
        if time.perf_counter() > deadline:
            break
        proposal = {**state.decisions}
        proposal.update((v, Decision.RECOMPUTE) for v in members)
        try:
            trace = simulate(proposal, options.bandwidth)
        except InvalidSchedule:
            continue
        if trace.peak <= room and trace.time <= state.time:
            state = _State(trace.time, trace.peak, proposal)
    return state


def _released_costliest_first(
    graph: Graph,
    decisions: dict[int, Decision],
    groups: dict[int, list[int]],
    window: dict[int, float],
    options: SolverOptions,
) -> list[int]:
    """The owners of the saved storages `decisions` release, the costliest per byte
    first: the estimated time of recomputing its members, plus the transfer time an
    offload does not hide (hiding_windows)."""
    decision = decider(graph, decisions)

    def cost_per_byte(owner: int) -> float:
        recomputed = [v for v in groups[owner] if decisions.get(v) is Decision.RECOMPUTE]
        cost = recompute_chain_time(graph, recomputed, decision) if recomputed else 0.0
        if decisions.get(owner) is Decision.OFFLOAD and options.bandwidth:
            cost += _exposed_transfer(graph, owner, window, options.bandwidth)
        return cost / max(graph[owner].bytes, 1)

    released = [o for o, members in groups.items() if not _all_kept(members, decisions)]
    return sorted(released, key=lambda o: (-cost_per_byte(o), o))


def _first_accepted(
    simulate: _Simulations,
    decisions: dict[int, Decision],
    tries: list[dict[int, Decision]],
    peak: int,
    options: SolverOptions,
) -> tuple[dict[int, Decision], _Simulated] | None:
    """The first of `tries` (changes to `decisions`) that makes a valid schedule peaking
    at most at `peak`, with its trace; None where none does."""
    for changes in tries:
        proposal = {**decisions, **changes}
        try:
            trace = simulate(proposal, options.bandwidth)
        except InvalidSchedule:
            continue
        if trace.peak <= peak:
            return proposal, trace
    return None


def _alike_releases(
    graph: Graph,
    owner: int,
    changes: dict[int, Decision],
    twins: dict[int, list[int]],
    groups: dict[int, list[int]],
    decisions: dict[int, Decision],
    trace: _Simulated,
    gap: int,
    read_pinned: bool,
) -> dict[int, Decision]:
    """The same release as `changes` (of `owner`) for the storages alike to it that are
    live at the peak of `trace`, wholly kept and releasable the same way, in order: as
    many as, with `owner`'s, could close a `gap` of bytes (chains priced as `read_pinned`
    says, PINNED_ESTIMATES)."""
    size = max(graph[owner].bytes, 1)
    room = -(-gap // size) - 1  # storages beyond owner's that the gap can use
    offloads = changes.get(owner) is Decision.OFFLOAD
    live = {graph.storage_owner[v] for v in trace.live_at_peak}
    decision = decider(graph, decisions, read_pinned=read_pinned)
    alike: dict[int, Decision] = {}
    for twin in twins.get(owner, []):
        if room <= 0:
            break
        if twin == owner or twin not in live or not _all_kept(groups[twin], decisions):
            continue
        if offloads and not graph[twin].offloadable:
            continue
        if not offloads and not math.isfinite(recompute_chain_time(graph, groups[twin], decision)):
            continue
        for v in groups[twin]:
            alike[v] = Decision.OFFLOAD if offloads and v == twin else Decision.RECOMPUTE
        room -= 1
    return alike


def _all_released(members: list[int], decisions: dict[int, Decision]) -> bool:
    return all(decisions.get(v) is not Decision.KEEP for v in members)


def _all_kept(members: list[int], decisions: dict[int, Decision]) -> bool:
    return all(decisions.get(v) is Decision.KEEP for v in members)


def hiding_windows(graph: Graph) -> dict[int, float]:
    """Forward node -> compute time from it to the end of the forward plus the whole
    backward: an upper bound on the time its offload and prefetch can hide under."""
    backward_time = sum(graph[u].time for u in graph.backward_ids)
    windows: dict[int, float] = {}
    remaining = 0.0
    for v in reversed(graph.forward_ids):
        remaining += graph[v].time
        windows[v] = remaining + backward_time
    return windows


def _exposed_transfer(
    graph: Graph, owner: int, window: dict[int, float], bandwidth: float
) -> float:
    """What an offload's round trip adds to the step, hidden under the compute from `owner`
    to the end of the step (hiding_windows)."""
    return exposed_round_trip(graph, owner, window.get(owner, 0.0), bandwidth)


def _cheapest_release(
    graph: Graph,
    decisions: dict[int, Decision],
    trace: _Simulated,
    groups: dict[int, list[int]],
    tried: set[int],
    window: dict[int, float],
    options: SolverOptions,
    order: _Order,
    read_pinned: bool,
) -> tuple[int, dict[int, Decision]] | None:
    """The untried saved storage live at the peak that ranks first by `order`, and the
    decisions that release it (chains priced as `read_pinned` says, PINNED_ESTIMATES)."""
    decision = decider(graph, decisions, read_pinned=read_pinned)
    live_owners = {graph.storage_owner[v] for v in trace.live_at_peak}
    # An owner already released can be live at the peak (a recomputed copy in the
    # backward): nothing of it is left to release, and trying it would cost a simulation.
    owners = sorted(
        (
            o
            for o in live_owners
            if o in groups and o not in tried and not _all_released(groups[o], decisions)
        ),
        key=lambda o: (-graph[o].bytes, o),
    )[:_CANDIDATES_PER_ROUND]
    candidates = frozenset(graph.saved_candidates)
    best: tuple[tuple[float, float], int, dict[int, Decision]] | None = None
    for owner in owners:
        kept = [v for v in groups[owner] if decisions.get(v) is Decision.KEEP]
        size = max(graph[owner].bytes, 1)
        after = decision
        if read_pinned and owner not in candidates:
            # Its kept views pin `owner` (pinned_owners): released, they pin it no more,
            # and their chain runs what computes it (a batch norm's reduction, for its
            # saved mean) rather than reading it for free.
            released = {**decisions, **dict.fromkeys(kept, Decision.RECOMPUTE)}
            after = decider(graph, released, read_pinned=True)
        for cost, changes in release_options(graph, owner, kept, after, window, options):
            score = order(cost, size, changes.get(owner) is Decision.OFFLOAD)
            if best is None or score < best[0]:
                best = (score, owner, changes)
    return None if best is None else (best[1], best[2])


# How a descent ranks the ways to release a storage: (added seconds, bytes, whether it
# offloads the storage) -> lower first.
_Order = Callable[[float, int, bool], tuple[float, ...]]


def _cost_per_byte(cost: float, size: int, offloads: bool) -> tuple[float, ...]:
    return (cost / size, -size)


def _largest_first(cost: float, size: int, offloads: bool) -> tuple[float, ...]:
    """The largest storage first, and offloaded where it can be, whatever that costs: this
    order runs for the least peak, and an offload leaves nothing of the storage on the
    device, where recomputing it holds its chain's inputs in the backward. Priced by
    cost alone, a chain of 8 layers whose transfers' host calls outcost recomputing
    reached a least peak 19% higher."""
    return (-size, not offloads, cost)


def release_options(
    graph: Graph,
    owner: int,
    kept: list[int],
    decision: Callable[[int], Decision],
    window: dict[int, float],
    options: SolverOptions,
) -> list[tuple[float, dict[int, Decision]]]:
    """(estimated added time, decisions) for each way to release the storage of `owner`."""
    found: list[tuple[float, dict[int, Decision]]] = []
    recompute = recompute_chain_time(graph, kept, decision)
    if math.isfinite(recompute):
        found.append((recompute, dict.fromkeys(kept, Decision.RECOMPUTE)))
    if options.bandwidth and graph[owner].offloadable:
        views = [v for v in kept if v != owner]
        exposed = _exposed_transfer(graph, owner, window, options.bandwidth)
        view_time = recompute_chain_time(graph, views, decision, stop_at=owner)
        if math.isfinite(view_time):
            changes = dict.fromkeys(views, Decision.RECOMPUTE)
            changes[owner] = Decision.OFFLOAD
            found.append((exposed + view_time, changes))
    return found
