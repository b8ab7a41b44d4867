"""The pipeline on one profiled graph: solve within the budget, lay out and check.

`plan_graph` turns a profiled Graph and a Budget into a Plan and its Schedule, for every
entry point (planner/prepared.py prepares a joint graph for it, planner/partitioner.py
hands the result to AOTAutograd). `Resident` is what the rest of the step holds while a
graph runs.
"""

from __future__ import annotations

import dataclasses
import warnings
from dataclasses import dataclass

from memplan.core.budget import Budget
from memplan.core.errors import InfeasibleBudget, MemplanWarning, PlanFileError
from memplan.core.graph import Decision, Graph, Schedule, SolveResult
from memplan.core.simulate import MemoryTrace, simulate
from memplan.core.units import format_bytes
from memplan.planner.fragmentation import MOVES, ArenaFit, fit_arena
from memplan.planner.layout import (
    ALLOCATOR_ALIGNMENT,
    EXACT_TIME_LIMIT,
    Layout,
    check_layout,
    lay_out,
)
from memplan.planner.options import PlanOptions
from memplan.planner.plan_file import Plan
from memplan.planner.solve import Solved, ran_out, solve_within_budget
from memplan.solvers import SolverOptions, get_solver
from memplan.solvers.baselines import as_written
from memplan.solvers.training import build_schedule


@dataclass(frozen=True)
class Resident:
    """What the rest of the step holds while a graph runs. Earlier graphs of the step
    (before a graph break): the bytes their forwards keep for their backwards, as planned
    and as unplanned, and the step's unplanned peak so far. Later graphs (`later`): the
    parameters only they take, and their gradients (memplan.compile.step.later_parameters).
    The step itself (`outside`): what stays on the device for the whole step outside its
    graphs, planned or not, the optimizer's state above all (planner/outside.py). A
    graph's budget is the step's, less what they hold."""

    held: int = 0
    unplanned_held: int = 0
    unplanned_step_peak: int = 0
    later: int = 0
    outside: int = 0

    def step_unplanned(self, unplanned_peak: int) -> int:
        """The step's unplanned peak, given a graph's own: the most of it, with what the
        earlier graphs hold unplanned and what the step holds outside its graphs, and the
        step's peak before it."""
        return max(self.unplanned_step_peak, unplanned_peak + self.unplanned_held + self.outside)

    def with_at_least(self, other: Resident) -> Resident:
        """What is resident, each count at least `other`'s."""
        return Resident(*(max(a, b) for a, b in zip(self.counts, other.counts, strict=True)))

    @property
    def counts(self) -> tuple[int, int, int, int, int]:
        return self.held, self.unplanned_held, self.unplanned_step_peak, self.later, self.outside

    def budget_of(self, budget: Budget, unplanned_peak: int) -> int:
        """A graph's budget in bytes, given its own unplanned peak: the step's budget less
        what the earlier and later graphs and the step outside them hold (at least 1
        byte)."""
        step_budget = budget.resolve(self.step_unplanned(unplanned_peak))
        return max(1, step_budget - self.held - self.later - self.outside)


