"""The training problem as a choice of releases: the model the exact engines solve on it.

A release frees one saved forward storage between its forward and backward uses, by
recomputing it or by offloading it (views of an offloaded storage are recomputed from the
prefetched copy). The simulator measures each release alone, every other storage kept: how
it changes the memory at each node position (training.position_profile) and the step
time. An engine (milp, cpsat) picks at most one release per storage under the additive
model: memory at a position is keep-all's plus the picked releases' changes, and so is the
step time.

Releases interact where their recompute chains meet: a chain that reaches another released
storage recomputes it early and holds it. Each such pair is simulated too, and its
interaction (the joint change minus the two single ones) is a term that counts when both
are picked. Other interactions remain (chains sharing an unsaved node, cascades of three
or more), so the simulator judges every pick: one it puts over the budget is cut off (a
no-good cut) and the engine solves again. The answer is the best pick the simulator
accepted, or the director's schedule where that is better; its status is "feasible", never
"optimal": the model's optimum is not a proof about the simulator's.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from memplan.core.errors import InvalidSchedule
from memplan.core.graph import Decision, Graph, NodeKind, Schedule, SolveResult
from memplan.core.simulate import MemoryTrace
from memplan.solvers import SolverOptions, director
from memplan.solvers.result import judged
from memplan.solvers.training import position_profile, saved_storages, simulate_decisions

# Share of the time limit the director gets for the incumbent and the hint.
_DIRECTOR_SHARE = 0.25


@dataclass(frozen=True)
class Release:
    """One way to free one storage: the decisions it sets and what they change alone."""

    owner: int
    decisions: Mapping[int, Decision]
    memory: np.ndarray  # bytes added (negative: freed) at each node position
    time: float  # step time added


Effect = tuple[int, ...]  # the releases whose joint pick an additive term stands for


class Row(NamedTuple):
    """Memory at one position under the model: constant + sum of bytes x picked, where an
    effect of two releases counts when both are picked."""

    constant: int
    terms: tuple[tuple[Effect, int], ...]


class Pick(NamedTuple):
    """What an engine returns: its status and the releases picked (None if none found)."""

    status: str  # optimal | feasible | infeasible | timeout, for the model
    chosen: frozenset[int] | None


@dataclass(frozen=True)
class Interaction:
    """What picking two related releases together changes beyond their sum."""

    pair: tuple[int, int]
    memory: np.ndarray
    time: float


@dataclass
class ReleaseModel:
    """Keep-all's profile and time, the releases, their interactions and the cuts."""

    base: np.ndarray
    base_time: float
    releases: list[Release]
    interactions: list[Interaction]
    cuts: list[frozenset[int]] = field(default_factory=list)

    @classmethod
    def of(cls, graph: Graph, options: SolverOptions, deadline: float) -> ReleaseModel | None:
        """Measure every release, and every pair whose recompute chains meet, by
        simulation; None if the deadline passes first."""
        keep_all = {v: Decision.KEEP for v in graph.saved_candidates}
        base, base_trace = _profile(graph, keep_all, options)
        releases: list[Release] = []
        for owner, members in saved_storages(graph).items():
            for decisions in _ways_to_release(graph, owner, members, options):
                if time.perf_counter() > deadline:
                    return None
                try:
                    profile, trace = _profile(graph, {**keep_all, **decisions}, options)
                except InvalidSchedule:
                    continue  # e.g. a chain through an op that cannot run again
                releases.append(
                    Release(owner, decisions, profile - base, trace.time - base_trace.time)
                )
        interactions: list[Interaction] = []
        for i, j in _related_pairs(graph, releases):
            if time.perf_counter() > deadline:
                return None
            both = {**keep_all, **releases[i].decisions, **releases[j].decisions}
            try:
                profile, trace = _profile(graph, both, options)
            except InvalidSchedule:
                continue
            memory = profile - base - releases[i].memory - releases[j].memory
            extra = trace.time - base_trace.time - releases[i].time - releases[j].time
            if memory.any() or extra:
                interactions.append(Interaction((i, j), memory, extra))
        return cls(base, base_trace.time, releases, interactions)

    @property
    def groups(self) -> list[list[int]]:
        """Release indices per storage: an engine picks at most one of each group."""
        by_owner: dict[int, list[int]] = {}
        for index, release in enumerate(self.releases):
            by_owner.setdefault(release.owner, []).append(index)
        return list(by_owner.values())

    @property
    def effects(self) -> list[tuple[Effect, np.ndarray, float]]:
        """Every additive term: (releases, bytes per position, time)."""
        singles = [((i,), r.memory, r.time) for i, r in enumerate(self.releases)]
        return singles + [(x.pair, x.memory, x.time) for x in self.interactions]

    def rows(self, cap: int | None) -> list[Row]:
        """The positions that matter, deduplicated: those that could exceed `cap`, or
        every position that holds memory when `cap` is None (the peak is minimized)."""
        effects = self.effects
        changes = np.stack([memory for _, memory, _ in effects]) if effects else None
        worst = self.base.copy()
        if changes is not None:
            worst += np.clip(changes, 0, None).sum(axis=0)
        positions = np.nonzero(worst > (0 if cap is None else cap))[0]
        rows: dict[tuple[tuple[Effect, int], ...], int] = {}
        for p in positions:
            terms: tuple[tuple[Effect, int], ...] = ()
            if changes is not None:
                column = changes[:, p]
                terms = tuple((effects[k][0], int(column[k])) for k in np.nonzero(column)[0])
            rows[terms] = max(rows.get(terms, 0), int(self.base[p]))
        return [Row(c, terms) for terms, c in rows.items()]

    def decisions(self, chosen: frozenset[int]) -> dict[int, Decision]:
        """Every candidate's decision under a pick (unpicked storages are kept)."""
        out: dict[int, Decision] = {}
        for index in sorted(chosen):
            out.update(self.releases[index].decisions)
        return out

    def picks_for(self, decisions: Mapping[int, Decision]) -> frozenset[int]:
        """The releases that carry out `decisions` (a hint from another solver)."""
        return frozenset(
            i
            for i, r in enumerate(self.releases)
            if all(decisions.get(v) is d for v, d in r.decisions.items())
        )

    def predicted_peak(self, chosen: frozenset[int]) -> int:
        profile = self.base.copy()
        for effect, memory, _ in self.effects:
            if chosen.issuperset(effect):
                profile += memory
        return int(profile.max())


