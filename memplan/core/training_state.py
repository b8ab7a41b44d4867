"""What one training step holds on the device besides its graph's values, and what its
peak is made of.

The traced graph holds the weights (its parameters), the gradients its backward returns,
the activations and the kernels' workspace. A training step also holds, for the whole
step, what the optimizer keeps between steps: its state (AdamW: two fp32 moments per
parameter; SGD with momentum: one) and, in mixed precision, the fp32 master copy of each
weight and the fp32 gradient it is accumulated into. These never leave the device during
the step, so the planner holds them as bytes resident beside the graph.

Under FSDP2 each of `ranks` ranks keeps 1/ranks of every parameter, gradient and optimizer
state, and gathers one unit's whole parameters to run it (and holds its whole gradients
until they are reduce-scattered): `per_rank` divides the graph's parameters and returned
gradients, and `TrainingState.gathered` adds one unit's weights and gradients in full.
No torch here.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from memplan.core.errors import MemplanError
from memplan.core.graph import Compute, Graph, NodeKind, Schedule
from memplan.core.simulate import MemoryTrace

# The dtypes a model's weights and activations may be planned in, by their short names.
DTYPE_NAMES = ("fp32", "bf16", "fp16")
# fp32 bytes per parameter that an optimizer keeps between steps.
OPTIMIZER_STATE = {"adamw": 8, "sgd": 4, "none": 0}
# Mixed precision: an fp32 master weight and an fp32 gradient per parameter.
MASTER_COPIES = 8
# Units FSDP2 holds whole at once, in weights' bytes: two units' weights (the one running
# and the next, prefetched) and the running unit's gradients.
GATHERED_UNITS = 3


@dataclass(frozen=True)
class TrainingState:
    """The bytes a training step holds outside its graph, per rank.

    `parameters` counts the model's trainable elements; `mixed_precision` says the graph's
    weights are not fp32, so fp32 master copies exist; `largest_unit` is the bytes of the
    largest FSDP unit's weights as the graph holds them (used where `ranks` > 1).
    """

    parameters: int
    optimizer: str = "adamw"
    mixed_precision: bool = False
    ranks: int = 1
    largest_unit: int = 0

    def __post_init__(self) -> None:
        if self.optimizer not in OPTIMIZER_STATE:
            raise MemplanError(
                f"optimizer must be one of {', '.join(OPTIMIZER_STATE)}, got {self.optimizer!r}"
            )
        if self.ranks < 1:
            raise MemplanError(f"ranks must be at least 1, got {self.ranks}")

    @property
    def optimizer_bytes(self) -> int:
        """The optimizer's state on one rank."""
        return math.ceil(self.parameters * OPTIMIZER_STATE[self.optimizer] / self.ranks)

    @property
    def master_bytes(self) -> int:
        """The fp32 master weights and gradients on one rank (0 in plain fp32)."""
        if not self.mixed_precision:
            return 0
        return math.ceil(self.parameters * MASTER_COPIES / self.ranks)

    @property
    def gathered(self) -> int:
        """Sharded: what FSDP2 holds whole beside the shards, sized by the largest unit:
        the weights of the unit running and of the next one, gathered ahead (its default
        prefetch), and the running unit's gradients before they are reduce-scattered
        (0 unsharded)."""
        return GATHERED_UNITS * self.largest_unit if self.ranks > 1 else 0

    @property
    def outside(self) -> int:
        """Everything the step holds outside its graph, for the whole step."""
        return self.optimizer_bytes + self.master_bytes + self.gathered


def per_rank(graph: Graph, ranks: int) -> Graph:
    """The graph as one of `ranks` FSDP ranks holds it between gathers: each parameter and
    each gradient the backward returns keeps 1/ranks of its bytes (its shard, rounded up).
    The units being run hold their whole weights and gradients: TrainingState.gathered.
    Buffers, which FSDP2 replicates, are divided too (the graph does not tell them from
    parameters); in the decoders this is for they are a few kilobytes (rotary tables)."""
    if ranks == 1:
        return graph
    sharded = {v for v in graph.resident_inputs if graph[v].kind is NodeKind.PARAM}
    sharded |= _returned(graph)
    nodes = tuple(
        dataclasses.replace(n, bytes=math.ceil(n.bytes / ranks)) if n.id in sharded else n
        for n in graph
    )
    return dataclasses.replace(graph, nodes=nodes)


@dataclass(frozen=True)
class Breakdown:
    """What a step's peak is made of, in bytes: the graph's weights, the gradients it has
    returned so far, activations (everything else the graph holds, inputs included), the
    workspace of the kernel running at the peak, and what the step holds outside the
    graph (TrainingState: optimizer state, master copies, a gathered unit)."""

    weights: int
    grads: int
    activations: int
    workspace: int
    optimizer_state: int = 0
    master_copies: int = 0
    gathered: int = 0

    @property
    def total(self) -> int:
        return sum(dataclasses.astuple(self))

    def parts(self) -> dict[str, int]:
        """Each part by a reader's name, largest first."""
        names = {
            "weights": self.weights,
            "gradients": self.grads,
            "optimizer state": self.optimizer_state,
            "fp32 master weights and grads": self.master_copies,
            "gathered FSDP unit": self.gathered,
            "activations": self.activations,
            "workspace": self.workspace,
        }
        return dict(sorted(names.items(), key=lambda item: -item[1]))


def breakdown(
    graph: Graph, schedule: Schedule, trace: MemoryTrace, state: TrainingState | None = None
) -> Breakdown:
    """The parts of the step's peak under `schedule` (simulated as `trace`), with what
    `state` holds outside the graph."""
    weights, grads = _weights_and_grads(graph, {graph.storage_owner[v] for v in trace.live_at_peak})
    # The peak step's kernel workspace, as the simulator holds it (none before step 0).
    step = schedule.steps[trace.peak_step] if trace.peak_step >= 0 else None
    workspace = 0
    if isinstance(step, Compute) and graph[step.node].kind is NodeKind.COMPUTE:
        workspace = graph[step.node].workspace
    return _with_state(weights, grads, trace.peak - weights - grads - workspace, workspace, state)


def floor(graph: Graph, state: TrainingState | None = None) -> Breakdown:
    """Bytes no schedule of the graph can go below, by part: at its last step the
    resident inputs and every output are live at once (the weights, every gradient
    returned, and the rest: inputs and forward outputs, as activations), with what
    `state` holds outside the graph."""
    owners = {graph.storage_owner[v] for v in (*graph.resident_inputs, *graph.outputs)}
    weights, grads = _weights_and_grads(graph, owners)
    rest = sum(graph[o].bytes for o in owners) - weights - grads
    return _with_state(weights, grads, rest, 0, state)


def _weights_and_grads(graph: Graph, owners: set[int]) -> tuple[int, int]:
    """Of the storages `owners`: the bytes of the parameters and of the returned
    gradients."""
    weights = sum(graph[o].bytes for o in owners if graph[o].kind is NodeKind.PARAM)
    return weights, sum(graph[o].bytes for o in owners & _returned(graph))


def _returned(graph: Graph) -> set[int]:
    """The storages of the gradients the backward returns."""
    return {graph.storage_owner[v] for v in graph.outputs if graph[v].is_backward}


def _with_state(
    weights: int, grads: int, activations: int, workspace: int, state: TrainingState | None
) -> Breakdown:
    state = state or TrainingState(0, optimizer="none")
    return Breakdown(
        weights=weights,
        grads=grads,
        activations=activations,
        workspace=workspace,
        optimizer_state=state.optimizer_bytes,
        master_copies=state.master_bytes,
        gathered=state.gathered,
    )
