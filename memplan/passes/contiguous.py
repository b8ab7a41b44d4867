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

Under Inductor's layout optimization the copies go the other way: Inductor lays a 2-D
convolution's activations out channels-last, and copies each graph input it reads (the
weights, the batch) to channels-last at the forward's start, handing the forward's copy
to the backward's convolution too, so that the copies are held through the step. A plan
that does not see them plans a step that peaks lower than the one compiled (ResNet in
the tests: 1.24 MB of 12.3 MB, 2-core CPU, 2026-12-07). `channels_last_convolution_inputs`
makes each such copy a node of the graph, one per input, read by every convolution of the
forward and backward that reads the input: what Inductor runs. A copy is planned as kept,
never made again in the backward: where the forward returns a graph input for its
backward, Inductor returns a channels-last copy of it instead, whatever the plan.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
import torch.fx as fx

from memplan import compat

aten = torch.ops.aten
# Convolutions and the positions of the tensor arguments whose layout they copy to a
# contiguous one.
_COPIED_ARGUMENTS = {
    aten.convolution.default: (0,),  # input
    aten.convolution_backward.default: (0, 1),  # grad_output, input
}
# Convolutions and the positions of the arguments Inductor's layout optimization copies to
# channels-last where they are graph inputs.
_CHANNELS_LAST_ARGUMENTS = {
    aten.convolution.default: (0, 1),  # input, weight
    aten.convolution_backward.default: (1, 2),  # input, weight
}
# The meta key marking a channels-last copy of a graph input, which the plan keeps
# (the module's docstring).
KEPT_COPY = "memplan_kept_copy"
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
    return _copied(joint, _COPIED_ARGUMENTS, _needs_copy, torch.contiguous_format, shared=False)


def channels_last_convolution_inputs(joint: fx.GraphModule) -> int:
    """Insert a channels-last copy of each graph input that a 2-D convolution (or its
    backward) reads and that is not channels-last, one per input, before its first such
    reader and read by all of them, as Inductor's layout optimization makes it (the
    module's docstring); otherwise as contiguous_convolution_inputs."""
    return _copied(
        joint, _CHANNELS_LAST_ARGUMENTS, _needs_channels_last, torch.channels_last, shared=True
    )


def _copied(
    joint: fx.GraphModule,
    arguments: dict[object, tuple[int, ...]],
    needs_copy: Callable[[object], bool],
    memory_format: torch.memory_format,
    *,
    shared: bool,
) -> int:
    """Copy each argument of `arguments` that `needs_copy` to `memory_format` (one copy
    per reader, or where `shared`, one per argument read by all its readers and marked
    KEPT_COPY: Inductor's channels-last copies, the module's docstring), and each
    view's input its new layout no longer allows; the traced values after them derived
    again. Returns how many copies were inserted (0 where the graph keeps its layouts)."""
    graph = joint.graph
    mode = compat.fake_mode_of([n.meta.get("val") for n in graph.find_nodes(op="placeholder")])
    changed: set[fx.Node] = set()  # nodes whose traced value was derived again
    copies: dict[fx.Node, fx.Node] = {}  # where shared: each argument's copy
    inserted = 0
    try:
        with mode or contextlib.nullcontext(), torch.no_grad():
            for node in list(graph.nodes):
                if node.op != "call_function":
                    continue
                # In graph order, so that a layout changed upstream is the one judged.
                for index in arguments.get(node.target, ()):
                    argument = node.args[index]
                    if shared and argument in copies:
                        node.update_arg(index, copies[argument])
                    elif needs_copy(argument):
                        copy = _copy_before(graph, node, index, memory_format, kept=shared)
                        copies[argument] = copy
                        changed.add(copy)
                        inserted += 1
                if node.target in _VIEWS and node.args[0] in changed and not _viewable(node):
                    changed.add(_copy_before(graph, node, 0, torch.contiguous_format))
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


def _needs_channels_last(argument: object) -> bool:
    """A graph input of four dimensions (a 2-D convolution's) not laid out channels-last."""
    if not isinstance(argument, fx.Node) or argument.op != "placeholder":
        return False
    value = argument.meta.get("val")
    return (
        isinstance(value, torch.Tensor)
        and value.dim() == 4
        and not value.is_contiguous(memory_format=torch.channels_last)
    )


def _copy_before(
    graph: fx.Graph,
    node: fx.Node,
    index: int,
    memory_format: torch.memory_format,
    *,
    kept: bool = False,
) -> fx.Node:
    """A copy of `node`'s argument `index` in `memory_format`, inserted before it and
    handed to it in the argument's place; `kept` marks it KEPT_COPY."""
    argument = node.args[index]
    with graph.inserting_before(node):
        copied = graph.call_function(
            aten.clone.default, (argument,), {"memory_format": memory_format}
        )
    copied.meta["val"] = argument.meta["val"].clone(memory_format=memory_format)
    copied.meta[KEPT_COPY] = kept
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
