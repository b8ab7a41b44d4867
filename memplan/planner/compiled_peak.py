"""The peak of a plan as Inductor compiled it.

The simulator predicts the planned forward and backward graphs as memplan runs them
unfused: every value of the graph is a storage, freed after its last use. Inductor runs
other code: it fuses pointwise chains, so their intermediates never exist; it writes
results into dead inputs' buffers; and around its fallback kernels (convolutions'
backwards, say) it keeps buffers alive for kernels fused after them. Measured by the
allocator, Inductor's step can peak below the prediction or above it (see
docs/results.md, "The prediction under Inductor").

The difference is measured, not modeled. `CompiledGraphs` is the inner compiler of
memplan's backend: for every planned graph it compiles with Inductor, it keeps the
unfused twin memplan would run and the graph's example inputs. `compiled_peak` runs each
compiled graph and its twin once on the same random inputs of the traced sizes, reads both
peaks from the allocator (measure.py), and adds the difference, forward and backward
apart, to the simulator's peak of that phase. The simulator predicts the unfused graphs'
peaks exactly (the e2e tests check it against the allocator), so the sum is the peak of
what Inductor runs. The backend plans again at a lower budget where that exceeds the
budget, and at a higher one where fusion leaves room (backends.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx as fx
import torch.utils._pytree as pytree

from memplan.planner.capture import boxed_runner, keep_saved_tensors, module_copy
from memplan.planner.measure import measure_peak, own_random_numbers
from memplan.planner.plan_file import Plan
from memplan.planner.shapes import hint

# Names AOTAutograd gives the step's own inputs (parameters, buffers, user inputs): the
# caller holds them through the step, so they are no graph's memory.
RESIDENT_PREFIX = "primals"

Runner = Callable[[list[Any]], Any]


@dataclass
class CompiledGraph:
    """One graph Inductor compiled: its runner, the unfused twin, and how to call both."""

    compiled: Runner
    unfused: Runner
    example_inputs: list[Any]
    inputs: list[str]  # placeholder names
    outputs: list[str | None]  # per output, the name of the value it returns


@dataclass
class CompiledGraphs:
    """An inner compiler (`compile(gm, example_inputs)`) that records what it compiled,
    in order: a planned step's forward, then its backward."""

    compile: Callable[[fx.GraphModule, Sequence[Any]], Runner]
    graphs: list[CompiledGraph] = field(default_factory=list)

    def __call__(self, gm: fx.GraphModule, example_inputs: Sequence[Any]) -> Runner:
        inputs = [n.name for n in gm.graph.find_nodes(op="placeholder")]
        (output,) = gm.graph.find_nodes(op="output")
        returned = pytree.tree_leaves(output.args[0])
        outputs = [v.name if isinstance(v, fx.Node) else None for v in returned]
        keep_saved_tensors()  # lowered at once, for the check
        # The twin first: Inductor's passes may change `gm` in place.
        unfused = boxed_runner(module_copy(gm), example_inputs)
        compiled = self.compile(gm, example_inputs)
        self.graphs.append(CompiledGraph(compiled, unfused, list(example_inputs), inputs, outputs))
        return compiled


def compiled_peak(
    plan: Plan, graphs: Sequence[CompiledGraph], device: torch.device
) -> tuple[int, int]:
    """The plan's peak as Inductor runs `graphs` (its forward, then its backward), and its
    backward's: each phase's simulated peak plus what the compiled graph held above its
    unfused twin (or less, negative). The forwards run on random inputs of their traced
    sizes; each backward on what its forward returned (a saved index is one the forward
    made, valid for its kernels) and the same random gradients of the outputs."""
    # The runs draw random numbers: the user's generators are left as they were.
    with own_random_numbers(device) as seed:
        seed(0)
        return _compiled_peak(plan, graphs, device)


