"""The workspace of each kernel Inductor calls rather than generates, as it calls it.

An extern kernel (a convolution, its backward, attention, a fallback op) allocates
buffers of its own while it runs. The profile measures each op as the unfused graph
calls it, but Inductor can call it on other layouts: with its layout optimization a
convolution's input is channels-last, and oneDNN then reorders nothing, where on the
traced layout it copied its input (a profiled 64 KiB against 14 KiB as called, on a small
CNN). So each such call is described as Inductor makes it (`KernelCall`: the op, and its
arguments with each tensor's sizes, strides, dtype and device as Inductor lays it out),
and run once on made-up values, alone, its workspace read by the allocator
(`workspace`): the bytes it held above its inputs beyond what it returned. Nothing of
the graph runs; the kernel's own inputs and outputs are all it holds.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from memplan import compat
from memplan.core.errors import AllocatorUnreadable
from memplan.planner.allocator import readable, recording
from memplan.planner.made_up import float_pool, made_up, span


@dataclass(frozen=True)
class TensorSpec:
    """A tensor argument as Inductor lays it out, at the sizes' hints."""

    size: tuple[int, ...]
    stride: tuple[int, ...]
    offset: int
    dtype: torch.dtype
    device: torch.device

    def made(self, floats: torch.Tensor) -> torch.Tensor:
        """A tensor of this layout, made up from `floats` (planner/made_up.py)."""
        return made_up(self.size, self.stride, self.offset, self.dtype, self.device, floats)


@dataclass(frozen=True)
class KernelCall:
    """An extern kernel's call: the op and its arguments (TensorSpecs for tensors)."""

    op: Any
    args: tuple[Any, ...]
    kwargs: tuple[tuple[str, Any], ...]

    @property
    def key(self) -> str:
        """The call, as text: what a workspace is kept by."""
        return f"{self.op}{self.args}{self.kwargs}"


def call_of(node: Any) -> KernelCall | None:
    """The call an extern kernel's IR node makes, where it can be made again: a fallback
    with its own unflattening of arguments, or a kernel of one graph op whose tensor
    arguments are its inputs, in order. None otherwise (its op's profiled workspace
    stands)."""
    op = getattr(node, "op_overload", None)
    if not compat.is_op_overload(op):
        return None
    specs = [_spec(x) for x in node.inputs]
    if any(s is None for s in specs):
        return None
    unflatten = getattr(node, "unflatten_args", None)
    if callable(unflatten):
        args, kwargs = unflatten(specs, node.constant_args)
    else:
        origin = node.get_origin_node()
        if origin is None or origin.target is not op:
            return None
        leaves, tree = compat.tree_flatten((origin.args, dict(origin.kwargs)))
        tensors = [i for i, leaf in enumerate(leaves) if _is_tensor_node(leaf)]
        if len(tensors) != len(specs):
            return None
        for i, spec in zip(tensors, specs, strict=True):
            leaves[i] = spec
        if any(isinstance(leaf, torch.fx.Node) for leaf in leaves):
            return None  # a size computed in the graph: not known here
        args, kwargs = compat.tree_unflatten(leaves, tree)
    return KernelCall(op, tuple(args), tuple(sorted(kwargs.items())))


def _is_tensor_node(value: Any) -> bool:
    return isinstance(value, torch.fx.Node) and isinstance(value.meta.get("val"), torch.Tensor)


def _spec(value: Any) -> TensorSpec | None:
    """The layout Inductor gives an input of an extern kernel (None: not a tensor)."""
    try:
        layout = value.get_layout()
        return TensorSpec(
            tuple(compat.hint(s) for s in layout.size),
            tuple(compat.hint(s) for s in layout.stride),
            compat.hint(layout.offset),
            layout.dtype,
            layout.device,
        )
    except (AttributeError, NotImplementedError, TypeError):
        return None


def workspaces(calls: Iterable[KernelCall]) -> dict[str, int]:
    """The workspace of each call that could be measured, by its key: none where the
    allocator cannot be read now (inside a user's profiler session) or the call fails."""
    if not readable():
        return {}
    found = {}
    for call in calls:
        if call.key not in _MEASURED:
            # Inside AOTAutograd's partition step the trace's fake mode is on: real
            # tensors are made outside it, as the profile's are.
            with compat.real_tensors():
                _MEASURED[call.key] = _measured(call)
        if _MEASURED[call.key] is not None:
            found[call.key] = _MEASURED[call.key]
    return found


# Each call measured once per process, by its key.
_MEASURED: dict[str, int | None] = {}


def _measured(call: KernelCall) -> int | None:
    """One call's workspace (the module's docstring), after one unmeasured call (a first
    call sets up what later ones reuse); None where the call fails."""
    given = (call.args, dict(call.kwargs))
    specs = [x for x in compat.tree_leaves(given) if isinstance(x, TensorSpec)]
    if not specs:
        return None
    device = specs[0].device
    floats = float_pool(max(span(s.size, s.stride) for s in specs), device)
    args, kwargs = compat.tree_map(
        lambda x: x.made(floats) if isinstance(x, TensorSpec) else x, given
    )
    try:
        call.op(*args, **kwargs)
        if device.type == "cuda":
            return _on_cuda(call, args, kwargs, device)
        with recording(device) as recorded:
            returned = call.op(*args, **kwargs)
        peak = recorded.peak_above_start()
    except (RuntimeError, AllocatorUnreadable, TypeError, ValueError):
        return None
    return max(0, peak - _bytes(returned))


def _on_cuda(call: KernelCall, args: Any, kwargs: dict[str, Any], device: torch.device) -> int:
    torch.cuda.synchronize(device)
    start = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    returned = call.op(*args, **kwargs)
    torch.cuda.synchronize(device)
    return max(0, torch.cuda.max_memory_allocated(device) - start - _bytes(returned))


def _bytes(returned: Any) -> int:
    """The bytes of the distinct storages a call returned."""
    storages = {
        t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
        for t in compat.tree_leaves(returned)
        if isinstance(t, torch.Tensor)
    }
    return sum(storages.values())
