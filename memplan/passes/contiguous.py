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
"""

from __future__ import annotations

import torch
import torch.fx as fx

aten = torch.ops.aten
# Convolutions and the positions of the tensor arguments whose layout they copy.
_COPIED_ARGUMENTS = {
    aten.convolution.default: (0,),  # input
    aten.convolution_backward.default: (0, 1),  # grad_output, input
}


def contiguous_convolution_inputs(joint: fx.GraphModule) -> int:
    """Insert a contiguous copy before each convolution argument that is not contiguous
    (by its traced value); returns how many were inserted."""
    graph = joint.graph
    inserted = 0
    for node in list(graph.nodes):
        positions = _COPIED_ARGUMENTS.get(node.target, ()) if node.op == "call_function" else ()
        for index in positions:
            argument = node.args[index]
            value = argument.meta.get("val") if isinstance(argument, fx.Node) else None
            if not isinstance(value, torch.Tensor) or value.is_contiguous():
                continue
            with graph.inserting_before(node):
                copied = graph.call_function(
                    aten.clone.default, (argument,), {"memory_format": torch.contiguous_format}
                )
            copied.meta["val"] = value.clone(memory_format=torch.contiguous_format)
            node.update_arg(index, copied)
            inserted += 1
    if inserted:
        graph.lint()
        joint.recompile()
    return inserted
