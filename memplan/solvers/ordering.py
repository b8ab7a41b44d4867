"""Memory-aware topological orders for the general problem.

The reference order is one topological order among many and rarely the one that holds
least: on the bundled 250-node layered graph an order found here peaks at about 0.72 of
the reference order's peak, with no recomputation at all. The director and the exact
solvers start from the order they are given, so a better order is worth more to them
than any recomputation they add afterwards.

Two seeded stages. A randomized greedy builds orders by computing, among the ready
nodes, the one that adds the fewest bytes (its output less the inputs it is the last to
read), the first without noise and the others with noise in proportion to its size; the
least-peak of GREEDY_STARTS is kept. Simulated annealing then moves one node at a time to
another position between its last input and its first user, minimizing the bytes held
above the target summed over the steps (zero exactly when the order fits). Minimizing the
peak, the annealing is steered by the bytes above a target below the start's peak, but the
order it returns is the least-peak one it met, so never one above its start. The work is a
fixed number of moves, so the same seed and graph give the same order whenever the search
finishes before its deadline.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Sequence
from dataclasses import replace

import numpy as np

from memplan.core.graph import Graph

# Greedy orders built before annealing; the least-peak one is the start.
GREEDY_STARTS = 30
# Noise of the greedy's choice, in units of the candidate's own bytes.
GREEDY_NOISE = 1.0
# Annealing moves on an n-node graph: MOVES_PER_NODE * n, at most MOVES, and at most
# MOVE_WORK / n (a move costs O(n) to score), so a search takes a few seconds at 100 to
# 1,000 nodes and a small graph few moves.
MOVES_PER_NODE = 2_000
MOVES = 200_000
MOVE_WORK = 40_000_000
# The starting temperature in units of the mean node's bytes (falls linearly to 0). Low
# temperatures stall in the first local optimum: at 1 the 100-node layered graph stays
# at 0.92 of its reference peak, at 10 it reaches 0.79.
TEMPERATURE = 10.0
# Minimizing the peak (no target), the target is this share of the greedy start's peak:
# the bytes above it weigh the steps nearest the peak most.
LEAST_PEAK_TARGET = 0.8


def reordered(graph: Graph, order: Sequence[int]) -> Graph:
    """`graph` with its ids renumbered so that `order` (a topological order of its ids) is
    the reference order: node order[i] becomes node i. Sequences over the result map back
    through `order`."""
    new_id = {v: i for i, v in enumerate(order)}

    def mapped(v: int | None) -> int | None:
        return None if v is None else new_id[v]

    nodes = tuple(
        replace(
            graph[v],
            id=i,
            inputs=tuple(new_id[u] for u in graph[v].inputs),
            alias_of=mapped(graph[v].alias_of),
            carved_from=mapped(graph[v].carved_from),
        )
        for i, v in enumerate(order)
    )
    return replace(
        graph,
        nodes=nodes,
        outputs=tuple(new_id[v] for v in graph.outputs),
        source_ids=tuple(graph.source_ids[v] for v in order) if graph.source_ids else (),
    )


def order_peak(graph: Graph, order: Sequence[int]) -> int:
    """The peak of `order` without recomputation, by the rules of remat.score."""
    return int(_Profiler(graph).memory(_positions(order)).max(initial=0))


def searched_order(graph: Graph, target: int | None, seed: int, deadline: float) -> list[int]:
    """A topological order of `graph` that holds few bytes above `target` (None: a low
    peak), from the seeded greedy and annealing of the module docstring."""
    rng = random.Random(seed)
    profiler = _Profiler(graph)
    start, start_peak = [], math.inf
    for built in range(GREEDY_STARTS):
        if built and time.perf_counter() > deadline:
            break
        order = _greedy(graph, rng if built else None)
        peak = profiler.memory(_positions(order)).max(initial=0)
        if peak < start_peak:
            start, start_peak = order, peak
    least_peak = target is None
    if target is None:
        target = int(LEAST_PEAK_TARGET * start_peak)
    n = max(len(graph), 1)
    moves = min(MOVES, MOVE_WORK // n, MOVES_PER_NODE * n)
    return _anneal(profiler, start, target, moves, rng, deadline, least_peak)


def _positions(order: Sequence[int]) -> np.ndarray:
    positions = np.empty(len(order), dtype=np.int64)
    positions[np.asarray(order, dtype=np.int64)] = np.arange(len(order))
    return positions


class _Profiler:
    """Memory per step of an order given as each node's position, in O(n + edges) numpy."""

    def __init__(self, graph: Graph) -> None:
        n = len(graph)
        self.n = n
        self.bytes = np.array([node.bytes for node in graph], dtype=np.float64)
        self.workspace = np.array([node.workspace for node in graph], dtype=np.float64)
        self.inputs = [sorted(set(node.inputs)) for node in graph]
        self.users = [list(users) for users in graph.users]
        # Each node followed by its users, flattened: the last reader of v is the max of
        # the positions in its segment (v itself when nothing reads it).
        segments = [[v, *self.users[v]] for v in range(n)]
        self.flat = np.array([x for segment in segments for x in segment], dtype=np.int64)
        self.starts = np.cumsum([0] + [len(s) for s in segments[:-1]]).astype(np.int64)
        self.has_workspace = bool(self.workspace.any())

    def memory(self, positions: np.ndarray) -> np.ndarray:
        """Bytes resident at each step (a copy from its step through its last read). The
        annealing calls it once per move, so it makes few numpy calls (methods, not
        numpy's wrappers) and no sort: each node's workspace is scattered to its step."""
        if self.n == 0:
            return np.zeros(0)
        last = np.maximum.reduceat(positions.take(self.flat), self.starts)
        change = np.bincount(positions, self.bytes, self.n + 1)
        change -= np.bincount(last + 1, self.bytes, self.n + 1)
        memory = change[:-1].cumsum()
        if self.has_workspace:
            by_step = np.empty(self.n)
            by_step[positions] = self.workspace
            memory += by_step
        return memory


