"""The solver-neutral IR: Graph, Node, Schedule and its steps, and what a solver returns.

Frozen dataclasses with no torch in them, and nothing of memplan but its errors. Solvers
take a Graph and return a Schedule; the simulator judges schedules; the torch-facing
stages produce and consume these.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from functools import cached_property

from memplan.core.errors import GraphError


class NodeKind(str, enum.Enum):
    """What a node is in the training step."""

    PARAM = "param"  # parameter or buffer: resident for the whole step
    INPUT = "input"  # user input: resident for the whole step
    TANGENT = "tangent"  # incoming gradient: materialised when the backward starts
    COMPUTE = "compute"  # an operation


class Decision(str, enum.Enum):
    """What happens to a forward tensor between its forward use and its backward use."""

    KEEP = "keep"
    RECOMPUTE = "recompute"
    OFFLOAD = "offload"


@dataclass(frozen=True)
class Node:
    """One value of the joint graph.

    `bytes` is the storage the node allocates when it runs. A view owns 0 bytes and keeps
    `alias_of` (the storage's owner) alive. A node `carved_from` a multi-output producer
    takes its bytes out of the producer's allocation instead of allocating anew.
    `workspace` is what the node's kernel holds while it runs beyond its inputs and output
    (its own buffers, layout copies), freed when it returns: every run of the node needs
    that room, a recomputation too. A `checkpointed` node is one the model's own
    activation checkpointing (torch.utils.checkpoint) recomputes in the backward: the step
    as written does, whatever a plan decides.
    """

    id: int
    name: str
    op: str
    inputs: tuple[int, ...] = ()
    bytes: int = 0
    time: float = 0.0
    kind: NodeKind = NodeKind.COMPUTE
    is_backward: bool = False
    alias_of: int | None = None
    carved_from: int | None = None
    recomputable: bool = True
    offloadable: bool = True
    workspace: int = 0
    checkpointed: bool = False

    @cached_property  # read for every step of every simulation
    def is_resident_input(self) -> bool:
        """Present before the step starts and never freed by it."""
        return self.kind in (NodeKind.PARAM, NodeKind.INPUT)


@dataclass(frozen=True)
class Graph:
    """A DAG of Nodes whose ids are 0..n-1 in a topological (reference) order.

    `outputs` stay resident until the end of the step (forward outputs held by the caller
    and the gradients the backward produces). `source_ids`, when set, maps each id to the
    node's id in the file it was loaded from (see load_node_link). `transfer_seconds` is
    the compute stream's time per transfer: the host calls that start an offload or a
    prefetch and order the compute stream on it, made between the kernels the host
    launches (measured by the profiler; 0 where unknown, as in the literature's graphs).
    """

    nodes: tuple[Node, ...]
    outputs: tuple[int, ...] = ()
    name: str = "graph"
    source_ids: tuple[int, ...] = ()
    transfer_seconds: float = 0.0

    def __post_init__(self) -> None:
        for index, node in enumerate(self.nodes):
            if node.id != index:
                raise GraphError(f"node {node.name!r} has id {node.id}, expected {index}")
            for source in node.inputs:
                if not 0 <= source < index:
                    raise GraphError(
                        f"node {node.name!r} reads {source}, which is not an earlier node"
                    )
            for ref, what in ((node.alias_of, "alias_of"), (node.carved_from, "carved_from")):
                if ref is not None and not 0 <= ref < index:
                    raise GraphError(f"node {node.name!r} has {what}={ref}, not an earlier node")
            if (
                node.bytes < 0
                or node.workspace < 0
                or not math.isfinite(node.time)
                or node.time < 0
            ):
                raise GraphError(f"node {node.name!r} has negative bytes, workspace or time")
        if not math.isfinite(self.transfer_seconds) or self.transfer_seconds < 0:
            raise GraphError(
                f"transfer_seconds must be finite and >= 0, got {self.transfer_seconds}"
            )
        if self.source_ids and len(self.source_ids) != len(self.nodes):
            raise GraphError("source_ids must name every node")
        for out in self.outputs:
            if not 0 <= out < len(self.nodes):
                raise GraphError(f"output {out} is not a node id")

    def __len__(self) -> int:
        return len(self.nodes)

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes)

    def __getitem__(self, node_id: int) -> Node:
        return self.nodes[node_id]

    @cached_property
    def users(self) -> tuple[tuple[int, ...], ...]:
        """users[v]: the nodes that read v, in increasing id order."""
        readers: list[list[int]] = [[] for _ in self.nodes]
        for node in self.nodes:
            for source in dict.fromkeys(node.inputs):
                readers[source].append(node.id)
        return tuple(tuple(r) for r in readers)

    @cached_property
    def storage_owner(self) -> tuple[int, ...]:
        """storage_owner[v]: the node whose allocation v's bytes live in (v itself if it owns)."""
        owner: list[int] = []
        for node in self.nodes:
            owner.append(owner[node.alias_of] if node.alias_of is not None else node.id)
        return tuple(owner)

    @cached_property
    def carved_outputs(self) -> dict[int, tuple[int, ...]]:
        """carved_outputs[v]: the nodes carved out of multi-output node v, in id order."""
        carved: dict[int, list[int]] = {}
        for node in self.nodes:
            if node.carved_from is not None:
                carved.setdefault(node.carved_from, []).append(node.id)
        return {parent: tuple(children) for parent, children in carved.items()}

    @cached_property
    def by_name(self) -> dict[str, int]:
        return {node.name: node.id for node in self.nodes}

    # Cached: solvers read these once per simulated schedule, and greedy simulates
    # hundreds of schedules of a graph of thousands of nodes.
    @cached_property
    def forward_ids(self) -> tuple[int, ...]:
        return tuple(n.id for n in self.nodes if n.kind is NodeKind.COMPUTE and not n.is_backward)

    @cached_property
    def backward_ids(self) -> tuple[int, ...]:
        return tuple(n.id for n in self.nodes if n.kind is NodeKind.COMPUTE and n.is_backward)

    @cached_property
    def resident_inputs(self) -> tuple[int, ...]:
        return tuple(n.id for n in self.nodes if n.is_resident_input)

    @cached_property
    def tangent_ids(self) -> tuple[int, ...]:
        """The incoming gradients of the backward."""
        return tuple(n.id for n in self.nodes if n.kind is NodeKind.TANGENT)

    @cached_property  # read by every schedule the training solvers build
    def gradient_driven(self) -> tuple[int, ...]:
        """Backward compute nodes with an incoming gradient among their ancestors, in
        order (the rest read saved tensors alone: views and transposes of them)."""
        driven = set(self.tangent_ids)
        for u in self.backward_ids:
            if any(s in driven for s in self.nodes[u].inputs):
                driven.add(u)
        return tuple(u for u in self.backward_ids if u in driven)

    @cached_property
    def saved_candidates(self) -> tuple[int, ...]:
        """Forward compute nodes that some backward node reads: what a planner decides on.

        Graph outputs are not candidates: they stay resident through the step anyway."""
        outputs = set(self.outputs)
        return tuple(
            v
            for v in self.forward_ids
            if v not in outputs and any(self.nodes[u].is_backward for u in self.users[v])
        )

    @property
    def total_time(self) -> float:
        return sum(n.time for n in self.nodes)

    def replace_times(
        self, times: Sequence[float], workspace: Sequence[int] | None = None
    ) -> Graph:
        """The same graph with node times (and workspaces, where given) replaced: the
        profiler's output."""
        if len(times) != len(self.nodes):
            raise GraphError(f"got {len(times)} times for {len(self.nodes)} nodes")
        held = [n.workspace for n in self.nodes] if workspace is None else list(workspace)
        if len(held) != len(self.nodes):
            raise GraphError(f"got {len(held)} workspaces for {len(self.nodes)} nodes")
        nodes = tuple(
            dataclasses.replace(n, time=float(t), workspace=int(w))
            for n, t, w in zip(self.nodes, times, held, strict=True)
        )
        return dataclasses.replace(self, nodes=nodes)


# --- schedule steps -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Compute:
    """Run the node (again, if it ran before: a recomputation)."""

    node: int


@dataclass(frozen=True, slots=True)
class Free:
    """Drop the device copy of the node."""

    node: int


@dataclass(frozen=True, slots=True)
class Offload:
    """Start a device-to-host copy of the node on the copy stream."""

    node: int


@dataclass(frozen=True, slots=True)
class Prefetch:
    """Start a host-to-device copy of the node's host copy on the copy stream."""

    node: int


@dataclass(frozen=True, slots=True)
class Wait:
    """Make the compute stream wait until the node's prefetch has landed."""

    node: int


Step = Compute | Free | Offload | Prefetch | Wait
STEP_TYPES: dict[str, type[Step]] = {
    cls.__name__.lower(): cls for cls in (Compute, Free, Offload, Prefetch, Wait)
}


@dataclass(frozen=True)
class Schedule:
    """An ordered list of steps over a Graph's nodes; the only thing a solver returns.

    `backward_start` is the index of the first step that belongs to the backward pass
    (len(steps) when the schedule is not split into a forward and a backward).
    """

    steps: tuple[Step, ...]
    backward_start: int | None = None

    @property
    def split(self) -> int:
        return len(self.steps) if self.backward_start is None else self.backward_start

    def computes(self) -> list[int]:
        return [s.node for s in self.steps if isinstance(s, Compute)]


def with_frees(graph: Graph, steps: Iterable[Step], keep: Iterable[int] = ()) -> list[Step]:
    """Insert a Free after the last read of every device copy, as Python frees fx values.

    A read is a Compute that takes the copy as input or an Offload of it. A copy is made by
    a Compute or a Wait (a landed prefetch); a copy that is never read is freed right after
    it is made. Nodes in `keep`, graph outputs and resident inputs are never freed.
    """
    steps = list(steps)
    never_free = set(keep) | set(graph.outputs) | set(graph.resident_inputs)
    last_read: dict[int, int] = {}  # node -> index of the step that last read its live copy
    made_at: dict[int, int] = {}
    free_after: dict[int, list[int]] = {}

    def close(node: int) -> None:
        if node in made_at and node not in never_free:
            free_after.setdefault(last_read.get(node, made_at[node]), []).append(node)
        made_at.pop(node, None)
        last_read.pop(node, None)

    nodes = graph.nodes  # read at every step
    for index, step in enumerate(steps):
        if isinstance(step, Compute):
            for source in nodes[step.node].inputs:
                last_read[source] = index
            close(step.node)
            made_at[step.node] = index
        elif isinstance(step, Offload):
            last_read[step.node] = index
        elif isinstance(step, Wait):
            close(step.node)
            made_at[step.node] = index
    for node in list(made_at):
        close(node)

    out: list[Step] = []
    for index, step in enumerate(steps):
        out.append(step)
        if index in free_after:
            out.extend([Free(v) for v in sorted(free_after[index])])
    return out


@dataclass(frozen=True)
class SolveResult:
    """What a solver returns: the schedule plus how it was found."""

    solver: str
    status: str  # optimal | feasible | infeasible | timeout
    schedule: Schedule | None
    objective: float | None = None
    lower_bound: float | None = None
    gap: float | None = None
    solve_seconds: float = 0.0
    decisions: dict[int, Decision] = field(default_factory=dict)
    options: dict[str, object] = field(default_factory=dict)
    message: str = ""
