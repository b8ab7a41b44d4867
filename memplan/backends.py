"""torch.compile backend: AOTAutograd with memplan's partition function.

`torch.compile(model, backend="memplan")` finds `memplan_backend` by name through the
torch_dynamo_backends entry point (options={"budget": "60%", "solver": ...} reach it);
`torch.compile(model, backend=memplan.backend(budget="60%"))` builds one explicitly.
Inductor compiles the planned graphs, as it does torch.compile's by default
(`inner="eager"` runs them unfused, for debugging). Each graph Dynamo hands over (one per
graph break) is planned so that the step stays within the budget: the bytes the graphs
before it keep for their backwards stay resident while it runs, and a share is of the
step's unplanned peak. A graph that cannot meet it is planned for its smallest feasible
peak, with a warning.

A graph Dynamo traced with dynamic shapes is planned at its traced sizes and runs at any
(planner/shapes.py). A call at sizes where that plan's prediction exceeds the budget is
planned again for those sizes (`ShapeDispatch`), up to MAX_SHAPE_PLANS per graph.

Plans are kept on disk by the graph's structure (planner/plan_cache.py): compiling the
same model with the same budget again, in this process or the next, applies the plan
made before without solving or profiling.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch._dynamo.backends.common import aot_autograd

from memplan.budget import Budget
from memplan.errors import MemplanError, MemplanWarning
from memplan.planner.capture import boxed_runner
from memplan.planner.options import PlanOptions
from memplan.planner.plan import Partitioner, Resident
from memplan.planner.plan_file import Plan
from memplan.planner.shapes import (
    ShapeSignature,
    SizeSymbol,
    describe,
    signature_of,
    size_symbols,
)
from memplan.units import format_bytes

INNER_COMPILERS = ("inductor", "eager")
# Per graph of dynamic shapes: how many sizes may get plans of their own. Each costs a
# trace, a profile and a compile; past the bound, calls run the plan made at the hints.
MAX_SHAPE_PLANS = 8


def _inductor_decompositions() -> dict[Any, Callable[..., Any]]:
    from torch._inductor.compile_fx import select_decomp_table

    return select_decomp_table()


# Inductor's settings under memplan. Layout optimization turns convolutions' activations
# channels-last, with copies the plan never saw: memplan plans the layouts of the graph as
# traced (PlanOptions.convolution_copies). `inductor_config=` overrides these.
INDUCTOR_CONFIG: dict[str, Any] = {"layout_optimization": False}


def _inductor(settings: dict[str, Any]) -> Callable[..., Any]:
    """Inductor's compile of one planned graph, under `settings` (torch._inductor.config)."""

    def compile_graph(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
        from torch._inductor import config
        from torch._inductor.compile_fx import compile_fx_inner

        with config.patch(settings):
            return compile_fx_inner(gm, list(example_inputs))

    return compile_graph


class MemplanBackend:
    """A Dynamo backend that plans every graph it compiles; `plans` holds their Plans."""

    def __init__(
        self,
        budget: Budget | str | float = "100%",
        solver: str = "greedy",
        inner: str = "inductor",
        inductor_config: dict[str, Any] | None = None,
        **options: Any,
    ) -> None:
        if inner not in INNER_COMPILERS:
            raise MemplanError(f"inner compiler must be one of {INNER_COMPILERS}, got {inner!r}")
        self.budget = Budget.parse(budget)
        self.options = PlanOptions(solver=solver, **{"best_effort": True, **options})
        # Eager runs the planned graphs as generated code that frees each value after its
        # last use, as the API path does, so saved activations die where the plan frees them.
        settings = {**INDUCTOR_CONFIG, **(inductor_config or {})}
        self.inner = boxed_runner if inner == "eager" else _inductor(settings)
        # Inductor lowers only graphs decomposed by its own table (as torch.compile's
        # default backend traces them): planned on the decomposed graph, the plan is of
        # the ops inductor is given.
        self.decompositions = _inductor_decompositions() if inner == "inductor" else None
        self.plans: list[Plan] = []
        self.graphs = 0
        # The step's graphs in the order they first compiled, the latest plan of each, by
        # (Dynamo frame, graph of that frame's compile): a graph break starts a new frame,
        # DDP's optimizer splits one compile into several graphs, and a recompile of a
        # frame (new guards, new sizes) replaces its graphs' plans, not adds to the step.
        self.step: dict[tuple[int, int], Plan] = {}
        self._graphs_of: dict[object, int] = {}  # graphs so far per Dynamo compile id

    @property
    def predicted_step_peak(self) -> int:
        """The step's predicted peak over its graphs: each graph's own peak plus what the
        graphs before it hold (0 before any graph is planned)."""
        return max((plan.step_peak for plan in self.step.values()), default=0)

    def __call__(
        self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any]
    ) -> Callable[..., Any]:
        name = f"graph{self.graphs}"
        self.graphs += 1
        symbols = size_symbols(example_inputs)
        partitioner = Partitioner(self.budget, self.options, name=name, keep_plans=True)
        partitioner.sizes = signature_of(symbols, example_inputs)
        key = self._graph_key()
        partitioner.resident = self._resident_before(key)
        compiled = self.compile(gm, example_inputs, partitioner)
        if partitioner.plans:
            self.step[key] = partitioner.plans[-1]
        if not symbols or not partitioner.plans:  # static, or no backward: nothing to resize
            return compiled
        dispatch = ShapeDispatch(self, gm, symbols, partitioner, compiled)
        # Dynamo runs what a backend returns inside the compiled frame: not to be traced.
        return torch._dynamo.disable(dispatch, reason="memplan dispatches on sizes")

    def _graph_key(self) -> tuple[int, int]:
        """(Dynamo frame, index of this graph in the frame's compile); (-1, n) outside one."""
        compile_id = torch._guards.CompileContext.current_compile_id()
        index = self._graphs_of.get(compile_id, 0)
        self._graphs_of[compile_id] = index + 1
        if compile_id is None or compile_id.frame_id is None:
            return (-1, index)
        return (compile_id.frame_id, index)

    def _resident_before(self, key: tuple[int, int]) -> Resident:
        """What the graphs of the step compiled before graph `key` first was hold."""
        earlier = []
        for seen, plan in self.step.items():
            if seen == key:
                break
            earlier.append(plan)
        return Resident(
            held=sum(p.held for p in earlier),
            unplanned_held=sum(p.unplanned_held for p in earlier),
            unplanned_step_peak=max((p.unplanned_step_peak for p in earlier), default=0),
        )

    def compile(
        self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any], partitioner: Partitioner
    ) -> Callable[..., Any]:
        """AOTAutograd on `gm` with `partitioner` planning it; its plans join `plans`."""
        compiled = aot_autograd(
            fw_compiler=self.inner,
            bw_compiler=self.inner,
            partition_fn=partitioner,
            decompositions=self.decompositions,
        )(gm, example_inputs)
        self.plans.extend(partitioner.plans)
        return compiled


