"""The step ledger: the step's plans by graph, and what is to be planned again, and why.

The step is each graph's plan in it (`step`: at the sizes the step runs at, for a graph of
dynamic shapes), in the order the graphs first compiled. One record per run of a plan
(runner.Run: one per compile of a graph and per size it has a plan for) says what room
later graphs asked of it, the room its plan leaves, and which re-plans are pending.
Events (a graph compiled, a call, a plan made again) change the step and the records in
this one place and answer with `Replan` requests; the runner carries them out. No torch
here: tests/test_ledger.py runs the transitions from a table.
"""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from memplan.compile.step import held_between, keys_before, later_parameters, step_peaks
from memplan.planner.plan import Resident
from memplan.planner.plan_file import Plan

# How far (a share of the step's budget) a graph may peak over what the graphs before it
# left before they are planned again to make room: each of them is compiled again.
ROOM_SLACK = 0.01
# Per compile of a graph of dynamic shapes: how many sizes may get plans of their own.
# Each costs a trace, a profile and a compile; past the bound, calls run the plan made at
# the hints.
MAX_SHAPE_PLANS = 8

Shapes = tuple[tuple[int, ...], ...]


class Reason(Enum):
    """Why a graph is planned again: the closed set of what the torch.compile path does."""

    # A call of a graph of dynamic shapes at sizes where the plan made at its hints does
    # not hold the budget (runner.GraphRunner).
    NEW_SIZES = "new sizes"
    # Calls waiting for their backward (a graph's own repeated calls among them) held
    # more than its plan allowed for (replanner.Replanner.for_what_was_held, at its next step).
    HELD_OVER = "held over"
    # A later graph of the step peaks over what this one left (room.make_room).
    ROOM = "room"
    # What the graphs before it hold changed, or the parameters of those after it take
    # the step over its budget while it runs (replanner.Replanner.for_the_step).
    REFRESH = "refresh"


@dataclass(frozen=True)
class Replan:
    """Graph `key` of the step is to be planned again, for `reason`."""

    key: Hashable
    reason: Reason


@dataclass(frozen=True)
class Room:
    """What a later graph needs of an earlier one's budget, as found in the step that
    asked (so at that step's sizes): its peak with what the graphs between them hold,
    and its step's unplanned peak (what a share of a budget is of)."""

    needed: int
    unplanned_step_peak: int


# The rooms a graph made, by its place in the step and its tensor inputs' shapes: the
# later graphs' Rooms, by their places.
RoomsMade = dict[tuple[Hashable, Shapes], dict[Hashable, Room]]


@dataclass(frozen=True)
class Held:
    """What the calls waiting for their backward keep while a graph runs (`resident`: the
    bytes, and as unplanned), how many of them are calls of that graph itself, and the
    bytes the plans those ran keep (`Plan.held`, summed over them)."""

    resident: Resident
    own_calls: int = 0
    own_planned: int = 0

    def under(self, plan: Plan) -> int:
        """What the waiting calls would hold had the graph's own calls run `plan`: each
        keeps what its plan keeps, moved by how far `plan`'s held bytes differ."""
        return self.resident.held + self.own_calls * plan.held - self.own_planned


@dataclass(frozen=True)
class Entry:
    """One plan running graph `key`: the room later graphs asked of it (`asked`, pending
    until it is planned again), the room its plan leaves (`leaving`), whether it made
    room once (it is asked no more after), whether it is to be planned again for what
    the graphs before it hold (`refresh`), what calls held over its plan (`over`,
    pending), the shapes of its first call's tensors (where the room it made is kept),
    and whether it can be planned again at all (not after it was for `over`)."""

    key: Hashable
    asked: Mapping[Hashable, Room] = field(default_factory=dict)
    leaving: Mapping[Hashable, Room] = field(default_factory=dict)
    made_room: bool = False
    refresh: bool = False
    over: Held | None = None
    shapes: Shapes | None = None
    replannable: bool = True


@dataclass(frozen=True)
class RoomAsked:
    """The answer to a graph compiled into the step: the graphs before it now to be
    planned again (REFRESH, then ROOM, each once), and whether any graph before it is to
    leave it room, asked now or before."""

    requests: tuple[Replan, ...]
    leaving: bool


