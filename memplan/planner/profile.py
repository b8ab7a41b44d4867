"""Seconds and transient bytes per node of an fx graph: measured by running it on the
device, or estimated (planner/roofline.py).

A node's transient is the allocator's peak while it runs above what it leaves allocated
(its outputs): the buffers a kernel makes and frees inside itself (workspaces, copies to
another layout, im2col columns), which no op returns, so that neither the live-storage
tracker nor the simulator would see them otherwise. On CPU it is read from the profiler's
allocation events inside a range around the node, on CUDA from max_memory_allocated
around it (planner/allocator.py).

Inputs are synthesised from the placeholders' `meta["val"]`, so any AOTAutograd graph runs.
Their values are made up (planner/made_up.py) from one pool per graph, so the step's own
random state stays as the user left it.
"""

from __future__ import annotations

import contextlib
import operator
import statistics
import sys
import time
import warnings
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
from rich.progress import track
from torch import fx

from memplan import compat
from memplan.core.config import shows_progress
from memplan.core.devices import DeviceSpec
from memplan.core.errors import MemplanWarning, UnsupportedModel
from memplan.planner import allocator
from memplan.planner.made_up import float_pool, made_up, span
from memplan.planner.pass_values import PassValues
from memplan.planner.profile_cache import Cost, ProfileCache, node_key
from memplan.planner.roofline import (
    device_spec,
    estimated_workspace,
    has_measured_bound,
    roofline_seconds,
)
from memplan.planner.shapes import concrete, hint

# The profiler range around node i of the transient pass.
_RANGE = "memplan.node."


@dataclass(frozen=True)
class Profile:
    """Per node name: seconds and transient bytes (0 for nodes that do no tensor work),
    and the nodes whose figures are estimates because they could not run here."""

    seconds: dict[str, float]
    workspace: dict[str, int]
    estimated: tuple[str, ...] = field(default=())


def profile_graph(
    gm: fx.GraphModule,
    *,
    device: torch.device,
    measure: bool = True,
    spec: DeviceSpec | None = None,
    repeats: int = 5,
    warmup: int = 2,
    cache: ProfileCache | None = None,
    progress: bool = True,
    cap: int | None = None,
) -> Profile:
    """The time and transient memory of every node of `gm` on `device` (estimates by the
    roofline of `spec` where given, else of `device`); each pass holds at most `cap`
    bytes of values where given (planner/pass_values.py).

    Measured times are the median of `repeats` passes over the whole graph after `warmup`,
    and transients the most of one more pass, both pooled over nodes with the same
    `node_key`. With a `cache`, a graph whose keys are all cached runs nothing. Estimates
    (`measure=False`, or a node that fails to run alone, which a MemplanWarning names) are
    never cached: they cost less to recompute than to look up.
    """
    device = torch.device(device)
    names = [n.name for n in gm.graph.nodes]
    seconds, workspace = dict.fromkeys(names, 0.0), dict.fromkeys(names, 0)
    work = [n for n in gm.graph.nodes if _does_tensor_work(n)]
    keys = {n: node_key(n, device) for n in work} if measure else {}
    # AOTAutograd calls the partition function with its fake tensor mode active: a real
    # measurement runs outside it, or every kernel would be a fake one's bookkeeping.
    with compat.real_tensors():
        measured = _cached_or_measured(gm, keys, device, cache, (warmup, repeats), progress, cap)
    spec = spec or device_spec(device)
    estimated = []
    for node in work:
        cost = measured.get(keys.get(node, ""))
        if cost is None:
            cost = Cost(roofline_seconds(node, spec), estimated_workspace(node))
            if measure:
                estimated.append(node.name)
        seconds[node.name], workspace[node.name] = cost
    if not measure:
        _warn_of_unbounded(work)
    if estimated:
        shown = ", ".join(estimated[:5]) + (
            f" and {len(estimated) - 5} more" if len(estimated) > 5 else ""
        )
        warnings.warn(
            f"{len(estimated)} node(s) could not run alone on {device} ({shown}): their time "
            "is a roofline estimate and their transient memory a conservative bound",
            MemplanWarning,
            stacklevel=2,
        )
    return Profile(seconds, workspace, tuple(estimated))


