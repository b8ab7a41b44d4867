"""Plan files: Plan.from_json checks every field's type, so a hand-edited or damaged plan
fails with a PlanFileError naming the field instead of a TypeError far from the file."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

import pytest
from strategies import chain_graph

from memplan.core.budget import Budget
from memplan.core.errors import PlanFileError
from memplan.planner.options import PlanOptions
from memplan.planner.plan import plan_graph
from memplan.planner.plan_file import _PLAN_FIELDS, PLAN_FORMAT, Plan


def hand_made_plan() -> Plan:
    """A small plan of three saved tensors, one of each decision, with a five-step timeline."""
    return Plan(
        name="tiny",
        solver="greedy",
        status="feasible",
        device="cpu",
        budget=1000,
        unplanned_peak=1200,
        predicted_peak=950,
        unplanned_time=4.0,
        predicted_time=4.5,
        solve_seconds=0.25,
        fingerprint="abc123",
        decisions={"mm": "keep", "relu": "recompute", "mm_1": "offload"},
        tensor_bytes={"mm": 100, "relu": 100, "mm_1": 200},
        timeline=[100, 300, 950, 700, 400],
        clock=[1.0, 2.0, 2.5, 3.5, 4.5],
        unplanned_timeline=[100, 300, 1200, 800],
        unplanned_clock=[1.0, 2.0, 3.0, 4.0],
        backward_start=2,
        options={"solver": "greedy", "seed": 0, "bandwidth": None},
    )


def plan_data() -> dict[str, Any]:
    """hand_made_plan() as a plan file holds it."""
    return json.loads(json.dumps(hand_made_plan().to_json()))


def test_every_plan_field_has_a_check():
    assert set(_PLAN_FIELDS) == {f.name for f in dataclasses.fields(Plan)}


def test_hand_made_plan_round_trips_through_a_file(tmp_path: Path):
    plan = hand_made_plan()
    path = tmp_path / "plan.json"
    plan.save(path)
    assert json.loads(path.read_text())["format"] == PLAN_FORMAT
    loaded = Plan.load(path)
    assert loaded == plan
    assert loaded.counts() == {"keep": 1, "recompute": 1, "offload": 1}
    assert loaded.overhead == pytest.approx(0.125)  # 4.5 / 4.0 - 1


def test_solved_plan_round_trips_through_a_file(tmp_path: Path):
    # a plan as the pipeline makes it, from a 3-layer chain planned on the CPU
    graph = chain_graph(3, act_bytes=100, param_bytes=1)
    options = PlanOptions(progress=False)
    plan, schedule = plan_graph(graph, Budget.parse("90%"), options, device="cpu")
    assert plan.predicted_peak <= plan.budget < plan.unplanned_peak
    assert len(plan.timeline) == len(schedule.steps)
    plan.save(tmp_path / "plan.json")
    assert Plan.load(tmp_path / "plan.json") == plan


def test_whole_numbers_are_accepted_for_times_and_stored_as_floats():
    data = plan_data()
    data.update(unplanned_time=4, solve_seconds=0, clock=[1, 2, 2.5, 3.5, 4.5])
    plan = Plan.from_json(data)
    assert plan == dataclasses.replace(hand_made_plan(), solve_seconds=0.0)
    assert isinstance(plan.unplanned_time, float)
    assert all(isinstance(t, float) for t in plan.clock)


def test_unknown_keys_are_ignored():
    assert Plan.from_json({**plan_data(), "written_by": "memplan 2"}) == hand_made_plan()


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("budget", "abc", r"'budget' must be a non-negative integer, got 'abc'"),
        ("budget", 1000.5, "'budget' must be a non-negative integer"),
        ("budget", True, "'budget' must be a non-negative integer, got True"),
        ("budget", -1, "'budget' must be a non-negative integer"),
        ("predicted_peak", None, "'predicted_peak' must be a non-negative integer, got None"),
        ("name", 7, "'name' must be a string, got 7"),
        ("device", ["cpu"], "'device' must be a string"),
        ("decisions", ["keep"], "'decisions' must map tensor names to keep, recompute or offload"),
        ("decisions", {"mm": "drop"}, "'decisions' .*'mm' maps to 'drop'"),
        ("decisions", {"mm": None}, "'decisions' .*'mm' maps to None"),
        ("decisions", {"mm": ["keep"]}, "'decisions' .*'mm' maps to \\['keep'\\]"),
        ("tensor_bytes", {"mm": "100"}, "'tensor_bytes' .*'mm' maps to '100'"),
        ("timeline", "100 300", "'timeline' must be a list of non-negative integers"),
        ("timeline", [100, 300, "950", 700, 400], "'timeline' .*; item 2 is '950'"),
        ("timeline", [100, 300, 950.0, 700, 400], "'timeline' .*; item 2 is 950.0"),
        ("unplanned_timeline", {"0": 100}, "'unplanned_timeline' must be a list"),
        ("clock", [1.0, 2.0, math.nan, 3.5, 4.5], "'clock' .*; item 2 is nan"),
        ("unplanned_time", "4s", "'unplanned_time' must be a finite non-negative number"),
        ("solve_seconds", math.inf, "'solve_seconds' must be a finite"),
        pytest.param(  # too large for a float: no OverflowError
            "predicted_time", 10**400, "'predicted_time' must be a finite", id="time-10**400"
        ),
        ("backward_start", 2.0, "'backward_start' must be a non-negative integer"),
        ("options", [], "'options' must be an object"),
    ],
)
def test_a_field_of_the_wrong_type_is_named(field: str, value: object, message: str):
    data = plan_data()
    data[field] = value
    with pytest.raises(PlanFileError, match=message) as caught:
        Plan.from_json(data)
    assert "\n" not in str(caught.value)


def test_a_long_bad_value_is_cut_short_in_the_message():
    data = plan_data()
    data["timeline"] = "x" * 10_000
    with pytest.raises(PlanFileError, match=r"'timeline' .*\.\.\.$") as caught:
        Plan.from_json(data)
    assert len(str(caught.value)) < 200


def test_a_timeline_and_its_clock_must_have_one_entry_per_step():
    data = plan_data()
    data["unplanned_clock"] = [1.0, 2.0, 3.0]
    with pytest.raises(PlanFileError, match=r"'unplanned_timeline' and 'unplanned_clock'.*4 and 3"):
        Plan.from_json(data)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ([], "'format'"),
        ({**plan_data(), "format": True}, "'format'"),  # true == 1, but it is no format number
        ({**plan_data(), "format": 2}, "'format'"),
        ({k: v for k, v in plan_data().items() if k not in {"clock", "name"}}, "clock, name"),
    ],
)
def test_not_a_plan(data: object, message: str):
    with pytest.raises(PlanFileError, match=message):
        Plan.from_json(data)


def test_a_bad_field_in_a_file_is_a_plan_file_error(tmp_path: Path):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({**plan_data(), "decisions": {"mm": "maybe"}}))
    with pytest.raises(PlanFileError, match="'decisions'"):
        Plan.load(path)