def plan_graph(
    graph: Graph,
    budget: Budget,
    options: PlanOptions,
    *,
    device: str,
    fingerprint: str = "",
    reuse: Plan | None = None,
    written: bool = False,
    resident: Resident = Resident(),
) -> tuple[Plan, Schedule]:
    """Solve the graph for the budget (or re-apply `reuse`'s decisions, or, `written`, carry
    out the step as the model is written, held to its own peak whatever the budget)
    through the driver (planner/solve.py), checked by the simulator, and lay its
    allocations out in one arena. `device` is where the step runs ("cpu", "cuda:0");
    `resident` is what earlier graphs of the step hold (a share is then of the step's
    unplanned peak). Raises InfeasibleBudget with the least peak (in "arena" mode, the
    least arena) found when nothing fits."""
    solver_options = options.solver_options(device.split(":")[0])
    reference, unplanned = unplanned_step(graph, solver_options)
    asked = resident.budget_of(budget, unplanned.peak)
    reapplied = None if reuse is None else _reapply(graph, reuse, solver_options)
    if written:  # each way of a graph's convolution copies has a peak of its own
        reapplied, asked = reference, unplanned.peak
    solved = solve_within_budget(
        graph,
        asked,
        options.solver,
        solver_options,
        best_effort=options.best_effort,
        first=reapplied,
        as_written=reference,
    )
    layout = lay_out(
        solved.trace.allocations,
        options.layout,
        alignment=ALLOCATOR_ALIGNMENT,
        time_limit=_layout_seconds(options),
        prove=options.fragmentation == "arena",
    )
    if options.fragmentation == "arena":
        # A reused plan's decisions (or the step as written) are fixed, and a best-effort
        # plan is already at the least live peak found: their arenas are checked, not
        # fitted.
        fixed = reapplied is not None or solved.result.status == "best-effort"
        solved, layout = _fit_arena(graph, solved, layout, options, solver_options, fixed)
    result, trace = solved.result, solved.trace
    assert result.schedule is not None
    # The judges: the simulator for the live peak, the invariant checker for the layout.
    simulate(graph, result.schedule, bandwidth=solver_options.bandwidth, budget=solved.budget)
    check_layout(trace.allocations, layout)
    plan = _make_plan(graph, solved, layout, unplanned, budget, asked, device, fingerprint, options)
    kept = kept_for_backward(graph, trace, result.schedule.split)
    plan = dataclasses.replace(
        plan,
        held=kept,
        unplanned_held=kept_for_backward(graph, unplanned, reference.schedule.split),
        resident=resident.held,
        outside=resident.outside,
        unplanned_step_peak=resident.step_unplanned(unplanned.peak),
        output_bytes=forward_outputs(graph),
    )
    return plan, result.schedule


def unplanned_step(graph: Graph, options: SolverOptions) -> tuple[SolveResult, MemoryTrace]:
    """The unplanned step a share is of, and its trace: the step as the model is written,
    its own activation checkpointing included (solvers.baselines.as_written)."""
    reference = as_written(graph, None, options)
    assert reference.schedule is not None
    return reference, simulate(graph, reference.schedule)


def profile_cap(graph: Graph, budget: Budget, resident: Resident, options: SolverOptions) -> int:
    """The most bytes of values profiling `graph` may hold (planner/pass_values.py): the
    graph's budget, less its parameters and inputs, which the step holds already. It runs
    during the step that compiles the graph, so it is held to the step's budget too."""
    _, unplanned = unplanned_step(graph, options)
    inputs = sum(node.bytes for node in graph.nodes if node.is_resident_input)
    return max(0, resident.budget_of(budget, unplanned.peak) - inputs)


def kept_for_backward(graph: Graph, trace: MemoryTrace, split: int) -> int:
    """Bytes live at the end of the forward other than its outputs (which a later graph
    counts as its inputs): parameters, inputs and what the backward reads."""
    return max(0, trace.live[split - 1] - forward_outputs(graph)) if split else 0


def forward_outputs(graph: Graph) -> int:
    """The bytes of the graph's forward outputs."""
    return sum(graph[o].bytes for o in graph.outputs if not graph[o].is_backward)


def _layout_seconds(options: PlanOptions) -> float:
    """CP-SAT's limit per layout: the layout's own, within the plan's time limit. Where the
    budget bounds live bytes, the arena is only reported: "best" keeps the better
    heuristic there (CP-SAT's proof cost about a second on each plan), and "exact", asked
    by name, gets a tenth of the limit (the deterministic limit of 10 ran 47 s of wall
    time on an 8-layer MLP's plan)."""
    limit = EXACT_TIME_LIMIT if options.fragmentation == "arena" else EXACT_TIME_LIMIT / 10
    return min(limit, options.time_limit)


