"""The modules a planned training step runs as: `CompiledStep` (a model's step compiled
through some partition function) and `PlannedModule` (memplan's, with its Plan).

`plan_module` is the pipeline from a model to a PlannedModule: the API, the tools and
the CLI all plan a module through it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from memplan.core.budget import Budget
from memplan.core.errors import MemplanError
from memplan.planner.capture import Compiled, compile_training_step
from memplan.planner.options import PlanOptions
from memplan.planner.outside import check_room, outside_of
from memplan.planner.partitioner import Partitioner
from memplan.planner.plan import Resident
from memplan.planner.plan_file import Plan


class CompiledStep(nn.Module):
    """Trains `model` with a forward and backward graph compiled for the example inputs.

    The graphs were traced for the example inputs' shapes and training mode: other shapes
    raise an error, and in eval mode the original module runs.
    """

    def __init__(self, model: nn.Module, compiled: Compiled, example_inputs: Sequence[Any]) -> None:
        super().__init__()
        self.model = model
        self._compiled = compiled
        self._signature = [_describe(x) for x in example_inputs]

    def forward(self, *inputs: Any) -> Any:
        if not self.training:
            return self.model(*inputs)
        signature = [_describe(x) for x in inputs]
        if signature != self._signature:
            raise MemplanError(
                f"compiled for inputs {self._signature}, got {signature}; "
                "compile again for new shapes"
            )
        params = dict(self.model.named_parameters(remove_duplicate=False))
        buffers = dict(self.model.named_buffers(remove_duplicate=False))
        state = [params[n] for n in self._compiled.param_names]
        state += [buffers[n] for n in self._compiled.buffer_names]
        return self._compiled.fn(*state, *inputs)


class PlannedModule(CompiledStep):
    """Trains `model` with memplan's forward and backward graphs; `.plan` is their Plan.

    Call memplan.optimize again for other input shapes."""

    def __init__(
        self, model: nn.Module, compiled: Compiled, plan: Plan, example_inputs: Sequence[Any]
    ) -> None:
        super().__init__(model, compiled, example_inputs)
        self.plan = plan


def plan_module(
    model: nn.Module,
    example_inputs: Sequence[Any],
    budget: Budget,
    options: PlanOptions,
    *,
    reuse: Plan | None = None,
    optimizer: torch.optim.Optimizer | str | None = None,
) -> PlannedModule:
    """A module that trains like `model` with peak memory within `budget`; `reuse` applies
    a saved Plan's decisions instead of solving again; the budget counts what the step
    holds outside its graph (`optimizer`'s state; on a GPU, other tensors: outside.py)."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    tensors = [*model.parameters(), *model.buffers(), *example_inputs]
    device = trainable[0].device if trainable else torch.device("cpu")
    outside = outside_of(optimizer, trainable, tensors, device)
    check_room(budget, outside)
    partitioner = Partitioner(budget, options, name=type(model).__name__, reuse=reuse)
    partitioner.resident = Resident(outside=outside.total)
    compiled = compile_training_step(model, example_inputs, partitioner)
    if len(partitioner.plans) != 1:
        raise MemplanError("the model produced no trainable graph (do any outputs require grad?)")
    return PlannedModule(model, compiled, partitioner.plans[0], example_inputs)


def _describe(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return (tuple(value.shape), str(value.dtype), str(value.device))
    return type(value).__name__
