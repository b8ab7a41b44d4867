"""torch.compile backend: AOTAutograd with memplan's partition function.

`torch.compile(model, backend="memplan")` finds `memplan_backend` by name through the
torch_dynamo_backends entry point (options={"budget": "60%", "solver": ...} reach it);
`torch.compile(model, backend=memplan.backend(budget="60%"))` builds one explicitly. Each
graph Dynamo hands over (one per graph break) is planned on its own against the budget;
a graph that cannot meet it is planned for its smallest feasible peak, with a warning.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch._dynamo.backends.common import aot_autograd

from memplan.budget import Budget
from memplan.errors import MemplanError
from memplan.planner.capture import boxed_runner
from memplan.planner.options import PlanOptions
from memplan.planner.plan import Partitioner
from memplan.planner.plan_file import Plan

INNER_COMPILERS = ("eager", "inductor")


def _inductor_decompositions() -> dict[Any, Callable[..., Any]]:
    from torch._inductor.compile_fx import select_decomp_table

    return select_decomp_table()


def _inductor(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Callable[..., Any]:
    from torch._inductor.compile_fx import compile_fx_inner

    if any(n.name.startswith(("offload_", "prefetch_")) for n in gm.graph.nodes):
        raise MemplanError("the inductor inner compiler does not support offload plans yet")
    return compile_fx_inner(gm, list(example_inputs))


class MemplanBackend:
    """A Dynamo backend that plans every graph it compiles; `plans` holds their Plans."""

    def __init__(
        self,
        budget: Budget | str | float = "100%",
        solver: str = "greedy",
        inner: str = "eager",
        **options: Any,
    ) -> None:
        if inner not in INNER_COMPILERS:
            raise MemplanError(f"inner compiler must be one of {INNER_COMPILERS}, got {inner!r}")
        self.budget = Budget.parse(budget)
        self.options = PlanOptions(solver=solver, **{"best_effort": True, **options})
        # Eager runs the planned graphs as generated code that frees each value after its
        # last use, as the API path does, so saved activations die where the plan frees them.
        self.inner = boxed_runner if inner == "eager" else _inductor
        # Inductor lowers only graphs decomposed by its own table (as torch.compile's
        # default backend traces them): planned on the decomposed graph, the plan is of
        # the ops inductor is given.
        self.decompositions = _inductor_decompositions() if inner == "inductor" else None
        self.plans: list[Plan] = []

    def __call__(
        self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any]
    ) -> Callable[..., Any]:
        partitioner = Partitioner(self.budget, self.options, name=f"graph{len(self.plans)}")
        compiled = aot_autograd(
            fw_compiler=self.inner,
            bw_compiler=self.inner,
            partition_fn=partitioner,
            decompositions=self.decompositions,
        )(gm, example_inputs)
        self.plans.extend(partitioner.plans)
        return compiled


def backend(
    budget: Budget | str | float = "100%",
    solver: str = "greedy",
    inner: str = "eager",
    **options: Any,
) -> MemplanBackend:
    """A memplan backend for torch.compile with the given budget, solver and inner compiler."""
    return MemplanBackend(budget, solver, inner, **options)


def memplan_backend(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    options: dict[str, Any] | None = None,
) -> Callable[..., Any]:
    """The backend registered by name: `torch.compile(model, backend="memplan")`."""
    return MemplanBackend(**(options or {}))(gm, example_inputs)
