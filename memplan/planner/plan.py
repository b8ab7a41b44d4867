"""The pipeline on one joint graph: lower, profile, solve within the budget, lay out, check
and rewrite.

`plan_graph` turns a profiled Graph and a Budget into a Plan and its Schedule;
`Partitioner` is the partition function memplan hands to AOTAutograd, so the Python
API, the .pt2 path and the torch.compile backend all plan through it.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch.fx as fx

from memplan.budget import Budget
from memplan.errors import InfeasibleBudget, MemplanWarning, PlanFileError
from memplan.graph import Decision, Graph, Schedule, SolveResult
from memplan.passes.contiguous import contiguous_convolution_inputs
from memplan.passes.rewrite import Lowered, rewrite
from memplan.planner.capture import module_copy
from memplan.planner.fragmentation import MOVES, ArenaFit, fit_arena
from memplan.planner.fusion import fused_seconds
from memplan.planner.layout import (
    ALLOCATOR_ALIGNMENT,
    EXACT_TIME_LIMIT,
    Layout,
    check_layout,
    lay_out,
)
from memplan.planner.lower import drop_checked_asserts, lower, write_inputs_early
from memplan.planner.options import PlanOptions
from memplan.planner.plan_cache import cached_plan, plan_key, store_plan
from memplan.planner.plan_file import Plan
from memplan.planner.profile import ProfileCache, profile_graph
from memplan.planner.shapes import ShapeSignature, at
from memplan.planner.solve import Solved, ran_out, solve_within_budget
from memplan.planner.transfer_cost import transfer_seconds
from memplan.simulate import MemoryTrace, simulate
from memplan.solvers import SolverOptions, get_solver
from memplan.solvers.baselines import as_written
from memplan.solvers.training import build_schedule
from memplan.units import format_bytes

# Where a convolution's input of another layout is copied to the one its kernel wants.
KERNEL_COPIES, GRAPH_COPIES = "kernel", "graph"  # the ways of PlanOptions.convolution_copies


@dataclass(frozen=True)
class Resident:
    """What earlier graphs of the step (before a graph break) hold while a graph runs: the
    bytes their forwards keep for their backwards, as planned and as unplanned, and the
    step's unplanned peak so far; and what later graphs do (`later`: the parameters only
    they take, and their gradients, memplan.step.later_parameters). A graph's budget is the
    step's, less what they hold."""

    held: int = 0
    unplanned_held: int = 0
    unplanned_step_peak: int = 0
    later: int = 0

    def step_unplanned(self, unplanned_peak: int) -> int:
        """The step's unplanned peak, given a graph's own: the most of it, with what the
        earlier graphs hold unplanned, and the step's peak before it."""
        return max(self.unplanned_step_peak, unplanned_peak + self.unplanned_held)

    def with_at_least(self, other: Resident) -> Resident:
        """What is resident, each count at least `other`'s."""
        return Resident(*(max(a, b) for a, b in zip(self.counts, other.counts, strict=True)))

    @property
    def counts(self) -> tuple[int, int, int, int]:
        return self.held, self.unplanned_held, self.unplanned_step_peak, self.later

    def budget_of(self, budget: Budget, unplanned_peak: int) -> int:
        """A graph's budget in bytes, given its own unplanned peak: the step's budget less
        what the earlier and later graphs hold (at least 1 byte)."""
        step_budget = budget.resolve(self.step_unplanned(unplanned_peak))
        return max(1, step_budget - self.held - self.later)


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
    kept = _kept_for_backward(graph, trace, result.schedule.split)
    plan = dataclasses.replace(
        plan,
        held=kept,
        unplanned_held=_kept_for_backward(graph, unplanned, reference.schedule.split),
        resident=resident.held,
        unplanned_step_peak=resident.step_unplanned(unplanned.peak),
        output_bytes=_forward_outputs(graph),
    )
    return plan, result.schedule


def unplanned_step(graph: Graph, options: SolverOptions) -> tuple[SolveResult, MemoryTrace]:
    """The unplanned step a share is of, and its trace: the step as the model is written,
    its own activation checkpointing included (solvers.baselines.as_written)."""
    reference = as_written(graph, None, options)
    assert reference.schedule is not None
    return reference, simulate(graph, reference.schedule)


