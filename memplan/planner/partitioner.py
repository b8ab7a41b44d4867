"""The partition function memplan hands to AOTAutograd: each joint graph it is given is
prepared (planner/prepared.py), planned for the budget and rewritten into the forward and
backward that run. The Python API and the .pt2 path plan through it; the torch.compile
path uses its record of the plans (compile/backend.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch.fx as fx

from memplan.core.budget import Budget
from memplan.core.graph import Graph, Schedule
from memplan.core.simulate import simulate
from memplan.passes.rewrite import Lowered
from memplan.planner.fusion import as_solved
from memplan.planner.lower import lower
from memplan.planner.options import PlanOptions
from memplan.planner.plan import Resident, forward_outputs, kept_for_backward, unplanned_step
from memplan.planner.plan_file import Plan
from memplan.planner.prepared import Planned, Prepared
from memplan.planner.profile import ProfileCache
from memplan.planner.shapes import ShapeSignature, at


class Partitioner:
    """memplan's partition function for AOTAutograd: plans each joint graph it is given
    and returns the rewritten forward and backward. `plans` collects one Plan per graph,
    `lowered` and `schedules` what each was planned on and carries out."""

    def __init__(
        self,
        budget: Budget,
        options: PlanOptions,
        *,
        name: str = "model",
        reuse: Plan | None = None,
        cache: ProfileCache | None = None,
    ) -> None:
        self.budget = budget
        self.options = options
        self.name = name
        self.reuse = reuse
        # Profiled times are cached on disk, so that planning the same model twice sees the
        # same times and makes the same decisions.
        self.cache = cache if cache is not None else ProfileCache()
        # The sizes (symbol -> value) a graph of dynamic shapes is planned at: its hints.
        self.sizes: ShapeSignature = ()
        # What earlier graphs of the step hold while this one runs (graph breaks), and
        # what the step holds outside its graphs (tools/fit.py: optimizer state).
        self.resident = Resident()
        # Of `resident.held`, the bytes a later graph of the step needs only between this
        # graph's forward and its backward (compile/room.py): a plan holds the budget
        # where its peak is within it with them given back, and what it keeps for its
        # backward within it with them taken (compile/search.py).
        self.room = 0
        # A last look at each graph, its costs set, before it is solved: tools/fit.py
        # divides it per FSDP rank there, and stops where no plan can fit.
        self.before_solving: Callable[[Graph], Graph] | None = None
        self.plans: list[Plan] = []
        self.lowered: list[Lowered] = []
        self.schedules: list[Schedule] = []

    def __call__(
        self, joint: fx.GraphModule, joint_inputs: object, *, num_fwd_outputs: int, **_: object
    ) -> tuple[fx.GraphModule, fx.GraphModule]:
        prepared = self.prepare(joint, num_fwd_outputs)
        planned = prepared.plan(
            self.budget, self.resident, reuse=self.reuse, requested_as=str(self.budget)
        )
        return self.keep(planned)

    def prepare(
        self, joint: fx.GraphModule, num_fwd_outputs: int, *, channels_last: bool = False
    ) -> Prepared:
        """`joint` prepared to plan, named after the graphs planned before it;
        `channels_last`: Inductor lays its convolutions out channels-last (Prepared)."""
        name = self.name if not self.plans else f"{self.name}.{len(self.plans)}"
        return Prepared(
            joint,
            num_fwd_outputs,
            name=name,
            options=self.options,
            budget=self.budget,
            resident=self.resident,
            cache=self.cache,
            reuse=self.reuse,
            before_solving=self.before_solving,
            channels_last=channels_last,
        )

    def keep(self, planned: Planned) -> tuple[fx.GraphModule, fx.GraphModule]:
        """`planned` recorded as the plan of the graph; the forward and backward that
        carry it out."""
        self.record(planned)
        return planned.rewrite()

    def record(self, planned: Planned) -> None:
        """`planned` as the plan of the graph, with the sizes it is planned at."""
        self.plans.append(dataclasses.replace(planned.plan, sizes=dict(self.sizes)))
        self.lowered.append(planned.lowered)
        self.schedules.append(planned.schedule)

    def forget_from(self, first: int) -> None:
        """Drop the plans made from index `first` on."""
        for made in (self.plans, self.lowered, self.schedules):
            del made[first:]

    def at_sizes(self, sizes: ShapeSignature) -> Plan:
        """The plan last made, of a graph of dynamic shapes, as it runs at other sizes, its
        schedule kept: its peaks, timeline, bytes kept for the backward and forward outputs
        evaluated at `sizes`, and its unplanned peak there. Times and transients are the
        profile's at the hints, a transient scaled with its node's bytes. A plan Inductor
        compiled keeps its peak as compiled in proportion to the simulated one."""
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
        graph = as_solved(
            resized.replace_times([n.time for n in traced], scaled), lowered.fx_nodes, self.options
        )
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
            held=kept_for_backward(graph, trace, schedule.split),
            unplanned_held=kept_for_backward(graph, unplanned, reference.schedule.split),
            output_bytes=forward_outputs(graph),
            sizes=dict(sizes),
        )
