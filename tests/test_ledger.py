"""The step ledger's transitions (compile/ledger.py), one row each: the records before, an
event, the re-plans it answers with and the records after. No torch, no compile.

The step of every row: graphs A, M and B, in that order, under a budget of 100 MiB. A
peaks at 50 MiB and keeps 30 for its backward; M, planned with A's 30 held, peaks at 30
and keeps 10; B, planned with their 40 held (60 MiB asked), peaks at 64: 4 MiB over what
they left, more than ROOM_SLACK (1 MiB), within the step's budget alone.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest
from test_plan_file import hand_made_plan

from memplan.compile.ledger import (
    MAX_SHAPE_PLANS,
    Held,
    Reason,
    Replan,
    Room,
    RoomAsked,
    StepLedger,
)
from memplan.compile.step import StepKey
from memplan.planner.plan import Resident
from memplan.planner.plan_file import Plan

MiB = 2**20
# B alone takes parameter 1 (see PARAMETERS).
KEYS = {
    "A": StepKey(0, 0, frozenset()),
    "M": StepKey(1, 0, frozenset()),
    "B": StepKey(2, 0, frozenset({1})),
}
A, M, B = KEYS["A"], KEYS["M"], KEYS["B"]
# B's parameter, 55 MiB and as much of gradient: while A runs the step holds it and, in A's
# backward (about 0 on its own), its gradient: 55 + 55 = 110 MiB; while M does, 30 more.
PARAMETERS = {1: (55 * MiB, 55 * MiB)}
SHAPES = ((8, 4),)
HELD = Held(Resident(held=20 * MiB), own_calls=1, own_planned=30 * MiB)


def _plan(name: str, peak: int, held: int, resident: int, asked: int) -> Plan:
    """Graph `name`'s plan: peaks at `peak` MiB, keeps `held`, with `resident` held before
    it and `asked` MiB of budget."""
    return dataclasses.replace(
        hand_made_plan(),
        name=name,
        compiled_peak=peak * MiB,
        compiled_backward_peak=1,  # its backward peaks low: its forward's peak stands
        held=held * MiB,
        resident=resident * MiB,
        requested_budget=asked * MiB,
        budget=asked * MiB,
    )


def _step(changes: dict[str, dict[str, Any]]) -> dict[Any, Plan]:
    step = {
        A: _plan("A", 50, 30, 0, 100),
        M: _plan("M", 30, 10, 30, 70),
        B: _plan("B", 64, 5, 40, 60),
    }
    for name, fields in changes.items():
        step[KEYS[name]] = dataclasses.replace(step[KEYS[name]], **fields)
    return step


class _Run:
    """A run, as the ledger knows it: any object it can weakly reference."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return self.name


@dataclass
class World:
    """A ledger whose runs a, m and b run graphs A, M and B, and b2 runs B at other sizes
    (entered before b: b runs B in the step now)."""

    step: dict[Any, Plan]
    ledger: StepLedger = field(default_factory=StepLedger)
    runs: dict[str, _Run] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name, key in [("a", A), ("m", M), ("b2", B), ("b", B)]:
            self.runs[name] = _Run(name)
            self.ledger.enter(self.runs[name], key, self.step[key])


@dataclass(frozen=True)
class Transition:
    """One row: `before` (record fields by run, `rooms` made by (graph, shapes),
    and `sizes_planned` by run), `event`, what it answers, and `after` (the same); the
    step's plans with `plans` changed, by graph."""

    name: str
    event: Callable[[World], object]
    answer: object
    before: dict[str, dict[str, Any]] = field(default_factory=dict)
    after: dict[str, dict[str, Any]] = field(default_factory=dict)
    plans: dict[str, dict[str, Any]] = field(default_factory=dict)


def ask_room(world: World) -> RoomAsked:
    return world.ledger.ask_room(B, PARAMETERS)


def ask_room_no_parameters(world: World) -> RoomAsked:
    return world.ledger.ask_room(B, {1: (0, 0)})


def _run(name: str, method: str, *args: Any) -> Callable[[World], object]:
    """The event: the ledger's `method` for run `name`, with `args`."""
    return lambda world: getattr(world.ledger, method)(world.runs[name], *args)


ROOM_B = Room(64 * MiB, 0)
FIT_B = {"B": {"compiled_peak": 58 * MiB}}  # B within what A and M left
A_ROOM = Room(74 * MiB, 0)  # B's peak and M's 10 MiB, held between A and B

