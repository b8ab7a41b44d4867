"""Room across graph breaks as graphs are planned again, through the graph runner with a
fake planner. A graph planned again for what the graphs before it in the step hold (its
`refresh`, replanner.Replanner.for_the_step) whose plan peaks over what they left of the
budget: the graphs before it are asked to leave it room (room.make_room), or, where they
can leave no more, the user is told. A graph that leaves room and is planned again for its
own earlier calls (Replanner.for_what_was_held) still leaves it. Plans are made by hand;
no model is compiled."""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import pytest
import torch
from test_plan_file import hand_made_plan

from memplan.compile.ledger import Entry, Held, Room, StepLedger
from memplan.compile.replanner import Replanner
from memplan.compile.runner import GraphRunner
from memplan.compile.step import StepKey
from memplan.compile.waiting import WaitingCalls
from memplan.core.budget import Budget
from memplan.core.errors import MemplanWarning
from memplan.planner.options import PlanOptions
from memplan.planner.outside import Outside
from memplan.planner.partitioner import Partitioner
from memplan.planner.plan import Resident
from memplan.planner.plan_file import Plan

MiB = 2**20
FIRST, SECOND = StepKey(0, 0, frozenset()), StepKey(1, 0, frozenset())


def _plan(name: str, peak: int, held: int, resident: int = 0, asked: int = 0) -> Plan:
    """A plan of graph `name` peaking at `peak` MiB on its own, keeping `held` MiB for its
    backward, planned with `resident` MiB held by the graphs before it and asked to peak
    within `asked` MiB (or its peak)."""
    return dataclasses.replace(
        hand_made_plan(),
        name=name,
        compiled_peak=peak * MiB,
        held=held * MiB,
        resident=resident * MiB,
        requested_budget=(asked or peak) * MiB,
        budget=(asked or peak) * MiB,
    )


def _run(*args: Any) -> Any:
    return args


class _Backend:
    """The backend as the runner and the replanner read it, under a budget of 100 MiB for
    the step: every graph it compiles again is planned as `made`."""

    def __init__(self, made: Plan) -> None:
        self.budget = Budget.parse(100 * MiB)
        self.options = PlanOptions()
        self.plans: list[Plan] = []
        self.ledger = StepLedger()
        self.parameters: dict[int, tuple[int, int]] = {}
        self.outside = Outside()  # no optimizer state
        self.made = made
        self.asked: list[Partitioner] = []  # what each compile was asked

    def outside_grew(self, inputs: Sequence[Any], step_budget: int) -> bool:
        return False  # no optimizer: nothing outside the graphs grows

    def compile(
        self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any], partitioner: Partitioner
    ) -> Callable[..., Any]:
        self.asked.append(partitioner)
        self.plans.append(self.made)
        return _run

    @property
    def step(self) -> dict[Any, Plan]:
        return self.ledger.step

    def run(self, key: StepKey, plan: Plan, resident: int) -> GraphRunner:
        """Graph `key` of the step runs `plan`, planned with `resident` MiB held before it."""
        planned = Partitioner(self.budget, self.options, name=plan.name)
        planned.resident = Resident(held=resident * MiB)
        planned.plans.append(plan)
        gm = torch.fx.GraphModule({}, torch.fx.Graph())
        return GraphRunner(self, Replanner(self), WaitingCalls(), gm, key, (), planned, _run)

    def entry(self, key: StepKey, **changes: Any) -> Entry:
        """The ledger's record of the run of graph `key`, with `changes` made."""
        run = self.ledger.running[key]
        self.ledger.entries[run] = dataclasses.replace(self.ledger.entries[run], **changes)
        return self.ledger.entries[run]


