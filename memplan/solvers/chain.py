"""The chain of cut points of a forward graph (Hong et al. 2025, arXiv 2502.12499): the
stages between nodes whose output alone is live across them, with the per-stage sizes
and times the chain model of solvers/chain_dp.py reads.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property

import numpy as np

from memplan.core import remat
from memplan.core.graph import Compute, Graph
from memplan.core.simulate import simulate
from memplan.solvers.training import build_schedule

# --- the chain ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Selection:
    """A checkpoint set: stage indices in increasing order (the last stage, n, always
    among them) and the stored ones among them, whose whole stage is kept instead of
    being recomputed when the segment ending there is."""

    checkpoints: tuple[int, ...]
    stored: frozenset[int] = frozenset()


@dataclass(frozen=True)
class Chain:
    """The forward graph as a chain of stages 1..n, stage k ending at cut point cuts[k-1].

    Index 0 is a virtual start (nothing held, d=0): a segment (0, j] is recomputed from
    the graph's sources. Per stage k (lists are indexed by k, entry 0 unused):
    keep[k-1] the nodes a checkpoint at k keeps: the cut and the outputs carved from it,
    d[k]   bytes of their storage (a view holds its owner's),
    a[k]   bytes of the stage's other storages the backward reads: after a recomputation
           they stay until the stage's backward has run,
    c[k]   bytes of the stage's storages the backward reads, the checkpoint's included:
           what a recomputed stage holds until its backward has run,
    fw[k]  peak bytes of running the stage's forward alone (its input not counted),
    h[k]   the most bytes of values outside the chain (gradients, the parameter gradients
           made so far) live while a backward node of stage k runs,
    t[k]   forward time of the whole stage,
    ti[k]  time of what a segment ending at checkpoint k recomputes of stage k: the
           stage's nodes outside the checkpoint that the backward reads, and their
           ancestors inside the stage,
    reach[k]  whether stage k's backward reads a forward value outside the checkpoint, so
           that a segment ending at checkpoint k is recomputed while stage k's backward runs.
    """

    cuts: tuple[int, ...]
    stages: tuple[tuple[int, ...], ...]
    keep: tuple[tuple[int, ...], ...]
    d: tuple[int, ...]
    a: tuple[int, ...]
    c: tuple[int, ...]
    fw: tuple[int, ...]
    h: tuple[int, ...]
    t: tuple[float, ...]
    ti: tuple[float, ...]
    reach: tuple[bool, ...]
    has_backward: bool

    @property
    def n(self) -> int:
        return len(self.cuts)

    def stage_costs(self, i: int, k: int, held: int) -> tuple[int, int]:
        """Bytes beyond the checkpoints <= i while stage k of a segment from checkpoint i
        runs, given `held` = bytes the recomputed stages i+1..k-1 hold: (k inside the
        segment, k its end).

        Forward: stage k's input cut (unless it is checkpoint i) and its work. Backward:
        inside, the recomputed stages i+1..k-1, stage k's retained values and the
        gradients; at the end, the recomputation has happened only if stage k's backward
        reaches back.
        """
        forward = (self.d[k - 1] if k - 1 > i else 0) + self.fw[k]
        if not self.has_backward:
            return forward, forward
        grads = self.h[k]
        inside = held + self.c[k] + grads
        end = held + self.a[k] + self.d[k] + grads if self.reach[k] else self.d[k] + grads
        return max(forward, inside), max(forward, end)

    def segment_costs(self) -> list[list[int]]:
        """U[i][j] = the most bytes segment (i, j] adds on top of the checkpoints <= i:
        max(stage costs inside, its end's), for 0 <= i < j <= n. O(n^2)."""
        n = self.n
        upper = [[0] * (n + 1) for _ in range(n + 1)]
        for i in range(n):
            held, worst = 0, 0
            for k in range(i + 1, n + 1):
                inside, end = self.stage_costs(i, k, held)
                upper[i][k] = max(worst, end)
                worst = max(worst, inside)
                held += self.c[k]
        return upper

    def held_bytes(self, k: int, stored: bool) -> int:
        """Bytes checkpoint k holds from the forward until its stage's backward."""
        return self.d[k] + (self.a[k] if stored else 0)

    def recompute_time(self, i: int, j: int, stored: bool = False) -> float:
        """Time the backward spends recomputing segment (i, j]: stages i+1..j-1 whole and
        what stage j's backward reads (nothing if stage j is stored); nothing without a
        backward."""
        if not self.has_backward:
            return 0.0
        return float(self.between[i, j]) + (0.0 if stored else self.ti[j])

    @cached_property
    def between(self) -> np.ndarray:
        """between[i, j] = forward time of stages i+1..j-1, for 0 <= i < j <= n. O(n^2)."""
        table = np.zeros((self.n + 1, self.n + 1))
        for i in range(self.n):
            elapsed = 0.0
            for j in range(i + 1, self.n + 1):
                table[i, j] = elapsed
                elapsed += self.t[j]
        return table

    def recompute_times(self, j: int, stored: bool) -> np.ndarray:
        """recompute_time(i, j, stored) for every i < j."""
        if not self.has_backward:
            return np.zeros(j)
        return self.between[:j, j] + (0.0 if stored else self.ti[j])

    def model_peak(self, checkpoints: Iterable[int], stored: Collection[int] = ()) -> int:
        """The chain model's peak for a checkpoint set (stage indices; n is always added):
        max over consecutive checkpoints i < j of (bytes of checkpoints <= i) + U(i, j).
        O(n), written apart from segment_costs so that tests can check one with the other."""
        ends = set(checkpoints) | {self.n}
        peak, saved, start, held, worst = 0, 0, 0, 0, 0
        for k in range(1, self.n + 1):
            inside, end = self.stage_costs(start, k, held)
            if k in ends:
                peak = max(peak, saved + worst, saved + end)
                saved += self.held_bytes(k, k in stored)
                start, held, worst = k, 0, 0
            else:
                worst = max(worst, inside)
                held += self.c[k]
        return max(peak, saved)

    def model_time(self, checkpoints: Iterable[int], stored: Collection[int] = ()) -> float:
        """The chain model's recompute time for a checkpoint set."""
        chosen = [0, *sorted(set(checkpoints) | {self.n})]
        return sum(self.recompute_time(i, j, j in stored) for i, j in itertools.pairwise(chosen))


def forward_nodes(graph: Graph, problem: str) -> list[int]:
    """The nodes the chain is made of: training, the forward compute nodes; general,
    every node not labelled backward (all of them in a graph with no labels)."""
    if problem == "training":
        return list(graph.forward_ids)
    return [v.id for v in graph if not v.is_backward and not v.is_resident_input]


def cut_points(graph: Graph, forward: Sequence[int]) -> list[int]:
    """Forward nodes whose output alone is live across them in the reference order: no
    forward edge u -> w with u before and w after them. The last forward node always is."""
    position = {v: p for p, v in enumerate(forward)}
    crossing = [0] * (len(forward) + 1)  # difference array of edges spanning each position
    for v in forward:
        for u in dict.fromkeys(graph[v].inputs):
            if u in position and position[v] - position[u] > 1:
                crossing[position[u] + 1] += 1
                crossing[position[v]] -= 1
    cuts, spanning = [], 0
    for p, v in enumerate(forward):
        spanning += crossing[p]
        if spanning == 0:
            cuts.append(v)
    return cuts


def build_chain(graph: Graph, problem: str) -> Chain:
    """The chain of cut points of the forward graph with the per-stage sizes and times."""
    forward = forward_nodes(graph, problem)
    cuts = cut_points(graph, forward)
    stages, keep = _stages(graph, forward, cuts)
    stage_of = {v: k for k, members in enumerate(stages, start=1) for v in members}
    read = _read_by_backward(graph, stage_of)
    d, a, c, fw, t, ti = [0], [0], [0], [0], [0.0], [0.0]
    for members, kept in zip(stages, keep, strict=True):
        others = [v for v in members if v not in kept and v in read]
        d.append(_storage_bytes(graph, kept))
        a.append(_storage_bytes(graph, [*kept, *others]) - d[-1])
        c.append(_storage_bytes(graph, [v for v in members if v in read]))
        fw.append(_stage_forward_peak(graph, members, kept))
        t.append(sum((graph[v].time for v in members), 0.0))
        ti.append(sum((graph[v].time for v in _ancestors_within(graph, members, others)), 0.0))
    h, reach = _backward_terms(graph, problem, stage_of, keep)
    return Chain(
        cuts=tuple(cuts),
        stages=tuple(stages),
        keep=tuple(keep),
        d=tuple(d),
        a=tuple(a),
        c=tuple(c),
        fw=tuple(fw),
        h=tuple(h),
        t=tuple(t),
        ti=tuple(ti),
        reach=tuple(reach),
        has_backward=bool(graph.backward_ids),
    )


def _stages(
    graph: Graph, forward: Sequence[int], cuts: Sequence[int]
) -> tuple[list[tuple[int, ...]], list[tuple[int, ...]]]:
    """The stages (forward nodes up to each cut) and what a checkpoint at each keeps: the
    cut and the outputs carved from it, which move into the cut's stage (they hold its
    bytes: keeping the cut alone would keep none of them)."""
    carved = graph.carved_outputs
    members_of_forward = set(forward) - set(cuts)  # an output that is a cut stays one
    taken = {u for v in cuts for u in carved.get(v, ()) if u in members_of_forward}
    stages: list[tuple[int, ...]] = []
    keep: list[tuple[int, ...]] = []
    start = 0
    for cut in cuts:
        end = forward.index(cut, start) + 1
        outputs = tuple(u for u in carved.get(cut, ()) if u in members_of_forward)
        members = [v for v in forward[start:end] if v not in taken]
        stages.append((*members, *outputs))
        keep.append((cut, *outputs))
        start = end
    return stages, keep


def _storage_bytes(graph: Graph, nodes: Iterable[int]) -> int:
    """Bytes of the storages that keeping `nodes` holds: each owner once (a view pins its
    owner's), none for resident inputs, and an output carved from a kept owner is part of
    that owner's bytes."""
    owners = {graph.storage_owner[v] for v in nodes}
    return sum(
        graph[o].bytes
        for o in owners
        if not graph[o].is_resident_input
        and not (
            graph[o].carved_from is not None and graph.storage_owner[graph[o].carved_from] in owners
        )
    )


def _read_by_backward(graph: Graph, stage_of: dict[int, int]) -> set[int]:
    """The chain's nodes that some node labelled backward reads."""
    return {v for v in stage_of if any(graph[u].is_backward for u in graph.users[v])}


def _ancestors_within(graph: Graph, members: Sequence[int], targets: Iterable[int]) -> set[int]:
    """`targets` and their ancestors among `members`: what recomputing them runs."""
    inside = set(members)
    found = set(targets)
    for v in sorted(members, reverse=True):
        if v in found:
            found.update(u for u in graph[v].inputs if u in inside)
    return found


def _backward_terms(
    graph: Graph, problem: str, stage_of: dict[int, int], keep: Sequence[tuple[int, ...]]
) -> tuple[list[int], list[bool]]:
    """h and reach per stage. A backward node belongs to the last stage it reads (one
    that reads none to the stage of the node before it, at first the last stage)."""
    n = len(keep)
    h, reach = [0] * (n + 1), [False] * (n + 1)
    live = _live_outside(graph, problem, set(stage_of))
    current = n
    for u in graph.backward_ids:
        inputs = dict.fromkeys(graph[u].inputs)
        read = [stage_of[s] for s in inputs if s in stage_of]
        current = max(read) if read else current
        kept = set(keep[current - 1]) if current else set()
        reach[current] = reach[current] or any(s in stage_of and s not in kept for s in inputs)
        h[current] = max(h[current], live.get(u, 0))
    return h, reach


def _live_outside(graph: Graph, problem: str, chain_nodes: set[int]) -> dict[int, int]:
    """Per node, the bytes of values outside the chain (gradients, the parameter
    gradients made so far, tangents) live just after it runs: the simulator's count on
    the schedule that recomputes nothing, with the chain and resident inputs weighing 0."""
    nodes = tuple(
        dataclasses.replace(v, bytes=0) if v.id in chain_nodes or v.is_resident_input else v
        for v in graph
    )
    weightless = Graph(nodes=nodes, outputs=graph.outputs, name=graph.name)
    if problem == "training":
        schedule = build_schedule(weightless, {})
    else:
        sequence = [v.id for v in graph if not v.is_resident_input]
        schedule = remat.to_schedule(weightless, sequence)
    trace = simulate(weightless, schedule)
    return {
        step.node: live
        for step, live in zip(schedule.steps, trace.live, strict=True)
        if isinstance(step, Compute)
    }


def _stage_forward_peak(graph: Graph, members: Sequence[int], kept: Collection[int]) -> int:
    """Peak bytes of running a stage's nodes in order, each freed after its last read
    inside the stage (the checkpoint's nodes stay), each holding its workspace as it runs.
    Carved outputs take their bytes out of their producer's, so they add none."""
    inside = set(members)
    last_read = {v: v for v in members}
    for v in members:
        for u in graph[v].inputs:
            if u in inside:
                last_read[u] = max(last_read[u], v)
    frees: dict[int, list[int]] = {}
    for v in members:
        if v not in kept:
            frees.setdefault(last_read[v], []).append(v)
    sizes = {v: 0 if graph[v].carved_from is not None else graph[v].bytes for v in members}
    live = peak = 0
    for v in members:
        live += sizes[v]
        peak = max(peak, live + graph[v].workspace)
        live -= sum(sizes[u] for u in frees.get(v, ()))
    return peak