def _profile_cap(graph: Graph, budget: Budget, resident: Resident, options: SolverOptions) -> int:
    """The most bytes of values profiling `graph` may hold (planner/pass_values.py): the
    graph's budget, less its parameters and inputs, which the step holds already. It runs
    during the step that compiles the graph, so it is held to the step's budget too."""
    _, unplanned = unplanned_step(graph, options)
    inputs = sum(node.bytes for node in graph.nodes if node.is_resident_input)
    return max(0, resident.budget_of(budget, unplanned.peak) - inputs)


def _kept_for_backward(graph: Graph, trace: MemoryTrace, split: int) -> int:
    """Bytes live at the end of the forward other than its outputs (which a later graph
    counts as its inputs): parameters, inputs and what the backward reads."""
    return max(0, trace.live[split - 1] - _forward_outputs(graph)) if split else 0


def _forward_outputs(graph: Graph) -> int:
    """The bytes of the graph's forward outputs."""
    return sum(graph[o].bytes for o in graph.outputs if not graph[o].is_backward)


def _layout_seconds(options: PlanOptions) -> float:
    """CP-SAT's limit per layout: the layout's own, within the plan's time limit."""
    return min(EXACT_TIME_LIMIT, options.time_limit)


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


class RepeatedPlan(Exception):
    """Raised by a Partitioner, before it rewrites the graph, where the plan it made is one
    its caller listed in `Partitioner.compiled`: what compiling it would give is known."""


