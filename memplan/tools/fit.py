"""Will it fit? A model's whole training step planned for a device one may not have.

The model is traced as it is given: built on fake tensors (tools/fake_model.py), nothing
is allocated and node times come from the target device's roofline. The step's peak is
the graph's (weights, gradients, activations, workspace) plus what the optimizer holds
outside it (training_state.py), per FSDP rank where sharded. A budget no schedule can
meet, because what is held all step and the gradients alone pass it, is reported at
once with that bound and what dominates it, without a search; a budget the solvers cannot
meet gives the least peak they found.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from memplan.core.budget import Budget
from memplan.core.errors import InfeasibleBudget, MemplanError
from memplan.core.graph import Graph, Schedule
from memplan.core.simulate import MemoryTrace, simulate
from memplan.core.training_state import Breakdown, TrainingState, breakdown, floor, per_rank
from memplan.planner.capture import compile_training_step
from memplan.planner.fusion import as_solved
from memplan.planner.options import PlanOptions
from memplan.planner.partitioner import Partitioner
from memplan.planner.plan import Resident, unplanned_step
from memplan.planner.plan_file import Plan
from memplan.solvers import SolverOptions
from memplan.tools.batch_search import largest
from memplan.tools.zoo import Example


@dataclass(frozen=True)
class Fit:
    """One model's step against one budget on one device, all bytes per rank.

    `plan` is the plan within the budget, None where nothing fits; `least` is then the
    least peak the solvers found, or None where the bound alone proved that nothing
    fits (no search ran). `floor` is a peak no plan goes below, by part.
    """

    name: str
    device: str
    budget: int
    state: TrainingState
    unplanned: Breakdown
    floor: Breakdown
    plan: Plan | None
    planned: Breakdown | None
    least: int | None
    seconds: float

    @property
    def fits(self) -> bool:
        return self.plan is not None

    @property
    def bound(self) -> int:
        return self.floor.total

    def dominant(self) -> tuple[str, int]:
        """The largest part of the peak that decides: the plan's where it fits, the
        floor's where the floor proved nothing fits, else the unplanned peak's; its name
        and bytes."""
        if self.planned is not None:
            parts = self.planned
        else:
            parts = self.floor if self.least is None else self.unplanned
        return next(iter(parts.parts().items()))


@dataclass
class _Seen:
    """The graph of the step as traced (the first variant the Partitioner plans, per rank)
    and its unplanned peak's trace, kept by the check before solving."""

    graph: Graph
    unplanned: MemoryTrace
    schedule: Schedule


class _NoPlanCanFit(Exception):
    """Raised from inside tracing where the floor proves the budget infeasible."""


