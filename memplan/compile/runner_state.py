"""The graph runner's states and transitions, and which re-planned plan is kept: pure.

A runner (runner.GraphRunner) runs one plan of a graph per size signature; each such run
is in one of three phases (`Phase`). Its calls are checked against what calls still
waiting for their backward hold until CHECKED_STEPS of the graph's steps were checked with
none over; a call found over has the rest of the step run the graph's least-memory plan,
and the graph is planned again for what was held when its next step begins. The functions
below take a run's state and what the runner saw, and answer with the state after and the
actions the runner carries out, in order. No torch here: tests/test_runner_state.py runs
the transitions from a table.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from enum import Enum

from memplan.compile.ledger import Reason
from memplan.planner.plan_file import Plan

# After how many of a graph's steps whose calls found earlier calls waiting, and held no
# more than its plan allowed for, its calls are no longer checked (counted again after it
# is planned again). Checking every call would cost every step; a step with no earlier
# call waiting costs little.
CHECKED_STEPS = 2


class Phase(Enum):
    """Where a run of a plan stands."""

    # Each call sums what the calls waiting for their backward hold, against the plan.
    CHECKING = "checking"
    # A call found them over: the step's later calls run the least-memory plan, and the
    # graph is planned again for what they held as its next step begins.
    LEAST_FOR_NOW = "least for now"
    # CHECKED_STEPS steps were checked with none over: calls run unchecked, until the
    # graph is planned again.
    TRUSTED = "trusted"


class Action(Enum):
    """What the runner does, as a transition answers."""

    # Plan again for the step: room later graphs asked (ROOM), or what the graphs before
    # it hold changed (REFRESH); kept by `keeps`.
    PLAN_FOR_THE_STEP = "plan for the step"
    # Plan again for what calls held over the plan (HELD_OVER), the last time.
    PLAN_FOR_WHAT_WAS_HELD = "plan for what was held"
    # Sum what the calls waiting for their backward hold, beyond this call's inputs.
    CHECK = "check"
    # Record the call among those waiting for their backward.
    RECORD = "record"
    # Tell the user the step is over its budget, and by how much.
    WARN = "warn"
    # Note in the step ledger the most held over the plan (pending HELD_OVER).
    NOTE_OVER = "note over"
    # Compile and run the least-memory plan for the rest of the step.
    RUN_LEAST = "run least"


@dataclass(frozen=True)
class RunState:
    """A run's phase; how many of its graph's steps were checked with earlier calls
    waiting and none over; whether a call of this step found earlier calls waiting; and
    whether the user was told of calls held over its plan (once per plan)."""

    phase: Phase = Phase.CHECKING
    checked_steps: int = 0
    found_waiting: bool = False
    warned: bool = False


def step_begins(state: RunState, due: frozenset[Reason]) -> tuple[RunState, tuple[Action, ...]]:
    """A call begins a step of the graph (none of its own calls waits), with the re-plans
    `due` for it (StepLedger.due). The step that ended counts as checked where a call of it
    found earlier calls waiting and no re-plan for what they held is due (a run that can
    no longer be planned again counts a step found over too: nothing more is done for
    it); at CHECKED_STEPS of them the run is trusted. The re-plans due are carried out:
    for the step first, then for what was held."""
    actions = []
    if due & {Reason.ROOM, Reason.REFRESH}:
        actions.append(Action.PLAN_FOR_THE_STEP)
    if Reason.HELD_OVER in due:
        actions.append(Action.PLAN_FOR_WHAT_WAS_HELD)
    if state.phase is not Phase.CHECKING:
        return state, tuple(actions)
    steps = state.checked_steps + (state.found_waiting and Reason.HELD_OVER not in due)
    phase = Phase.TRUSTED if steps >= CHECKED_STEPS else Phase.CHECKING
    return RunState(phase, steps, found_waiting=False, warned=state.warned), tuple(actions)


def planned_again(state: RunState, for_what_was_held: bool) -> RunState:
    """The run's plan was replaced: its calls are checked again from none, and, planned
    for what was held, the user is told again where the step is still over."""
    warned = state.warned and not for_what_was_held
    return RunState(Phase.CHECKING, 0, found_waiting=False, warned=warned)


def at_call(state: RunState, waiting: bool) -> tuple[RunState, tuple[Action, ...]]:
    """A call of the run, with calls of the backend's graphs `waiting` for their backward
    or not: a run not trusted checks what they hold, and records the call."""
    if state.phase is Phase.TRUSTED:
        return state, ()
    if not waiting:
        return state, (Action.RECORD,)
    return dataclasses.replace(state, found_waiting=True), (Action.CHECK, Action.RECORD)


def checked(
    state: RunState, over: bool, most_so_far: bool, replannable: bool
) -> tuple[RunState, tuple[Action, ...]]:
    """What a call's check found: the waiting calls held `over` what the plan allowed for
    or not; where over, whether by the most so far (else the user was told, and the
    ledger holds more). The most is told of once per plan and noted where the graph can
    be planned again (StepLedger.replannable), and a checking run then runs the
    least-memory plan for the rest of the step."""
    if not over:
        return state, ()
    actions = []
    if most_so_far and not state.warned:
        actions.append(Action.WARN)
    if most_so_far and replannable:
        actions.append(Action.NOTE_OVER)
    phase = state.phase
    if phase is Phase.CHECKING and replannable:
        phase = Phase.LEAST_FOR_NOW
        actions.append(Action.RUN_LEAST)
    warned = state.warned or most_so_far
    return dataclasses.replace(state, phase=phase, warned=warned), tuple(actions)


def over_plan(plan: Plan, held: int, final: bool) -> int:
    """How far `held` bytes, held by calls waiting while `plan` runs, are over what it
    allowed for: its resident bytes and the room it left under its budget. A best-effort
    plan was warned of, but one made for what calls held (`final`), its budget cut by a
    bound on what they hold: there the step's budget is what counts."""
    room = plan.asked - plan.peak
    return held - plan.resident - (room if final else max(0, room))


def keeps(reason: Reason, old: Plan, new: Plan, freed: int) -> bool:
    """Whether a plan made again for the step replaces the graph's plan `old`. Asked for
    room (ROOM), it is to keep less for its backward. Refreshed (REFRESH), it is to peak
    no higher than `old` or than it was asked to, and to keep no more than `old` did with
    what the graphs before it let go of (`freed`): the graphs after it were planned for
    what it and they held."""
    if reason is Reason.ROOM:
        return new.held < old.held
    return new.peak <= max(old.peak, new.asked) and new.held <= old.held + freed