TABLE = [
    # ask_room: a later graph over what the graphs before it left.
    Transition(
        "B over what A and M left: both asked for room, A for M's bytes too",
        ask_room_no_parameters,
        RoomAsked((Replan(A, Reason.ROOM), Replan(M, Reason.ROOM)), leaving=True),
        after={"a": {"asked": {B: A_ROOM}}, "m": {"asked": {B: ROOM_B}}},
    ),
    Transition(
        "B over by ROOM_SLACK exactly: no room asked",
        ask_room_no_parameters,
        RoomAsked((), leaving=False),
        plans={"B": {"compiled_peak": 61 * MiB}},
        after={"a": {"asked": {}}, "m": {"asked": {}}},
    ),
    Transition(
        "B over the step's whole budget: room cannot help, none asked",
        ask_room_no_parameters,
        RoomAsked((), leaving=False),
        plans={"B": {"compiled_peak": 101 * MiB}},
        after={"a": {"asked": {}}},
    ),
    Transition(
        "A made room once already: only M is asked",
        ask_room_no_parameters,
        RoomAsked((Replan(M, Reason.ROOM),), leaving=True),
        before={"a": {"made_room": True}},
        after={"a": {"asked": {}}, "m": {"asked": {B: ROOM_B}}},
    ),
    Transition(
        "A and M asked for B already (B compiled again): leaving, nothing new",
        ask_room_no_parameters,
        RoomAsked((), leaving=True),
        before={"a": {"asked": {B: Room(1, 0)}, "made_room": True}, "m": {"asked": {B: ROOM_B}}},
        after={"a": {"asked": {B: Room(1, 0)}}, "m": {"asked": {B: ROOM_B}}},
    ),
    Transition(
        "neither can be planned again: no room",
        ask_room_no_parameters,
        RoomAsked((), leaving=False),
        before={"a": {"replannable": False}, "m": {"replannable": False}},
        after={"a": {"asked": {}}, "m": {"asked": {}}},
    ),
    # ask_room: the later graph's parameters take the step over while earlier ones run.
    Transition(
        "B's parameters take A's and M's steps over: both refreshed, before any room",
        ask_room,
        RoomAsked(
            (
                Replan(A, Reason.REFRESH),
                Replan(M, Reason.REFRESH),
                Replan(A, Reason.ROOM),
                Replan(M, Reason.ROOM),
            ),
            leaving=True,
        ),
        after={"a": {"refresh": True}, "m": {"refresh": True}},
    ),
    Transition(
        "A planned for its least (best effort) is not refreshed for them",
        ask_room,
        RoomAsked((Replan(M, Reason.REFRESH),), leaving=False),
        plans={**FIT_B, "A": {"status": "best-effort"}},
        after={"a": {"refresh": False}, "m": {"refresh": True}},
    ),
    Transition(
        "B within what was left and its parameters none: nothing",
        ask_room_no_parameters,
        RoomAsked((), leaving=False),
        plans=FIT_B,
        after={"a": {"refresh": False, "asked": {}}, "m": {"refresh": False}},
    ),
    # first_call: the room a graph made before at the same shapes is asked at once.
    Transition(
        "first call at shapes where A made room: asked at once",
        _run("a", "first_call", SHAPES),
        None,
        before={"rooms": {(A, SHAPES): {B: ROOM_B}}},
        after={"a": {"asked": {B: ROOM_B}, "shapes": SHAPES}},
    ),
    Transition(
        "first call of a plan that made room already: shapes only",
        _run("a", "first_call", SHAPES),
        None,
        before={"a": {"made_room": True}, "rooms": {(A, SHAPES): {B: ROOM_B}}},
        after={"a": {"asked": {}, "shapes": SHAPES}},
    ),
    Transition(
        "first call at other shapes: nothing made there",
        _run("a", "first_call", ((1,),)),
        None,
        before={"rooms": {(A, SHAPES): {B: ROOM_B}}},
        after={"a": {"asked": {}, "shapes": ((1,),)}},
    ),
    # due: what a call that begins a step of the graph plans.
    Transition("nothing pending", _run("a", "due"), ()),
    Transition(
        "room asked: ROOM (a refresh with it is the same re-plan)",
        _run("a", "due"),
        (Replan(A, Reason.ROOM),),
        before={"a": {"asked": {B: ROOM_B}, "refresh": True}},
    ),
    Transition(
        "refreshed and held over: REFRESH, then HELD_OVER",
        _run("a", "due"),
        (Replan(A, Reason.REFRESH), Replan(A, Reason.HELD_OVER)),
        before={"a": {"refresh": True, "over": HELD}},
    ),
    Transition(
        "planned again for what calls held: never again",
        _run("a", "due"),
        (),
        before={"a": {"refresh": True, "replannable": False}},
    ),
    # take_step, left, refresh_after, refresh_all: planned again for the step.
    Transition(
        "room taken: asked and left given, made once",
        _run("a", "take_step"),
        ({B: ROOM_B}, {M: Room(1, 0), B: ROOM_B}),
        before={"a": {"asked": {B: ROOM_B}, "leaving": {M: Room(1, 0)}, "refresh": True}},
        after={"a": {"asked": {}, "refresh": False, "made_room": True}},
    ),
    Transition(
        "refresh taken: the room it leaves still given, no room made",
        _run("a", "take_step"),
        ({}, {B: ROOM_B}),
        before={"a": {"leaving": {B: ROOM_B}, "refresh": True}},
        after={"a": {"refresh": False, "made_room": False}},
    ),
    Transition(
        "a plan leaving room, run at known shapes: kept by them",
        _run("a", "left", {B: ROOM_B}),
        None,
        before={"a": {"shapes": SHAPES}},
        after={"a": {"leaving": {B: ROOM_B}}, "rooms": {(A, SHAPES): {B: ROOM_B}}},
    ),
    Transition(
        "A holds other bytes: every plan of M and B (both sizes) refreshed",
        lambda world: world.ledger.refresh_after(A),
        (Replan(M, Reason.REFRESH), Replan(B, Reason.REFRESH)),
        after={"a": {"refresh": False}, "m": {"refresh": True}, "b": {"refresh": True}}
        | {"b2": {"refresh": True}},
    ),
    Transition(
        "the step holds more outside its graphs: every plan of every graph refreshed",
        lambda world: world.ledger.refresh_all(),
        (Replan(A, Reason.REFRESH), Replan(M, Reason.REFRESH), Replan(B, Reason.REFRESH)),
        after={"a": {"refresh": True}, "m": {"refresh": True}, "b": {"refresh": True}}
        | {"b2": {"refresh": True}},
    ),
    # found_over, take_over: calls held more than the plan allowed for.
    Transition(
        "calls held over the plan",
        _run("a", "found_over", HELD),
        None,
        after={"a": {"over": HELD, "replannable": True}},
    ),
    Transition(
        "planned again for them: what they held, and the last re-plan",
        _run("a", "take_over"),
        HELD,
        before={"a": {"over": HELD}},
        after={"a": {"over": None, "replannable": False}},
    ),
    # new_sizes: a graph of dynamic shapes at new sizes.
    Transition(
        "the plan made at the hints holds: no plan of their own",
        lambda world: world.ledger.new_sizes(world.runs["b"], B, holds=True),
        None,
    ),
    Transition(
        "it does not: a plan of their own, counted",
        lambda world: world.ledger.new_sizes(world.runs["b"], B, holds=False),
        Replan(B, Reason.NEW_SIZES),
        before={"sizes_planned": {"b": MAX_SHAPE_PLANS - 1}},
        after={"sizes_planned": {"b": MAX_SHAPE_PLANS}},
    ),
    Transition(
        "MAX_SHAPE_PLANS sizes have their own: refused",
        lambda world: world.ledger.new_sizes(world.runs["b"], B, holds=False),
        None,
        before={"sizes_planned": {"b": MAX_SHAPE_PLANS}},
    ),
]