@dataclass
class StepLedger:
    """The step's plans by graph (`step`, in the order the graphs first compiled); the
    records of a backend's plans, by the run (any object that can be weakly referenced)
    that runs each; which of them runs each graph of the step now (`running`), every one
    of each graph (`of_key`: at every size, and of earlier compiles), the rooms made by
    graph and shapes (`rooms`), and the sizes planned on their own per compile of a graph
    of dynamic shapes (`sizes_planned`)."""

    step: dict[Any, Plan] = field(default_factory=dict)

    # Weakly: a record lives as long as its run, which Dynamo drops with its compile.
    entries: weakref.WeakKeyDictionary[Any, Entry] = field(
        default_factory=weakref.WeakKeyDictionary
    )
    running: dict[Hashable, Any] = field(default_factory=dict)
    of_key: dict[Hashable, list[Any]] = field(default_factory=dict)
    rooms: RoomsMade = field(default_factory=dict)
    sizes_planned: weakref.WeakKeyDictionary[Any, int] = field(
        default_factory=weakref.WeakKeyDictionary
    )

    def enter(self, run: Any, key: Hashable, plan: Plan) -> None:
        """`run` is a new plan of graph `key`, `plan`, and runs it in the step now."""
        self.entries[run] = Entry(key)
        self.of_key.setdefault(key, []).append(run)
        self.runs(key, run, plan)

    def runs(self, key: Hashable, run: Any, plan: Plan) -> None:
        """`run` runs graph `key` in the step now, as `plan` (a graph of dynamic shapes, at
        a call's sizes): the graphs after it count what it holds, and ask room of it."""
        self.running[key] = run
        self.step[key] = plan

    def keep(self, key: Hashable, plan: Plan) -> None:
        """Graph `key` was planned again: `plan` is its plan in the step."""
        self.step[key] = plan

    def forget_step(self) -> None:
        """Forget which graphs the step has (torch._dynamo.reset). The records stay: a
        run compiled before may still be called."""
        self.step.clear()
        self.running.clear()
        self.of_key.clear()
        self.rooms.clear()

    def ask_room(self, key: Hashable, parameters: dict[int, tuple[int, int]]) -> RoomAsked:
        """Graph `key` joined the step (its plan there). Each graph before it that the
        parameters graph `key` takes (with their gradients, `parameters`: step_peaks) take
        over the step's budget by more than ROOM_SLACK of it is refreshed, unless it was
        planned before any later graph was compiled or for its least (best effort). Where
        graph `key` peaks over what the graphs before it left (by more than ROOM_SLACK of
        the step's budget), though within the budget alone, each graph before it that did
        not make room yet leaves it room at its next step, once."""
        step = self.step
        plan = step[key]
        step_budget = plan.step_budget
        requests = [Replan(seen, Reason.REFRESH) for seen in self._refreshed(key, parameters)]
        if plan.peak - plan.asked <= ROOM_SLACK * step_budget or plan.peak > step_budget:
            return RoomAsked(tuple(requests), leaving=False)
        before = [(seen, self.running.get(seen)) for seen in keys_before(step, key)]
        leaving = [
            (seen, run)
            for seen, run in before
            if run is not None
            and self.entries[run].replannable
            and (key in self.entries[run].asked or not self.entries[run].made_room)
        ]
        for seen, run in leaving:
            entry = self.entries[run]
            if key in entry.asked:  # asked already where it was compiled again in the step
                continue
            room = Room(held_between(step, seen, key) + plan.peak, plan.unplanned_step_peak)
            self.entries[run] = dataclasses.replace(entry, asked={**entry.asked, key: room})
            requests.append(Replan(seen, Reason.ROOM))
        return RoomAsked(tuple(requests), leaving=bool(leaving))

    def _refreshed(self, key: Hashable, parameters: dict[int, tuple[int, int]]) -> list[Hashable]:
        """The graphs before graph `key` now refreshed for the parameters of those after."""
        step = self.step
        plan = step[key]
        step_budget = plan.step_budget
        peaks = step_peaks(step, parameters)
        refreshed = []
        for seen in keys_before(step, key):
            run = self.running.get(seen)
            over = peaks[seen] - step_budget
            if run is None or not self.entries[run].replannable or over <= ROOM_SLACK * step_budget:
                continue
            # Planned for its least (best effort), it is over its budget without them, as
            # it said; planned before any later graph was compiled, it counts none.
            if step[seen].status == "best-effort" or not any(
                later_parameters(step, seen, parameters)
            ):
                continue
            self.entries[run] = dataclasses.replace(self.entries[run], refresh=True)
            refreshed.append(seen)
        return refreshed

    def first_call(self, run: Any, shapes: Shapes) -> None:
        """`run`'s first call (of real tensors) is at `shapes`: where its graph made room
        at them before (another compile of it: Dynamo's recompile with dynamic sizes), and
        this plan made none yet, that room is asked of it at once."""
        entry = self.entries[run]
        if entry.shapes is not None or not entry.replannable:
            return
        made = {} if entry.made_room else self.rooms.get((entry.key, shapes), {})
        self.entries[run] = dataclasses.replace(entry, shapes=shapes, asked={**made, **entry.asked})

    def due(self, run: Any) -> tuple[Replan, ...]:
        """The re-plans pending for `run` at a call that begins a step of its graph: for
        the step (ROOM where room was asked, else REFRESH), then HELD_OVER."""
        entry = self.entries[run]
        if not entry.replannable:
            return ()
        for_step = Reason.ROOM if entry.asked else Reason.REFRESH if entry.refresh else None
        reasons = [for_step, Reason.HELD_OVER if entry.over is not None else None]
        return tuple(Replan(entry.key, reason) for reason in reasons if reason is not None)

    def take_step(self, run: Any) -> tuple[dict[Hashable, Room], dict[Hashable, Room]]:
        """`run` is planned again for the step (ROOM or REFRESH, no longer pending): the
        rooms asked of it, and all it is to leave (the room it leaves already, and those)."""
        entry = self.entries[run]
        asked = dict(entry.asked)
        self.entries[run] = dataclasses.replace(
            entry, asked={}, refresh=False, made_room=entry.made_room or bool(asked)
        )
        return asked, {**entry.leaving, **asked}

    def left(self, run: Any, rooms: dict[Hashable, Room]) -> None:
        """`run`'s new plan leaves `rooms`: kept by its graph and first call's shapes, for
        another compile of it at those shapes."""
        entry = self.entries[run] = dataclasses.replace(self.entries[run], leaving=rooms)
        if entry.shapes is not None:
            self.rooms[(entry.key, entry.shapes)] = rooms

    def refresh_after(self, key: Hashable) -> tuple[Replan, ...]:
        """What graph `key` holds changed: every plan of the graphs after it in the step,
        at every size, is planned again at its next step."""
        order = list(self.step)
        return self._refresh(order[order.index(key) + 1 :])

    def refresh_all(self) -> tuple[Replan, ...]:
        """What the step holds outside its graphs grew: every plan of every graph of the
        step, at every size, is planned again at its next step."""
        return self._refresh(list(self.step))

    def _refresh(self, keys: Sequence[Hashable]) -> tuple[Replan, ...]:
        requests = []
        for key in keys:
            for run in self.of_key.get(key, []):
                self.entries[run] = dataclasses.replace(self.entries[run], refresh=True)
            if self.of_key.get(key):
                requests.append(Replan(key, Reason.REFRESH))
        return tuple(requests)

    def found_over(self, run: Any, held: Held) -> None:
        """Calls waiting at a call of `run` held `held`, over its plan: the most so far."""
        self.entries[run] = dataclasses.replace(self.entries[run], over=held)

    def take_over(self, run: Any) -> Held:
        """`run` is planned again for what calls held over it (HELD_OVER), the last time
        it is planned again: what they held."""
        entry = self.entries[run]
        assert entry.over is not None, "planned again for held bytes none were found over"
        self.entries[run] = dataclasses.replace(entry, over=None, replannable=False)
        return entry.over

    def new_sizes(self, compile: Any, key: Hashable, holds: bool) -> Replan | None:
        """A call of graph `key` (of dynamic shapes, compiled as `compile`) at sizes new to
        it, where the plan made at its hints `holds` the budget or not: a plan of their
        own (NEW_SIZES) where it does not and fewer than MAX_SHAPE_PLANS sizes of that
        compile have one; else None (past the bound, the generic plan runs)."""
        planned = self.sizes_planned.get(compile, 0)
        if holds or planned >= MAX_SHAPE_PLANS:
            return None
        self.sizes_planned[compile] = planned + 1
        return Replan(key, Reason.NEW_SIZES)


def room_for(rooms: Mapping[Hashable, Room], resident: Resident) -> tuple[int, int]:
    """The most the later graphs a graph leaves `rooms` for need, and of it what is not
    taken as resident already: their peaks count their parameters and gradients, which
    are (`resident.later`) for the whole graph."""
    needed = max((room.needed for room in rooms.values()), default=0)
    return needed, max(0, needed - resident.later)