Engine = Callable[[ReleaseModel, "int | None", frozenset[int], float, SolverOptions], Pick]


@dataclass(frozen=True)
class _Judged:
    decisions: dict[int, Decision]
    schedule: Schedule
    trace: MemoryTrace


def solve(
    graph: Graph, budget: int | None, options: SolverOptions, name: str, engine: Engine
) -> SolveResult:
    """The training problem by the release model, solved by `engine` (see the module);
    budget None minimizes the peak."""
    started = time.perf_counter()
    deadline = started + options.time_limit
    cap = budget
    lead = director.solve(
        graph, budget, dataclasses.replace(options, time_limit=options.time_limit * _DIRECTOR_SHARE)
    )
    best = _judge(graph, dict(lead.decisions), options)
    model = ReleaseModel.of(graph, options, deadline)
    if model is None:
        return _result(name, budget, options, started, best, "timeout", "no time to model")
    hint = model.picks_for(best.decisions)
    rounds, outcome = 0, "timeout"
    while time.perf_counter() < deadline:
        rounds += 1
        pick = engine(model, cap, hint, deadline, options)
        if pick.chosen is None:
            outcome = pick.status
            break
        try:
            judged = _judge(graph, model.decisions(pick.chosen), options)
        except InvalidSchedule:
            model.cuts.append(pick.chosen)
            continue
        # The hint stays the director's: a pick the loop goes past is cut, so it would be
        # an infeasible start.
        if _better(judged.trace, best.trace, budget):
            best = judged
        # The model's promise: within the budget, or (minimizing) its predicted peak.
        limit = model.predicted_peak(pick.chosen) if cap is None else cap
        if judged.trace.peak <= limit:
            outcome = "accepted by the simulator"
            break
        model.cuts.append(pick.chosen)
    message = (
        f"{rounds} round(s) of the release model ({len(model.releases)} releases, "
        f"{len(model.cuts)} cut); last: {outcome}"
    )
    status = "timeout" if outcome == "timeout" else "infeasible"
    return _result(name, budget, options, started, best, status, message)


