"""Estimates where nothing is measured: a node's time from a roofline of the device, and
its transient memory from a conservative bound per op family.

A plan made from estimates must never be silently optimistic about memory: each family's
bound is at least the largest transient measured on the zoo models (docs/measurement.md
has the table and how it was measured), and ops of no known family get the largest bound.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import fx
from torch.utils.flop_counter import FlopCounterMode, sdpa_backward_flop_count, sdpa_flop_count

from memplan import compat
from memplan.core import devices
from memplan.core.devices import DeviceSpec
from memplan.planner.profile_cache import device_name
from memplan.planner.shapes import concrete, hint
from memplan.planner.views import is_view


def device_spec(device: torch.device) -> DeviceSpec:
    """The roofline of `device`: a GPU's from its name (memplan/core/devices.py), an unknown
    GPU a slow one's."""
    if device.type != "cuda":
        return devices.CPU
    return devices.for_cuda_name(device_name(device))


def roofline_seconds(node: fx.Node, spec: DeviceSpec) -> float:
    """max(FLOPs / peak, bytes moved / bandwidth) + launch overhead, from meta values only.
    FLOPs are counted for matrix math (matmuls, convolutions, attention), whose peak is
    that of the dtype of the node's first tensor output."""
    args, kwargs = fx.node.map_arg((node.args, node.kwargs), lambda n: n.meta.get("val"))
    counter = FlopCounterMode(display=False, custom_mapping=MORE_FLOP_FORMULAS)
    try:
        with counter:
            node.target(*compat.tree_map(to_meta, args), **compat.tree_map(to_meta, kwargs))
        flops = counter.get_total_flops()
    except Exception:
        # Some ops have no meta kernel or need real data (nonzero, item): bytes only.
        flops = 0
    # A view reads and writes nothing; any other op reads its inputs and writes its outputs.
    moved = 0 if is_view(node.target) else _nbytes((args, kwargs, node.meta.get("val")))
    outputs = [v for v in compat.tree_leaves(node.meta.get("val")) if isinstance(v, torch.Tensor)]
    dtype = str(outputs[0].dtype).removeprefix("torch.") if outputs else "float32"
    peak = spec.matmul_flops(dtype)
    return max(flops / peak, moved / spec.bandwidth) + spec.launch_overhead


def _attention_flops(query: Any, key: Any, value: Any, *_: Any, **__: Any) -> int:
    return sdpa_flop_count(query, key, value)


def _attention_backward_flops(
    grad: Any, query: Any, key: Any, value: Any, *_: Any, **__: Any
) -> int:
    return sdpa_backward_flop_count(grad, query, key, value)


aten = torch.ops.aten
# Ops torch's FLOP counter has no formula for: the CPU's fused attention, whose arithmetic
# is that of the GPU's flash attention (the same formulas, given shapes); without them a
# model traced on CPU for a GPU would have its attention costed as if it did none.
MORE_FLOP_FORMULAS = {
    aten._scaled_dot_product_flash_attention_for_cpu: _attention_flops,
    aten._scaled_dot_product_flash_attention_for_cpu_backward: _attention_backward_flops,
}


def to_meta(v: object) -> object:
    """A meta tensor like `v` (shape, strides, dtype), or a concrete number for a symbol."""
    if isinstance(v, torch.Tensor):
        shape, stride = [hint(s) for s in v.shape], [hint(s) for s in v.stride()]
        return torch.empty_strided(shape, stride, dtype=v.dtype, device="meta")
    return concrete(v)


def _nbytes(tree: object) -> int:
    tensors = (v for v in compat.tree_leaves(tree) if isinstance(v, torch.Tensor))
    return sum(t.numel() * t.element_size() for t in tensors)


# Op families and their bounds on a node's transient bytes, in terms of the bytes of its
# tensor inputs and outputs (io). Each bound is at least the largest transient measured
# on the zoo models on CPU (`python -m benchmarks.transients`, docs/measurement.md);
# ops of no family get the default, the largest ratio measured outside convolutions.
_SMALL = 64  # pointwise ops, reductions, matmuls and copies: at most a few scalars measured
_DEFAULT_RATIO = 1.0
_RATIOS = {
    aten.convolution.default: 2.0,
    aten.native_batch_norm_backward.default: 1.0,
    aten.native_layer_norm_backward.default: 1.0,
    aten.native_layer_norm.default: 1.0,
    aten._native_batch_norm_legit_functional.default: 1.0,
    aten._scaled_dot_product_flash_attention_for_cpu.default: 0.25,
    aten._scaled_dot_product_flash_attention_for_cpu_backward.default: 0.25,
    aten.embedding.default: 0.25,
    aten.embedding_dense_backward.default: 0.25,
}
_SMALL_OPS = frozenset(
    {aten.mm.default, aten.bmm.default, aten.addmm.default, aten.baddbmm.default,
     aten._to_copy.default, aten.cat.default, aten.nll_loss_forward.default,
     aten.nll_loss_backward.default, aten._log_softmax.default,
     aten._log_softmax_backward_data.default, aten._softmax.default,
     aten._softmax_backward_data.default, aten.arange.default, aten.arange.start,
     aten.lift_fresh_copy.default, aten.constant_pad_nd.default, aten.gather.default,
     aten.select_backward.default, aten.slice_backward.default,
     aten.max_pool2d_with_indices.default, aten.max_pool2d_with_indices_backward.default,
     aten.copy_.default}
)  # fmt: skip
# copy_: a write into an input kept in the graph (BatchNorm's running statistics); into
# an existing buffer of its dtype it allocated nothing on CPU (16 B to 4 MiB, 2026-11-30).
# convolution_backward: 3 x io, plus per sample, output channel and kernel tap the buffers
# CPU's depthwise kernel was measured to hold (about 128 B each).
_CONV_BACKWARD_RATIO = 3.0
_CONV_BACKWARD_PER_TAP = 132


def has_measured_bound(target: object) -> bool:
    """Whether the op's transient bound comes from measurements (else it is the default)."""
    if is_view(target) or not compat.is_op_overload(target):
        return True
    tags = target.tags
    return (
        target in _RATIOS
        or target in _SMALL_OPS
        or target is aten.convolution_backward.default
        or torch.Tag.pointwise in tags
        or torch.Tag.reduction in tags
    )


def estimated_workspace(node: fx.Node) -> int:
    """A conservative bound on the node's transient bytes, from its op family."""
    target = node.target
    if is_view(target) or not compat.is_op_overload(target):
        return 0
    args, kwargs = fx.node.map_arg((node.args, node.kwargs), lambda n: n.meta.get("val"))
    io = _nbytes((args, kwargs, node.meta.get("val")))
    if target is aten.convolution_backward.default:
        grad, weight = args[0], args[2]
        taps = math.prod(int(k) for k in weight.shape[2:])
        per_tap = int(grad.shape[0]) * int(weight.shape[0]) * taps * _CONV_BACKWARD_PER_TAP
        return math.ceil(_CONV_BACKWARD_RATIO * io) + per_tap
    if target in _RATIOS:
        return math.ceil(_RATIOS[target] * io)
    tags = target.tags
    if target in _SMALL_OPS or torch.Tag.pointwise in tags or torch.Tag.reduction in tags:
        return _SMALL
    return math.ceil(_DEFAULT_RATIO * io)
