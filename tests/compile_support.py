"""Helpers the torch.compile tests share: models, a step compared with eager's,
Inductor's own tolerance, and counting what the backend does."""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.utils.checkpoint
from test_e2e import train_step

import memplan
import memplan.compile.backend as memplan_backends
import memplan.compile.spinner
import memplan.planner.plan
import memplan.planner.profile
import memplan.planner.solve
from benchmarks.blocks import checkpointed_parts
from memplan.core.errors import (
    InfeasibleBudget,
    MemplanWarning,
    cause_of,
)
from memplan.planner.plan_file import Plan
from memplan.tools.zoo import ZOO, Example

# Bytes: far under any model's least peak, so that the backend plans for its least.
LEAST = 1024


def max_grad_errors(model: torch.nn.Module, expected: dict[str, torch.Tensor]) -> list[float]:
    """Per parameter, the largest absolute difference of its gradient from `expected`."""
    return [(p.grad - expected[n]).abs().max().item() for n, p in model.named_parameters()]


def inductor_errors(example: Example, expected: dict[str, torch.Tensor]) -> list[float]:
    """Inductor's own tolerance: per parameter, twice the larger distance from eager's
    gradients of plain torch.compile and of memplan's backend keeping everything (or
    1e-6). Fused kernels reduce in another order than eager's (BatchNorm's gradients
    differ most), and memplan hands Inductor the step decomposed by Inductor's own table
    before it is planned: what a plan recomputes or offloads must add nothing to that."""
    distances = []
    for backend in ("inductor", memplan.backend(budget="100%", progress=False)):
        torch._dynamo.reset()
        model = copy.deepcopy(example.model)
        train_step(torch.compile(model, backend=backend), example.inputs)()
        distances.append(max_grad_errors(model, expected))
    return [max(2 * a, 2 * b, 1e-6) for a, b in zip(*distances, strict=True)]


def in_float64(example: Example) -> Example:
    """A copy of `example` with its model and floating inputs in float64."""
    inputs = tuple(x.double() if x.is_floating_point() else x for x in example.inputs)
    return dataclasses.replace(example, model=copy.deepcopy(example.model).double(), inputs=inputs)


def small_gpt2() -> Example:
    return ZOO["gpt2"](batch=4, seq=32, layers=2, width=32)


def _cut(inputs: tuple[torch.Tensor, ...], batch: int, seq: int) -> tuple[torch.Tensor, ...]:
    return tuple(x[:batch, :seq].contiguous() for x in inputs)


def _train_and_compare(
    compiled: torch.nn.Module, model: torch.nn.Module, inputs: tuple[torch.Tensor, ...]
) -> None:
    """One step of the compiled model against one eager step of the same weights."""
    reference = copy.deepcopy(model)
    for m in (model, reference):
        m.zero_grad(set_to_none=True)
    train_step(compiled, inputs)()
    train_step(reference, inputs)()
    _assert_same_grads(model, reference)


def _assert_same_buffers(model: torch.nn.Module, reference: torch.nn.Module) -> None:
    """`model`'s buffers (BatchNorm's running statistics and its count of batches) are
    `reference`'s, within Inductor's tolerance."""
    for (name, got), want in zip(model.named_buffers(), reference.buffers(), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5, msg=name)


