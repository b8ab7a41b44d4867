"""A joint graph made ready to plan, once: cleaned, lowered for each way of its
convolutions' input copies (under Inductor's layout optimization, the channels-last
copies it makes: passes/contiguous.py), and profiled. Planning it at a budget and
rewriting it then cost a solve and a rewrite, not a trace and a profile, so that the
torch.compile path can plan one graph at several budgets (compile/search.py).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch.fx as fx

from memplan.core.budget import Budget
from memplan.core.errors import InfeasibleBudget, PlanFileError
from memplan.core.graph import Graph, Schedule
from memplan.passes.contiguous import (
    channels_last_convolution_inputs,
    contiguous_convolution_inputs,
)
from memplan.passes.rewrite import Lowered, rewrite
from memplan.planner.capture import module_copy
from memplan.planner.fusion import as_solved, fused_seconds
from memplan.planner.lower import drop_checked_asserts, lower, write_inputs_early
from memplan.planner.options import PlanOptions
from memplan.planner.plan import Resident, plan_graph, profile_cap, say_again
from memplan.planner.plan_file import Plan
from memplan.planner.profile import ProfileCache, profile_graph
from memplan.planner.transfer_cost import transfer_seconds

# Where a convolution's input of another layout is copied to the one its kernel wants.
KERNEL_COPIES, GRAPH_COPIES = "kernel", "graph"  # the ways of PlanOptions.convolution_copies
# The way of a graph Inductor lays out channels-last: its copies of the graph's inputs.
CHANNELS_LAST_COPIES = "channels_last"


@dataclass(frozen=True)
class Planned:
    """A plan of a prepared graph: the way its convolutions' copies are made, the lowered
    graph of that way, the Plan and its Schedule."""

    way: str
    lowered: Lowered
    plan: Plan
    schedule: Schedule

    def rewrite(self) -> tuple[fx.GraphModule, fx.GraphModule]:
        """The forward and backward modules that carry out the plan."""
        plan = self.plan
        stamp = {
            "solver": plan.solver,
            "budget": plan.budget,
            "predicted_peak": plan.predicted_peak,
            "solve_seconds": plan.solve_seconds,
        }
        return rewrite(self.lowered, self.schedule, stamp=stamp)


class Prepared:
    """A joint graph ready to plan (the module's docstring). `budget` and `resident`, as
    first asked, cap what profiling holds (planner/pass_values.py); `reuse` is a saved
    Plan whose way must match (PlanFileError otherwise); `before_solving` is a last look
    at each lowered graph, its costs set (tools/fit.py divides it per rank there);
    `channels_last`: Inductor lays the graph's convolutions out channels-last, so that it
    is also prepared with the copies that makes, as a way of its own."""

    def __init__(
        self,
        joint: fx.GraphModule,
        num_fwd_outputs: int,
        *,
        name: str,
        options: PlanOptions,
        budget: Budget,
        resident: Resident,
        cache: ProfileCache,
        reuse: Plan | None = None,
        before_solving: Callable[[Graph], Graph] | None = None,
        channels_last: bool = False,
    ) -> None:
        self.name = name
        self.options = options
        drop_checked_asserts(joint)
        joint.graph.eliminate_dead_code()
        write_inputs_early(joint)
        threshold = options.offload_threshold
        lowered = {
            way: lower(variant, num_fwd_outputs, name=name, offload_threshold=threshold)
            for way, variant in _variants(
                joint, options.convolution_copies, channels_last=channels_last
            ).items()
        }
        if reuse is not None:
            lowered = _matching(lowered, reuse)
        self.variants = {
            way: _costed(low, options, budget, resident, cache, before_solving)
            for way, low in lowered.items()
        }
        # What the solvers are given: under Inductor, with the outputs it never writes
        # held at 0 bytes. The graph as lowered stays the one a plan is made for (its
        # fingerprint) and rewritten from.
        self.solved = {
            way: as_solved(low.graph, low.fx_nodes, options) for way, low in self.variants.items()
        }

    @property
    def first(self) -> Lowered:
        """The graph as traced (the first way planned)."""
        return next(iter(self.variants.values()))

    def unplanned(self, *, channels_last: bool = False) -> Graph:
        """The graph whose step as written is the unplanned one: the first way planned,
        compiled channels-last (`plan`) or not, as the solvers are given it."""
        return self.solved[next(iter(self._ways(None, channels_last)))]

    def plan(
        self,
        budget: Budget,
        resident: Resident,
        *,
        reuse: Plan | None = None,
        written: bool = False,
        requested_as: str = "",
        options: PlanOptions | None = None,
        channels_last: bool = False,
    ) -> Planned:
        """The fastest plan of the ways that holds `budget` with `resident` held by the
        graphs before, else the least peak (best effort); each way is held to the bytes
        the first was asked. `options` are the graph's, unless given (the torch.compile
        path's rounds plan best effort); `channels_last`: compiled with Inductor's layout
        optimization (_ways). Raises the least InfeasibleBudget where none planned. The
        warnings of the way kept are said; the others' are about a graph that does not
        run."""
        planned: dict[str, Planned | InfeasibleBudget] = {}
        said: dict[str, list[warnings.WarningMessage]] = {}
        for way, lowered in self._ways(reuse, channels_last).items():
            with warnings.catch_warnings(record=True) as said[way]:
                warnings.simplefilter("always")
                planned[way] = found = self._plan_way(
                    way, lowered, budget, resident, reuse, written, options or self.options
                )
            asked = found.budget if isinstance(found, InfeasibleBudget) else found.plan.asked
            # The next way is held to these bytes, which are net of what is resident.
            budget = Budget(bytes=asked)
            resident = dataclasses.replace(resident, held=0)
        kept = _faster(planned)
        for warning in said[kept.way]:
            say_again(warning)
        # The plan records the way it was made, so that applying it again makes it that way.
        plan = dataclasses.replace(
            kept.plan,
            options={**kept.plan.options, "convolution_copies": kept.way},
            requested_as=requested_as or kept.plan.requested_as,
        )
        return dataclasses.replace(kept, plan=plan)

    def _ways(self, reuse: Plan | None, channels_last: bool) -> dict[str, Lowered]:
        """The ways to plan: the one `reuse` was made for; compiled channels-last, the
        way of its copies where the graph has one (Inductor lays out the copies of the
        other ways channels-last too, so that theirs are not what runs); otherwise the
        others."""
        if reuse is not None:
            return _matching(self.variants, reuse)
        if channels_last and CHANNELS_LAST_COPIES in self.variants:
            return {CHANNELS_LAST_COPIES: self.variants[CHANNELS_LAST_COPIES]}
        return {w: low for w, low in self.variants.items() if w != CHANNELS_LAST_COPIES}

    def _plan_way(
        self,
        way: str,
        lowered: Lowered,
        budget: Budget,
        resident: Resident,
        reuse: Plan | None,
        written: bool,
        options: PlanOptions,
    ) -> Planned | InfeasibleBudget:
        try:
            plan, schedule = plan_graph(
                self.solved[way],
                budget,
                options,
                device=str(lowered.device),
                fingerprint=lowered.fingerprint,
                reuse=reuse,
                written=written,
                resident=resident,
            )
        except InfeasibleBudget as infeasible:
            return infeasible
        return Planned(way, lowered, plan, schedule)


def _variants(
    joint: fx.GraphModule, copies: str, *, channels_last: bool
) -> dict[str, fx.GraphModule]:
    """The joint graph for each way its convolutions' input copies may be made: inside
    the kernels (as traced), in the graph (passes/contiguous.py), or both; and where
    `channels_last`, with the channels-last copies Inductor makes."""
    variants = {} if copies == GRAPH_COPIES else {KERNEL_COPIES: joint}
    if copies != KERNEL_COPIES:
        copied = module_copy(joint)
        if contiguous_convolution_inputs(copied):
            variants[GRAPH_COPIES] = copied
    variants = variants or {KERNEL_COPIES: joint}  # "graph", but nothing to copy
    if channels_last:
        copied = module_copy(joint)
        if channels_last_convolution_inputs(copied):
            variants[CHANNELS_LAST_COPIES] = copied
    return variants


def _matching(lowered: dict[str, Lowered], reuse: Plan) -> dict[str, Lowered]:
    """The ways whose graph `reuse` was made for; PlanFileError where none is."""
    matching = {w: low for w, low in lowered.items() if low.fingerprint == reuse.fingerprint}
    if not matching:
        ours = next(iter(lowered.values())).fingerprint
        raise PlanFileError(
            f"plan {reuse.name!r} was made for another graph "
            f"(fingerprint {reuse.fingerprint}, this model {ours})"
        )
    return matching


def _costed(
    lowered: Lowered,
    options: PlanOptions,
    budget: Budget,
    resident: Resident,
    cache: ProfileCache,
    before_solving: Callable[[Graph], Graph] | None,
) -> Lowered:
    """`lowered` with its nodes' times and workspaces profiled (priced as Inductor fuses
    them, where it does), and the host time of a transfer where offloading."""
    device = lowered.device
    solver_options = options.solver_options(device.type)
    profile = profile_graph(
        lowered.joint,
        device=device,
        measure=options.measure,
        spec=options.device_spec,
        cache=cache,
        progress=options.progress,
        cap=profile_cap(lowered.graph, budget, resident, solver_options),
    )
    seconds = [profile.seconds.get(n.name, 0.0) for n in lowered.fx_nodes]
    if options.fused_pointwise:
        seconds = fused_seconds(lowered.fx_nodes, seconds)
    graph = lowered.graph.replace_times(
        seconds, [profile.workspace.get(n.name, 0) for n in lowered.fx_nodes]
    )
    if solver_options.bandwidth:
        priced = transfer_seconds(device, measure=options.measure, cache=cache)
        graph = dataclasses.replace(graph, transfer_seconds=priced)
    if before_solving is not None:
        graph = before_solving(graph)
    return dataclasses.replace(lowered, graph=graph)


def _faster(planned: dict[str, Planned | InfeasibleBudget]) -> Planned:
    """Of the plans of a graph's ways: the fastest predicted among those that hold the
    budget asked for, else (all best effort) the least peak. Raises the least
    InfeasibleBudget where none planned."""
    plans = [p for p in planned.values() if isinstance(p, Planned)]
    if not plans:
        raise min(planned.values(), key=lambda e: e.smallest_feasible)  # type: ignore[union-attr]
    held = [p for p in plans if p.plan.status != "best-effort"]
    if held:
        return min(held, key=lambda p: p.plan.predicted_time)
    return min(plans, key=lambda p: p.plan.predicted_peak)