def _greedy(graph: Graph, rng: random.Random | None) -> list[int]:
    """A topological order that computes, among the ready nodes, the one adding the fewest
    bytes (a node nothing reads adds none past its step), with noise of up to GREEDY_NOISE
    times its own bytes when `rng` is given; ties go to the smaller node, then the lower
    id."""
    readers_left = [len(users) for users in graph.users]
    inputs_left = [len(set(node.inputs)) for node in graph]
    ready = [v for v in range(len(graph)) if inputs_left[v] == 0]
    outputs = set(graph.outputs)
    order: list[int] = []
    while ready:

        def added(v: int) -> tuple[float, int, int]:
            node = graph[v]
            freed = sum(graph[u].bytes for u in set(node.inputs) if readers_left[u] == 1)
            held = node.bytes if graph.users[v] or v in outputs else 0
            noise = rng.random() * GREEDY_NOISE * node.bytes if rng else 0.0
            return held - freed + noise, node.bytes, v

        v = min(ready, key=added)
        ready.remove(v)
        order.append(v)
        for u in set(graph[v].inputs):
            readers_left[u] -= 1
        for w in graph.users[v]:
            inputs_left[w] -= 1
            if inputs_left[w] == 0:
                ready.append(w)
    return order


def _anneal(
    profiler: _Profiler,
    start: list[int],
    target: int,
    moves: int,
    rng: random.Random,
    deadline: float,
    least_peak: bool,
) -> list[int]:
    """Simulated annealing over single-node moves from `start`, accepting moves by the bytes
    above `target` summed over steps. Returns the order seen with the fewest such bytes
    (then the least peak), or with `least_peak` the one with the least peak (then the
    fewest bytes): an order with less summed excess can peak higher."""
    n = profiler.n
    order = list(start)
    positions = _positions(order)

    def cost(memory: np.ndarray) -> tuple[float, float]:
        return float((memory - target).clip(min=0).sum()), float(memory.max(initial=0))

    def rank(found: tuple[float, float]) -> tuple[float, float]:
        return (found[1], found[0]) if least_peak else found

    current = cost(profiler.memory(positions))
    best, best_order = rank(current), list(order)
    temperature = TEMPERATURE * float(profiler.bytes.mean()) if n else 0.0
    for move in range(moves):
        if current[0] == 0 or (move % 256 == 0 and time.perf_counter() > deadline):
            break
        v = rng.randrange(n)
        here = int(positions[v])
        low = max((int(positions[u]) for u in profiler.inputs[v]), default=-1) + 1
        high = min((int(positions[u]) for u in profiler.users[v]), default=n) - 1
        if high <= low:
            continue
        there = rng.randint(low, high)
        if there == here:
            continue
        moved = order[:here] + order[here + 1 :]
        moved.insert(there, v)
        first, last = min(here, there), max(here, there)
        trial = positions.copy()
        trial[np.asarray(moved[first : last + 1])] = np.arange(first, last + 1)
        found = cost(profiler.memory(trial))
        heat = temperature * (1 - move / moves)
        if found <= current or (
            heat > 0 and rng.random() < math.exp(-(found[0] - current[0]) / heat)
        ):
            order, positions, current = moved, trial, found
            if rank(current) < best:
                best, best_order = rank(current), list(order)
    return best_order
