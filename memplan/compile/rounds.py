"""The rounds of planning one graph under torch.compile, and the graph AOTAutograd is
handed.

`GraphSearch` is the partition function and the inner compiler of one AOTAutograd compile.
It prepares the joint graph once (planner/prepared.py) and runs the search's rounds on it
(compile/search.py): each plans the graph at an aim, rewrites it, compiles the forward
and the backward with Inductor while reading what they allocate (compile/inductor.py),
and simulates the step as compiled (core/emitted.py). Nothing is run. The kept round's
graphs go to AOTAutograd, and its compiled graphs are what the inner compiler returns for
them: the round was the compile. Unfused (no Inductor settings: `inner="eager"`), one
round plans the graph at its budget, and the simulator's peak is what runs. A plan kept
on disk for the same graph, budget and settings (planner/plan_cache.py) is applied again
without rounds.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from memplan import compat
from memplan.compile.inductor import NotEmittable, compile_reading, inductor_compile, input_specs
from memplan.compile.kernels import workspaces
from memplan.compile.search import (
    Attempt,
    Goal,
    Lane,
    Outcome,
    holds,
    kept,
    next_attempt,
    worth_compiling,
)
from memplan.core.budget import Budget
from memplan.core.emitted import step_graph
from memplan.core.errors import (
    InfeasibleBudget,
    InfeasibleBudgetWarning,
    MemplanWarning,
    first_line,
)
from memplan.core.graph import Decision, Graph, NodeKind
from memplan.core.simulate import simulate
from memplan.core.units import format_bytes
from memplan.planner.capture import boxed_runner, keep_saved_tensors
from memplan.planner.partitioner import Partitioner
from memplan.planner.plan import unplanned_step
from memplan.planner.plan_cache import cached_plan, plan_key, store_plan
from memplan.planner.plan_file import Plan
from memplan.planner.prepared import Planned, Prepared


@dataclass(frozen=True)
class Compiled:
    """A graph Inductor compiled in a round, and the inputs it was compiled for."""

    compiled: Any
    specs: tuple[object, ...]
    forward: bool


@dataclass(frozen=True)
class Round:
    """One round: what the search tried and got, the plan, its graphs as rewritten, and
    its peaks as compiled (the step's, the backward's) and the bytes its forward keeps
    for the backward."""

    outcome: Outcome
    planned: Planned
    forward: torch.fx.GraphModule
    backward: torch.fx.GraphModule
    compiled: tuple[Compiled, Compiled] | None
    backward_peak: int


class GraphSearch:
    """The partition function and inner compiler of one AOTAutograd compile (the module's
    docstring). Plans made are recorded in `partitioner` (its budget, options, what is
    resident, the room a later graph needs and a plan to reuse are the request);
    `settings` are the user's Inductor settings (None: the graphs run unfused); `strict`
    refuses a budget no round holds (best_effort=False); `keep_plans` keeps the plan on
    disk."""

    def __init__(
        self,
        partitioner: Partitioner,
        settings: Mapping[str, Any] | None,
        *,
        strict: bool,
        keep_plans: bool = True,
    ) -> None:
        self.partitioner = partitioner
        self.settings = None if settings is None else dict(settings)
        self.strict = strict
        self.keep_plans = keep_plans
        self.history: list[Outcome] = []
        # By the code of the graph module handed over: AOTAutograd hands the inner compiler
        # a copy of the backward partition returned, not the module itself.
        self.compiled: dict[str, Compiled] = {}
        self.kept_settings = self.settings

    def partition(
        self, joint: torch.fx.GraphModule, joint_inputs: object, *, num_fwd_outputs: int, **_: Any
    ) -> tuple[torch.fx.GraphModule, torch.fx.GraphModule]:
        part = self.partitioner
        channels_last = self._layout_on(Lane()) and compat.layout_optimized(
            joint, self.settings or {}
        )
        prepared = part.prepare(joint, num_fwd_outputs, channels_last=channels_last)
        cached = self._cached(prepared)
        if cached is not None:  # its decisions applied again; compiled as AOTAutograd asks
            planned = self._plan(prepared, Attempt(1), cached)
            layout = bool(cached.options.get("layout_optimization", True))
            self.kept_settings = self._settings(Lane(layout))
            part.record(dataclasses.replace(planned, plan=cached))
            return planned.rewrite()
        goal = self._goal(prepared)
        rounds: list[Round] = []
        while (attempt := next_attempt(self.history, goal)) is not None:
            planned = self._plan(prepared, attempt, part.reuse)
            if not worth_compiling(self.history, goal, planned.plan.predicted_time):
                break
            made = self._round(planned, attempt, rounds)
            rounds.append(made)
            self.history.append(made.outcome)
            if part.reuse is not None or self.settings is None:
                break  # the decisions are fixed, or the plan made at the budget is what runs
        chosen = rounds[kept(self.history, goal)]
        plan = self._kept_plan(chosen, goal)
        part.record(dataclasses.replace(chosen.planned, plan=plan))
        if chosen.compiled is not None:
            modules = (chosen.forward, chosen.backward)
            for module, made in zip(modules, chosen.compiled, strict=True):
                self.compiled[module.code] = made
        self.kept_settings = self._settings(chosen.outcome.attempt.lane)
        if self.keep_plans and part.reuse is None and not plan.cut_short:
            store_plan(self._key(prepared), plan)
        return chosen.forward, chosen.backward

    def compiler(self, gm: torch.fx.GraphModule, example_inputs: list[Any]) -> Any:
        """The inner compiler: the kept round's compile of `gm` where it was compiled for
        these inputs, else Inductor's compile now (a plan applied again from disk). The
        backward reuses no saved tensor's buffer in place (capture.keep_saved_tensors): it
        is compiled before any call could tell that one retains the graph."""
        if self.kept_settings is None:
            return boxed_runner(gm, example_inputs)
        keep_saved_tensors()
        made = self.compiled.pop(gm.code, None)
        if made is not None and made.specs == input_specs(example_inputs):
            if made.forward:
                compat.report_output_strides(made.compiled, example_inputs)
            return made.compiled
        return inductor_compile(self.kept_settings)(gm, example_inputs)

    def _goal(self, prepared: Prepared) -> Goal:
        part = self.partitioner
        first = prepared.first
        options = part.options.solver_options(first.device.type)
        # A share is of the step as the first lane compiles it unplanned: under Inductor's
        # layout optimization, with its channels-last copies, and what it never writes
        # held at 0 bytes (the graph the solvers are given, so that each plan's unplanned
        # peak, of which the step's is made, is of the same step).
        as_compiled = prepared.unplanned(channels_last=self._layout_on(Lane()))
        _, unplanned = unplanned_step(as_compiled, options)
        target = part.resident.budget_of(part.budget, unplanned.peak)
        convolutions = first.joint.graph.find_nodes(
            op="call_function", target=torch.ops.aten.convolution.default
        )
        return Goal(
            target=target,
            room=part.room,
            layout_off=bool(convolutions)
            and self.settings is not None
            and "layout_optimization" not in self.settings,
            written=part.reuse is None and any(n.checkpointed for n in first.graph),
        )

    def _layout_on(self, lane: Lane) -> bool:
        """Whether a round of `lane` is compiled with Inductor's layout optimization."""
        settings = self._settings(lane)
        return settings is not None and bool(settings.get("layout_optimization", True))

    def _settings(self, lane: Lane) -> dict[str, Any] | None:
        """The Inductor settings a round of `lane` compiles under (None: unfused)."""
        if self.settings is None or lane.layout:
            return self.settings
        return {**self.settings, "layout_optimization": False}

    def _plan(self, prepared: Prepared, attempt: Attempt, reuse: Plan | None) -> Planned:
        """The plan made at `attempt`'s aim (beyond what is resident): best effort, its
        warnings not the user's (the search says what it found, _kept_plan). A plan
        reused is planned at its own peak at least, which its decisions hold: under it,
        the driver would stand another solver's plan in for them."""
        part = self.partitioner
        aim = attempt.aim if reuse is None else max(attempt.aim, reuse.predicted_peak)
        budget = Budget(bytes=aim + part.resident.held)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", MemplanWarning)
            return prepared.plan(
                budget,
                part.resident,
                reuse=reuse,
                written=attempt.lane.written,
                requested_as=str(part.budget),
                options=dataclasses.replace(part.options, best_effort=True),
                channels_last=self._layout_on(attempt.lane),
            )

    def _round(self, planned: Planned, attempt: Attempt, rounds: list[Round]) -> Round:
        """One round: `planned` (the plan at `attempt`), compiled and read; a plan an
        earlier round of the lane made is that round's again, not compiled twice."""
        for earlier in rounds:
            same_lane = earlier.outcome.attempt.lane.layout == attempt.lane.layout
            if same_lane and (earlier.planned.way, earlier.planned.schedule) == (
                planned.way,
                planned.schedule,
            ):
                outcome = dataclasses.replace(earlier.outcome, attempt=attempt, repeat=True)
                return dataclasses.replace(earlier, outcome=outcome)
        forward, backward = planned.rewrite()
        plan = planned.plan
        saves = any(d != Decision.KEEP.value for d in plan.decisions.values())
        least = plan.status == "best-effort"
        peak, time = plan.predicted_peak, plan.predicted_time
        unfused = Round(
            Outcome(attempt, peak, plan.held, time, peak, least, saves),
            planned, forward, backward, None, plan.backward_peak,
        )  # fmt: skip
        settings = self._settings(attempt.lane)
        if settings is None:
            return unfused
        try:
            fw = compile_reading(forward, settings)
            strides = fw.emitted.strides_by_name()
            bw = compile_reading(backward, settings, strides)
        except NotEmittable as why:
            warnings.warn(
                f"{plan.name}: what Inductor allocates could not be read ({first_line(why)}); "
                "the prediction is the unfused graphs'",
                MemplanWarning,
                stacklevel=2,
            )
            return unfused
        graph = planned.lowered.graph
        measured = workspaces([*fw.calls.values(), *bw.calls.values()])
        step, schedule = step_graph(
            {n.name: n for n in graph if n.kind in (NodeKind.PARAM, NodeKind.INPUT)},
            fw.emitted,
            bw.emitted,
            {**{n.name: n.workspace for n in graph}, **measured},
            name=plan.name,
        )
        trace = simulate(step, schedule)
        split = schedule.split
        users = fw.emitted.outputs[: planned.lowered.num_fwd_outputs]
        held = trace.live[split - 1] - _output_bytes(step, users) if split else 0
        outcome = Outcome(attempt, trace.peak, held, time, peak, least, saves)
        compiled = (
            Compiled(fw.compiled, fw.specs, forward=True),
            Compiled(bw.compiled, bw.specs, forward=False),
        )
        backward_peak = max(trace.live[split:], default=0)
        return Round(outcome, planned, forward, backward, compiled, backward_peak)

    def _kept_plan(self, chosen: Round, goal: Goal) -> Plan:
        """The kept round's plan, with its peaks as compiled and the rounds tried; held to
        the target where it holds it, else (best effort) to what it needs, with a
        warning, or refused (strict) before anything of the step runs."""
        outcome, plan = chosen.outcome, chosen.planned.plan
        need = max(outcome.peak - goal.room, outcome.held) if goal.room else outcome.peak
        lane = outcome.attempt.lane
        rounds = [
            [o.attempt.aim, o.peak, o.attempt.lane.layout, o.attempt.lane.written]
            for o in self.history
        ]
        options = {
            **plan.options,
            "compiled_rounds": rounds,
            **({} if self._layout_on(lane) else {"layout_optimization": False}),
        }
        how = "as Inductor compiles it" if chosen.compiled is not None else "as planned"
        if holds(outcome, goal):
            status = "feasible" if plan.status == "best-effort" else plan.status
            budget, note = goal.target + goal.room, self._note(outcome, goal)
        else:
            if self.strict:
                what = "peak as compiled" if chosen.compiled is not None else "peak"
                raise InfeasibleBudget(goal.target, need, plan.solver, what=what)
            status, budget = "best-effort", need + goal.room
            unmet = (
                f"no plan found holds {format_bytes(goal.target)} {how}; "
                f"the least peak found is {format_bytes(need)}"
            )
            warnings.warn(f"{plan.name}: {unmet}", InfeasibleBudgetWarning, stacklevel=5)
            note = "; ".join(filter(None, (_kind(outcome), unmet)))
        kept_plan = dataclasses.replace(
            plan, status=status, budget=budget, requested_budget=goal.target, note=note
        )
        if chosen.compiled is None:
            return kept_plan
        return dataclasses.replace(
            kept_plan,
            compiled_peak=outcome.peak,
            compiled_backward_peak=chosen.backward_peak,
            held=outcome.held,
            options=options,
        )

    def _note(self, outcome: Outcome, goal: Goal) -> str:
        """What a kept plan made at an aim other than the target says of itself."""
        attempt = outcome.attempt
        if attempt.aim == goal.target and not attempt.lane.written:
            return ""
        within = (
            f"so that the graphs as Inductor compiles them peak within {format_bytes(goal.target)}"
        )
        kind = _kind(outcome) or f"planned at {format_bytes(attempt.aim)}"
        return f"{kind}, {within}"

    def _key(self, prepared: Prepared) -> str:
        """The plan cache's key: the graph, its costs and the request, what the rest of
        the step holds and the room asked for included, and the Inductor settings."""
        part, first = self.partitioner, prepared.first
        options = dataclasses.replace(part.options, best_effort=not self.strict)
        request = [part.resident.counts, part.room, self.settings]
        return plan_key(
            first.fingerprint,
            first.graph,
            part.budget,
            part.resident.held,
            options,
            first.device,
            extra=request,
        )

    def _cached(self, prepared: Prepared) -> Plan | None:
        """The plan kept on disk for this graph and request, if any."""
        if not self.keep_plans or self.partitioner.reuse is not None:
            return None
        return cached_plan(self._key(prepared))


def _kind(outcome: Outcome) -> str:
    """The plans named by what they are: the step as the model is written, the
    least-memory plan; "" for any other."""
    if outcome.attempt.lane.written:
        return "the step as the model is written"
    return "the least-memory plan" if outcome.least else ""


def _output_bytes(step: Graph, buffers: Sequence[str | None]) -> int:
    """The bytes of the forward's outputs (in `buffers`): a later graph counts them as
    its inputs, so what a graph keeps for its backward (Plan.held) is net of them, even
    where its backward reads them too."""
    names = {f"fw:{b}" for b in buffers if b is not None}
    owners = {step.storage_owner[step.by_name[n]] for n in names if n in step.by_name}
    return sum(step[v].bytes for v in owners if step[v].kind is NodeKind.COMPUTE)
