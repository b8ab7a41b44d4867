"""The rounds of the torch.compile backend: how a graph Inductor compiled over its budget
(or well under it) is planned again, and which round is kept.

A round is one plan of a graph compiled by Inductor and checked (compiled_peak.py). Its
peak as compiled moves the aim of the next (`next_aim`); the rounds end where planning
again cannot do better (`next_aim` is None, `lowered_in_vain`, or the plan is one compiled
before: Partitioner.compiled); the fastest round within the budget is kept
(`kept_round`). The least-memory plan, where it compiles above its prediction, is followed
by one round planned for that peak (`least_peak_aim`); made for a budget under the unfused
graphs' least, where it compiles within that budget, it holds it (`held_as_compiled`).
Where no round holds the budget, a model's own checkpointing, the step as written, is one
more round (`checkpoints_its_own`). backends.MemplanBackend runs them.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch

from memplan.errors import MemplanWarning, first_line
from memplan.graph import Schedule
from memplan.planner.compiled_peak import CompiledGraphs, compiled_peak
from memplan.planner.plan import Partitioner
from memplan.planner.plan_file import Plan
from memplan.units import format_bytes

# Per graph: how many times it may be planned again, at a budget moved by what Inductor's
# compiled graphs peaked above (or below) the budget; the least-memory plan, tried where
# none holds the budget, and the round after it (least_peak_aim) come on top.
INDUCTOR_ROUNDS = 3
LEAST_AIM = 1  # bytes: a budget under every graph's least, planned best effort for it
# Inductor's fusion can leave a plan well under its budget: where the room left is over
# this share of the budget, the graph is planned again at a budget raised by it.
COMPILED_SLACK = 0.05
# A round's aim this close to one already tried (a share of the graph's budget) counts as
# tried: the plan there is the same or nearly, and compiling it again costs a whole round.
SAME_AIM = 0.001


@dataclasses.dataclass(frozen=True)
class Round:
    """One compile of a graph under Inductor: the compiled step, its plan (with its peak as
    compiled, where the check ran), the inner compiler that compiled it, and what makes
    the plan that plan (Partitioner.compiled): the way of its convolutions' copies and its
    schedule."""

    compiled: Callable[..., Any]
    plan: Plan
    inner: Callable[..., Any]
    schedule: Schedule

    @property
    def way(self) -> str:
        return str(self.plan.options["convolution_copies"])


def checked_round(
    partitioner: Partitioner,
    index: int,
    compiled: Callable[..., Any],
    graphs: CompiledGraphs | None,
    inner: Callable[..., Any],
    quiet: bool = False,
) -> Round:
    """The round compiled with `inner` (the graph's plan number `index`): its plan with the
    peak of what Inductor runs (none where the check cannot run: said in a warning, unless
    `quiet`, where the caller will compile the graph again)."""
    plan, schedule = partitioner.plans[-1], partitioner.schedules[-1]
    assert graphs is not None and len(partitioner.plans) == index + 1
    device = partitioner.lowered[-1].device
    try:
        peak, backward_peak = compiled_peak(plan, graphs.graphs, device)
    except Exception as error:  # a check that fails must not fail the user's compile
        if quiet:
            return Round(compiled, plan, inner, schedule)
        warnings.warn(
            f"{plan.name}: the peak of the graphs as Inductor compiled them could not "
            f"be checked ({first_line(error)}); the prediction is the unfused graphs'",
            MemplanWarning,
            stacklevel=4,
        )
        return Round(compiled, plan, inner, schedule)
    if plan.status == "best-effort":
        # At the least, the least is what Inductor runs.
        plan = dataclasses.replace(plan, budget=max(plan.budget, peak))
    checked = dataclasses.replace(plan, compiled_peak=peak, compiled_backward_peak=backward_peak)
    return Round(compiled, checked, inner, schedule)


def layout_may_cost(partitioner: Partitioner, plans: Sequence[Plan], target: int) -> bool:
    """Whether a graph Inductor compiled with its layout optimization may hold its budget
    only without it: it has convolutions (the only graphs the optimization changes), and
    every round's peak as compiled (`plans`) is above `target` or, planned best effort
    (its budget then being what runs), above the unfused graphs' prediction."""
    if not has_convolutions(partitioner) or not all(p.compiled_peak for p in plans):
        return False
    return all(p.peak > (p.predicted_peak if p.status == "best-effort" else target) for p in plans)


def has_convolutions(partitioner: Partitioner) -> bool:
    """Whether the graph last planned has convolutions: the only graphs Inductor's layout
    optimization changes."""
    joint = partitioner.lowered[-1].joint.graph
    return bool(joint.find_nodes(op="call_function", target=torch.ops.aten.convolution.default))


def checkpoints_its_own(partitioner: Partitioner) -> bool:
    """Whether the graph last planned has ops its model's own activation checkpointing
    recomputes (Node.checkpointed): its step as written is then a plan of its own."""
    return any(node.checkpointed for node in partitioner.lowered[-1].graph)


def least_ways(
    partitioner: Partitioner,
    inner: Callable[..., Any],
    with_layout: Callable[..., Any],
    without_layout: Callable[..., Any] | None,
    layout_checked: bool,
) -> list[Callable[..., Any]]:
    """The inner compilers to compile the least-memory plan with, where no round held the
    budget: the rounds' own (`inner`) and, for a graph with convolutions whose check could
    run with layout optimization (`with_layout`), the other way of it (`without_layout`).
    The least an InfeasibleBudget names is the least peak as compiled of that plan and the
    round after it (MemplanBackend._after_least), with layout optimization or without it
    where that is lower, while the rounds may have left layout optimization for a plan it
    took over the budget: a budget at that least is held only if the least plan is
    compiled both ways."""
    if without_layout is None or not layout_checked or not has_convolutions(partitioner):
        return [inner]
    return [with_layout, without_layout]


def replanned_note(plan: Plan, target: int, least_sought: bool, room: int = 0) -> str:
    """What a plan made at a budget moved from `target` says of itself (a least-memory
    round's planner note, of a budget under its least, is not the user's). Where the budget
    asked is under the graph's least (`least_sought`), the rounds sought its least peak as
    compiled, and `target` is no budget of the user's; leaving a later graph `room`
    (Partitioner.room), the round nearest to holding the budget with it."""
    # The plans named by what they are: the round of a model's own checkpointing, and
    # the least-memory plan; any other by the budget it was planned at.
    if plan.solver == "as_written":
        kind = "the step as the model is written"
    elif plan.status == "best-effort":
        kind = "the least-memory plan"
    else:
        kind = ""
    if least_sought:
        how = kind or f"planned at {format_bytes(plan.requested_budget)}"
        if room:
            return f"{how}: the nearest found to holding its budget with the room it leaves"
        return f"{how}: the least peak of the graphs as Inductor compiled them"
    within = f"so that the graphs as Inductor compiled them peak within {format_bytes(target)}"
    if kind:
        return f"{kind}, {within}"
    said = f"{plan.note}; " if plan.note else ""
    return f"{said}planned at {format_bytes(plan.requested_budget)} {within}"


def next_aim(plan: Plan, target: int) -> int | None:
    """The budget to plan a graph at next, given a plan and its peak as Inductor compiled
    it: lower by what it peaked above `target`, or higher by the room its fusion left
    (less recomputation, a faster step) where that is over COMPILED_SLACK of the target;
    None where the plan is as good as planning again can make it."""
    room = target - plan.peak
    if not plan.compiled_peak or plan.status == "best-effort":
        return None
    if 0 <= room <= COMPILED_SLACK * target:
        return None
    if room > 0:
        if all(d == "keep" for d in plan.decisions.values()):
            return None  # nothing to give back
        return plan.budget + room
    # Below the plan's own simulated peak, which can lie well under its budget: a budget
    # lowered from above it could give the same plan again.
    return max(1, min(plan.budget, plan.predicted_peak) + room)


def held_as_compiled(plan: Plan) -> Plan | None:
    """Where `plan` is the least-memory plan, made because the budget asked is under the
    unfused graphs' least, yet as Inductor compiled it peaks within that budget: the plan
    as one within it, since the budget is not under the graph's least as compiled, and the
    rounds may raise its aim (less recomputation). Inductor's fusion can do that: the zoo's
    MLP under bfloat16 autocast at 70% (1.70 MiB) is under its unfused least (1.71 MiB),
    and its least-memory plan compiles to 1.44 MiB. None otherwise."""
    if plan.status != "best-effort" or not plan.compiled_peak or plan.peak > plan.asked:
        return None
    note = replanned_note(plan, plan.asked, least_sought=False)
    return dataclasses.replace(plan, status="feasible", budget=plan.asked, note=note)


def least_peak_aim(plan: Plan) -> int | None:
    """Where `plan` is the least-memory plan (best effort) and peaks above its prediction as
    Inductor compiled it by over COMPILED_SLACK of it, that peak: the aim of one more round
    (with less room, the plan made is that plan or nearly). A plan made for it recomputes
    less, and its kernels may peak lower: on the zoo's CNN, the least-memory plan
    (19 tensors recomputed) compiles to 195.69 MiB, and the plan made for 195.69 MiB (9
    recomputed) to 179.69 MiB (docs/pipeline.md). None otherwise."""
    if plan.status != "best-effort" or not plan.compiled_peak:
        return None
    if plan.compiled_peak <= plan.predicted_peak * (1 + COMPILED_SLACK):
        return None
    return plan.compiled_peak


def lowered_in_vain(before: Plan, last: Plan, target: int) -> bool:
    """Whether `last`, planned lower because `before` peaked over `target` as compiled,
    peaks no lower: its fused kernels hold what the plan saved, and lower aims are
    unlikely to do better than the least-memory plan, which is tried where none holds."""
    return before.peak > target and last.peak >= before.peak


def peak_with_room(plan: Plan, room: int) -> int:
    """A plan's peak against a budget `room` of whose resident bytes are a later graph's,
    needed only between the plan's forward and its backward (Partitioner.room): its own
    peak without them, and what it keeps for its backward, which they are resident with."""
    return max(plan.peak - room, plan.held) if room else plan.peak


def kept_round(plans: Sequence[Plan], target: int, room: int = 0) -> int:
    """Which round to keep: the fastest predicted within `target`, else the least peak;
    where the first was planned best effort (for the least), the least peak. Leaving a
    later graph `room` (peak_with_room), the fastest within is kept even under the least:
    a least-memory plan keeps more for its backward than a model's own checkpointing can."""
    within = [i for i, p in enumerate(plans) if peak_with_room(p, room) <= target]
    if within and (plans[0].status != "best-effort" or room):
        return min(within, key=lambda i: plans[i].predicted_time)
    return min(range(len(plans)), key=lambda i: peak_with_room(plans[i], room))