class Partitioner:
    """memplan's partition function for AOTAutograd: plans each joint graph it is given
    and returns the rewritten forward and backward. `plans` collects one Plan per graph."""

    def __init__(
        self,
        budget: Budget,
        options: PlanOptions,
        *,
        name: str = "model",
        reuse: Plan | None = None,
        cache: ProfileCache | None = None,
        keep_plans: bool = False,
    ) -> None:
        self.budget = budget
        self.options = options
        self.name = name
        self.reuse = reuse
        # Plans kept on disk by graph structure (plan_cache.py), for the next process.
        self.keep_plans = keep_plans
        # Profiled times are cached on disk, so that planning the same model twice sees the
        # same times and makes the same decisions.
        self.cache = cache if cache is not None else ProfileCache()
        # The sizes (symbol -> value) a graph of dynamic shapes is planned at: its hints.
        self.sizes: ShapeSignature = ()
        # What earlier graphs of the step hold while this one runs (graph breaks), and
        # what the step holds outside its graphs (tools/fit.py: optimizer state).
        self.resident = Resident()
        # Of `resident.held`, the bytes a later graph of the step needs only between this
        # graph's forward and its backward (held_watch.make_room): a plan holds the budget
        # where its peak is within the budget with them given back, and what it keeps for
        # its backward within it with them taken (rounds.kept_round).
        self.room = 0
        # A last look at each graph, its times set, before it is solved: tools/fit.py
        # divides it per FSDP rank there, and stops where no plan can fit.
        self.before_solving: Callable[[Graph], Graph] | None = None
        # Plans the caller has compiled already, by the way their convolutions' copies are
        # made and their schedule: one made again raises RepeatedPlan instead of being
        # rewritten (the torch.compile backend's rounds, backends.py).
        self.compiled: list[tuple[str, Schedule]] = []
        # Carry out the step as the model is written instead of solving (a round of the
        # backend's for a model with its own checkpointing, backends.py); never cached.
        self.as_written = False
        self.plans: list[Plan] = []
        self.lowered: list[Lowered] = []
        self.schedules: list[Schedule] = []

    def __call__(
        self, joint: fx.GraphModule, joint_inputs: object, *, num_fwd_outputs: int, **_: object
    ) -> tuple[fx.GraphModule, fx.GraphModule]:
        drop_checked_asserts(joint)
        joint.graph.eliminate_dead_code()
        write_inputs_early(joint)
        name = self.name if not self.plans else f"{self.name}.{len(self.plans)}"
        # A graph whose convolutions get inputs of another layout can be planned with the
        # copies inside the kernels, in the graph (passes/contiguous.py), or both ways.
        copies = self.options.convolution_copies
        variants = {} if copies == "graph" else {KERNEL_COPIES: joint}
        if copies != "kernel":
            copied = module_copy(joint)
            if contiguous_convolution_inputs(copied):
                variants[GRAPH_COPIES] = copied
        variants = variants or {KERNEL_COPIES: joint}  # "graph", but nothing to copy
        offload_threshold = self.options.offload_threshold
        lowered = {
            way: (v, lower(v, num_fwd_outputs, name=name, offload_threshold=offload_threshold))
            for way, v in variants.items()
        }
        if self.reuse is not None:
            fingerprint = self.reuse.fingerprint
            matching = {w: p for w, p in lowered.items() if p[1].fingerprint == fingerprint}
            if not matching:
                ours = next(iter(lowered.values()))[1].fingerprint
                raise PlanFileError(
                    f"plan {self.reuse.name!r} was made for another graph "
                    f"(fingerprint {fingerprint}, this model {ours})"
                )
            lowered = matching
        # Planned both ways, a share is of the unplanned step of the graph as traced (copies
        # in the kernels), and both ways are held to the same bytes.
        # Warnings (a best-effort budget, a node that cannot run) are said only for the
        # variant kept: the other's are about a graph that does not run.
        planned: dict[str, tuple[Lowered, Plan, Schedule] | InfeasibleBudget] = {}
        said: dict[str, list[warnings.WarningMessage]] = {}
        budget, resident = self.budget, self.resident
        for way, (variant, low) in lowered.items():
            with warnings.catch_warnings(record=True) as said[way]:
                warnings.simplefilter("always")
                planned[way] = found = self._plan(variant, low, budget, resident)
            asked = found.budget if isinstance(found, InfeasibleBudget) else found[1].asked
            # The next way is held to these bytes, which are net of what is resident.
            budget = Budget(bytes=asked)
            resident = dataclasses.replace(resident, held=0)
        way, (chosen, plan, schedule) = _faster(planned)
        if (way, schedule) in self.compiled:
            raise RepeatedPlan(f"{name}: the plan made is one compiled already")
        for warning in said[way]:
            say_again(warning)
        # The plan records the way it was made, so that applying it again makes it that way.
        plan = dataclasses.replace(
            plan,
            options={**plan.options, "convolution_copies": way},
            requested_as=str(self.budget),
            sizes=dict(self.sizes),
        )
        stamp = {
            "solver": plan.solver,
            "budget": plan.budget,
            "predicted_peak": plan.predicted_peak,
            "solve_seconds": plan.solve_seconds,
        }
        forward, backward = rewrite(chosen, schedule, stamp=stamp)
        self.plans.append(plan)
        self.lowered.append(chosen)
        self.schedules.append(schedule)
        return forward, backward

    def forget_from(self, first: int) -> None:
        """Drop the plans made from index `first` on."""
        for made in (self.plans, self.lowered, self.schedules):
            del made[first:]

    def keep_only(self, first: int, chosen: int, plan: Plan) -> None:
        """Of the plans made from index `first` on (rounds of planning one graph again),
        keep only round `chosen`'s, its Plan replaced by `plan`."""
        for made in (self.plans, self.lowered, self.schedules):
            kept = made[first + chosen]
            del made[first:]
            made.append(kept)  # type: ignore[arg-type]
        self.plans[first] = plan

    def at_sizes(self, sizes: ShapeSignature) -> Plan:
        """The plan last made, of a graph of dynamic shapes, as it runs at other sizes, its
        schedule kept: its peaks, timeline, bytes kept for the backward and forward outputs
        evaluated at `sizes`, and its unplanned peak there. Times and transients are the
        profile's at the hints, a transient scaled with its node's bytes. A plan Inductor
        compiled keeps its measured difference from the unfused graphs (Plan.compiled_peak)
        in proportion to the peak."""
        plan, lowered, schedule = self.plans[-1], self.lowered[-1], self.schedules[-1]
        traced = lowered.graph
        # Offload threshold 0: a schedule's offloads stay legal at smaller sizes.
        resized = lower(
            lowered.joint, lowered.num_fwd_outputs, offload_threshold=0, size=at(sizes)
        ).graph
        scaled = [
            n.workspace * r.bytes // n.bytes if n.bytes else n.workspace
            for n, r in zip(traced, resized, strict=True)
        ]
        graph = resized.replace_times([n.time for n in traced], scaled)
        options = self.options.solver_options(lowered.device.type)
        trace = simulate(graph, schedule, bandwidth=options.bandwidth)
        reference, unplanned = unplanned_step(graph, options)

        def as_compiled(peak: int) -> int:
            return peak * plan.peak // max(1, plan.predicted_peak) if plan.compiled_peak else 0

        return dataclasses.replace(
            plan,
            predicted_peak=trace.peak,
            compiled_peak=as_compiled(trace.peak),
            compiled_backward_peak=as_compiled(max(trace.live[schedule.split :], default=0)),
            unplanned_peak=unplanned.peak,
            timeline=list(trace.live),
            held=_kept_for_backward(graph, trace, schedule.split),
            unplanned_held=_kept_for_backward(graph, unplanned, reference.schedule.split),
            output_bytes=_forward_outputs(graph),
            sizes=dict(sizes),
        )

    def _plan(
        self, joint: fx.GraphModule, lowered: Lowered, budget: Budget, resident: Resident
    ) -> tuple[Lowered, Plan, Schedule] | InfeasibleBudget:
        """Profile and plan one lowered joint graph for `budget`; the InfeasibleBudget
        where nothing fits."""
        device = lowered.device
        solver_options = self.options.solver_options(device.type)
        profile = profile_graph(
            joint,
            device=device,
            measure=self.options.measure,
            spec=self.options.device_spec,
            cache=self.cache,
            progress=self.options.progress,
            cap=_profile_cap(lowered.graph, budget, resident, solver_options),
        )
        seconds = [profile.seconds.get(n.name, 0.0) for n in lowered.fx_nodes]
        if self.options.fused_pointwise:
            seconds = fused_seconds(lowered.fx_nodes, seconds)
        graph = lowered.graph.replace_times(
            seconds, [profile.workspace.get(n.name, 0) for n in lowered.fx_nodes]
        )
        if solver_options.bandwidth:
            graph = dataclasses.replace(
                graph,
                transfer_seconds=transfer_seconds(
                    device, measure=self.options.measure, cache=self.cache
                ),
            )
        if self.before_solving is not None:
            graph = self.before_solving(graph)
        lowered = dataclasses.replace(lowered, graph=graph)
        reuse, key = self.reuse, ""
        if self.keep_plans and reuse is None and not self.as_written:
            key = plan_key(lowered.fingerprint, graph, budget, resident.held, self.options, device)
            reuse = cached_plan(key)
        try:
            plan, schedule = plan_graph(
                graph,
                budget,
                self.options,
                device=str(device),
                fingerprint=lowered.fingerprint,
                reuse=reuse,
                written=self.as_written,
                resident=resident,
            )
        except InfeasibleBudget as infeasible:
            return infeasible
        # A plan whose solve ran to its time limit depends on how busy the machine was:
        # kept, it would stand for every later compile, however idle.
        if key and reuse is None and not plan.cut_short:
            store_plan(key, plan)
        return lowered, plan, schedule


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


def _faster(
    planned: dict[str, tuple[Lowered, Plan, Schedule] | InfeasibleBudget],
) -> tuple[str, tuple[Lowered, Plan, Schedule]]:
    """Of the plans of a graph's variants, by name: the fastest predicted among those that
    hold the budget asked for, else (all best effort) the least peak. Raises the least
    InfeasibleBudget where none planned."""
    plans = {w: p for w, p in planned.items() if not isinstance(p, InfeasibleBudget)}
    if not plans:
        raise min(planned.values(), key=lambda e: e.smallest_feasible)  # type: ignore[union-attr]
    held = {w: p for w, p in plans.items() if p[1].status != "best-effort"}
    if held:
        return min(held.items(), key=lambda item: item[1][1].predicted_time)
    return min(plans.items(), key=lambda item: item[1][1].predicted_peak)