def _assert_same_grads(model: torch.nn.Module, reference: torch.nn.Module) -> None:
    """`model`'s gradients are `reference`'s, within Inductor's tolerance."""
    for (name, got), want in zip(model.named_parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(got.grad, want.grad, rtol=1e-4, atol=1e-5, msg=name)


def strict_refusal(example: Example, budget: str) -> InfeasibleBudget:
    """The InfeasibleBudget a backend with best_effort=False raises for `example` at
    `budget`, checked to come before anything of the step ran, with no plan kept."""
    torch._dynamo.reset()
    strict = memplan.backend(budget=budget, best_effort=False, progress=False)
    model = copy.deepcopy(example.model)
    with pytest.raises(Exception) as raised:  # Dynamo wraps what a backend raises
        train_step(torch.compile(model, backend=strict), example.inputs)()
    infeasible = cause_of(raised.value, InfeasibleBudget)
    assert isinstance(infeasible, InfeasibleBudget)
    assert not strict.plans and all(p.grad is None for p in model.parameters())
    return infeasible


class ThreeBreaks(torch.nn.Module):
    """Four MLP stages with a graph break between each two: Dynamo hands over 4 graphs."""

    def __init__(self, width: int = 64, depth: int = 6) -> None:
        super().__init__()
        self.stages = torch.nn.ModuleList(
            torch.nn.Sequential(
                *[m for _ in range(depth) for m in (torch.nn.Linear(width, width), torch.nn.GELU())]
            )
            for _ in range(4)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stages[0](x)
        torch._dynamo.graph_break()
        x = self.stages[1](x)
        torch._dynamo.graph_break()
        x = self.stages[2](x)
        torch._dynamo.graph_break()
        return self.stages[3](x).square().mean()


def _compiled_parts(
    parts: int, budget: str | int
) -> tuple[
    memplan_backends.MemplanBackend, torch.nn.Module, Callable[..., Any], tuple[torch.Tensor, ...]
]:
    """benchmarks.blocks.checkpointed_parts(parts) compiled afresh with memplan at `budget`:
    the backend, the module it trains (a copy of the model), the compiled module and the
    batch."""
    model, inputs = checkpointed_parts(parts)
    torch._dynamo.reset()
    backend = memplan.backend(budget=budget, progress=False)
    planned = copy.deepcopy(model)
    return backend, planned, torch.compile(planned, backend=backend), inputs


def _first_step_of_parts(
    parts: int, budget: str
) -> tuple[
    memplan_backends.MemplanBackend,
    torch.nn.Module,
    Callable[..., Any],
    tuple[torch.Tensor, ...],
    pytest.WarningsRecorder,
]:
    """benchmarks.blocks.checkpointed_parts(parts) compiled with memplan at `budget`, after
    its first step (planned, and found short): the backend, the module it trains, the
    compiled module, the inputs and the warnings the step gave."""
    backend, planned, compiled, inputs = _compiled_parts(parts, budget)
    with pytest.warns(MemplanWarning) as said:
        train_step(compiled, inputs)()
    return backend, planned, compiled, inputs, said


def _later_parameters(parts: torch.nn.Module, first: int) -> int:
    """The bytes of the parameters of a checkpointed_parts model's graphs from part `first`
    on (the last graph's include the head's)."""
    later = [*parts.parts[first:].parameters(), *parts.head.parameters()]
    return sum(p.nbytes for p in later) if first < len(parts.parts) else 0


def _counted_compiles(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """One entry per AOTAutograd compile the memplan backend makes from now on."""
    compiles: list[int] = []
    aot = memplan_backends.MemplanBackend._aot

    def counted(self: memplan_backends.MemplanBackend, *args: Any) -> Any:
        compiles.append(len(compiles))
        return aot(self, *args)

    monkeypatch.setattr(memplan_backends.MemplanBackend, "_aot", counted)
    return compiles


def _counted_solves(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the solvers the driver runs from now on, in order."""
    solved: list[str] = []
    get_solver = memplan.planner.solve.get_solver

    def counted(name: str) -> Callable[..., Any]:
        solved.append(name)
        return get_solver(name)

    monkeypatch.setattr(memplan.planner.solve, "get_solver", counted)
    return solved


def _plans_of_two_compiles(example: Example, budget: str, time_limit: float) -> list[Plan]:
    """The plans of two compiles of `example` by fresh backends (as two processes would)."""
    plans: list[Plan] = []
    for _ in range(2):
        torch._dynamo.reset()
        backend = memplan.backend(
            budget=budget, inner="eager", progress=False, time_limit=time_limit
        )
        train_step(torch.compile(copy.deepcopy(example.model), backend=backend), example.inputs)()
        assert len(backend.plans) == 1
        plans += backend.plans
    return plans


def _must_not_run(*_: object, **__: object) -> None:
    raise AssertionError("ran where the kept plan should have been applied")
