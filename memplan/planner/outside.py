"""What a training step holds on the device outside its graphs, which a budget counts: the
optimizer's state (what it holds now, and what its first step will create), the master
weights it updates beside a model's own, and on a GPU whatever else is allocated there
beyond the graph's own inputs (another model, a cache, the state of an optimizer memplan
was not told of).

A budget is the device's peak for the whole step, what `torch.cuda.max_memory_allocated`
reads; the graphs are planned for what this leaves of it (planner/plan.Resident.outside).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch.multiprocessing.reductions import StorageWeakRef

from memplan.core.budget import Budget
from memplan.core.errors import BudgetError, MemplanError
from memplan.core.units import format_bytes

# Copies of a parameter that an optimizer of each kind creates at its first step, in the
# parameter's dtype (torch's optimizers make them with zeros_like): AdamW's and Adam's
# two moments, SGD's momentum buffer. Optimizers that create their state when built
# (Adagrad) hold it already, and are counted as they are.
STATE_COPIES = {"adamw": 2, "adam": 2, "sgd": 1, "none": 0}


@dataclass(frozen=True)
class Outside:
    """The bytes the step holds outside its graphs on its device: the optimizer's state,
    as it is and as its first step makes it, and, on a GPU, the other tensors allocated
    there beyond the graph's inputs."""

    optimizer_state: int = 0
    # The tensors an optimizer updates that the graph does not take, and their gradients:
    # fp32 master weights beside a bf16 model's.
    masters: int = 0
    other: int = 0

    @property
    def total(self) -> int:
        return self.optimizer_state + self.masters + self.other

    def describe(self) -> str:
        parts = [
            f"optimizer state {format_bytes(self.optimizer_state)}" if self.optimizer_state else "",
            f"master weights {format_bytes(self.masters)}" if self.masters else "",
            f"other tensors {format_bytes(self.other)}" if self.other else "",
        ]
        return ", ".join(filter(None, parts))


def optimizer_kind(optimizer: torch.optim.Optimizer | str | None) -> str:
    """The kind of state `optimizer` makes at its first step, one of STATE_COPIES;
    MemplanError, in one line, for one memplan cannot tell."""
    if optimizer is None:
        return "none"
    if isinstance(optimizer, str):
        if optimizer.lower() not in STATE_COPIES:
            raise MemplanError(
                f"optimizer must be a torch.optim.Optimizer or one of "
                f"{', '.join(STATE_COPIES)}, got {optimizer!r}"
            )
        return optimizer.lower()
    if isinstance(optimizer, torch.optim.AdamW | torch.optim.Adam):
        return "adamw"
    if isinstance(optimizer, torch.optim.SGD):
        momentum = optimizer.defaults.get("momentum", 0)
        return "sgd" if momentum else "none"
    if isinstance(optimizer, torch.optim.Optimizer):
        return "held"
    raise MemplanError(
        f"optimizer must be a torch.optim.Optimizer or one of {', '.join(STATE_COPIES)}, "
        f"got {type(optimizer).__name__}"
    )


def optimizer_state_bytes(
    optimizer: torch.optim.Optimizer | str | None,
    parameters: Iterable[torch.Tensor],
    device: torch.device,
) -> int:
    """The bytes on `device` of `optimizer`'s state for `parameters` once it has stepped:
    the state it holds (an Optimizer) and, for each trainable parameter it has none for
    yet, the copies its kind makes (STATE_COPIES; an Adam with amsgrad makes three).
    A kind memplan does not know ("held") is counted by the state it holds: at its first
    step it may make more, which memplan cannot foresee."""
    kind = optimizer_kind(optimizer)
    states = optimizer.state if isinstance(optimizer, torch.optim.Optimizer) else {}
    copies = STATE_COPIES.get(kind, 0)
    if isinstance(optimizer, torch.optim.Adam | torch.optim.AdamW):
        copies += bool(optimizer.defaults.get("amsgrad"))
    total = 0
    for parameter in parameters:
        state = states.get(parameter)
        if state:  # held: counted as it is, for a frozen parameter too
            total += _tensor_bytes(state.values(), device)
        elif _trained(parameter) and parameter.device == device:
            total += copies * parameter.nbytes
    return total


def allocated_beyond(inputs: Sequence[Any], device: torch.device) -> int:
    """On a GPU, the bytes allocated on `device` now beyond the storages of `inputs` (the
    tensors the graph takes: parameters, buffers, the batch); 0 on the CPU, where no
    allocator counts what is allocated."""
    if device.type != "cuda" or not torch.cuda.is_available():  # a CPU, or fake tensors
        return 0
    allocated = torch.cuda.memory_allocated(device)
    return max(0, allocated - _tensor_bytes(inputs, device))


def outside_of(
    optimizer: torch.optim.Optimizer | str | None,
    parameters: Sequence[torch.Tensor],
    inputs: Sequence[Any],
    device: torch.device,
) -> Outside:
    """What the step holds outside its graphs on `device`: the optimizer's state once it
    has stepped; the tensors among `parameters` (what the optimizer updates) that are no
    module's parameters and not among the graph's `inputs`, with their gradients (master
    weights: a module's parameter is a graph's input, of this graph or a later one); and,
    on a GPU, the other tensors allocated there now beyond those, the inputs and the
    state held."""
    state = optimizer_state_bytes(optimizer, parameters, device)
    taken = {id(x) for x in inputs}
    apart = [p for p in parameters if not isinstance(p, torch.nn.Parameter) and id(p) not in taken]
    masters = _tensor_bytes([*apart, *(p.grad for p in apart if p.grad is not None)], device)
    held = (
        _tensor_bytes(_state_tensors(optimizer), device)
        if isinstance(optimizer, torch.optim.Optimizer)
        else 0
    )
    other = max(0, allocated_beyond(inputs, device) - held - masters)
    return Outside(optimizer_state=state, masters=masters, other=other)


def check_room(budget: Budget, outside: Outside) -> None:
    """BudgetError, in one line naming both, where an absolute `budget` is not above what
    the step holds outside its graphs."""
    if budget.bytes is not None and budget.bytes <= outside.total:
        raise BudgetError(
            f"budget {format_bytes(budget.bytes)} is not above the "
            f"{format_bytes(outside.total)} the step holds outside its graphs "
            f"({outside.describe()})"
        )


def _trained(parameter: torch.Tensor) -> bool:
    """Whether an optimizer updates `parameter`: it takes gradients, or has one already (a
    master weight, detached from the graph, is given its gradient by hand)."""
    return parameter.requires_grad or parameter.grad is not None


def _state_tensors(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    return [v for state in optimizer.state.values() for v in state.values()]


def _tensor_bytes(values: Iterable[Any], device: torch.device) -> int:
    """The bytes of the storages of the tensors among `values` on `device`, each storage
    once (tied weights and views share one)."""
    storages: dict[StorageWeakRef, int] = {}
    for value in values:
        if isinstance(value, torch.Tensor) and value.device == device:
            storage = value.untyped_storage()
            storages[StorageWeakRef(storage)] = storage.nbytes()
    return sum(storages.values())