def _related_pairs(graph: Graph, releases: list[Release]) -> list[tuple[int, int]]:
    """Pairs of releases where one's recompute chain reaches the other's storage (walking
    inputs through the unsaved nodes it recomputes anyway): picked together, the chain
    recomputes that storage early and holds it, which the two alone do not show.

    Two chains that merely share an unsaved node also interact (they share its
    recomputation), but pair terms for those overcount where three or more chains share
    one: on GPT-2 they made the model pick slower plans. Cuts handle them instead."""
    saved = set(graph.saved_candidates)
    reaches: list[set[int]] = []  # storages of saved nodes a release's chain stops at
    for release in releases:
        seen: set[int] = set()
        stack = [s for v, d in release.decisions.items() if d is Decision.RECOMPUTE
                 for s in graph[v].inputs]  # fmt: skip
        while stack:
            v = stack.pop()
            node = graph[v]
            if v in seen or node.kind is not NodeKind.COMPUTE or node.is_backward:
                continue
            seen.add(v)
            if v not in saved:
                stack.extend(node.inputs)
        reaches.append({graph.storage_owner[v] for v in seen & saved})
    return [
        (i, j)
        for i, first in enumerate(releases)
        for j, second in enumerate(releases[i + 1 :], start=i + 1)
        if first.owner != second.owner and (first.owner in reaches[j] or second.owner in reaches[i])
    ]


def _ways_to_release(
    graph: Graph, owner: int, members: list[int], options: SolverOptions
) -> list[dict[int, Decision]]:
    """Recompute the storage; or, with a host link, offload the owner and recompute its
    saved views from the prefetched copy."""
    ways = [dict.fromkeys(members, Decision.RECOMPUTE)]
    if options.bandwidth is not None and graph[owner].offloadable:
        views = dict.fromkeys((m for m in members if m != owner), Decision.RECOMPUTE)
        ways.append({**views, owner: Decision.OFFLOAD})
    return ways


def _profile(
    graph: Graph, decisions: Mapping[int, Decision], options: SolverOptions
) -> tuple[np.ndarray, MemoryTrace]:
    schedule, trace = simulate_decisions(graph, decisions, options.bandwidth)
    return position_profile(graph, schedule, trace), trace


def _judge(graph: Graph, decisions: dict[int, Decision], options: SolverOptions) -> _Judged:
    schedule, trace = simulate_decisions(graph, decisions, options.bandwidth)
    return _Judged(decisions, schedule, trace)


def _better(new: MemoryTrace, old: MemoryTrace, budget: int | None) -> bool:
    """Least peak when minimizing (budget None); else within the budget first, then the
    least time."""
    if budget is None:
        return (new.peak, new.time) < (old.peak, old.time)
    if (new.peak <= budget) != (old.peak <= budget):
        return new.peak <= budget
    if new.peak > budget:
        return new.peak < old.peak
    return new.time < old.time


def _result(
    name: str,
    budget: int | None,
    options: SolverOptions,
    started: float,
    best: _Judged,
    unfit_status: str,
    message: str,
) -> SolveResult:
    objective = float(best.trace.peak) if budget is None else best.trace.time
    return judged(
        name, best.schedule, best.trace, budget, options, started, objective=objective,
        unfit=unfit_status, decisions=best.decisions, message=message,
    )  # fmt: skip
