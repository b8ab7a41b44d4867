"""The training formulation: per-tensor decisions (keep, recompute, offload) -> a Schedule.

The forward runs once in order. In the backward, each forward tensor a backward node reads
is either still resident (keep), recomputed with its chain of missing ancestors just before
its first use (recompute), or prefetched from its host copy early enough to land before
that use (offload). Every training solver emits decisions and lets this module build the
schedule, so that all of them are judged on the same footing.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from memplan.core.errors import InvalidSchedule
from memplan.core.graph import (
    Compute,
    Decision,
    Free,
    Graph,
    NodeKind,
    Offload,
    Prefetch,
    Schedule,
    Step,
    Wait,
    with_frees,
)
from memplan.core.simulate import MemoryTrace, simulate


def decider(
    graph: Graph, decisions: Mapping[int, Decision], *, read_pinned: bool = False
) -> Callable[[int], Decision]:
    """The decision for any forward node. Candidates (forward tensors the backward reads)
    and nodes that cannot be recomputed default to keep; other nodes are dropped after the
    forward and recomputed if a recompute chain needs them. With `read_pinned`, a node a
    kept candidate pins (pinned_owners) counts as kept: how solvers estimate a chain's
    cost, as build_schedule reads such a node while the candidate is still to be read."""
    candidates = frozenset(graph.saved_candidates)
    pinned = frozenset(pinned_owners(graph, decisions)) if read_pinned else frozenset()

    def decision(v: int) -> Decision:
        if v in decisions:
            return decisions[v]
        if v in candidates or v in pinned or not graph[v].recomputable:
            return Decision.KEEP
        return Decision.RECOMPUTE

    return decision


def pinned_owners(graph: Graph, decisions: Mapping[int, Decision]) -> dict[int, list[int]]:
    """Forward nodes that are no candidate but whose storage a kept candidate pins (the
    candidate is a view of them: a batch norm's saved mean, under Inductor's decomposition,
    is a squeeze of the mean its forward subtracts), with those candidates. While such a
    candidate is still to be read, its owner is on the device: a recompute chain can read
    it instead of running it (and a batch norm's reduction) again, at no memory."""
    candidates = frozenset(graph.saved_candidates)
    owners: dict[int, list[int]] = {}
    for w in graph.saved_candidates:
        owner = graph.storage_owner[w]
        node = graph[owner]
        if (
            owner in candidates
            or node.kind is not NodeKind.COMPUTE
            or node.is_backward
            or decisions.get(w, Decision.KEEP) is not Decision.KEEP
        ):
            continue
        owners.setdefault(owner, []).append(w)
    return owners


def build_schedule(
    graph: Graph,
    decisions: Mapping[int, Decision],
    *,
    bandwidth: float | None = None,
) -> Schedule:
    """The schedule that carries out `decisions` (missing entries take default_decision)."""
    decision = decider(graph, decisions)
    forward: list[Step] = []
    for v in graph.forward_ids:
        forward.append(Compute(v))
        if decision(v) is Decision.OFFLOAD:
            if bandwidth is None:
                raise InvalidSchedule(f"offloading {graph[v].name} needs a host link bandwidth")
            forward.append(Offload(v))

    available = set(graph.resident_inputs) | set(graph.outputs)
    available.update(v for v in graph.forward_ids if decision(v) is Decision.KEEP)
    backward: list[Step] = [Compute(t) for t in graph.tangent_ids]
    available.update(graph.tangent_ids)
    driven = graph.gradient_driven
    pinned_until = _pinned_until(graph, decisions, driven)
    # Backward nodes that read no gradient (views and transposes of saved tensors) are run
    # on demand, as the autograd engine would, so they do not extend lifetimes.
    for position, u in enumerate(driven):
        _materialise(graph, u, decision, available, backward, pinned_until, position)
        backward.append(Compute(u))
        available.add(u)
    for out in graph.outputs:
        if out not in available:
            _materialise(graph, out, decision, available, backward)
            backward.append(Compute(out))
            available.add(out)

    if bandwidth is not None:
        backward = _with_prefetches(graph, backward, bandwidth)
    # The autograd engine holds the incoming gradients until the backward returns.
    steps = with_frees(graph, forward + backward, keep=graph.tangent_ids)
    return Schedule(steps=tuple(steps), backward_start=_split_index(steps, len(forward)))


def simulate_decisions(
    graph: Graph, decisions: Mapping[int, Decision], bandwidth: float | None
) -> tuple[Schedule, MemoryTrace]:
    """The schedule that carries out `decisions` and the simulator's trace of it."""
    schedule = build_schedule(graph, decisions, bandwidth=bandwidth)
    return schedule, simulate(graph, schedule, bandwidth=bandwidth)


def _pinned_until(
    graph: Graph, decisions: Mapping[int, Decision], driven: Sequence[int]
) -> dict[int, int]:
    """Pinned owners (pinned_owners), each with the last position in `driven` at which its
    storage is read through a view (a kept candidate, or a view the backward takes of
    one): up to there, reading the owner keeps no storage alive that would not be anyway.
    A backward node run on demand reads at the position of its first driven consumer."""
    owners = pinned_owners(graph, decisions)
    if not owners:
        return {}
    position = {u: i for i, u in enumerate(driven)}
    for n in reversed(graph.backward_ids):
        if n not in position:
            needs = [position[u] for u in graph.users[n] if u in position]
            if needs:
                position[n] = min(needs)
    until: dict[int, int] = {}
    for n, at in position.items():
        for s in graph[n].inputs:
            owner = graph.storage_owner[s]
            if owner in owners and s != owner:
                until[owner] = max(until.get(owner, at), at)
    return until


def _materialise(
    graph: Graph,
    target: int,
    decision: Callable[[int], Decision],
    available: set[int],
    out: list[Step],
    pinned_until: Mapping[int, int] | None = None,
    position: int = 0,
) -> None:
    """Append the steps that bring every input of `target` onto the device; a node of
    `pinned_until` is on it already while `position` (in the gradient-driven order) is
    at most its entry, held by a kept view (_pinned_until).

    An iterative post-order walk: a node is emitted once all of its own inputs are
    available, so recompute chains come out in topological order.
    """
    carved = graph.carved_outputs
    pinned_until = pinned_until or {}

    def on_device(v: int) -> bool:
        return v in available or pinned_until.get(v, -1) >= position

    stack: list[tuple[int, bool]] = [(s, False) for s in reversed(graph[target].inputs)]
    while stack:
        v, inputs_done = stack.pop()
        if on_device(v):
            continue
        choice = decision(v)
        if choice is Decision.OFFLOAD:
            out.append(Wait(v))
            available.add(v)
        elif inputs_done:
            out.append(Compute(v))
            available.add(v)
            # A multi-output op's result holds all its outputs until every one is taken
            # out of it: take them all at once, so that the result dies here and an output
            # nobody needs is freed at once instead of riding along until a later use.
            # Those a recomputation does not make (BatchNorm's updated running statistics,
            # passes/recompute.py) are the forward's alone.
            for child in carved.get(v, ()):
                runs_again = graph[child].recomputable or graph[child].is_backward
                if child not in available and runs_again:
                    out.append(Compute(child))
                    available.add(child)
        else:
            node = graph[v]
            if node.kind is not NodeKind.COMPUTE:
                raise InvalidSchedule(f"{node.name} is needed before it can be computed")
            if not node.recomputable and not node.is_backward:
                raise InvalidSchedule(
                    f"{node.name} must be kept or offloaded: {node.op} cannot be recomputed"
                )
            stack.append((v, True))
            stack.extend((s, False) for s in reversed(node.inputs) if not on_device(s))


def _with_prefetches(graph: Graph, backward: list[Step], bandwidth: float) -> list[Step]:
    """Issue each prefetch early enough that its transfer hides under the compute before
    its Wait: walk back over that compute until it covers bytes / bandwidth."""
    issue_before: dict[int, list[int]] = {}
    for index, step in enumerate(backward):
        if not isinstance(step, Wait):
            continue
        need = graph[step.node].bytes / bandwidth
        position = index
        while position > 0 and need > 0:
            position -= 1
            previous = backward[position]
            if isinstance(previous, Compute):
                need -= graph[previous.node].time
        issue_before.setdefault(position, []).append(step.node)
    out: list[Step] = []
    for index, step in enumerate(backward):
        out.extend(Prefetch(v) for v in issue_before.get(index, ()))
        out.append(step)
    return out


def _split_index(steps: list[Step], forward_len: int) -> int:
    """Index of the first backward step: after the forward's steps and the Frees they cause."""
    seen = 0
    for index, step in enumerate(steps):
        if isinstance(step, Free):
            continue
        if seen == forward_len:
            return index
        seen += 1
    return len(steps)


def recompute_chain_time(
    graph: Graph,
    roots: list[int],
    decision: Callable[[int], Decision],
    stop_at: int | None = None,
) -> float:
    """Time to recompute `roots` and every ancestor that would not be resident in the
    backward; infinite if the chain needs a node that cannot be recomputed."""
    seen: set[int] = set()
    stack = list(roots)
    total = 0.0
    while stack:
        v = stack.pop()
        if v in seen or v == stop_at:
            continue
        seen.add(v)
        node = graph[v]
        if node.kind is not NodeKind.COMPUTE:
            continue
        if v not in roots and decision(v) is not Decision.RECOMPUTE:
            continue
        if not node.recomputable:
            return math.inf
        total += node.time
        stack.extend(node.inputs)
    return total


def exposed_round_trip(graph: Graph, owner: int, hidden: float, bandwidth: float) -> float:
    """What offloading `owner` and prefetching it back adds to the step: the host calls of
    both transfers (Graph.transfer_seconds), which nothing hides, and the part of the
    copies (2 x bytes / bandwidth) that does not hide under `hidden` seconds of compute."""
    copies = max(0.0, 2 * graph[owner].bytes / bandwidth - hidden)
    return 2 * graph.transfer_seconds + copies


def saved_storages(graph: Graph) -> dict[int, list[int]]:
    """Forward storages the backward reads: owner -> its saved members (the owner and views
    of it), in id order. A storage is released as one, since a saved view pins it."""
    groups: dict[int, list[int]] = {}
    for v in graph.saved_candidates:
        owner = graph.storage_owner[v]
        if graph[owner].kind is NodeKind.COMPUTE and not graph[owner].is_backward:
            groups.setdefault(owner, []).append(v)
    return groups


def position_profile(graph: Graph, schedule: Schedule, trace: MemoryTrace) -> np.ndarray:
    """The simulated memory per node position: forward steps count at the forward node
    they follow, backward steps (recomputes, prefetches) at the backward node they lead
    up to; positions with no step of their own stay 0."""
    out = np.zeros(len(graph), dtype=np.int64)
    steps = schedule.steps
    split = schedule.split
    current = 0
    for index in range(split):
        step = steps[index]
        if isinstance(step, Compute):
            current = step.node
        out[current] = max(out[current], trace.live[index])
    current = len(graph) - 1
    for index in range(len(steps) - 1, split - 1, -1):
        step = steps[index]
        if isinstance(step, Compute) and (
            graph[step.node].is_backward or graph[step.node].kind is NodeKind.TANGENT
        ):
            current = step.node
        out[current] = max(out[current], trace.live[index])
    return out
