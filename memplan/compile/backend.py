"""torch.compile backend: AOTAutograd with memplan's partition function.

`torch.compile(model, backend=memplan.backend(budget="60%"))` builds one explicitly;
`torch.compile(model, backend="memplan", options={...})` builds one per torch.compile
call (by_name.py). Inductor compiles the planned graphs, as it does torch.compile's by
default (`inner="eager"` runs them unfused, for debugging), and the plan kept for a graph
is the one whose step, as Inductor compiles it, best holds the budget (rounds.py, with
the policy of search.py): `Plan.compiled_peak` is the prediction of what runs, read from
Inductor's compile, not measured. Each graph Dynamo hands over (one per graph break) is
planned so that the step stays within the budget: the bytes the graphs before it keep
for their backwards stay resident while it runs, as does what the step holds outside its
graphs (the optimizer's state, and on a GPU any other tensor allocated: planner/outside.py),
and a share is of the step's unplanned peak. Each planned graph is run by a graph runner
(runner.py): at sizes where the plan made at a dynamic graph's traced sizes exceeds the
budget, it is planned again for them, and a graph called again while earlier calls hold
more than its plan allowed for is planned again for what they held. The step's plans and
what is pending are the step ledger's (ledger.py). Plans are kept on disk by the graph's
structure (planner/plan_cache.py).
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch

from memplan import compat
from memplan.compile.inductor import (
    after_joint_passes,
    inductor_decompositions,
)
from memplan.compile.ledger import ROOM_SLACK, StepLedger
from memplan.compile.products import SETTING, products_pass
from memplan.compile.replanner import Replanner
from memplan.compile.rounds import GraphSearch
from memplan.compile.runner import GraphRunner
from memplan.compile.spinner import spinner
from memplan.compile.step import graph_key, resident_before, step_peaks
from memplan.compile.waiting import WaitingCalls
from memplan.core.budget import Budget
from memplan.core.errors import MemplanError
from memplan.planner.options import keyword_options
from memplan.planner.outside import Outside, check_room, optimizer_kind, outside_of
from memplan.planner.partitioner import Partitioner
from memplan.planner.plan_file import Plan
from memplan.planner.shapes import signature_of, size_symbols

INNER_COMPILERS = ("inductor", "eager")
# The backend's parameters besides PlanOptions' fields (named where an option is unknown).
OWN_OPTIONS = ("budget", "inner", "inductor_config", "reuse", "optimizer")


class MemplanBackend:
    """A Dynamo backend that plans every graph it compiles; `plans` holds their Plans."""

    def __init__(
        self,
        budget: Budget | str | float = "100%",
        solver: str = "greedy",
        inner: str = "inductor",
        inductor_config: dict[str, Any] | None = None,
        reuse: Plan | None = None,
        optimizer: torch.optim.Optimizer | str | None = None,
        **options: Any,
    ) -> None:
        if inner not in INNER_COMPILERS:
            raise MemplanError(f"inner compiler must be one of {INNER_COMPILERS}, got {inner!r}")
        self.budget = Budget.parse(budget)
        # The optimizer whose state the budget counts beside the graphs (outside.py): an
        # Optimizer, or its kind, counted over the trainable parameters the graphs take.
        optimizer_kind(optimizer)
        self.optimizer = optimizer
        self.outside = Outside()
        self._trainable: weakref.WeakValueDictionary[int, torch.nn.Parameter] = (
            weakref.WeakValueDictionary()
        )
        # Inductor fuses pointwise ops away: the solver prices them as it runs them.
        defaults = {"best_effort": True, "fused_pointwise": inner == "inductor"}
        self.options = keyword_options(OWN_OPTIONS, solver=solver, **{**defaults, **options})
        # Eager runs the planned graphs as generated code that frees each value after its
        # last use, as the API path does, so saved activations die where the plan frees them.
        # Inductor runs with torch.compile's own settings (layout optimization included:
        # the channels-last copies it makes are in what the rounds read), unless overridden.
        # None: unfused.
        # Its addmm rewrite is undone where it moves a product (compile/products.py),
        # unless the user gave a post-grad pass of their own.
        self.settings = None if inner == "eager" else dict(inductor_config or {})
        if self.settings is not None:
            self.settings.setdefault(SETTING, products_pass())
        # Inductor lowers only graphs decomposed by its own table (as torch.compile's
        # default backend traces them): planned on the decomposed graph, the plan is of
        # the ops inductor is given.
        self.decompositions = inductor_decompositions() if inner == "inductor" else None
        # A saved plan whose decisions every graph carries out instead of being solved
        # (a graph it was not made for is refused: PlanFileError).
        self.reuse = reuse
        self.plans: list[Plan] = []
        self.graphs = 0
        self._graphs_of: dict[object, int] = {}  # graphs so far per Dynamo compile id
        # The bytes of each parameter the step's graphs take, and of its gradient, by id.
        self.parameters: dict[int, tuple[int, int]] = {}
        # Calls of the graphs whose backward has not run, for what they hold (waiting.py).
        self.waiting = WaitingCalls()
        # The step's graphs in the order they first compiled, the plan of each in it, by
        # (Dynamo frame, graph of that frame's compile, the parameters it takes: a graph
        # break starts a new frame, DDP's optimizer splits one compile into several graphs,
        # and a recompile of a frame for new guards or sizes replaces its graphs' plans,
        # not adds to the step, unless it is of other parameters: each block of a model
        # compiled alone is a recompile of one frame, regional compilation); what is to be
        # planned again at run time, and why, by the graphs' runs (ledger.py).
        self.ledger = StepLedger()
        self.replanner = Replanner(self)

    @property
    def predicted_step_peak(self) -> int:
        """The step's predicted peak over its graphs (step.step_peaks; 0 before any
        graph is planned)."""
        return max(step_peaks(self.ledger.step, self.parameters).values(), default=0)

    def __call__(
        self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any], mode: str | None = None
    ) -> Callable[..., Any]:
        if mode is not None:  # torch.compile hands a backend its mode where not "default"
            raise MemplanError(
                f"torch.compile's mode={mode!r} stands for Inductor settings: give them to "
                f"memplan, as memplan.backend(inductor_config=torch._inductor."
                f"list_mode_options({mode!r})) or options={{'inductor_config': ...}} by name"
            )
        name = f"graph{self.graphs}"
        self.graphs += 1
        symbols = size_symbols(example_inputs)
        partitioner = Partitioner(self.budget, self.options, name=name, reuse=self.reuse)
        partitioner.sizes = signature_of(symbols, example_inputs)
        key = graph_key(example_inputs, self._graphs_of, self.parameters)
        step = self.ledger.step
        self.outside = self._outside(example_inputs, first=next(iter(step), key) == key)
        check_room(self.budget, self.outside)
        partitioner.resident = resident_before(step, key, self.outside.total)
        compiled = self.compile(gm, example_inputs, partitioner)
        if not partitioner.plans:  # no backward: nothing planned
            return compiled
        run = GraphRunner(
            self, self.replanner, self.waiting, gm, key, symbols, partitioner, compiled
        )
        # Dynamo runs what a backend returns inside the compiled frame: not to be traced.
        return torch.compiler.disable(run, reason="memplan checks what the step holds")

    def _outside(self, example_inputs: Sequence[Any], first: bool) -> Outside:
        """What the step holds outside its graphs as a graph compiles: the optimizer's
        state over the parameters known now, and, measured as the step's first graph
        compiles (later ones would count what earlier graphs hold for their backwards),
        what else is allocated on the device (outside.outside_of)."""
        tensors = [x for x in example_inputs if isinstance(x, torch.Tensor)]
        device = tensors[0].device if tensors else torch.device("cpu")
        self._trainable.update(
            {id(x): x for x in tensors if isinstance(x, torch.nn.Parameter) and x.requires_grad}
        )
        optimizer = self.optimizer
        if isinstance(optimizer, torch.optim.Optimizer):
            parameters = [p for group in optimizer.param_groups for p in group["params"]]
        else:
            parameters = list(self._trainable.values())
        found = outside_of(optimizer, parameters, tensors, device)
        return found if first else dataclasses.replace(found, other=self.outside.other)

    def outside_grew(self, inputs: Sequence[Any], step_budget: int) -> bool:
        """Whether what the step holds outside its graphs, read as a call begins the
        step's first graph (`inputs`), grew by more than ledger.ROOM_SLACK of the step's
        budget (`step_budget`): then it is taken as it is now, and the graphs are to be
        planned again for it, their plans' `outside` saying so. State an optimizer memplan
        was told of was counted ahead; the state of another is read as it grows (and on
        a GPU, whatever else is allocated: cuBLAS's workspace, made at the first step)."""
        now = self._outside(inputs, first=True)
        if now.total - self.outside.total <= ROOM_SLACK * step_budget:
            return False
        self.outside = now
        return True

    def reset(self) -> None:
        """Forget the step: torch._dynamo.reset() calls it (through torch.compile's
        wrapper), and Dynamo then numbers its frames and compiles from 0 again."""
        self.ledger.forget_step()
        self._graphs_of.clear()

    def compile(
        self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any], partitioner: Partitioner
    ) -> Callable[..., Any]:
        """AOTAutograd on `gm` with `partitioner` planning it; its plan joins `plans`. Under
        Inductor the plan is searched for in rounds (rounds.GraphSearch); with
        best_effort=False, a budget no round holds raises InfeasibleBudget before
        anything of the step runs, and no plan is kept."""
        first = len(partitioner.plans)
        strict = not partitioner.options.best_effort
        search = GraphSearch(partitioner, self.settings, strict=strict)
        # Under Inductor, planned on the joint graph as Inductor's joint passes leave it.
        partition = (
            search.partition if self.settings is None else after_joint_passes(search.partition)
        )
        compiled = self._aot(gm, example_inputs, partition, search.compiler, partitioner.name)
        self.plans.extend(partitioner.plans[first:])
        return compiled

    def _aot(
        self,
        gm: torch.fx.GraphModule,
        example_inputs: Sequence[Any],
        partition: Callable[..., Any],
        inner: Callable[..., Any],
        name: str,
    ) -> Callable[..., Any]:
        """One AOTAutograd compile of graph `name` with `partition` planning and `inner`
        compiling; the backward compiled at once (not at the first backward), so that the
        plan is whole before the step runs."""
        how = " with Inductor" if self.settings is not None else ""
        doing = f"{name}: planning for {self.budget}, then compiling{how}"
        with spinner(doing, self.options.progress), compat.lowering_backward_at_once(True):
            return compat.aot_autograd(
                fw_compiler=inner,
                bw_compiler=inner,
                partition_fn=partition,
                decompositions=self.decompositions,
                # As torch.compile's Inductor backend: the step's writes into its inputs
                # (BatchNorm's running statistics) stay in the graph, where Inductor fuses
                # them into its kernels, rather than being applied after it, a copy and an
                # allocation per buffer per step (ResNet-50: 159 of each).
                keep_inference_input_mutations=True,
            )(gm, example_inputs)


def backend(
    budget: Budget | str | float = "100%",
    solver: str = "greedy",
    inner: str = "inductor",
    inductor_config: dict[str, Any] | None = None,
    reuse: Plan | None = None,
    optimizer: torch.optim.Optimizer | str | None = None,
    **options: Any,
) -> MemplanBackend:
    """A memplan backend for torch.compile with the given budget, solver and inner compiler
    (`inductor_config`: settings of torch._inductor.config to compile under). `reuse`
    carries out the decisions of a Plan a backend made (one of `plans`) instead of solving;
    the budget is then what the compiled graphs are checked against. A plan of
    memplan.optimize or the CLI is of another trace (PlanFileError). `optimizer` (an
    Optimizer, or "adamw", "adam", "sgd") has the budget count the state it holds once it
    has stepped (planner/outside.py)."""
    return MemplanBackend(budget, solver, inner, inductor_config, reuse, optimizer, **options)