def training_state(model: nn.Module, optimizer: str, ranks: int) -> TrainingState:
    """The state a step of `model` holds outside its graph: from its trainable parameters,
    whose dtype says whether fp32 master copies exist, and its largest FSDP unit. FSDP2 is
    taken as applied the usual way: to each block of every nn.ModuleList (a transformer's
    layers) and to the root, whose unit holds every parameter outside those blocks (the
    embeddings and the output head). A unit gathers its frozen parameters too."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    if not trainable:
        raise MemplanError(f"{type(model).__name__} has no trainable parameters")
    blocks = [b for m in model.modules() if isinstance(m, nn.ModuleList) for b in m]
    in_blocks = {id(p) for b in blocks for p in b.parameters()}
    root = sum(p.nbytes for p in model.parameters() if id(p) not in in_blocks)
    units = [root, *(sum(p.nbytes for p in b.parameters()) for b in blocks)]
    return TrainingState(
        parameters=sum(p.numel() for p in trainable),
        optimizer=optimizer,
        mixed_precision=any(p.dtype != torch.float32 for p in trainable),
        ranks=ranks,
        largest_unit=max(units),
    )


def fit(
    example: Example,
    budget: Budget,
    options: PlanOptions,
    *,
    optimizer: str = "adamw",
    ranks: int = 1,
) -> Fit:
    """Plan `example`'s whole training step for `budget` (a share is of the step's
    unplanned peak, optimizer state included), with `options` (measure=False and a
    device_spec for a device one does not have)."""
    started = time.perf_counter()
    state = training_state(example.model, optimizer, ranks)
    partitioner = Partitioner(budget, options, name=example.name)
    partitioner.resident = Resident(outside=state.outside)
    seen: list[_Seen] = []
    partitioner.before_solving = _checker(state, budget, seen)
    plan, least = None, None
    try:
        compile_training_step(example.model, example.inputs, partitioner)
        plan = partitioner.plans[-1]
    except _NoPlanCanFit:
        pass
    except InfeasibleBudget as infeasible:
        least = infeasible.smallest_feasible + state.outside
    if not seen:
        raise MemplanError(f"{example.name} produced no trainable graph")
    traced = seen[0]
    unplanned = breakdown(traced.graph, traced.schedule, traced.unplanned, state)
    planned = None
    if plan is not None:
        schedule, lowered = partitioner.schedules[-1], partitioner.lowered[-1]
        bandwidth = options.solver_options(lowered.device.type).bandwidth
        solved = as_solved(lowered.graph, lowered.fx_nodes, options)
        trace = simulate(solved, schedule, bandwidth=bandwidth)
        planned = breakdown(solved, schedule, trace, state)
    return Fit(
        name=example.name,
        device=options.device_spec.name if options.device_spec else "this machine",
        budget=budget.resolve(unplanned.total),
        state=state,
        unplanned=unplanned,
        floor=floor(traced.graph, state),
        plan=plan,
        planned=planned,
        least=least,
        seconds=time.perf_counter() - started,
    )


def _checker(state: TrainingState, budget: Budget, seen: list[_Seen]) -> Callable[[Graph], Graph]:
    """The Partitioner's look at each graph before solving: divided per rank; the first,
    the graph as traced (a later one is another way to plan it: convolution copies in
    the graph), kept in `seen` with its unplanned trace, and stopped with _NoPlanCanFit
    where its floor is over the budget. A share is of the step's unplanned peak, as the
    planner takes it (planner/plan.py, Resident.budget_of)."""

    def check(graph: Graph) -> Graph:
        graph = per_rank(graph, state.ranks)
        if seen:
            return graph
        reference, unplanned = unplanned_step(graph, SolverOptions())
        assert reference.schedule is not None
        seen.append(_Seen(graph, unplanned, reference.schedule))
        asked = budget.resolve(unplanned.peak + state.outside)
        if floor(graph, state).total > asked:
            raise _NoPlanCanFit
        return graph

    return check


def largest_batch(
    build: Callable[[int], Example],
    budget: Budget,
    options: PlanOptions,
    *,
    optimizer: str = "adamw",
    ranks: int = 1,
    limit: int = 1 << 12,
    on_probe: Callable[[int, Fit], None] | None = None,
) -> int:
    """The largest batch whose step some plan fits within `budget` (bytes), by doubling
    and then bisection on fake-tensor plans: nothing runs. 0 where batch 1 does not fit.
    Assumes that a larger batch never needs less memory."""
    if budget.bytes is None:
        raise MemplanError("the largest batch needs a budget in bytes, not a share")

    def fits(batch: int) -> bool:
        found = fit(build(batch), budget, options, optimizer=optimizer, ranks=ranks)
        if on_probe is not None:
            on_probe(batch, found)
        return found.fits

    return largest(fits, 1, limit, 0)


def ranks_needed(found: Fit, most: int = 1024) -> int | None:
    """Of an unsharded step: the fewest FSDP ranks (a power of 2) at which what each rank
    holds all step, its shards of the state outside the graph, of the weights and of all
    their gradients, alone fits the budget; None beyond `most`.
    A necessary condition, not a plan: activations do not shrink with ranks."""
    state = found.state
    for ranks in (2**k for k in range(int(math.log2(most)) + 1)):
        sharded = dataclasses.replace(state, ranks=ranks)
        weights_and_grads = math.ceil((found.floor.weights + found.floor.grads) / ranks)
        if sharded.outside + weights_and_grads <= found.budget:
            return ranks
    return None
