"""What Inductor emits for a planned step, as memory: the simulator's input for the step
as compiled.

Inductor fuses a planned graph's ops into kernels, gives each kernel's result a buffer,
hands a dead buffer to a later result of the same size (reuse), and deletes each buffer
after its last reader. Its wrapper code is that sequence of allocations, renamings and
deletions; `Emitted` is one compiled graph's sequence, read off Inductor before any code
runs (compile/inductor.py). `step_graph` joins a forward's and its backward's into one
Graph and Schedule, so that the simulator, the single judge, predicts the step as
Inductor runs it: each kernel's buffers, their sizes and lifetimes, in Inductor's order.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from memplan.core.graph import Compute, Free, Graph, Node, NodeKind, Schedule, Step

# The prefix of a recomputed node's name in a planned backward (passes/rewrite.py).
RECOMPUTED = "recompute_"


@dataclass(frozen=True)
class Allocate:
    """A new buffer of `bytes` named `name`."""

    name: str
    bytes: int


@dataclass(frozen=True)
class Alias:
    """`name` made a name of the buffer `of` is in (a view, or a dead buffer reused)."""

    name: str
    of: str


@dataclass(frozen=True)
class Release:
    """The name dropped; its buffer is freed once no name holds it."""

    name: str


@dataclass(frozen=True)
class Kernel:
    """A kernel Inductor calls rather than generates (a matrix product, a convolution, a
    fallback op), lowered from the graph's ops `origins` (its own op alone, where
    Inductor names it): what it holds while it runs beyond its inputs and outputs (its
    workspace) is held while it runs. `call` names the call as Inductor makes it, where
    its workspace was measured so (compile/kernels.py); else the largest profiled
    workspace among its origins stands."""

    origins: tuple[str, ...]
    call: str = ""


Event = Allocate | Alias | Release | Kernel


@dataclass(frozen=True)
class Emitted:
    """One graph as Inductor emits it: its tensor inputs (name, bytes), the memory events
    of its wrapper in order, and per value it returns, the name it has in the graph
    (`returned`), the buffer it lives in (`outputs`; None for a size) and its strides as
    compiled (`strides`: a forward's outputs can be laid out otherwise than traced, and
    the backward is compiled for them; None for a size)."""

    inputs: tuple[tuple[str, int], ...]
    events: tuple[Event, ...]
    returned: tuple[str | None, ...]
    outputs: tuple[str | None, ...]
    strides: tuple[tuple[int, ...] | None, ...] = ()

    def strides_by_name(self) -> dict[str, tuple[int, ...]]:
        """The strides of each returned tensor, by its name in the graph."""
        return {
            name: stride
            for name, stride in zip(self.returned, self.strides, strict=False)
            if name is not None and stride is not None
        }


def step_graph(
    resident: Mapping[str, Node],
    forward: Emitted,
    backward: Emitted | None,
    workspace: Mapping[str, int],
    *,
    name: str = "compiled",
) -> tuple[Graph, Schedule]:
    """A forward and its backward, as Inductor emits them, as one Graph and Schedule.

    `resident` gives the forward's inputs by name as the planned graph has them (parameters
    and inputs, with their bytes and views): the step holds them throughout. The backward's
    inputs are the forward's values it returned under the same names (what the backward
    reads of the forward) and its incoming gradients (tangents, held until the backward
    returns, as the autograd engine holds them). `workspace` is the workspace of each op of
    the planned graph, by name (a recomputed op's is its forward op's), and of each kernel
    call measured as Inductor makes it, by its `Kernel.call`. What the forward
    returns for the caller and what the backward returns (gradients) live to the end."""
    builder = _Builder(name, workspace)
    for input_name, _ in forward.inputs:
        if input_name not in resident:
            raise ValueError(f"the forward's input {input_name!r} is not among the resident")
    builder.resident(resident)
    builder.replay("fw", forward, held={n for n, _ in forward.inputs})
    returned = dict(zip(forward.returned, forward.outputs, strict=True))
    saved = set() if backward is None else {n for n, _ in backward.inputs if n in returned}
    # What the caller holds of the forward's values: all it returned but what only the
    # backward reads. The forward's other names die as it returns: the backward starts
    # after that.
    for_caller = [
        buffer
        for value, buffer in zip(forward.returned, forward.outputs, strict=True)
        if buffer is not None and value not in saved
    ]
    builder.keep_outputs("fw", forward, for_caller)
    split = len(builder.steps)
    if backward is None:
        return builder.graph(), Schedule(tuple(builder.steps), split)
    tangents = {n: b for n, b in backward.inputs if n not in returned}
    builder.start_backward(forward, backward, returned, tangents)
    builder.replay("bw", backward, held=set(tangents))
    builder.keep_outputs("bw", backward, [b for b in backward.outputs if b is not None])
    return builder.graph(), Schedule(tuple(builder.steps), split)


class _Builder:
    """The Graph and Schedule `step_graph` builds, node by node; names are made unique
    per graph (a forward's buf0 is not its backward's)."""

    def __init__(self, name: str, workspace: Mapping[str, int]) -> None:
        self.name = name
        self.workspace = workspace
        self.nodes: list[Node] = []
        self.steps: list[Step] = []
        self.node_of: dict[str, int] = {}  # a name in the step (part:name) -> its node
        self.outputs: list[int] = []

    def graph(self) -> Graph:
        return Graph(tuple(self.nodes), tuple(dict.fromkeys(self.outputs)), self.name)

    def _add(self, label: str, **fields: object) -> int:
        node = Node(id=len(self.nodes), name=label, op=str(fields.pop("op", "buffer")), **fields)
        self.nodes.append(node)
        return node.id

    def _owner(self, node: int) -> int:
        alias = self.nodes[node].alias_of
        return node if alias is None else alias

    def resident(self, resident: Mapping[str, Node]) -> None:
        """The step's resident tensors, views after what they view."""
        ids: dict[str, int] = {}
        by_id = {node.id: n for n, node in resident.items()}
        for input_name, node in sorted(resident.items(), key=lambda item: item[1].id):
            base = by_id.get(node.alias_of) if node.alias_of is not None else None
            alias_of = ids.get(base) if base is not None else None
            kind = node.kind if node.is_resident_input else NodeKind.INPUT
            ids[input_name] = self._add(
                f"fw:{input_name}",
                op="input",
                kind=kind,
                bytes=0 if alias_of is not None else node.bytes,
                alias_of=alias_of,
            )
        self.node_of.update({f"fw:{n}": v for n, v in ids.items()})

    def replay(self, part: str, emitted: Emitted, held: set[str]) -> None:
        """The memory events of one graph, in order; releases of names the caller holds
        (`held`: the step's resident tensors, the tangents) free nothing."""
        for event in emitted.events:
            if isinstance(event, Allocate):
                self._compute(f"{part}:{event.name}", bytes=event.bytes)
            elif isinstance(event, Alias):
                source = self.node_of.get(f"{part}:{event.of}")
                if source is None:  # a name of a buffer the graph never made: nothing held
                    continue
                self._compute(
                    f"{part}:{event.name}",
                    inputs=(source,),
                    alias_of=self._owner(source),
                    is_backward=part == "bw",
                )
            elif isinstance(event, Release):
                if event.name not in held:
                    self._free(f"{part}:{event.name}")
            else:
                held_bytes = self.workspace.get(event.call, -1) if event.call else -1
                if held_bytes < 0:
                    held_bytes = max((self._workspace_of(o) for o in event.origins), default=0)
                if held_bytes:
                    label = f"{part}:kernel{len(self.nodes)}"
                    self._compute(label, workspace=held_bytes)
                    self._free(label)

    def _workspace_of(self, origin: str) -> int:
        return self.workspace.get(origin.removeprefix(RECOMPUTED), 0)

    def _compute(self, label: str, **fields: object) -> None:
        if label in self.node_of:  # a name given again (a reuse's second name): the old
            self._free(label)  # one is dropped first
        fields.setdefault("is_backward", label.startswith("bw:"))
        self.node_of[label] = self._add(label, **fields)
        self.steps.append(Compute(self.node_of[label]))

    def _free(self, label: str) -> None:
        node = self.node_of.pop(label, None)
        if node is not None and not self.nodes[node].is_resident_input:
            self.steps.append(Free(node))

    def keep_outputs(self, part: str, emitted: Emitted, buffers: list[str | None]) -> None:
        """What outlives the graph: `buffers` (of `emitted`'s outputs) kept to the step's
        end; every other name the graph made is dropped when it returns."""
        kept = {self.node_of[f"{part}:{b}"] for b in buffers if f"{part}:{b}" in self.node_of}
        self.outputs.extend(sorted(kept))
        for label in [label for label in self.node_of if label.startswith(f"{part}:")]:
            node = self.node_of[label]
            returned = self._is_returned(part, emitted, label)
            if node not in kept and not self.nodes[node].is_resident_input and not returned:
                self._free(label)

    def _is_returned(self, part: str, emitted: Emitted, label: str) -> bool:
        """Whether the name is a buffer the graph returns (held past its end)."""
        return label.removeprefix(f"{part}:") in {b for b in emitted.outputs if b is not None}

    def start_backward(
        self,
        forward: Emitted,
        backward: Emitted,
        returned: Mapping[str | None, str | None],
        tangents: Mapping[str, int],
    ) -> None:
        """The backward's inputs: each value of the forward it reads, under its own name
        (a view of the forward's buffer), then the forward's own names of them dropped;
        and the tangents, new buffers."""
        made = []
        for input_name, _ in backward.inputs:
            if input_name in tangents:
                continue
            buffer = returned[input_name]
            source = self.node_of.get(f"fw:{buffer}")
            if source is None:
                continue
            made.append(input_name)
            self._compute(
                f"bw:{input_name}",
                op="saved",
                inputs=(source,),
                alias_of=self._owner(source),
                is_backward=True,
            )
        for buffer in dict.fromkeys(returned[n] for n in made):
            label = f"fw:{buffer}"
            if label in self.node_of and self.node_of[label] not in self.outputs:
                self._free(label)
        for input_name, nbytes in tangents.items():
            self.node_of[f"bw:{input_name}"] = self._add(
                f"bw:{input_name}", op="tangent", kind=NodeKind.TANGENT, bytes=nbytes
            )
            self.steps.append(Compute(self.node_of[f"bw:{input_name}"]))
