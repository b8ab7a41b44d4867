"""The simulator: the single judge of a Schedule's validity, peak memory and step time.

Memory is counted per storage instance, as the device allocator sees it: each allocation
(a Compute of a storage owner, a Prefetch) opens an instance, views join the instance of
what they are made from, and the instance's bytes are freed when its last member dies.
A Compute also holds its node's workspace (the kernel's own buffers) for its step only,
every time the node runs. Offloads and prefetches run on one copy stream that overlaps
compute at a given host link bandwidth; the host calls that start each of them take the
graph's `transfer_seconds` of compute-stream time (between two kernels the host launches,
nothing else is launched). No torch here: solvers call it too.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass, field

from memplan.core.errors import InvalidSchedule
from memplan.core.graph import (
    Compute,
    Free,
    Graph,
    Node,
    NodeKind,
    Offload,
    Prefetch,
    Schedule,
    Step,
    Wait,
)


@dataclass(frozen=True)
class Allocation:
    """One storage instance's device bytes and the steps they are live in.

    Live after steps start..end-1, the way MemoryTrace.live counts: `start` is the step
    that allocated it (-1: resident before the first step) and `end` the step that freed
    it (the schedule's length: still live at the end). `node` made the allocation. A
    carved output is its own allocation from its producer's start, and the producer's
    allocation is what it keeps, so the bytes live at each step match MemoryTrace.live. A
    node's workspace is an allocation of its own, live in its step only.
    """

    node: int
    bytes: int
    start: int
    end: int
    workspace: bool = False  # the node's own buffers while it runs: nothing can release it


@dataclass(frozen=True)
class MemoryTrace:
    """What simulating a schedule predicts.

    live[i] is the most device bytes held during step i (what is live after it, plus a
    computed node's workspace while it runs) and clock[i] the compute-stream time after it.
    """

    peak: int
    peak_step: int
    time: float
    stall: float  # compute-stream time spent waiting on the copy stream
    live: tuple[int, ...]
    clock: tuple[float, ...]
    live_at_peak: frozenset[int]  # nodes with a device copy at the peak step
    baseline: int  # bytes resident before the first step
    # Builds `allocations`; kept as a function so that solvers, which simulate often and
    # never read them, do not pay for building them.
    recorded: Callable[[], tuple[Allocation, ...]] = field(default=tuple, repr=False, compare=False)

    @functools.cached_property
    def allocations(self) -> tuple[Allocation, ...]:
        """Every storage instance, in allocation order."""
        return self.recorded()


class _State:
    """Mutable bookkeeping of one simulation run.

    Bytes are accounted per storage *instance*, not per storage owner: recomputing (or
    prefetching) an owner while an old view of its previous copy is still alive makes a fresh
    allocation, separate from the old one the view pins. So each allocation opens an
    instance; a view joins the instance of the copy it is made from; an instance's bytes are
    released when its last member (the allocating copy or any view of it) is freed.
    """

    def __init__(self, graph: Graph, bandwidth: float | None) -> None:
        self.graph = graph
        self.bandwidth = bandwidth or 0.0
        self.owner = graph.storage_owner
        self.resident: set[int] = set()  # nodes with a usable device copy
        # Each time a node gains (True) or loses (False) a device copy or a prefetch in
        # flight, in order: the nodes on the device at any step are replayed from it, far
        # cheaper than copying the set at each new peak (every step of a forward).
        self.arrivals: list[tuple[int, bool]] = []
        self.in_flight: dict[int, float] = {}  # prefetching node -> landing time
        self.instance: dict[int, int] = {}  # node with a device copy -> its storage instance
        self.members: dict[int, int] = {}  # live storage instance -> live copies in it
        self.account: dict[int, int] = {}  # live storage instance -> bytes it holds now
        self.newest: dict[int, int] = {}  # storage owner -> the last instance opened for it
        self.opened = 0  # storage instances opened so far (the next one's id)
        self.step = -1  # the step being simulated; -1 before the first
        self.maker: dict[int, int] = {}  # storage instance -> the node that allocated it
        self.since: dict[int, int] = {}  # storage instance -> the step that allocated it
        self.freed: dict[int, tuple[int, int]] = {}  # released instance -> (step, bytes)
        self.workspaces: list[Allocation] = []  # each Compute's workspace, for its step
        self.host_ready: dict[int, float] = {}  # offloaded node -> time its host copy is whole
        self.offload_end: dict[int, float] = {}  # device copy busy being read until then
        self.memory = 0
        self.now = 0.0
        self.copy_free = 0.0
        self.stall = 0.0

    def hold(self, node: int, new_bytes: int, instance: int | None = None) -> None:
        """Give `node` a device copy in `instance`, or in a new instance if None."""
        if instance is None:
            instance, self.opened = self.opened, self.opened + 1
            self.members[instance], self.account[instance] = 0, 0
            self.newest[self.owner[node]] = instance
            self.maker[instance], self.since[instance] = node, self.step
        self.instance[node] = instance
        self.members[instance] += 1
        self.account[instance] += new_bytes
        self.memory += new_bytes

    def release(self, node: int) -> None:
        instance = self.instance.pop(node)
        self.members[instance] -= 1
        if self.members[instance] == 0:
            del self.members[instance]
            held = self.account.pop(instance)
            self.memory -= held
            self.freed[instance] = (self.step, held)

    def allocations(self, steps: int) -> tuple[Allocation, ...]:
        """Every instance opened, in opening order, with the bytes it holds last (carvings
        taken out); then every workspace, in step order."""
        ends = {**self.freed, **{i: (steps, held) for i, held in self.account.items()}}
        instances = [
            Allocation(node, ends[i][1], self.since[i], ends[i][0])
            for i, node in self.maker.items()
        ]
        return (*instances, *self.workspaces)

    def view_instance(self, v: int) -> int | None:
        """The live storage instance view `v` joins when it is made now, None if there is none.

        That of the first input in v's storage with a device copy (a view is made from its
        first such input; lowered graphs name the owner as `alias_of` even for a view of a
        view), else that of `alias_of`, else the newest instance of the storage if still live.
        """
        node = self.graph[v]
        for source in (*node.inputs, node.alias_of):
            if source in self.instance and self.owner[source] == self.owner[v]:
                return self.instance[source]
        newest = self.newest.get(self.owner[v])
        return newest if newest in self.members else None

    def transfer(self, node: int, ready: float) -> float:
        """Queue a copy of the node's storage on the copy stream; return when it ends."""
        start = max(self.copy_free, self.now, ready)
        self.copy_free = start + self.graph[node].bytes / self.bandwidth
        return self.copy_free


def simulate(
    graph: Graph,
    schedule: Schedule,
    *,
    bandwidth: float | None = None,
    budget: int | None = None,
) -> MemoryTrace:
    """Run the schedule on the model of the device; raise InvalidSchedule if it is invalid.

    `bandwidth` (bytes/s) is the host link; schedules with transfers need it. With a
    `budget`, a peak above it is an error too.
    """
    state = _State(graph, bandwidth)
    for v in graph.resident_inputs:
        state.resident.add(v)
        state.arrivals.append((v, True))
        if graph[v].alias_of is None:
            state.hold(v, graph[v].bytes)
        else:
            state.hold(v, 0, state.view_instance(v))
    baseline = state.memory
    peak, peak_step, arrivals_at_peak = baseline, -1, len(state.arrivals)
    live: list[int] = []
    clock: list[float] = []
    nodes, count = graph.nodes, len(graph)  # read at every step

    for index, step in enumerate(schedule.steps):
        state.step = index
        node = nodes[step.node] if 0 <= step.node < count else None
        if node is None:
            raise InvalidSchedule(f"step {index}: unknown node id {step.node}")
        held = 0  # a computed node's workspace, held during its step only
        if isinstance(step, Compute):
            _compute(state, step, node, index)
            held = node.workspace if node.kind is NodeKind.COMPUTE else 0
            if held:
                state.workspaces.append(Allocation(step.node, held, index, index + 1, True))
        elif isinstance(step, Free):
            if step.node not in state.resident:
                raise _invalid(graph, index, step, "frees a node with no device copy")
            if node.is_resident_input:
                raise _invalid(graph, index, step, "frees a resident input")
            busy_until = state.offload_end.pop(step.node, 0.0)
            if busy_until > state.now:  # the copy stream still reads this storage
                state.stall += busy_until - state.now
                state.now = busy_until
            state.resident.discard(step.node)
            state.arrivals.append((step.node, False))
            state.release(step.node)
        elif isinstance(step, Offload):
            _need_link(bandwidth, graph, index, step)
            if step.node not in state.resident or not node.offloadable:
                raise _invalid(
                    graph, index, step, "offloads a node that is absent or not offloadable"
                )
            state.now += graph.transfer_seconds
            end = state.transfer(step.node, state.now)
            state.host_ready[step.node] = end
            state.offload_end[step.node] = end
        elif isinstance(step, Prefetch):
            _need_link(bandwidth, graph, index, step)
            if step.node not in state.host_ready:
                raise _invalid(graph, index, step, "prefetches a node that was never offloaded")
            if step.node in state.resident or step.node in state.in_flight:
                raise _invalid(graph, index, step, "prefetches a node already on the device")
            state.now += graph.transfer_seconds
            state.in_flight[step.node] = state.transfer(step.node, state.host_ready[step.node])
            state.arrivals.append((step.node, True))
            state.hold(step.node, node.bytes)  # lands in a fresh allocation
        elif isinstance(step, Wait):
            if step.node not in state.in_flight:
                raise _invalid(graph, index, step, "waits on a node with no prefetch in flight")
            landed = state.in_flight.pop(step.node)
            if landed > state.now:
                state.stall += landed - state.now
                state.now = landed
            state.resident.add(step.node)
        if state.memory + held > peak:
            peak, peak_step = state.memory + held, index
            arrivals_at_peak = len(state.arrivals)
        live.append(state.memory + held)
        clock.append(state.now)

    missing = [graph[v].name for v in graph.outputs if v not in state.resident]
    if missing:
        raise InvalidSchedule(f"outputs not on the device at the end: {', '.join(missing[:5])}")
    if budget is not None and peak > budget:
        raise InvalidSchedule(f"peak {peak} B at step {peak_step} exceeds the budget of {budget} B")
    return MemoryTrace(
        peak=peak,
        peak_step=peak_step,
        time=state.now,
        stall=state.stall,
        live=tuple(live),
        clock=tuple(clock),
        live_at_peak=_on_device(state.arrivals[:arrivals_at_peak]),
        baseline=baseline,
        recorded=functools.partial(state.allocations, len(schedule.steps)),
    )


def _compute(state: _State, step: Compute, node: Node, index: int) -> None:
    graph = state.graph
    v = step.node
    if node.is_resident_input:
        raise _invalid(graph, index, step, "computes a resident input")
    if v in state.resident or v in state.in_flight:
        raise _invalid(graph, index, step, "computes a node whose previous copy is still live")
    for source in node.inputs:
        if source not in state.resident:
            raise _invalid(graph, index, step, f"input {graph[source].name} is not on the device")
    if node.carved_from is not None:
        # A carved output owns its bytes: they move out of the producer's current instance
        # into a new instance of the carved node's own.
        if node.carved_from not in state.resident:
            parent = state.owner[node.carved_from]
            raise _invalid(graph, index, step, f"carved from {graph[parent].name}, which is absent")
        parent_instance = state.instance[node.carved_from]
        taken = min(node.bytes, state.account[parent_instance])
        state.account[parent_instance] -= taken
        state.memory -= taken
        state.hold(v, taken)
        # The carved bytes were allocated with the producer's instance, not now.
        state.since[state.instance[v]] = state.since[parent_instance]
    elif node.alias_of is not None:
        instance = state.view_instance(v)
        if instance is None:
            raise _invalid(
                graph, index, step, f"views storage of {graph[state.owner[v]].name}, freed"
            )
        state.hold(v, 0, instance)
    else:
        state.hold(v, node.bytes)  # a fresh allocation, even if old views pin an older copy
    state.resident.add(v)
    state.arrivals.append((v, True))
    if node.kind is NodeKind.COMPUTE:
        state.now += node.time


def _need_link(bandwidth: float | None, graph: Graph, index: int, step: Step) -> None:
    if bandwidth is None or bandwidth <= 0:
        raise _invalid(graph, index, step, "a transfer needs a host link bandwidth")


def _invalid(graph: Graph, index: int, step: Step, what: str) -> InvalidSchedule:
    """The error for step `index` of a schedule, saying where it fails: made only on
    failing, as the simulations solvers run by the thousand mostly do not."""
    return InvalidSchedule(f"step {index} ({type(step).__name__} {graph[step.node].name}): {what}")


def _on_device(arrivals: list[tuple[int, bool]]) -> frozenset[int]:
    """The nodes with a device copy or a prefetch in flight after `arrivals` (_State)."""
    present: set[int] = set()
    for v, arrived in arrivals:
        if arrived:
            present.add(v)
        else:
            present.discard(v)
    return frozenset(present)
