"""Room across graph breaks: which graphs before a graph, planned first, are to leave it
room in the step, and how much.

The graphs of a step are planned in the order Dynamo compiles them, and an earlier graph
knows nothing of the later ones: it can keep so much for its backward that a later graph
is left under its least. `make_room` then tells each graph before it (its watch: the one
that ran in this step, at this step's sizes) the most that graph needs while they hold
their saved tensors (a `Room`: its peak, with what the graphs between hold), and they are
planned again for it at their next step (held_watch.HeldWatch._plan_for_the_step). The
room a graph made is kept by its place in the step and its inputs' shapes
(`RoomsMade`): a graph compiled again at shapes it ran at before (Dynamo's recompile with
dynamic sizes) makes the same room at once, not a step later.
"""

from __future__ import annotations

import warnings
from collections.abc import Hashable, Iterable, Mapping
from typing import Any, NamedTuple, Protocol

import torch

from memplan.compile.step import held_between, keys_before, later_parameters, step_peaks
from memplan.core.errors import MemplanWarning
from memplan.core.units import format_bytes
from memplan.planner.plan_file import Plan

# How far (a share of the step's budget) a graph may peak over what the graphs before it
# left before they are planned again to make room: each of them is compiled again.
ROOM_SLACK = 0.01


class Room(NamedTuple):
    """What a later graph needs of an earlier one's budget, as found in the step that
    asked (so at that step's sizes): its peak with what the graphs between them hold,
    and its step's unplanned peak (what a share of a budget is of)."""

    needed: int
    unplanned_step_peak: int


class Watch(Protocol):
    """What room-making reads and sets of a graph's watch (held_watch.HeldWatch)."""

    again: object | None  # how it is planned again; None where it cannot be
    made_room: bool
    room_for: dict[Hashable, Room]
    refresh: bool


Shapes = tuple[tuple[int, ...], ...]
# The rooms a graph made, by its place in the step and its tensor inputs' shapes: the
# later graphs' Rooms, by their places.
RoomsMade = dict[tuple[Hashable, Shapes], dict[Hashable, Room]]


def shapes_of(args: Iterable[Any]) -> Shapes:
    """The shapes of a call's tensor arguments, in order."""
    return tuple(tuple(x.shape) for x in args if isinstance(x, torch.Tensor))


def make_room(
    watches: Mapping[Any, Watch],
    step: dict[Any, Plan],
    key: Hashable,
    parameters: dict[int, tuple[int, int]],
) -> bool:
    """Where graph `key`'s plan peaks over what the graphs before it left of the step's
    budget (by more than ROOM_SLACK of it), though within the budget alone, each graph
    before it (its watch in `watches`) leaves room for it at its next step, once
    (HeldWatch._plan_for_the_step). And each graph before it that the parameters graph
    `key` takes (with their gradients, `parameters`: step_peaks) take over the step's
    budget is planned again at its next step, for them (_hold_later_parameters). Whether
    any graph is to leave it room at its next step."""
    plan = step[key]
    step_budget = plan.asked + plan.resident
    _hold_later_parameters(watches, step, key, parameters, step_budget)
    if plan.peak - plan.asked <= ROOM_SLACK * step_budget or plan.peak > step_budget:
        return False
    leaving = [
        seen
        for seen in keys_before(step, key)
        if (watch := watches.get(seen)) is not None
        and watch.again is not None
        and (key in watch.room_for or not watch.made_room)
    ]
    # Asked already where it was compiled again in the step: said once.
    making = [seen for seen in leaving if key not in watches[seen].room_for]
    for seen in making:
        needed = held_between(step, seen, key) + plan.peak
        watches[seen].room_for[key] = Room(needed, plan.unplanned_step_peak)
    if making:  # the user sees this step over the budget, and why the next differs
        names = ", ".join(step[seen].name for seen in making)
        warnings.warn(
            f"{plan.name}: with what the graphs before it hold, the step peaks at "
            f"{format_bytes(plan.step_peak)}, {format_bytes(plan.peak - plan.asked)} "
            f"above its budget of {format_bytes(step_budget)}: at the next step {names} "
            "will be planned again to leave it room",
            MemplanWarning,
            stacklevel=3,
        )
    return bool(leaving)


def _hold_later_parameters(
    watches: Mapping[Any, Watch],
    step: dict[Any, Plan],
    key: Hashable,
    parameters: dict[int, tuple[int, int]],
    step_budget: int,
) -> None:
    """Where, with the parameters graph `key` (just compiled) takes and their gradients,
    the step peaks over `step_budget` (by more than ROOM_SLACK of it) while a graph before
    it runs, that graph is planned again at its next step with them taken as resident
    (HeldWatch._plan_for_the_step, `refresh`: GraphAgain.resident_now counts them), and
    the user is told. A graph planned before any later one was compiled counts none; one
    planned for its least (best effort) is over its budget without them, as it said."""
    peaks = step_peaks(step, parameters)
    for seen in keys_before(step, key):
        watch = watches.get(seen)
        over = peaks[seen] - step_budget
        if watch is None or watch.again is None or over <= ROOM_SLACK * step_budget:
            continue
        if step[seen].status == "best-effort" or not any(later_parameters(step, seen, parameters)):
            continue
        watch.refresh = True
        warnings.warn(
            f"{step[seen].name}: with the parameters of the graphs after it and their "
            f"gradients, the step peaks at {format_bytes(peaks[seen])} while it runs, "
            f"{format_bytes(over)} above its budget of {format_bytes(step_budget)}: at "
            "the next step it will be planned again for them",
            MemplanWarning,
            stacklevel=4,
        )
