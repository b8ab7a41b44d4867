"""Give convolutions their inputs in the layout their kernels want, as nodes of the graph.

A convolution (or its backward) handed a tensor that is not contiguous, such as a
permuted activation or gradient in a ConvNeXt block, copies it to a contiguous one inside
the kernel, and on CPU may take a slower path that holds buffers of its own as well. Such
a copy is a transient the plan can only leave room for, at every run and recomputation.
Made a node of the graph instead (a `clone` to the contiguous format just before the
convolution), the copy is a tensor like any other: the planner sees it and can free or
recompute it. Measured on the zoo's ConvNeXt (docs/measurement.md), this lowers the
unplanned and the least peak alike, with eager's gradients, but the step can be slower;
so the planner plans such a graph both ways by default (PlanOptions.convolution_copies).

A copy changes the layout of what the convolution returns (a channels-last input gave a
channels-last result; a contiguous one gives a contiguous result), and so of everything
computed from it. The traced values downstream are derived again, and a `view` that the
new layout no longer allows (a ConvNeXt block permutes the result back to channels-last
and flattens it) is given a contiguous copy of its input first, as `reshape` would.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.fx as fx
from torch._guards import detect_fake_mode

aten = torch.ops.aten
# Convolutions and the positions of the tensor arguments whose layout they copy.
_COPIED_ARGUMENTS = {
    aten.convolution.default: (0,),  # input
    aten.convolution_backward.default: (0, 1),  # grad_output, input
}
# Views that need their input's layout to allow them: given a contiguous copy where not.
_VIEWS = (aten.view.default, aten._unsafe_view.default)
# Ops whose result depends on their input's strides, not only its values: a graph that
# applies one to a value whose layout a copy would change keeps its layouts.
_STRIDED = (aten.as_strided.default, aten.as_strided_scatter.default, aten._reshape_alias.default)


def contiguous_convolution_inputs(joint: fx.GraphModule) -> int:
    """Insert a contiguous copy before each convolution argument that is not contiguous
    (by its traced value), and derive the traced values after it again; returns how many
    copies were inserted (none where an op that reads strides depends on them)."""
    graph = joint.graph
    copied = [
        (node, index)
        for node in graph.nodes
        if node.op == "call_function"
        for index in _COPIED_ARGUMENTS.get(node.target, ())
        if _needs_copy(node.args[index])
    ]
    if not copied or any(n.target in _STRIDED for n in _downstream(node for node, _ in copied)):
        return 0
    for node, index in copied:
        argument = node.args[index]
        with graph.inserting_before(node):
            copy = graph.call_function(
                aten.clone.default, (argument,), {"memory_format": torch.contiguous_format}
            )
        copy.meta["val"] = argument.meta["val"].clone(memory_format=torch.contiguous_format)
        node.update_arg(index, copy)
    _propagate_layouts(graph, [node for node, _ in copied])
    graph.lint()
    joint.recompile()
    return len(copied)


def _needs_copy(argument: object) -> bool:
    value = argument.meta.get("val") if isinstance(argument, fx.Node) else None
    return isinstance(value, torch.Tensor) and not value.is_contiguous()


def _downstream(starts: Iterable[fx.Node]) -> list[fx.Node]:
    """The nodes computed from `starts`, the starts included, in no particular order."""
    seen: set[fx.Node] = set()
    stack = list(starts)
    while stack:
        node = stack.pop()
        if node not in seen:
            seen.add(node)
            stack.extend(node.users)
    return list(seen)


def _propagate_layouts(graph: fx.Graph, changed: list[fx.Node]) -> None:
    """Derive the traced value of every node downstream of `changed` again, in graph
    order, on the graph's fake tensors; a view its input's new layout does not allow gets
    a contiguous copy of that input first."""
    affected = set(_downstream(changed))
    values = [n.meta.get("val") for n in graph.find_nodes(op="placeholder")]
    mode = detect_fake_mode(values)
    assert mode is not None, "a traced joint graph carries fake values"
    with mode:
        for node in list(graph.nodes):
            if node not in affected or node.op != "call_function":
                continue
            if node.target in _VIEWS and not _viewable(node):
                (source, *_) = node.args
                with graph.inserting_before(node):
                    copy = graph.call_function(
                        aten.clone.default, (source,), {"memory_format": torch.contiguous_format}
                    )
                copy.meta["val"] = source.meta["val"].clone(memory_format=torch.contiguous_format)
                node.update_arg(0, copy)
            args, kwargs = fx.node.map_arg((node.args, node.kwargs), _value)
            node.meta["val"] = node.target(*args, **kwargs)


def _value(node: fx.Node) -> object:
    return node.meta["val"]


def _viewable(view: fx.Node) -> bool:
    """Whether the view's input, in its traced layout, can be viewed at the view's sizes."""
    source, sizes = view.args[:2]
    try:
        source.meta["val"].view(fx.node.map_arg(sizes, _value))
    except (RuntimeError, ValueError):  # fake tensors raise the latter
        return False
    return True
