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

import contextlib

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
    """Insert a contiguous copy before each convolution argument that is not contiguous,
    and before each view its input's new layout no longer allows, deriving the traced
    values after them again; returns how many copies were inserted. Works in place: where
    it returns 0 (nothing to copy, an op downstream that reads strides, a value that cannot
    be derived again) `joint` may be changed partway, so callers pass a copy."""
    graph = joint.graph
    mode = detect_fake_mode([n.meta.get("val") for n in graph.find_nodes(op="placeholder")])
    changed: set[fx.Node] = set()  # nodes whose traced value was derived again
    inserted = 0
    try:
        with mode or contextlib.nullcontext(), torch.no_grad():
            for node in list(graph.nodes):
                if node.op != "call_function":
                    continue
                # In graph order, so that a layout changed upstream is the one judged.
                for index in _COPIED_ARGUMENTS.get(node.target, ()):
                    if _needs_copy(node.args[index]):
                        changed.add(_copy_before(graph, node, index))
                        inserted += 1
                if node.target in _VIEWS and node.args[0] in changed and not _viewable(node):
                    changed.add(_copy_before(graph, node, 0))
                    inserted += 1
                if not changed.intersection(node.all_input_nodes):
                    continue
                if node.target in _STRIDED:
                    return 0
                if not _mutates(node):  # an in-place op's value is its input's, kept
                    args, kwargs = fx.node.map_arg((node.args, node.kwargs), _value)
                    node.meta["val"] = node.target(*args, **kwargs)
                changed.add(node)
    except Exception:  # an op fake tensors cannot run again: planned without copies
        return 0
    if inserted:
        graph.lint()
        joint.recompile()
    return inserted


def _needs_copy(argument: object) -> bool:
    value = argument.meta.get("val") if isinstance(argument, fx.Node) else None
    return isinstance(value, torch.Tensor) and not value.is_contiguous()


def _copy_before(graph: fx.Graph, node: fx.Node, index: int) -> fx.Node:
    """A contiguous copy of `node`'s argument `index`, inserted before it and handed to
    it in the argument's place."""
    argument = node.args[index]
    with graph.inserting_before(node):
        copied = graph.call_function(
            aten.clone.default, (argument,), {"memory_format": torch.contiguous_format}
        )
    copied.meta["val"] = argument.meta["val"].clone(memory_format=torch.contiguous_format)
    node.update_arg(index, copied)
    return copied


def _mutates(node: fx.Node) -> bool:
    schema = getattr(node.target, "_schema", None)
    return schema is not None and schema.is_mutable


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