def _compiled_peak(
    plan: Plan, graphs: Sequence[CompiledGraph], device: torch.device
) -> tuple[int, int]:
    split = plan.backward_start
    if not split:
        return plan.predicted_peak, plan.backward_peak
    forward, *rest = graphs
    made = [_materialize(x) for x in forward.example_inputs]
    # The step's own tensors (parameters, buffers, inputs): held by the caller through the
    # step, so no graph's memory. What else a graph is handed is its own.
    resident = {
        x.untyped_storage().data_ptr()
        for name, x in zip(forward.inputs, made, strict=True)
        if name.startswith(RESIDENT_PREFIX) and isinstance(x, torch.Tensor)
    }
    # Each backward runs on what its own forward returned: Inductor's forward may return
    # other strides than the unfused one (channels-last, say), as its backward expects.
    unfused, unfused_bytes = _peak_of(forward.unfused, made, resident, device)
    compiled, compiled_bytes = _peak_of(forward.compiled, made, resident, device)
    peaks = [max(plan.timeline[:split]) + compiled_bytes - unfused_bytes]
    backward_peak = plan.backward_peak
    if rest and split < len(plan.timeline):
        (backward,) = rest
        gradients = {
            name: _materialize(example)
            for name, example in zip(backward.inputs, backward.example_inputs, strict=True)
            if name not in forward.outputs and name not in forward.inputs
        }
        unfused_bytes = _peak_of(
            backward.unfused, _fed(backward, forward, made, unfused, gradients), resident, device
        )[1]
        compiled_bytes = _peak_of(
            backward.compiled, _fed(backward, forward, made, compiled, gradients), resident, device
        )[1]
        backward_peak = max(plan.timeline[split:]) + compiled_bytes - unfused_bytes
        peaks.append(backward_peak)
    return max(peaks), backward_peak


def _fed(
    backward: CompiledGraph,
    forward: CompiledGraph,
    inputs: list[Any],
    returned: Sequence[Any],
    gradients: dict[str, Any],
) -> list[Any]:
    """The backward's inputs: what the forward was given or returned, by name, and the
    random gradients of its outputs."""
    by_name = {**gradients, **dict(zip(forward.inputs, inputs, strict=True))}
    by_name.update(zip(forward.outputs, returned, strict=True))
    return [by_name[name] for name in backward.inputs]


def _peak_of(
    run: Runner, inputs: list[Any], resident: set[int], device: torch.device
) -> tuple[Any, int]:
    """What one boxed call returns, and the allocator's peak over the call (measure.py,
    nothing counted as resident). Inputs whose storage is in `resident` are handed as they
    are; the others are copied inside what is measured and freed as the graph consumes
    them, as in the step. So a parameter an unfused forward saves costs nothing, while
    the channels-last copy of it Inductor's forward may save in its place is counted."""
    # A first, unmeasured call: what it sets up once and later calls reuse (the cuBLAS
    # workspace a CUDA stream gets at its first matrix product, tens of MiB) is not the
    # graph's, as steady_step_peak's unmeasured first step keeps it out of the step's.
    run(_handed(inputs, resident))
    results: list[Any] = []

    def call() -> None:
        results.append(run(_handed(inputs, resident)))

    peak = measure_peak(call, resident=[], device=device).peak_bytes
    return results[0], peak


def _handed(values: list[Any], resident: set[int]) -> list[Any]:
    """The list a boxed call consumes: the tensors whose storage is in `resident` as they
    are, fresh copies of the others (a compiled graph may write into an input it was
    handed). The copies keep sizes, strides and aliasing: each storage copied once, a view
    a view of its base's copy (a saved view keeps its base alive)."""
    storages: dict[int, torch.UntypedStorage] = {}
    handed = []
    for x in values:
        if not isinstance(x, torch.Tensor) or x.untyped_storage().data_ptr() in resident:
            handed.append(x)
            continue
        storage = x.untyped_storage()
        key = storage.data_ptr()
        if key not in storages:
            storages[key] = storage.clone()
        copy = torch.empty(0, dtype=x.dtype, device=x.device)
        handed.append(copy.set_(storages[key], x.storage_offset(), x.size(), x.stride()))
    return handed


def _materialize(value: Any) -> Any:
    """A real value for an example input: a tensor of its traced sizes and strides on its
    device (random floats, zero integers), the hint of a symbolic size."""
    if isinstance(value, torch.Tensor):
        sizes = [hint(s) for s in value.shape]
        strides = [hint(s) for s in value.stride()]
        real = torch.empty_strided(sizes, strides, dtype=value.dtype, device=value.device)
        if real.is_floating_point() or real.is_complex():
            return real.normal_()
        return real.zero_()
    if isinstance(value, torch.SymInt):
        return hint(value)
    return value