@pytest.mark.parametrize("row", TABLE, ids=[row.name for row in TABLE])
def test_transition(row: Transition) -> None:
    world = World(_step(row.plans))
    for name, fields in row.before.items():
        if name == "rooms":
            world.ledger.rooms.update(fields)
            continue
        if name == "sizes_planned":
            world.ledger.sizes_planned.update({world.runs[n]: c for n, c in fields.items()})
            continue
        run = world.runs[name]
        world.ledger.entries[run] = dataclasses.replace(world.ledger.entries[run], **fields)
    assert row.event(world) == row.answer
    for name, fields in row.after.items():
        if name == "rooms":
            assert world.ledger.rooms == fields
            continue
        if name == "sizes_planned":
            planned = {world.runs[n]: c for n, c in fields.items()}
            assert dict(world.ledger.sizes_planned) == planned
            continue
        entry = world.ledger.entries[world.runs[name]]
        assert {f: getattr(entry, f) for f in fields} == fields


def test_a_compile_of_a_graph_runs_it_in_the_step_and_a_reset_forgets_the_step() -> None:
    world = World(_step({}))
    assert world.ledger.running == {A: world.runs["a"], M: world.runs["m"], B: world.runs["b"]}
    assert world.ledger.step == world.step
    at_b2 = dataclasses.replace(world.step[B], name="B at b2's sizes")
    world.ledger.runs(B, world.runs["b2"], at_b2)  # a call at b2's sizes
    assert world.ledger.running[B] is world.runs["b2"] and world.ledger.step[B] is at_b2
    assert world.ledger.of_key[B] == [world.runs["b2"], world.runs["b"]]
    world.ledger.forget_step()
    assert (world.ledger.step, world.ledger.running, world.ledger.of_key) == ({}, {}, {})
    assert len(world.ledger.entries) == 4  # the runs may still be called


def test_a_record_lives_as_long_as_its_run() -> None:
    ledger = StepLedger()
    run = _Run("gone")
    ledger.enter(run, A, _step({})[A])
    ledger.forget_step()
    del run
    assert len(ledger.entries) == 0