def _warn_of_unbounded(nodes: list[fx.Node]) -> None:
    """A MemplanWarning naming the ops whose transient estimate is the default guess, not a
    bound from measurements: a plan from estimates is never silently optimistic."""
    unknown = sorted({str(n.target) for n in nodes if not has_measured_bound(n.target)})
    if unknown:
        warnings.warn(
            f"no measured bound on the transient memory of {', '.join(unknown)}: taken as "
            "the bytes of their inputs and outputs; profile on the device (measure=True) to "
            "know it",
            MemplanWarning,
            stacklevel=3,
        )


def _cached_or_measured(
    gm: fx.GraphModule,
    keys: dict[fx.Node, str],
    device: torch.device,
    cache: ProfileCache | None,
    counts: tuple[int, int],
    progress: bool,
    cap: int | None,
) -> dict[str, Cost]:
    """A Cost per key: all from `cache` if it has every key, else one measurement of `gm`
    for the keys it lacks (a key another process cached meanwhile takes its cost)."""
    unique = set(keys.values())
    cached = {k: cache.get(k) for k in unique} if cache is not None else {}
    hits = {k: c for k, c in cached.items() if c is not None}
    if len(hits) == len(unique):
        return hits
    transients_readable = device.type == "cuda" or allocator.readable()
    if not transients_readable:
        warnings.warn(
            "a torch.profiler session is recording, and the CPU allocator cannot be read "
            "inside it without ending it: node times are measured, but transient memory is "
            "a conservative bound per op family and is not cached; plan outside the profiler "
            "to measure it",
            MemplanWarning,
            stacklevel=4,
        )
    measured = _measure(gm, keys, device, counts, progress, transients_readable, cap)
    # The whole graph ran again, hits included: the cached costs stand, so that a graph
    # planned before with them sees the same times now.
    costs = {**measured, **hits}
    if cache is not None and transients_readable:
        costs.update(cache.update({k: c for k, c in measured.items() if k not in hits}))
    return costs


def _measure(
    gm: fx.GraphModule,
    keys: dict[fx.Node, str],
    device: torch.device,
    counts: tuple[int, int],
    progress: bool,
    transients_readable: bool,
    cap: int | None,
) -> dict[str, Cost]:
    """Median seconds over the timed passes of `counts` (warmup, repeats) and the most
    transient bytes of one more pass (where the allocator can be read, else the
    roofline's bound), per key; keys of nodes that failed are absent. Each pass holds at
    most `cap` bytes of values where given (PassValues)."""
    warmup, repeats = counts
    passes = _Passes.of(gm, device, cap)
    samples: dict[str, list[float]] = defaultdict(list)
    show = progress and sys.stdout.isatty() and shows_progress()
    for i in track(range(warmup + repeats), description="profiling", disable=not show):
        seconds = _run_pass(passes)
        if i >= warmup:
            for node, s in seconds.items():
                if node in keys and node not in passes.substitutes:
                    samples[keys[node]].append(s)
    held: dict[str, int] = defaultdict(int)
    transients = (
        _transients(passes)
        if transients_readable
        else {node: estimated_workspace(node) for node in keys}
    )
    for node, nbytes in transients.items():
        if node in keys and node not in passes.substitutes:
            held[keys[node]] = max(held[keys[node]], nbytes)
    return {key: Cost(statistics.median(s), held[key]) for key, s in samples.items()}


@dataclass
class _Passes:
    """What the passes over one graph share: its nodes, the values each node's run lets
    go (`frees`), the values kept from pass to pass (placeholders and attributes), the
    outputs of nodes that failed (made up from meta), the floats made-up values are tiled
    from, and the cap on the bytes a pass holds (None: none), the pool's not included."""

    nodes: list[fx.Node]
    frees: dict[fx.Node, list[fx.Node]]
    kept: dict[fx.Node, object]
    substitutes: dict[fx.Node, object]
    device: torch.device
    floats: torch.Tensor
    cap: int | None

    @classmethod
    def of(cls, gm: fx.GraphModule, device: torch.device, cap: int | None) -> _Passes:
        nodes = list(gm.graph.nodes)
        # A size traced as a plain number has no value recorded, and nothing reads it.
        # The other placeholders' values are made up when first read (PassValues).
        kept: dict[fx.Node, object] = {
            n: None for n in nodes if n.op == "placeholder" and not n.users and "val" not in n.meta
        }
        kept.update({n: _attribute(gm, n, device) for n in nodes if n.op == "get_attr"})
        floats = _float_pool(nodes, device)
        if cap is not None:  # the pool is held through every pass
            cap = max(0, cap - floats.untyped_storage().nbytes())
        return cls(nodes, _frees_after(nodes), kept, {}, device, floats, cap)

    def values(self) -> PassValues:
        """The values of a new pass."""

        def make(node: fx.Node) -> object:
            return _synthesise(_val(node), self.device, self.floats)

        return PassValues(self.nodes, self.kept, make, self.cap)


