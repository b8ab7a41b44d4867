"""Node times as Inductor runs them: what it fuses away priced at 0 s.

The profiler times each node as its own kernel, as the unfused graphs run. Inductor
inlines a pointwise op (an add, a GELU, the scaling half of a normalization) into the
kernels of the pointwise ops and reductions that read it, where its output is never
written and it costs no kernel of its own; a view is a reinterpretation of a buffer under
any compiler. A pointwise op read by a matrix product, a convolution or another kernel
Inductor does not generate is still a kernel that writes its output, and keeps its
profiled time. Priced unfused, plans that differ in how many fused-away ops they recompute
are ranked by time Inductor never spends, and each run's profile noise picks between them.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import fx

from memplan.planner.views import is_view


def fused_seconds(nodes: Sequence[fx.Node], seconds: Sequence[float]) -> list[float]:
    """`seconds` (per node of `nodes`) with the nodes Inductor fuses away at 0."""
    return [0.0 if fused_away(n) else s for n, s in zip(nodes, seconds, strict=True)]


def fused_away(node: fx.Node) -> bool:
    """Whether Inductor runs `node` without a kernel or an output buffer of its own: a
    view, or a pointwise op every reader of which (through views) it is inlined into."""
    if is_view(node.target):
        return True
    return _tagged(node, torch.Tag.pointwise) and all(_inlines(user) for user in node.users)


def _inlines(reader: fx.Node) -> bool:
    """Whether Inductor computes what `reader` reads inside `reader`'s own kernel."""
    if is_view(reader.target):
        return all(_inlines(user) for user in reader.users)
    return _tagged(reader, torch.Tag.pointwise) or _tagged(reader, torch.Tag.reduction)


def _tagged(node: fx.Node, tag: torch.Tag) -> bool:
    op = _op(node)
    return op is not None and tag in op.tags


def _op(node: fx.Node) -> torch._ops.OpOverload | None:
    """The ATen op `node` calls, if it calls one."""
    target = node.target
    if node.op == "call_function" and isinstance(target, torch._ops.OpOverload):
        return target
    return None
