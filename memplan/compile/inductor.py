"""What memplan's torch.compile backend takes from Inductor: its decomposition table, its
joint-graph passes run before planning (as torch.compile's own partition step runs them),
and its compile of one planned graph, with what that compile allocates (`compile_reading`).

`compile_reading` reads Inductor's wrapper as it is generated, once it has decided every
buffer: which kernels there are, in which order, which buffer each result gets, which
dead buffer a later result reuses, and where each is deleted. Those decisions are the
memory of the compiled graph; core/emitted.py turns a forward's and a backward's into the
step the simulator judges. Nothing runs: a plan's peak as compiled is known before the
step, without device memory. Nor is anything built: a compile read is loaded, and its
kernels built, at its first call, so that a round the search does not keep costs no
kernel builds.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from memplan import compat
from memplan.compile.kernels import KernelCall, call_of
from memplan.core.emitted import Alias, Allocate, Emitted, Event, Kernel, Release
from memplan.core.errors import MemplanError
from memplan.passes.offload import OFFLOAD
from memplan.planner.capture import module_copy
from memplan.planner.partitioner import Partitioner


class NotEmittable(MemplanError):
    """Inductor's compile of a graph could not be read (a graph with control flow, whose
    wrapper has subgraphs of its own)."""


def inductor_decompositions() -> dict[Any, Callable[..., Any]]:
    """The decomposition table Inductor lowers with, as torch.compile's default backend
    traces with it."""
    return compat.inductor_decompositions()


def after_joint_passes(partitioner: Partitioner) -> Callable[..., Any]:
    """`partitioner` given the joint graph as Inductor's joint-graph passes leave it (no-op
    views and clones removed, uniform constants folded, its pattern rewrites, its seeded
    random ops), as torch.compile's own partition step gives it to torch's partitioner:
    memplan plans the graph Inductor compiles, under the names torch.compile's graphs
    have."""

    def partition(
        joint: torch.fx.GraphModule, joint_inputs: Sequence[Any], **kwargs: Any
    ) -> tuple[torch.fx.GraphModule, torch.fx.GraphModule]:
        inputs = compat.tree_leaves(joint_inputs)
        passed = compat.joint_graph_passes(joint, inputs)
        _traced_again(passed, inputs)
        return partitioner(passed, joint_inputs, **kwargs)

    return partition


def _traced_again(gm: torch.fx.GraphModule, joint_inputs: Sequence[Any]) -> None:
    """Each node's value traced again, on the fake inputs the graph was traced with (a
    placeholder's own, or where the passes left it none, a symbolic size's, the joint
    input in its place). Inductor's rewrites can leave a node the value it had before
    them: on BERT, a view that now reads another tensor kept a value viewing the one it
    read before, so lowering took it for a storage of its own, and a second view of it
    for a view of the first."""
    placeholders = gm.graph.find_nodes(op="placeholder")
    inputs = [n.meta.get("val", given) for n, given in zip(placeholders, joint_inputs, strict=True)]
    compat.propagate_fake(gm, inputs)


def inductor_compile(settings: dict[str, Any]) -> Callable[..., Any]:
    """Inductor's compile of one planned graph, under `settings` (torch._inductor.config)."""

    def compile_graph(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
        with compat.inductor_settings(settings):
            return compat.compile_graph(gm, example_inputs)

    return compile_graph


@dataclass(frozen=True)
class Reading:
    """A graph Inductor compiled, what it allocates, the inputs it was compiled for
    (input_specs) and the calls of its extern kernels that allocate, by key."""

    compiled: Any
    emitted: Emitted
    specs: tuple[object, ...]
    calls: dict[str, KernelCall]


def compile_reading(
    gm: torch.fx.GraphModule,
    settings: dict[str, Any],
    strides: Mapping[str, tuple[int, ...]] | None = None,
) -> Reading:
    """Inductor's compile of `gm` under `settings`, what it allocates (the module's
    docstring), the inputs it was compiled for and its extern kernels' calls (Reading).
    It compiles a copy (Inductor's passes change a graph in place), on the placeholders'
    traced values, each
    laid out with its `strides` where given: a backward is compiled for the strides its
    forward returned its tensors with, as AOTAutograd compiles it. Raises NotEmittable
    where the wrapper cannot be read."""
    copy = module_copy(gm)
    inputs = [
        _laid_out(n.meta.get("val"), (strides or {}).get(n.name))
        for n in copy.graph.find_nodes(op="placeholder")
    ]
    (output,) = copy.graph.find_nodes(op="output")
    returned = tuple(
        v.name if isinstance(v, torch.fx.Node) else None for v in compat.tree_leaves(output.args[0])
    )
    read: list[tuple[Emitted, dict[str, KernelCall]]] = []
    refused: list[NotEmittable] = []

    def reading(wrapper: Any) -> None:
        # Raised inside Inductor's compile, NotEmittable would reach the caller wrapped in
        # Inductor's own error: it is raised once the compile returns.
        try:
            read.append(_read(wrapper, returned))
        except NotEmittable as why:
            refused.append(why)

    # The FX graph cache would skip the lowering, and with it the wrapper.
    # Built at its first call: a round the search does not keep is never called, and
    # building kernels was 40% of a compile (ResNet on a 2-core CPU, 2026-12-06).
    with (
        compat.inductor_settings({**settings, "fx_graph_cache": False}),
        compat.reading_wrapper(reading),
        compat.building_at_first_call(),
    ):
        compiled = compat.compile_graph(copy, inputs)
    if refused:
        raise refused[0]
    if len(read) != 1:
        raise NotEmittable(f"Inductor generated {len(read)} wrappers for one graph")
    emitted, calls = read[0]
    return Reading(compiled, emitted, input_specs(inputs), calls)


def input_specs(inputs: Sequence[Any]) -> tuple[object, ...]:
    """What a compile depends on of its inputs: each tensor's sizes, strides, dtype and
    device (a size stands for itself)."""
    return tuple(
        (tuple(x.shape), x.stride(), x.dtype, x.device) if isinstance(x, torch.Tensor) else x
        for x in inputs
    )


def _laid_out(value: Any, stride: tuple[int, ...] | None) -> Any:
    """A traced input value with `stride`, where given and other than its own."""
    if stride is None or not isinstance(value, torch.Tensor) or value.stride() == stride:
        return value
    return value.as_strided(value.size(), stride)


def _read(wrapper: Any, returned: tuple[str | None, ...]) -> tuple[Emitted, dict[str, KernelCall]]:
    """The memory events of a wrapper whose buffers are planned (compat.reading_wrapper).
    A graph with subgraphs (control flow) is refused: its subgraphs' buffers are their
    own wrapper's."""
    graph = compat.lowering_graph()
    lines, layouts = compat.wrapper_lines(), compat.layouts()
    inputs = tuple(
        (name, compat.storage_bytes(value))
        for name, value in graph.graph_inputs.items()
        if compat.is_ir_node(value)
    )
    device = next((graph.graph_inputs[n].get_device() for n, _ in inputs), None)
    events: list[Event | _Slot] = []
    calls: dict[str, KernelCall] = {}

    def kernel(node: Any) -> Kernel:
        # A kernel that allocates inside itself: its call, to measure as Inductor makes it.
        call = call_of(node)
        if call is None:
            return Kernel(_origins(node))
        calls[call.key] = call
        return Kernel(_origins(node), call.key)

    def allocate(buffer: Any, into: list[Any]) -> None:
        # A buffer elsewhere than the graph's device (an offload's host copy on a GPU) is
        # not device memory.
        if device is None or buffer.get_device() in (None, device):
            into.append(Allocate(buffer.get_name(), compat.storage_bytes(buffer)))

    # A fallback returning several tensors makes them all as it runs; the wrapper names
    # them after its call, and after deleting what the call read last: each is made at
    # the call, and its workspace held with them (a slot of events, filled as named).
    slots: dict[str, list[Event]] = {}
    for line in wrapper.lines:
        if isinstance(line, lines.enter_subgraph):
            raise NotEmittable("a graph with subgraphs (control flow) cannot be read")
        if isinstance(line, lines.allocate):
            allocate(line.node, events)
        elif isinstance(line, lines.reuse):
            events.append(Alias(line.reused_as.get_name(), line.node.get_name()))
            if line.delete_old:
                events.append(Release(line.node.get_name()))
        elif isinstance(line, lines.free_if_not_reused):
            if not line.is_reused:
                events.append(Release(line.node.get_name()))
        elif isinstance(line, lines.free):
            events.append(Release(line.node.get_name()))
        elif isinstance(line, lines.reinterpret):
            events.append(Alias(line.reused_as.get_name(), line.node.get_name()))
        elif isinstance(line, lines.extern_alloc):
            node = line.node
            # An offload's copy is host memory (passes/offload.py), even where the host is
            # the device: the plan counts it off the device, as on a GPU.
            host = getattr(node, "op_overload", None) is OFFLOAD
            if isinstance(node.layout, layouts.multi_output):
                slot = _Slot([], kernel(node), host)
                slots[node.get_name()] = slot
                events.append(slot)
            elif not isinstance(node.layout, layouts.none) and not host:
                _made(node, events, allocate)
                events.append(kernel(node))
            else:
                events.append(kernel(node))
        elif isinstance(line, lines.extern_out):
            events.append(Kernel(_origins(line.node)))
        elif isinstance(line, lines.multi_output):
            slot = slots.get(line.arg_name)
            if slot is None or not slot.host:
                made = events if slot is None else slot.made
                _made(graph.get_buffer(line.result_name), made, allocate)
    flat: list[Event] = []
    for event in events:
        flat.extend([*event.made, event.kernel] if isinstance(event, _Slot) else [event])
    outputs = tuple(_buffer_name(node) for node in graph.graph_outputs)
    strides = tuple(_stride(node) for node in graph.graph_outputs)
    return Emitted(inputs, tuple(flat), returned, outputs, strides), calls


@dataclass(frozen=True)
class _Slot:
    """The events of a fallback that returns several tensors: each made, then its kernel;
    none made where they are host memory (an offload's copy)."""

    made: list[Event]
    kernel: Kernel
    host: bool = False


def _made(buffer: Any, into: list[Any], allocate: Callable[[Any, list[Any]], None]) -> None:
    """A buffer a kernel returns: a view of one of its inputs where it is one, else new."""
    aliased = buffer.get_inputs_that_alias_output()
    if aliased:
        into.append(Alias(buffer.get_name(), aliased[0]))
    else:
        allocate(buffer, into)


def _origins(node: Any) -> tuple[str, ...]:
    """The names of the graph's ops whose workspace an extern kernel holds as it runs: the
    op it was lowered from, where Inductor names it. Inductor's origins of a kernel also
    name the ops that made its inputs, fused into kernels of their own: a softmax's
    backward fused ahead of a batched product holds nothing of its unfused workspace (4 MiB
    per product on the T5 of benchmarks/beyond.py, over a step of 92 MB). Else all of them."""
    names = {origin.name for origin in node.get_origins()}
    own = node.get_origin_node()  # every IR node has it, as kernels.call_of reads it
    if own is not None and own.name in names:
        return (own.name,)
    return tuple(sorted(names))


def _stride(node: Any) -> tuple[int, ...] | None:
    """The strides of a returned tensor as compiled, at the sizes' hints; None for a
    size."""
    try:
        return tuple(compat.hint(s) for s in node.get_layout().stride)
    except (AttributeError, NotImplementedError):
        return None


def _buffer_name(node: Any) -> str | None:
    """The buffer a returned value lives in; None for a size or a None."""
    try:
        return node.get_name()
    except (AttributeError, NotImplementedError):
        return None