def _transients(passes: _Passes) -> dict[fx.Node, int]:
    """One pass with the allocator watched around every call: each node's transient."""
    device = passes.device
    calls = [n for n in passes.nodes if n.op == "call_function"]
    if device.type == "cuda":
        found: dict[fx.Node, int] = {}

        @contextlib.contextmanager
        def watched(node: fx.Node) -> Iterator[None]:
            torch.cuda.synchronize(device)
            torch.cuda.reset_peak_memory_stats(device)
            yield
            torch.cuda.synchronize(device)
            peak = torch.cuda.max_memory_allocated(device)
            found[node] = max(0, peak - torch.cuda.memory_allocated(device))

        _run_pass(passes, around=watched)
        return found
    index = {node: i for i, node in enumerate(calls)}

    def ranged(node: fx.Node) -> contextlib.AbstractContextManager[object]:
        return torch.profiler.record_function(f"{_RANGE}{index[node]}")

    with allocator.recording(device, marked=_RANGE) as recorded:
        _run_pass(passes, around=ranged)
    held = recorded.transients()
    return {node: held.get(f"{_RANGE}{i}", 0) for node, i in index.items()}


def _run_pass(
    passes: _Passes,
    around: Callable[[fx.Node], contextlib.AbstractContextManager[object]] | None = None,
) -> dict[fx.Node, float]:
    """Run every call_function once, timing each (inside `around(node)` where given); a
    node that raises gets a substitute."""
    env = passes.values()
    device, substitutes = passes.device, passes.substitutes
    marks: dict[fx.Node, tuple[float | torch.cuda.Event, float | torch.cuda.Event]] = {}
    for node in passes.nodes:
        if node.op == "call_function" and node in substitutes:
            env.set(node, substitutes[node])
        elif node.op == "call_function":
            env.room_for(node)
            args, kwargs = fx.node.map_arg((node.args, node.kwargs), env.__getitem__)
            start = _mark(device)
            try:
                with around(node) if around is not None else contextlib.nullcontext():
                    value = node.target(*args, **kwargs)
            except Exception:
                # Unrunnable here (an op without a kernel on this device, say): downstream
                # nodes still run on an input made up from meta, and this one is estimated.
                value = substitutes[node] = _synthesise(_val(node), device, passes.floats)
            env.set(node, value)
            marks[node] = (start, _mark(device))
            del args, kwargs, value  # a value let go is freed
        for dead in passes.frees[node]:
            env.drop(dead)
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
        and any(isinstance(v, torch.Tensor) for v in compat.tree_leaves(node.meta.get("val")))
    )


def _val(node: fx.Node) -> object:
    if "val" not in node.meta:
        raise UnsupportedModel(
            node.name, 'no meta["val"] to make a value from; trace it with fake tensors'
        )
    return node.meta["val"]


def _synthesise(val: object, device: torch.device, floats: torch.Tensor) -> object:
    """A real value like `val`, with its strides (a kernel may copy an input of another
    layout, and that copy is part of its transient), made up (`made_up`)."""

    def make(v: object) -> object:
        if not isinstance(v, torch.Tensor):
            return concrete(v)
        return made_up(*_layout(v), 0, v.dtype, device, floats)

    return compat.tree_map(make, val)


def _layout(v: torch.Tensor) -> tuple[list[int], list[int]]:
    """`v`'s shape and strides at the hints."""
    return [hint(s) for s in v.shape], [hint(s) for s in v.stride()]


def _float_pool(nodes: list[fx.Node], device: torch.device) -> torch.Tensor:
    """The pool values are tiled from: as long as the longest floating value of `nodes`,
    up to its cap."""
    spans = (
        span(*_layout(v))
        for node in nodes
        for v in compat.tree_leaves(node.meta.get("val"))
        if isinstance(v, torch.Tensor) and (v.dtype.is_floating_point or v.dtype.is_complex)
    )
    return float_pool(max(spans, default=1), device)