def _second_planned_again(made: Plan, first_made_room: bool) -> tuple[_Backend, list[str]]:
    """The first graph keeps 40 MiB for its backward, where the second was planned with 30
    MiB held before it (to peak at 66 MiB within 70): planned again for the 40 MiB, the
    second's plan is `made`, within or over the 60 MiB the first leaves it. Its next call
    is made (a step); the backend, and memplan's warnings said, are returned."""
    backend = _Backend(made)
    backend.run(FIRST, _plan("graph0", 50, 40), resident=0)
    backend.entry(FIRST, made_room=first_made_room)
    second = backend.run(SECOND, _plan("graph1", 66, 10, resident=30, asked=70), resident=30)
    backend.entry(SECOND, refresh=True)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        second(torch.zeros(1))
    return backend, [str(w.message) for w in said if issubclass(w.category, MemplanWarning)]


# Planned again, the second graph finds no plan under 64 MiB: 4 MiB over what is left.
OVER = dataclasses.replace(_plan("graph1 again", 64, 10, asked=60), status="best-effort")


def test_a_graph_planned_again_over_what_the_graphs_before_left_has_them_leave_it_room() -> None:
    backend, said = _second_planned_again(OVER, first_made_room=False)
    assert backend.step[SECOND].name == "graph1 again"
    assert backend.step[SECOND].step_peak == 104 * MiB
    # The first graph leaves the second its peak at its next step, and the user is told.
    assert backend.entry(FIRST).asked == {SECOND: Room(64 * MiB, 0)}
    assert len(said) == 1 and "graph0 will be planned again to leave it room" in said[0]


def test_where_the_graphs_before_leave_no_more_room_the_user_is_told_how_far_over() -> None:
    backend, said = _second_planned_again(OVER, first_made_room=True)
    assert backend.entry(FIRST).asked == {}
    assert len(said) == 1
    assert said[0].startswith("graph1 again: planned again for the step, it peaks at 64.00 MiB")
    assert "the step at 104.00 MiB, 4.00 MiB above its budget of 100.00 MiB" in said[0]


@pytest.mark.parametrize("first_made_room", [False, True])
def test_a_graph_planned_again_within_what_is_left_says_nothing(first_made_room: bool) -> None:
    within = _plan("graph1 again", 58, 10, asked=60)
    backend, said = _second_planned_again(within, first_made_room)
    assert said == []
    assert backend.step[SECOND].step_peak == 98 * MiB and backend.entry(FIRST).asked == {}


def _leaving_room_planned_again(made: Plan) -> _Backend:
    """The first graph keeps 40 MiB for its backward and leaves the second 30 MiB of room;
    a call of its own (the step before) was found to hold 20 MiB while it ran. At its next
    call it is planned again for them (its plans are `made`); the backend is returned."""
    backend = _Backend(made)
    first = backend.run(FIRST, _plan("graph0", 50, 40), resident=0)
    backend.run(SECOND, _plan("graph1", 30, 10, resident=40, asked=60), resident=40)
    backend.entry(
        FIRST,
        leaving={SECOND: Room(30 * MiB, 0)},
        over=Held(Resident(held=20 * MiB), own_calls=1, own_planned=40 * MiB),
    )
    first(torch.zeros(1))
    return backend


def test_a_graph_planned_again_for_its_own_calls_still_leaves_the_room_it_left() -> None:
    # With its calls holding 15 MiB under it, it peaks within 100 MiB on its own (15 + 45)
    # and with the room taken while the second graph runs (15 + 35 + 30).
    made = _plan("graph0 again", 45, 35, resident=50, asked=50)
    backend = _leaving_room_planned_again(made)
    (asked,) = backend.asked
    assert (asked.room, asked.resident.held) == (30 * MiB, 50 * MiB)
    assert asked.name == "graph0 (leaving 30.00 MiB for later graphs)"
    assert backend.step[FIRST] is made


def test_a_plan_that_holds_only_without_the_room_is_not_kept_as_holding() -> None:
    # On its own it peaks within the budget (40 + 45), but it keeps 60 MiB, and with its
    # calls' 40 MiB and the 30 MiB room, the step would peak at 130 MiB: the least-memory
    # plan (all of the budget taken as resident) is asked for.
    made = _plan("graph0 again", 45, 60, resident=50, asked=50)
    backend = _leaving_room_planned_again(made)
    assert [p.resident.held for p in backend.asked] == [50 * MiB, 130 * MiB]
