"""Seconds per node of an fx graph: measured by running it on the device, or a roofline.

Inputs are synthesised from the placeholders' `meta["val"]`, so any AOTAutograd graph runs.
"""

from __future__ import annotations

import operator
import statistics
import sys
import time
from collections import defaultdict
from dataclasses import dataclass

import torch
from rich.progress import track
from torch import fx
from torch.utils._pytree import tree_leaves, tree_map
from torch.utils.flop_counter import FlopCounterMode

from memplan.errors import UnsupportedModel
from memplan.planner.profile_cache import ProfileCache, device_name, node_key


@dataclass(frozen=True)
class DeviceSpec:
    """What the roofline needs: FLOP/s, bytes/s to memory, and seconds per op launched."""

    peak_flops: float
    bandwidth: float
    launch_overhead: float


_CPU = DeviceSpec(peak_flops=5e10, bandwidth=1e10, launch_overhead=5e-6)
# FP32 CUDA-core peaks and HBM bandwidth: conservative, TF32 and BF16 matmuls run faster.
# Matched as substrings of the device name; no key is a substring of another model's name.
_CUDA = {
    "H200": DeviceSpec(peak_flops=6.7e13, bandwidth=4.8e12, launch_overhead=5e-6),
    "H100": DeviceSpec(peak_flops=6.7e13, bandwidth=3.35e12, launch_overhead=5e-6),
    "A100": DeviceSpec(peak_flops=1.95e13, bandwidth=1.5e12, launch_overhead=5e-6),
    "V100": DeviceSpec(peak_flops=1.5e13, bandwidth=9e11, launch_overhead=5e-6),
}
_CUDA_DEFAULT = DeviceSpec(peak_flops=1e13, bandwidth=3e11, launch_overhead=5e-6)


def device_spec(device: torch.device) -> DeviceSpec:
    """The roofline parameters of `device`; an unknown GPU gets a slow one's."""
    if device.type != "cuda":
        return _CPU
    name = device_name(device)
    return next((spec for key, spec in _CUDA.items() if key in name), _CUDA_DEFAULT)


def profile_graph(
    gm: fx.GraphModule,
    *,
    device: torch.device,
    measure: bool = True,
    repeats: int = 5,
    warmup: int = 2,
    cache: ProfileCache | None = None,
    progress: bool = True,
) -> dict[str, float]:
    """Seconds per node name; nodes that produce no tensor (placeholders, getitem) get 0.0.

    Measured times are the median of `repeats` passes over the whole graph after `warmup`,
    pooled over nodes with the same `node_key`. With a `cache`, a graph whose keys are all
    cached runs nothing. Roofline times (`measure=False`, or a node that fails to run) are
    never cached: they cost less to recompute than to look up.
    """
    device = torch.device(device)
    times = dict.fromkeys((n.name for n in gm.graph.nodes), 0.0)
    work = [n for n in gm.graph.nodes if _does_tensor_work(n)]
    keys = {n: node_key(n, device) for n in work} if measure else {}
    measured = _cached_or_measured(gm, keys, device, cache, warmup, repeats, progress)
    spec = device_spec(device)
    for node in work:
        key = keys.get(node)
        times[node.name] = measured[key] if key in measured else roofline_seconds(node, spec)
    return times


def _cached_or_measured(
    gm: fx.GraphModule,
    keys: dict[fx.Node, str],
    device: torch.device,
    cache: ProfileCache | None,
    warmup: int,
    repeats: int,
    progress: bool,
) -> dict[str, float]:
    """Seconds per key: all from `cache` if it has every key, else one measurement of `gm`."""
    unique = set(keys.values())
    cached = {k: cache.get(k) for k in unique} if cache is not None else {}
    hits = {k: s for k, s in cached.items() if s is not None}
    if len(hits) == len(unique):
        return hits
    measured = _measure(gm, keys, device, warmup, repeats, progress)
    if cache is not None:
        cache.update(measured)
    return measured


def roofline_seconds(node: fx.Node, spec: DeviceSpec) -> float:
    """max(FLOPs / peak, bytes moved / bandwidth) + launch overhead, from meta values only."""
    args, kwargs = fx.node.map_arg((node.args, node.kwargs), lambda n: n.meta.get("val"))
    counter = FlopCounterMode(display=False)
    try:
        with counter:
            node.target(*tree_map(_to_meta, args), **tree_map(_to_meta, kwargs))
        flops = counter.get_total_flops()
    except Exception:
        # Some ops have no meta kernel or need real data (nonzero, item): bytes only.
        flops = 0
    # A view reads and writes nothing; any other op reads its inputs and writes its outputs.
    is_view = getattr(node.target, "is_view", False)
    moved = 0 if is_view else _nbytes((args, kwargs, node.meta.get("val")))
    return max(flops / spec.peak_flops, moved / spec.bandwidth) + spec.launch_overhead


