"""Node times and bytes as Inductor runs them: what it fuses away priced at 0 s, and
where it is never written, at 0 bytes.

The profiler times each node as its own kernel, as the unfused graphs run. Inductor
inlines a pointwise op (an add, a GELU, the scaling half of a normalization) or a
constant fill into the kernels of the pointwise ops and reductions that read it, and into
the copy a scatter is written into, where its output is never written and it costs no
kernel of its own; a view is a reinterpretation of a buffer under any compiler. A
pointwise op read by a matrix product, a convolution or another kernel Inductor does not
generate is still a kernel that writes its output, and keeps its profiled time. Priced
unfused, plans that differ in how many fused-away ops they recompute are ranked by time
Inductor never spends, and each run's profile noise picks between them.

Its output is never written only where no graph beyond its own reads it: a forward op the
backward reads is saved, so written, whatever its readers do with it. Counted unfused, a
backward's chain of pointwise ops holds each of its outputs at once (on a language model
three logits-sized buffers, 12.6 MB, that one kernel never allocates), so plans aimed at a
budget peak well under it as compiled, and the search compiles again to use the room.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import torch
from torch import fx

from memplan import compat
from memplan.core.graph import Graph, NodeKind
from memplan.planner.options import PlanOptions
from memplan.planner.views import is_view


def fused_seconds(nodes: Sequence[fx.Node], seconds: Sequence[float]) -> list[float]:
    """`seconds` (per node of `nodes`) with the nodes Inductor fuses away at 0."""
    return [0.0 if fused_away(n) else s for n, s in zip(nodes, seconds, strict=True)]


def as_solved(graph: Graph, nodes: Sequence[fx.Node], options: PlanOptions) -> Graph:
    """The graph the solvers are given: under Inductor (`options.fused_pointwise`), with
    the outputs it never writes at 0 bytes (fused_memory); else `graph` itself. A plan is
    simulated on it wherever it is judged again (at other sizes, in a fit)."""
    return fused_memory(graph, nodes) if options.fused_pointwise else graph


def fused_memory(graph: Graph, nodes: Sequence[fx.Node]) -> Graph:
    """`graph` (whose node i is `nodes[i]`) with the outputs Inductor never writes at 0
    bytes: of a node fused away that only its own graph reads (through views), and that is
    no output of the step. The kernel it is inlined into reads what it read, so each node
    that reads it (or a view of it) reads those too: they stay live until that kernel
    runs, not only until the op that never runs alone."""
    outputs = set(graph.outputs)
    unwritten = {
        node.id
        for node, fx_node in zip(graph, nodes, strict=True)
        if node.kind is NodeKind.COMPUTE
        and node.alias_of is None
        and node.carved_from is None
        and node.id not in outputs
        and node.id not in graph.carved_outputs
        and fused_away(fx_node)
        and all(graph[r].is_backward == node.is_backward for r in _readers(graph, nodes, node.id))
    }
    owner = graph.storage_owner
    # What a node that is never written stands for, to its readers: what it reads (what
    # those stand for, where they are never written either). A view of one stands for
    # what it does. Resident inputs are live throughout, so no reader needs to keep them.
    stands: dict[int, tuple[int, ...]] = {}
    rebuilt = []
    for node in graph:
        extra = [s for source in node.inputs for s in stands.get(source, ())]
        if node.id in unwritten or owner[node.id] in unwritten:
            stands[node.id] = tuple(
                dict.fromkeys(
                    s
                    for source in node.inputs
                    for s in stands.get(source, (source,))
                    if not graph[s].is_resident_input
                )
            )
        inputs = tuple(dict.fromkeys((*node.inputs, *extra)))
        bytes_ = 0 if node.id in unwritten else node.bytes
        rebuilt.append(dataclasses.replace(node, inputs=inputs, bytes=bytes_))
    return dataclasses.replace(graph, nodes=tuple(rebuilt))


def _readers(graph: Graph, nodes: Sequence[fx.Node], node_id: int) -> list[int]:
    """The nodes that read `node_id`'s output, through views of it."""
    found = []
    for reader in graph.users[node_id]:
        if is_view(nodes[reader].target):
            found.extend(_readers(graph, nodes, reader))
        else:
            found.append(reader)
    return found


_aten = torch.ops.aten
# Ops Inductor lowers to a constant fill (lowering.tensor_constructor): a pointwise
# computation of no inputs, inlined into its readers as any pointwise op is. An
# embedding's gradient is a scatter into one: counted as written, the fill doubled the
# gradient's bytes at the backward's end.
_FILLS = frozenset(
    {
        _aten.full.default,
        _aten.full_like.default,
        _aten.zeros.default,
        _aten.zeros_like.default,
        _aten.ones.default,
        _aten.ones_like.default,
        _aten.new_zeros.default,
        _aten.new_ones.default,
        _aten.new_full.default,
    }
)
# Ops Inductor lowers by cloning their first input into the buffer they return, then
# writing into that (lowering.index_put, lowering.scatter): the clone's kernel computes
# the first input, so a pointwise one is never written.
_INTO_A_COPY = frozenset(
    {
        _aten.index_put.default,
        _aten._unsafe_index_put.default,
        _aten._unsafe_masked_index_put_accumulate.default,
        _aten.scatter.src,
        _aten.scatter.value,
        _aten.scatter.reduce,
        _aten.scatter.value_reduce,
        _aten.scatter_add.default,
        _aten.scatter_reduce.two,
    }
)
# Ops Inductor lowers to one pointwise computation of both their inputs
# (lowering.slice_scatter, lowering.select_scatter): a slice's gradient fills the rest.
_POINTWISE_LOWERED = frozenset({_aten.slice_scatter.default, _aten.select_scatter.default})


def fused_away(node: fx.Node) -> bool:
    """Whether Inductor runs `node` without a kernel or an output buffer of its own: a
    view, or a pointwise op or a constant fill every reader of which (through views) it
    is inlined into."""
    if is_view(node.target):
        return True
    pointwise = _tagged(node, torch.Tag.pointwise) or _op(node) in _FILLS
    return pointwise and all(_inlines(user, node) for user in node.users)


def _inlines(reader: fx.Node, source: fx.Node) -> bool:
    """Whether Inductor computes `source`, which `reader` reads, inside a kernel of
    `reader`'s own."""
    if is_view(reader.target):
        return all(_inlines(user, reader) for user in reader.users)
    op = _op(reader)
    if op in _INTO_A_COPY:  # the first input only; the others are read as written
        rest = compat.arg_tree_leaves(*reader.args[1:], **reader.kwargs)
        return reader.args[0] is source and all(value is not source for value in rest)
    return (
        _tagged(reader, torch.Tag.pointwise)
        or _tagged(reader, torch.Tag.reduction)
        or op in _POINTWISE_LOWERED
    )


def _tagged(node: fx.Node, tag: torch.Tag) -> bool:
    op = _op(node)
    return op is not None and tag in op.tags


def _op(node: fx.Node) -> compat.OpOverload | None:
    """The ATen op `node` calls, if it calls one."""
    target = node.target
    if node.op == "call_function" and compat.is_op_overload(target):
        return target
    return None
