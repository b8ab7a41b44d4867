"""torch.compile backend: AOTAutograd with memplan's partition function.

`torch.compile(model, backend=memplan.backend(budget="60%"))` builds one explicitly;
`torch.compile(model, backend="memplan", options={...})` builds one per torch.compile
call (named_backend.py).
Inductor compiles the planned graphs, as it does torch.compile's by default
(`inner="eager"` runs them unfused, for debugging). Each graph Dynamo hands over (one per
graph break) is planned so that the step stays within the budget: the bytes the graphs
before it keep for their backwards stay resident while it runs, and a share is of the
step's unplanned peak. A graph that cannot meet it is planned for its smallest feasible
peak, with a warning. A graph called again while earlier calls hold more than its plan
allowed for is planned again for what they held (held_watch.py).

A graph Dynamo traced with dynamic shapes is planned at its traced sizes and runs at any
(planner/shapes.py); at sizes where that plan exceeds the budget it is planned again
(`shape_dispatch.ShapeDispatch`), up to MAX_SHAPE_PLANS per graph. The plan that runs at a
call's sizes is the graph's in the step (`running`): the graphs after it count what it
holds there (step.py).

Under Inductor, a plan's peak is checked as Inductor compiled it (planner/compiled_peak.py),
and the graph is planned again at a budget moved by what Inductor's kernels hold over or
under it, with or without Inductor's layout optimization (planner/rounds.py;
`MemplanBackend.compile` says in what order). `Plan.compiled_peak` is the prediction of
what runs. Plans are kept on disk by the graph's structure (planner/plan_cache.py).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch._functorch.config as functorch_config
from torch._dynamo.backends.common import aot_autograd

from memplan.budget import Budget
from memplan.errors import (
    InfeasibleBudget,
    InfeasibleBudgetWarning,
    MemplanError,
    MemplanWarning,
)
from memplan.held_watch import GraphAgain, HeldWatch, WaitingCalls
from memplan.planner.capture import boxed_runner
from memplan.planner.compiled_peak import CompiledGraphs
from memplan.planner.inductor_steps import (
    after_joint_passes,
    inductor_compile,
    inductor_decompositions,
)
from memplan.planner.options import PlanOptions
from memplan.planner.plan import Partitioner, RepeatedPlan, Resident, say_again
from memplan.planner.plan_file import Plan
from memplan.planner.rounds import (
    INDUCTOR_ROUNDS,
    LEAST_AIM,
    SAME_AIM,
    Round,
    checked_round,
    checkpoints_its_own,
    held_as_compiled,
    kept_round,
    layout_may_cost,
    least_peak_aim,
    least_ways,
    lowered_in_vain,
    next_aim,
    peak_with_room,
    replanned_note,
)
from memplan.planner.shapes import ShapeSignature, signature_of, size_symbols
from memplan.room import RoomsMade, make_room
from memplan.shape_dispatch import ShapeDispatch
from memplan.spinner import spinner
from memplan.step import StepKey, graph_key, resident_before, step_peaks
from memplan.units import format_bytes

INNER_COMPILERS = ("inductor", "eager")


class MemplanBackend:
    """A Dynamo backend that plans every graph it compiles; `plans` holds their Plans."""

    def __init__(
        self,
        budget: Budget | str | float = "100%",
        solver: str = "greedy",
        inner: str = "inductor",
        inductor_config: dict[str, Any] | None = None,
        reuse: Plan | None = None,
        **options: Any,
    ) -> None:
        if inner not in INNER_COMPILERS:
            raise MemplanError(f"inner compiler must be one of {INNER_COMPILERS}, got {inner!r}")
        self.budget = Budget.parse(budget)
        # Inductor fuses pointwise ops away: the solver prices them as it runs them.
        defaults = {"best_effort": True, "fused_pointwise": inner == "inductor"}
        self.options = PlanOptions(solver=solver, **{**defaults, **options})
        # Eager runs the planned graphs as generated code that frees each value after its
        # last use, as the API path does, so saved activations die where the plan frees them.
        # Inductor runs with torch.compile's own settings (layout optimization included:
        # the channels-last copies of convolutions' weights and activations it makes are
        # seen by the check of the compiled graphs, compiled_peak.py), unless overridden.
        settings = inductor_config or {}
        self.inner = boxed_runner if inner == "eager" else inductor_compile(settings)
        # Where the check of a compiled graph cannot run, what layout optimization adds (a
        # channels-last copy saved in a parameter's place) would go unseen: that graph is
        # compiled again without it, where the unfused prediction holds. Where the check
        # finds that it takes a graph over its budget, the graph is compiled without it too.
        # Unless the user chose the setting.
        self.without_layout = (
            inductor_compile({**settings, "layout_optimization": False})
            if inner == "inductor" and "layout_optimization" not in settings
            else None
        )
        self.checks_compiled = inner == "inductor"
        # Whether the user turned layout optimization off: the plans then say so too.
        self.layout_off_by_user = self.checks_compiled and not settings.get(
            "layout_optimization", True
        )
        # Inductor lowers only graphs decomposed by its own table (as torch.compile's
        # default backend traces them): planned on the decomposed graph, the plan is of
        # the ops inductor is given.
        self.decompositions = inductor_decompositions() if inner == "inductor" else None
        # And with its joint-graph passes run first, as torch.compile's partition step does.
        self.joint_passes = inner == "inductor"
        # A saved plan whose decisions every graph carries out instead of being solved
        # (a graph it was not made for is refused: PlanFileError).
        self.reuse = reuse
        self.plans: list[Plan] = []
        self.graphs = 0
        # The step's graphs in the order they first compiled, the latest plan of each, by
        # (Dynamo frame, graph of that frame's compile, the parameters it takes): a graph
        # break starts a new frame, DDP's optimizer splits one compile into several graphs,
        # and a recompile of a frame for new guards or sizes replaces its graphs' plans,
        # not adds to the step, unless it is of other parameters: each block of a model
        # compiled alone is a recompile of one frame (regional compilation).
        self.step: dict[StepKey, Plan] = {}
        self._graphs_of: dict[object, int] = {}  # graphs so far per Dynamo compile id
        # The bytes of each parameter the step's graphs take, and of its gradient, by id.
        self.parameters: dict[int, tuple[int, int]] = {}
        # Calls of the graphs whose backward has not run, for what they hold (held_watch.py).
        self.waiting = WaitingCalls()
        self.watches: dict[StepKey, HeldWatch] = {}  # the step's graphs' watches, by key
        # Each graph's watches at every size it has a plan for, and of earlier compiles.
        self.every_watch: dict[StepKey, list[HeldWatch]] = {}
        self.rooms: RoomsMade = {}  # the room each graph made for later ones (room.py)

    @property
    def predicted_step_peak(self) -> int:
        """The step's predicted peak over its graphs (step.step_peaks; 0 before any
        graph is planned)."""
        return max(step_peaks(self.step, self.parameters).values(), default=0)

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
        partitioner = Partitioner(
            self.budget, self.options, name=name, keep_plans=True, reuse=self.reuse
        )
        partitioner.sizes = signature_of(symbols, example_inputs)
        key = graph_key(example_inputs, self._graphs_of, self.parameters)
        partitioner.resident = resident_before(self.step, key)
        compiled = self.compile(gm, example_inputs, partitioner)
        if not partitioner.plans:  # no backward: nothing planned
            return compiled
        plan, sizes = partitioner.plans[-1], partitioner.sizes
        run = self.watched(gm, key, name, compiled, plan, partitioner.resident, sizes)
        if symbols:  # planned at its hints, and again at sizes the plan does not hold
            run = ShapeDispatch(self, gm, symbols, partitioner, compiled, key, run)
        # Dynamo runs what a backend returns inside the compiled frame: not to be traced.
        return torch._dynamo.disable(run, reason="memplan checks what the step holds")

    def watched(
        self,
        gm: torch.fx.GraphModule,
        key: StepKey,
        name: str,
        compiled: Callable[..., Any],
        plan: Plan,
        resident: Resident,
        sizes: ShapeSignature = (),
    ) -> HeldWatch:
        """`compiled` (`gm` as `plan` runs it, at `sizes` where its shapes are dynamic) as
        graph `key` of the step (named `name`), checked against what earlier calls hold
        and planned again for the step (held_watch.py); the later graphs it leaves over
        the budget are told (make_room)."""
        again = GraphAgain(self, gm, key, name, resident, sizes)
        watch = HeldWatch(compiled, plan, self.waiting, again)
        self.every_watch.setdefault(key, []).append(watch)
        self.running(key, watch)
        make_room(self.watches, self.step, key, self.parameters)
        return watch

    def running(self, key: StepKey, watch: HeldWatch) -> None:
        """`watch` runs graph `key` in the step now: at the sizes of this call, for a graph
        of dynamic shapes, whose plan the graphs after it then count."""
        self.step[key] = watch.plan
        self.watches[key] = watch

    def reset(self) -> None:
        """Forget the step: torch._dynamo.reset() calls it (through torch.compile's
        wrapper), and Dynamo then numbers its frames and compiles from 0 again."""
        self.step.clear()
        self.watches.clear()
        self.every_watch.clear()
        self.rooms.clear()
        self._graphs_of.clear()

    def compile(
        self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any], partitioner: Partitioner
    ) -> Callable[..., Any]:
        """AOTAutograd on `gm` with `partitioner` planning it; its plans join `plans`.

        Under Inductor each plan's peak as compiled is checked (Plan.compiled_peak), and the
        graph is planned and compiled again at a budget moved by what it peaked over or
        under the budget (_more_rounds); the round fastest within the budget, else the
        least over it, is kept. A least-memory plan that compiles within a budget under the
        unfused graphs' least holds it (held_as_compiled). Layout optimization is dropped
        where the check cannot run with it or where a convolution graph holds the budget
        only without it (layout_may_cost); the least-memory plan is the last tried where no
        round holds, and is followed by one round at its peak as compiled (_after_least):
        under a budget below the least, only the lower least-memory round is. Where no
        round holds, the step as the model is written (its own checkpointing) is compiled
        too, the last round. With best_effort=False, where no round holds the budget,
        InfeasibleBudget names the least peak as compiled found, and no plan is kept. The
        order and the reasons are in docs/pipeline.md."""
        first = len(partitioner.plans)
        inner, held, checked = self.inner, None, False
        options, budget = partitioner.options, partitioner.budget
        # With best_effort=False, a budget is unmet only once no round holds it as Inductor
        # compiled it: the first round is planned best effort, and the error (if any) is
        # raised after the rounds, before anything of the step runs.
        strict = self.checks_compiled and not options.best_effort
        planning = dataclasses.replace(options, best_effort=True) if strict else options
        # The planner's warnings wait for the check: a budget under the unfused graphs'
        # least may be within the least as Inductor compiles them (held_as_compiled).
        said: list[warnings.WarningMessage] = []
        try:
            with warnings.catch_warnings(record=True) as said:
                warnings.simplefilter("always")
                partitioner.options = planning
                compiled, graphs = self._aot(gm, example_inputs, partitioner, inner)
                checked = self.checks_compiled and len(partitioner.plans) > first
                if checked:
                    aot = (compiled, graphs)
                    rounds = self._first_round(gm, example_inputs, partitioner, first, aot)
                    held = held_as_compiled(rounds[0].plan)
        finally:
            partitioner.options = options
            unmet = [w for w in said if issubclass(w.category, InfeasibleBudgetWarning)]
            for warning in said:  # the planner's "infeasible" waits for the rounds
                if not issubclass(warning.category, InfeasibleBudgetWarning):
                    say_again(warning)
        if not checked:
            for warning in unmet:
                say_again(warning)
            self.plans.extend(partitioner.plans[first:])
            return compiled
        rounds[0] = dataclasses.replace(rounds[0], plan=held or rounds[0].plan)
        inner = rounds[0].inner
        layout_checked = inner is self.inner and bool(rounds[0].plan.compiled_peak)
        first_plan = rounds[0].plan
        target = first_plan.budget  # the graph's budget as first planned
        planned_least = first_plan.status == "best-effort"  # its budget: its peak
        # Later rounds aim off the budget: best effort, their warnings not the user's.
        aiming = dataclasses.replace(options, best_effort=True)
        least_tried: list[Callable[..., Any]] = []  # inner compilers the least plan had
        try:
            partitioner.options = aiming
            if not planned_least:  # below the least, each round is the least-memory plan
                self._more_rounds(gm, example_inputs, partitioner, rounds, target)
            can_drop_layout = layout_checked and self.without_layout is not None
            # Under the least, the least-memory rounds tell whether layout optimization
            # costs memory: the round after one is held to no budget of the user's.
            plans = [r.plan for r in rounds if r.plan.status == "best-effort" or not planned_least]
            if can_drop_layout and layout_may_cost(partitioner, plans, target):
                # Layout optimization is worth recomputing more (its channels-last kernels
                # are much faster: docs/measurement.md), but the budget comes first. The
                # rounds' aims can step past the plans that hold (a plan's peak as compiled
                # does not fall with its budget), so the least-memory plan is tried with it
                # first; where that does not hold either, the graph is planned again
                # without it, from its budget as first asked.
                if not planned_least:
                    self._add_round(gm, example_inputs, partitioner, rounds, inner, LEAST_AIM)
                    least_tried.append(inner)
                if planned_least or all(r.plan.peak > target for r in rounds):
                    partitioner.options, partitioner.budget = planning, budget
                    start, inner = len(partitioner.plans), self.without_layout
                    with warnings.catch_warnings():  # the first round's said them
                        warnings.simplefilter("ignore", MemplanWarning)
                        plain = self._aot(gm, example_inputs, partitioner, inner)
                    rounds.append(checked_round(partitioner, start, *plain, inner, quiet=True))
                    partitioner.options = aiming
                    if not planned_least:
                        self._more_rounds(gm, example_inputs, partitioner, rounds, target)
            if planned_least and partitioner.reuse is None:
                # One round after the lower least-memory round, not one after each: planned
                # for a peak above the least found, the other's would recompute less and
                # seldom compile lower (on ResNet at its least, neither did), and a round
                # is a whole compile. The rounds at a budget at the least an
                # InfeasibleBudget names (least_ways) follow each, so they find it again.
                lowest = min(rounds, key=lambda r: r.plan.peak)
                self._after_least(gm, example_inputs, partitioner, rounds, lowest)
            # Where no round held the budget, the least-memory plan is the last tried, with
            # the round after it: the least an InfeasibleBudget names (best_effort=False) is
            # the lowest peak of the rounds as compiled, so a budget at that least is held.
            if not planned_least and all(r.plan.peak > target for r in rounds):
                ways = least_ways(
                    partitioner, inner, self.inner, self.without_layout, layout_checked
                )
                for way in ways:
                    if way not in least_tried:
                        self._add_round(gm, example_inputs, partitioner, rounds, way, LEAST_AIM)
            # Where no round holds, the step as the model is written (its own
            # checkpointing) is compiled too, planned at its own peak, which holds it.
            # Ranked on the unfused graphs it can lose to the solvers' least-memory plan,
            # yet compile lower: on six checkpointed blocks, the unfused GELUs'
            # temporaries put it at 64.02 MiB, above greedy's least; as Inductor compiled
            # them, it peaked at 54.03 MiB, as torch.compile's step does, and greedy's
            # least at 56.03 MiB (benchmarks/own_checkpointing.py).
            under_least = planned_least or all(r.plan.peak > target for r in rounds)
            if under_least and partitioner.reuse is None and checkpoints_its_own(partitioner):
                aim = rounds[0].plan.unplanned_peak
                made = self._round(gm, example_inputs, partitioner, rounds, inner, aim, True)
                if made is not None:
                    rounds.append(made)
        finally:
            partitioner.options, partitioner.budget = options, budget
        # Leaving a later graph room, the budget is the one asked, the room in it, even
        # under the least: the least-memory plan is not what the step needs; a plan's peak
        # is then counted as rounds.peak_with_room does.
        room = partitioner.room
        kept_to = first_plan.asked if room else target
        index = kept_round([r.plan for r in rounds], kept_to, room)
        compiled, plan, inner = rounds[index].compiled, rounds[index].plan, rounds[index].inner
        peak = peak_with_room(plan, room)
        # Under the unfused graphs' least, a least-memory round may yet hold the budget
        # asked: the round after the least-memory plan (least_peak_aim) can compile lower.
        held_to = first_plan.asked if planned_least else target
        least_sought = planned_least and peak > held_to
        if strict and peak > held_to:  # raised before the step runs; no plan is kept
            partitioner.forget_from(first)
            raise InfeasibleBudget(held_to, peak, plan.solver, what="peak as compiled")
        for warning in unmet if least_sought else ():
            say_again(warning)
        if peak > target and not planned_least:
            warnings.warn(
                f"{plan.name}: as Inductor compiled it, the graph peaks at "
                f"{format_bytes(plan.peak)}, {format_bytes(plan.peak - target)} above its "
                f"budget of {format_bytes(target)} after {len(rounds)} plans",
                MemplanWarning,
                stacklevel=3,
            )
        elif least_sought and plan.peak > first_plan.predicted_peak:
            # The planner's warning named the least of the unfused graphs.
            warnings.warn(
                f"{plan.name}: as Inductor compiled it, the graph's least peak found is "
                f"{format_bytes(plan.peak)}",
                MemplanWarning,
                stacklevel=3,
            )
        # The kept round's plan, held to the budget asked, is the graph's only plan: a
        # least-memory round that holds it is a plan for it, not a best effort. Where the
        # budget asked is under the least, the plan kept is a best effort, whatever round
        # it came from, held to the least peak found: its own as compiled, or the least
        # the planner found (the first round's budget before its check) where higher.
        # Leaving room, a plan is held to the budget with the room given back where it
        # holds, else (best effort) to the most it needs: its own peak, or what it keeps
        # with the room.
        holds_as_least = index > 0 and plan.status == "best-effort" and peak <= target
        short = least_sought or (room > 0 and peak > kept_to)
        if short and room:
            status, budget_held = "best-effort", peak + room
        elif short:
            status = "best-effort"
            budget_held = max(plan.peak, partitioner.plans[first].budget)
        elif planned_least:
            status, budget_held = "feasible", held_to + room
            target = budget_held
        else:
            status = "feasible" if holds_as_least else plan.status
            budget_held = target = target + room
        kept = dataclasses.replace(
            plan,
            status=status,
            budget=budget_held,
            requested_budget=first_plan.requested_budget,
            requested_as=first_plan.requested_as,
            note=plan.note if index == 0 else replanned_note(plan, target, short, room),
            # Each round's aim, its peak as compiled and whether Inductor's layout
            # optimization was on, for reports and benchmarks.
            options={
                **plan.options,
                "compiled_rounds": [
                    [r.plan.requested_budget, r.plan.peak, self._layout_on(r.inner)] for r in rounds
                ],
                **({} if self._layout_on(inner) else {"layout_optimization": False}),
            },
        )
        partitioner.keep_only(first, index, kept)
        self.plans.append(kept)
        return compiled

    def _first_round(
        self,
        gm: torch.fx.GraphModule,
        example_inputs: Sequence[Any],
        partitioner: Partitioner,
        first: int,
        compiled: tuple[Callable[..., Any], CompiledGraphs | None],
    ) -> list[Round]:
        """The first round (`compiled` by the first AOTAutograd compile), checked; where the
        check cannot run with layout optimization, the graph compiled again without it and
        checked, its plan replacing the first."""
        again = self.without_layout is not None  # compiled again where the check fails
        round_ = checked_round(partitioner, first, *compiled, self.inner, quiet=again)
        if round_.plan.compiled_peak or self.without_layout is None:
            return [round_]
        inner = self.without_layout
        compiled, graphs = self._aot(gm, example_inputs, partitioner, inner)
        partitioner.keep_only(first, 1, partitioner.plans[first + 1])
        return [checked_round(partitioner, first, compiled, graphs, inner)]

    def _more_rounds(
        self,
        gm: torch.fx.GraphModule,
        example_inputs: Sequence[Any],
        partitioner: Partitioner,
        rounds: list[Round],
        target: int,
    ) -> None:
        """Up to INDUCTOR_ROUNDS more rounds after the last of `rounds`, compiled as it was,
        each planned at a budget moved by the last one's peak as compiled (_next_aim) until
        none would differ, the aim is within SAME_AIM of a round's compiled this way, the
        plan made is one compiled this way already, or a lower aim bought no lower peak;
        `rounds` grows by each. The least-memory plan, whether the last of `rounds` or
        made by a lowered aim, ends them, after the round that follows it (_after_least):
        no aim is lower."""
        if partitioner.reuse is not None:
            return  # the decisions are fixed: planned at any aim, the plan is the same
        if rounds[-1].plan.status == "best-effort":
            self._after_least(gm, example_inputs, partitioner, rounds, rounds[-1])
            return
        inner = rounds[-1].inner
        for _ in range(INDUCTOR_ROUNDS):
            # A round's plan is made at its aim: a plan's budget is the aim it was made at
            # (a best-effort one's is raised to its peak, but it ends the rounds).
            ours = [r.plan for r in rounds if r.inner is inner]
            aim = next_aim(ours[-1], target)
            if aim is None or any(abs(aim - p.budget) <= SAME_AIM * target for p in ours):
                return
            if len(ours) > 1 and lowered_in_vain(ours[-2], ours[-1], target):
                return
            made = self._add_round(gm, example_inputs, partitioner, rounds, inner, aim)
            if made is None:
                return  # more or less budget gave a plan compiled before: nothing new
            if made.plan.status == "best-effort":
                return  # the least-memory plan, and the round after it: no aim is lower

    def _add_round(
        self,
        gm: torch.fx.GraphModule,
        example_inputs: Sequence[Any],
        partitioner: Partitioner,
        rounds: list[Round],
        inner: Callable[..., Any],
        aim: int,
    ) -> Round | None:
        """The round at `aim` (_round), added to `rounds` and returned, and the round
        after it where it is the least-memory plan (_after_least); None, adding none, where
        the plan made is one of `rounds` compiled with `inner`."""
        made = self._round(gm, example_inputs, partitioner, rounds, inner, aim)
        if made is None:
            return None
        rounds.append(made)
        self._after_least(gm, example_inputs, partitioner, rounds, made)
        return made

    def _after_least(
        self,
        gm: torch.fx.GraphModule,
        example_inputs: Sequence[Any],
        partitioner: Partitioner,
        rounds: list[Round],
        least: Round,
    ) -> None:
        """Where `least` (one of `rounds`) is the least-memory plan and peaks over
        COMPILED_SLACK above its prediction as Inductor compiled it, one more round added
        to `rounds`, compiled as it was, planned for that peak (least_peak_aim):
        recomputing less, it may compile lower. Where a budget is held to no least, every
        least-memory round is followed by it, so the least an InfeasibleBudget names
        (the lowest round's peak) is one the rounds find again at that budget."""
        aim = least_peak_aim(least.plan)
        if aim is not None:
            made = self._round(gm, example_inputs, partitioner, rounds, least.inner, aim)
            if made is not None:
                rounds.append(made)

    def _round(
        self,
        gm: torch.fx.GraphModule,
        example_inputs: Sequence[Any],
        partitioner: Partitioner,
        rounds: Sequence[Round],
        inner: Callable[..., Any],
        aim: int,
        as_written: bool = False,
    ) -> Round | None:
        """One more round of planning the graph, at `aim` bytes beyond what is resident
        (`as_written`: the step as the model is written carried out instead, its peak the
        aim), compiled with `inner` and checked; the planner's warnings are not the user's.
        None, without compiling, where the plan made is one of `rounds` compiled with
        `inner`: its peak as compiled is that round's."""
        partitioner.budget = Budget(bytes=aim + partitioner.resident.held)
        partitioner.compiled = [(r.way, r.schedule) for r in rounds if r.inner is inner]
        partitioner.as_written = as_written
        start = len(partitioner.plans)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", MemplanWarning)
                compiled, graphs = self._aot(gm, example_inputs, partitioner, inner)
        except RepeatedPlan:
            return None
        finally:
            partitioner.compiled, partitioner.as_written = [], False
        return checked_round(partitioner, start, compiled, graphs, inner)

    def _layout_on(self, inner: Callable[..., Any]) -> bool:
        """Whether Inductor compiled with `inner` applies its layout optimization."""
        return inner is not self.without_layout and not self.layout_off_by_user

    def _aot(
        self,
        gm: torch.fx.GraphModule,
        example_inputs: Sequence[Any],
        partitioner: Partitioner,
        compiler: Callable[..., Any],
    ) -> tuple[Callable[..., Any], CompiledGraphs | None]:
        """One AOTAutograd compile with `compiler` inside; under Inductor, the graphs it
        compiled, the backward lowered at once (not at the first backward) so that it can
        be checked."""
        inner = CompiledGraphs(compiler) if self.checks_compiled else compiler
        rounds = len(partitioner.plans)  # this graph's plans compiled before
        doing = (
            f"{partitioner.name}: planning for {partitioner.budget}, then compiling"
            + (" with Inductor" if self.checks_compiled else "")
            + (f" (plan {rounds + 1})" if rounds else "")
        )
        with (
            spinner(doing, self.options.progress),
            functorch_config.patch(force_non_lazy_backward_lowering=self.checks_compiled),
        ):
            compiled = aot_autograd(
                fw_compiler=inner,
                bw_compiler=inner,
                partition_fn=(
                    after_joint_passes(partitioner) if self.joint_passes else partitioner
                ),
                decompositions=self.decompositions,
                # As torch.compile's Inductor backend: the step's writes into its inputs
                # (BatchNorm's running statistics) stay in the graph, where Inductor fuses
                # them into its kernels, rather than being applied after it, a copy and an
                # allocation per buffer per step (ResNet-50: 159 of each).
                keep_inference_input_mutations=True,
            )(gm, example_inputs)
        return compiled, inner if isinstance(inner, CompiledGraphs) else None


def backend(
    budget: Budget | str | float = "100%",
    solver: str = "greedy",
    inner: str = "inductor",
    inductor_config: dict[str, Any] | None = None,
    reuse: Plan | None = None,
    **options: Any,
) -> MemplanBackend:
    """A memplan backend for torch.compile with the given budget, solver and inner compiler
    (`inductor_config`: settings of torch._inductor.config to compile under). `reuse`
    carries out the decisions of a Plan a backend made (one of `plans`) instead of solving;
    the budget is then what the compiled graphs are checked against. A plan of
    memplan.optimize or the CLI is of another trace (PlanFileError)."""
    return MemplanBackend(budget, solver, inner, inductor_config, reuse, **options)
