"""The graph runner's transitions (compile/runner_state.py), one row each: a run's state
before, what the runner saw, the state after and the actions it carries out; and which
re-planned plan is kept, by reason. No torch, no compile: tests/test_room.py drives the
runner itself with a fake planner."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

import pytest
from test_plan_file import hand_made_plan

from memplan.compile.ledger import Reason
from memplan.compile.runner_state import (
    CHECKED_STEPS,
    Action,
    Phase,
    RunState,
    at_call,
    checked,
    keeps,
    over_plan,
    planned_again,
    step_begins,
)
from memplan.planner.plan_file import Plan

MiB = 2**20
CHECKING = RunState()
NONE: frozenset[Reason] = frozenset()


@dataclass(frozen=True)
class Row:
    name: str
    before: RunState
    event: Callable[[RunState], tuple[RunState, tuple[Action, ...]]]
    after: RunState
    actions: tuple[Action, ...]


def _state(
    phase: Phase = Phase.CHECKING, steps: int = 0, found: bool = False, warned: bool = False
):
    return RunState(phase, steps, found_waiting=found, warned=warned)


TABLE = [
    # step_begins: a call while none of the run's own calls waits.
    Row(
        "a step with no call waiting is not counted",
        _state(),
        lambda s: step_begins(s, NONE),
        _state(),
        (),
    ),
    Row(
        "a step that found calls waiting, none over, is counted",
        _state(found=True),
        lambda s: step_begins(s, NONE),
        _state(steps=1),
        (),
    ),
    Row(
        f"the {CHECKED_STEPS}th such step trusts the run",
        _state(steps=CHECKED_STEPS - 1, found=True),
        lambda s: step_begins(s, NONE),
        _state(Phase.TRUSTED, steps=CHECKED_STEPS),
        (),
    ),
    Row(
        "room asked: planned for the step first, then counted",
        _state(found=True),
        lambda s: step_begins(s, frozenset({Reason.ROOM})),
        _state(steps=1),
        (Action.PLAN_FOR_THE_STEP,),
    ),
    Row(
        "refreshed and held over: for the step, then for what was held; not counted",
        _state(found=True, warned=True),
        lambda s: step_begins(s, frozenset({Reason.REFRESH, Reason.HELD_OVER})),
        _state(warned=True),
        (Action.PLAN_FOR_THE_STEP, Action.PLAN_FOR_WHAT_WAS_HELD),
    ),
    Row(
        "running the least for now: planned for what was held as the step begins",
        _state(Phase.LEAST_FOR_NOW, found=True, warned=True),
        lambda s: step_begins(s, frozenset({Reason.HELD_OVER})),
        _state(Phase.LEAST_FOR_NOW, found=True, warned=True),
        (Action.PLAN_FOR_WHAT_WAS_HELD,),
    ),
    Row(
        "a trusted run is still planned for the step",
        _state(Phase.TRUSTED, steps=CHECKED_STEPS),
        lambda s: step_begins(s, frozenset({Reason.REFRESH})),
        _state(Phase.TRUSTED, steps=CHECKED_STEPS),
        (Action.PLAN_FOR_THE_STEP,),
    ),
    # planned_again: the run's plan was replaced.
    Row(
        "planned for the step: checked again from none, told once per plan still",
        _state(Phase.TRUSTED, steps=CHECKED_STEPS, warned=True),
        lambda s: (planned_again(s, for_what_was_held=False), ()),
        _state(warned=True),
        (),
    ),
    Row(
        "planned for what was held: checked again, and told again where still over",
        _state(Phase.LEAST_FOR_NOW, steps=1, found=True, warned=True),
        lambda s: (planned_again(s, for_what_was_held=True), ()),
        _state(),
        (),
    ),
    # at_call: every call, after the step's begin.
    Row(
        "no call waiting: recorded only",
        _state(),
        lambda s: at_call(s, waiting=False),
        _state(),
        (Action.RECORD,),
    ),
    Row(
        "calls waiting: checked and recorded",
        _state(),
        lambda s: at_call(s, waiting=True),
        _state(found=True),
        (Action.CHECK, Action.RECORD),
    ),
    Row(
        "running the least for now: still checked",
        _state(Phase.LEAST_FOR_NOW),
        lambda s: at_call(s, waiting=True),
        _state(Phase.LEAST_FOR_NOW, found=True),
        (Action.CHECK, Action.RECORD),
    ),
    Row(
        "trusted: nothing",
        _state(Phase.TRUSTED, steps=CHECKED_STEPS),
        lambda s: at_call(s, waiting=True),
        _state(Phase.TRUSTED, steps=CHECKED_STEPS),
        (),
    ),
    # checked: what a check found.
    Row(
        "within the plan: nothing",
        _state(found=True),
        lambda s: checked(s, over=False, most_so_far=True, replannable=True),
        _state(found=True),
        (),
    ),
    Row(
        "over, first time: told, noted, the least run for now",
        _state(found=True),
        lambda s: checked(s, over=True, most_so_far=True, replannable=True),
        _state(Phase.LEAST_FOR_NOW, found=True, warned=True),
        (Action.WARN, Action.NOTE_OVER, Action.RUN_LEAST),
    ),
    Row(
        "over by more while running the least: noted, not told again",
        _state(Phase.LEAST_FOR_NOW, found=True, warned=True),
        lambda s: checked(s, over=True, most_so_far=True, replannable=True),
        _state(Phase.LEAST_FOR_NOW, found=True, warned=True),
        (Action.NOTE_OVER,),
    ),
    Row(
        "over by less than the most noted, while running the least: nothing",
        _state(Phase.LEAST_FOR_NOW, found=True, warned=True),
        lambda s: checked(s, over=True, most_so_far=False, replannable=True),
        _state(Phase.LEAST_FOR_NOW, found=True, warned=True),
        (),
    ),
    Row(
        "over after its last re-plan: told, not noted, runs its plan",
        _state(found=True),
        lambda s: checked(s, over=True, most_so_far=True, replannable=False),
        _state(found=True, warned=True),
        (Action.WARN,),
    ),
]


@pytest.mark.parametrize("row", TABLE, ids=[row.name for row in TABLE])
def test_transition(row: Row) -> None:
    assert row.event(row.before) == (row.after, row.actions)


def _plan(peak: int, held: int, resident: int = 0, asked: int | None = None) -> Plan:
    """A plan peaking at `peak` MiB, keeping `held` MiB for its backward, planned with
    `resident` MiB held before it and asked to peak within `asked` MiB (or its peak)."""
    return dataclasses.replace(
        hand_made_plan(),
        compiled_peak=peak * MiB,
        held=held * MiB,
        resident=resident * MiB,
        requested_budget=(peak if asked is None else asked) * MiB,
        budget=(peak if asked is None else asked) * MiB,
    )


OLD = _plan(50, 30)


@pytest.mark.parametrize(
    ("reason", "new", "freed", "kept"),
    [
        (Reason.ROOM, _plan(60, 29), 0, True),  # keeps less for its backward, peaks higher
        (Reason.ROOM, _plan(40, 30), 0, False),  # keeps as much
        (Reason.REFRESH, _plan(50, 30), 0, True),
        (Reason.REFRESH, _plan(55, 30, asked=60), 0, True),  # within what it was asked
        (Reason.REFRESH, _plan(55, 30, asked=52), 0, False),  # peaks higher, over its ask
        (Reason.REFRESH, _plan(45, 34), 4 * MiB, True),  # keeps what the graphs before freed
        (Reason.REFRESH, _plan(45, 34), 3 * MiB, False),  # keeps more than they freed
    ],
)
def test_which_plan_made_again_for_the_step_is_kept(
    reason: Reason, new: Plan, freed: int, kept: bool
) -> None:
    assert keeps(reason, OLD, new, freed) is kept


@pytest.mark.parametrize(
    ("plan", "held", "final", "over"),
    [
        (_plan(60, 10, resident=20, asked=80), 40, False, 0),  # 20 more, in its 20 of room
        (_plan(60, 10, resident=20, asked=80), 45, False, 5),
        (_plan(90, 10, resident=20, asked=80), 25, False, 5),  # best effort: room not < 0
        (_plan(90, 10, resident=20, asked=80), 25, True, 15),  # its last: the step counts
    ],
)
def test_how_far_calls_held_over_a_plan(plan: Plan, held: int, final: bool, over: int) -> None:
    assert over_plan(plan, held * MiB, final) == over * MiB