class ShapeDispatch:
    """Runs a graph of dynamic shapes: the plan made at its hints where its prediction at
    a call's sizes holds the budget, else a plan made for those sizes (kept per size
    signature, at most MAX_SHAPE_PLANS)."""

    def __init__(
        self,
        backend: MemplanBackend,
        gm: torch.fx.GraphModule,
        symbols: tuple[SizeSymbol, ...],
        generic: Partitioner,
        compiled: Callable[..., Any],
    ) -> None:
        self.backend = backend
        self.gm = gm
        self.symbols = symbols
        self.generic = generic
        self.compiled = compiled
        self.runs: dict[ShapeSignature, Callable[..., Any]] = {generic.sizes: compiled}
        self.specialized = 0

    def __call__(self, *args: Any) -> Any:
        # AOTAutograd's boxed convention hands one list of arguments (and empties it).
        flat = args[0] if len(args) == 1 and isinstance(args[0], list) else args
        sizes = signature_of(self.symbols, flat)
        run = self.runs.get(sizes)
        if run is None:
            # Planning raises (best_effort=False) before anything of the step has run.
            run = self.runs[sizes] = self._run_for(sizes, list(flat))
        return run(*args)

    def _run_for(self, sizes: ShapeSignature, args: list[Any]) -> Callable[..., Any]:
        """The generic plan where it holds the budget at `sizes`, else a plan of its own."""
        budget = self.backend.budget
        peaks = self.generic.peaks_at(sizes)
        held = [(p, self.generic.resident.budget_of(budget, u)) for p, u in peaks]
        if all(peak <= asked for peak, asked in held):
            return self.compiled
        peak, asked = max(held, key=lambda h: h[0] - h[1])
        if self.specialized >= MAX_SHAPE_PLANS:
            warnings.warn(
                f"{self.generic.name} at sizes {describe(sizes)}: the plan made at "
                f"{describe(self.generic.sizes)} predicts {format_bytes(peak)}, above the "
                f"budget of {format_bytes(asked)}; {MAX_SHAPE_PLANS} sizes have plans of "
                "their own already, so it runs as planned",
                MemplanWarning,
                stacklevel=3,
            )
            return self.compiled
        self.specialized += 1
        partitioner = Partitioner(
            budget,
            self.backend.options,
            name=f"{self.generic.name}[{describe(sizes)}]",
            keep_plans=True,
        )
        partitioner.sizes = sizes
        partitioner.resident = self.generic.resident
        # Traced again on the call's own tensors: a graph of these sizes only.
        return self.backend.compile(self.gm, args, partitioner)


def backend(
    budget: Budget | str | float = "100%",
    solver: str = "greedy",
    inner: str = "inductor",
    inductor_config: dict[str, Any] | None = None,
    **options: Any,
) -> MemplanBackend:
    """A memplan backend for torch.compile with the given budget, solver and inner compiler
    (`inductor_config`: settings of torch._inductor.config over memplan's INDUCTOR_CONFIG)."""
    return MemplanBackend(budget, solver, inner, inductor_config, **options)


def memplan_backend(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    options: dict[str, Any] | None = None,
) -> Callable[..., Any]:
    """The backend registered by name: `torch.compile(model, backend="memplan")`. Dynamo
    calls it once per graph, so each graph is planned alone: for one budget across graph
    breaks, pass one `backend(...)` object instead."""
    return MemplanBackend(**(options or {}))(gm, example_inputs)