def _fit_arena(
    graph: Graph,
    solved: Solved,
    layout: Layout,
    options: PlanOptions,
    solver_options: SolverOptions,
    fixed: bool,
) -> tuple[Solved, Layout]:
    """Bound the arena of the layout, fragmentation included, by the budget (see
    planner/fragmentation.py; a `fixed` plan's arena is checked, not fitted); with
    best_effort, the least arena found becomes the budget."""
    solver = get_solver(options.solver)
    budget = solved.budget
    fit = fit_arena(
        graph,
        budget,
        ArenaFit(solved.result, solved.trace, layout, ()),
        lambda live_budget: solver(graph, live_budget, solver_options),
        solver_options,
        method=options.layout,
        alignment=ALLOCATOR_ALIGNMENT,
        layout_seconds=_layout_seconds(options),
        moves=() if fixed else MOVES,
    )
    # The moves are recorded in the plan's options, for reports and benchmarks.
    fitted = dataclasses.replace(
        fit.result, options={**fit.result.options, "arena_moves": list(fit.moves)}
    )
    # A move's solve is held to the plan's limit too: one that reached it cut the plan short.
    cut_short = solved.cut_short or (
        fit.result is not solved.result and ran_out(fit.result, solver_options)
    )
    if fit.layout.arena <= budget:
        return Solved(fitted, fit.trace, budget, solved.note, cut_short), fit.layout
    if not options.best_effort:
        raise InfeasibleBudget(budget, fit.layout.arena, fit.result.solver, what="arena")
    note = (
        f"{graph.name}: no layout found within {format_bytes(budget)}; planned for an "
        f"arena of {format_bytes(fit.layout.arena)} instead"
    )
    warnings.warn(note, MemplanWarning, stacklevel=3)
    best_effort = dataclasses.replace(fitted, status="best-effort")
    return Solved(best_effort, fit.trace, fit.layout.arena, note, cut_short), fit.layout


def _reapply(graph: Graph, reuse: Plan, options: SolverOptions) -> SolveResult:
    unknown = [name for name in reuse.decisions if name not in graph.by_name]
    if unknown:
        raise PlanFileError(f"plan does not match this model: no tensor named {unknown[0]!r}")
    decisions = {graph.by_name[k]: Decision(v) for k, v in reuse.decisions.items()}
    schedule = build_schedule(graph, decisions, bandwidth=options.bandwidth)
    return SolveResult(
        solver=reuse.solver,
        status=reuse.status,
        schedule=schedule,
        decisions=decisions,
        options=reuse.options,
        message="re-applied from a saved plan",
    )


def _make_plan(
    graph: Graph,
    solved: Solved,
    layout: Layout,
    unplanned: MemoryTrace,
    budget: Budget,
    asked: int,
    device: str,
    fingerprint: str,
    options: PlanOptions,
) -> Plan:
    result, trace = solved.result, solved.trace
    assert result.schedule is not None
    decisions = {graph[v].name: d.value for v, d in sorted(result.decisions.items())}
    return Plan(
        name=graph.name,
        solver=result.solver,
        status=result.status,
        device=device,
        budget=solved.budget,
        unplanned_peak=unplanned.peak,
        predicted_peak=trace.peak,
        unplanned_time=unplanned.time,
        predicted_time=trace.time,
        solve_seconds=result.solve_seconds,
        cut_short=solved.cut_short,
        fingerprint=fingerprint,
        decisions=decisions,
        tensor_bytes={graph[v].name: graph[v].bytes for v in sorted(result.decisions)},
        timeline=list(trace.live),
        clock=list(trace.clock),
        unplanned_timeline=list(unplanned.live),
        unplanned_clock=list(unplanned.clock),
        backward_start=result.schedule.split,
        options={**dataclasses.asdict(options), **result.options},
        arena=layout.arena,
        arena_bound=layout.live_peak,
        layout_method=layout.method,
        layout_status=layout.status,
        placements=[
            [a.start, a.end, a.bytes, offset]
            for a, offset in zip(trace.allocations, layout.offsets, strict=True)
        ],
        requested_budget=asked,
        requested_as=str(budget),
        note=solved.note,
    )


def say_again(warning: warnings.WarningMessage) -> None:
    """A warning held back while a way was planned, said now. memplan's own are said to
    the caller; any other (a library's DeprecationWarning, say) at the place that said it,
    so that the filters treat it as they would have: said as memplan's, the filters that
    make memplan's warnings errors turned torch's into errors."""
    if issubclass(warning.category, MemplanWarning):
        warnings.warn(warning.message, warning.category, stacklevel=3)
    else:
        where = (warning.filename, warning.lineno)
        warnings.warn_explicit(warning.message, warning.category, *where, source=warning.source)