def _measure(
    gm: fx.GraphModule,
    keys: dict[fx.Node, str],
    device: torch.device,
    warmup: int,
    repeats: int,
    progress: bool,
) -> dict[str, float]:
    """Median seconds per key over `repeats` timed passes; keys of nodes that failed are absent."""
    nodes = list(gm.graph.nodes)
    frees = _frees_after(nodes)
    inputs = {n: _synthesise(_val(n), device) for n in nodes if n.op == "placeholder"}
    inputs.update({n: _attribute(gm, n, device) for n in nodes if n.op == "get_attr"})
    substitutes: dict[fx.Node, object] = {}  # outputs of nodes that failed, made up from meta
    samples: dict[str, list[float]] = defaultdict(list)
    show = progress and sys.stdout.isatty()
    for i in track(range(warmup + repeats), description="profiling", disable=not show):
        seconds = _run_pass(nodes, frees, inputs, substitutes, device)
        if i >= warmup:
            for node, s in seconds.items():
                if node in keys and node not in substitutes:
                    samples[keys[node]].append(s)
    return {key: statistics.median(s) for key, s in samples.items()}


def _run_pass(
    nodes: list[fx.Node],
    frees: dict[fx.Node, list[fx.Node]],
    inputs: dict[fx.Node, object],
    substitutes: dict[fx.Node, object],
    device: torch.device,
) -> dict[fx.Node, float]:
    """Run every call_function once, timing each; a node that raises gets a substitute."""
    env = dict(inputs)
    marks: dict[fx.Node, tuple[float | torch.cuda.Event, float | torch.cuda.Event]] = {}
    for node in nodes:
        if node.op == "call_function" and node in substitutes:
            env[node] = substitutes[node]
        elif node.op == "call_function":
            args, kwargs = fx.node.map_arg((node.args, node.kwargs), env.__getitem__)
            start = _mark(device)
            try:
                env[node] = node.target(*args, **kwargs)
            except Exception:
                # Unrunnable here (an op without a kernel on this device, say): downstream
                # nodes still run on an input made up from meta, and this one gets a roofline.
                env[node] = substitutes[node] = _synthesise(_val(node), device)
            marks[node] = (start, _mark(device))
        for dead in frees[node]:
            env.pop(dead, None)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return {node: _elapsed(start, end) for node, (start, end) in marks.items()}


def _attribute(gm: fx.GraphModule, node: fx.Node, device: torch.device) -> object:
    """The module attribute a get_attr node reads (a constant tensor), on `device`."""
    value: object = gm
    for part in str(node.target).split("."):
        value = getattr(value, part)
    return value.to(device) if isinstance(value, torch.Tensor) else value


def _frees_after(nodes: list[fx.Node]) -> dict[fx.Node, list[fx.Node]]:
    """The values whose last use is each node, so a pass holds only what is still needed."""
    frees: dict[fx.Node, list[fx.Node]] = {n: [] for n in nodes}
    seen: set[fx.Node] = set()
    for node in reversed(nodes):
        for used in node.all_input_nodes:
            if used not in seen:
                seen.add(used)
                frees[node].append(used)
    return frees


def _mark(device: torch.device) -> float | torch.cuda.Event:
    # CUDA runs asynchronously: events time the kernels, not the Python that queued them.
    if device.type == "cuda":
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event
    return time.perf_counter()


def _elapsed(start: float | torch.cuda.Event, end: float | torch.cuda.Event) -> float:
    if isinstance(start, torch.cuda.Event) and isinstance(end, torch.cuda.Event):
        return start.elapsed_time(end) / 1e3
    assert isinstance(start, float) and isinstance(end, float)
    return end - start


def _does_tensor_work(node: fx.Node) -> bool:
    return (
        node.op == "call_function"
        and node.target is not operator.getitem
        and any(isinstance(v, torch.Tensor) for v in tree_leaves(node.meta.get("val")))
    )


def _val(node: fx.Node) -> object:
    if "val" not in node.meta:
        raise UnsupportedModel(
            node.name, 'no meta["val"] to make a value from; trace it with fake tensors'
        )
    return node.meta["val"]


def _synthesise(val: object, device: torch.device) -> object:
    """A real value like `val`: random floats, zero integers (always a valid index)."""

    def make(v: object) -> object:
        if isinstance(v, torch.Tensor):
            shape = [int(s) for s in v.shape]
            if v.dtype.is_floating_point or v.dtype.is_complex:
                return torch.randn(shape, dtype=v.dtype, device=device)
            return torch.zeros(shape, dtype=v.dtype, device=device)
        return _concrete(v)

    return tree_map(make, val)


def _to_meta(v: object) -> object:
    if isinstance(v, torch.Tensor):
        shape, stride = [int(s) for s in v.shape], [int(s) for s in v.stride()]
        return torch.empty_strided(shape, stride, dtype=v.dtype, device="meta")
    return _concrete(v)


def _concrete(v: object) -> object:
    # A real or meta kernel needs a concrete number; a symbol's hint is the value traced.
    if isinstance(v, torch.SymInt | torch.SymFloat | torch.SymBool):
        return v.node.hint
    return v


def _nbytes(tree: object) -> int:
    tensors = (v for v in tree_leaves(tree) if isinstance(v, torch.Tensor))
    return sum(t.numel() * t.element_size() for t in tensors)
