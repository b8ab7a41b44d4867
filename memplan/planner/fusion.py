"""Node times as Inductor runs them: pointwise ops and views priced as fused (0 s).

The profiler times each node as its own kernel, as the unfused graphs run. Inductor fuses a
pointwise op (an add, a GELU, the scaling half of a normalization) into the kernel of its
neighbours, where it costs no launch and no trip through memory, and a view is a
reinterpretation of a buffer under any compiler. Priced at their unfused times, plans that
differ in how many of them they recompute are ranked by time Inductor never spends, and
each run's profile noise picks between them. PyTorch's own partitioner prices them alike:
its default runtime estimate of a node is its floating-point operations, which a pointwise
op has next to none of.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import fx


def fused_seconds(nodes: Sequence[fx.Node], seconds: Sequence[float]) -> list[float]:
    """`seconds` (per node of `nodes`) with the nodes Inductor fuses at 0."""
    return [0.0 if fuses(n) else s for n, s in zip(nodes, seconds, strict=True)]


def fuses(node: fx.Node) -> bool:
    """Whether `node` is a pointwise op or a view: work Inductor folds into other kernels."""
    target = node.target
    if node.op != "call_function" or not isinstance(target, torch._ops.OpOverload):
        return False
    return target.is_view or torch.Tag.pointwise in target.tags
