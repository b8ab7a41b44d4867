"""The IR without torch: Budget parsing, Graph validation and queries, with_frees, Schedule JSON."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import random_graphs, topological_steps, training_graphs

from memplan.errors import BudgetError, GraphError, MemplanError
from memplan.graph import (
    Budget,
    Compute,
    Free,
    Graph,
    Node,
    NodeKind,
    Offload,
    Prefetch,
    Schedule,
    Wait,
    format_bytes,
    with_frees,
)

PARAM, INPUT, TANGENT = NodeKind.PARAM, NodeKind.INPUT, NodeKind.TANGENT


def small_graph() -> Graph:
    """p (param, 100 B); a = f(p) 10 B; b = g(a) 10 B; c = h(a, b) 10 B (output); d = k(p) 5 B."""
    return Graph(
        nodes=(
            Node(0, "p", "param", bytes=100, kind=PARAM),
            Node(1, "a", "f", (0,), bytes=10, time=1.0),
            Node(2, "b", "g", (1,), bytes=10, time=2.0),
            Node(3, "c", "h", (1, 2, 1), bytes=10, time=3.0),
            Node(4, "d", "k", (0,), bytes=5, time=4.0),
        ),
        outputs=(3,),
    )


# --- torch-free ------------------------------------------------------------------------


def test_ir_simulator_and_solvers_import_without_torch():
    code = (
        "import sys\n"
        "import memplan.graph, memplan.planner.simulate, memplan.solvers, memplan.remat\n"
        "import memplan.node_link\n"
        "import memplan.solvers.training, memplan.solvers.baselines, memplan.solvers.greedy\n"
        "from memplan.solvers import REGISTRY\n"
        "import importlib\n"
        "for target, _ in REGISTRY.values():\n"
        "    importlib.import_module(target.split(':')[0])\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr


# --- Budget ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2GiB", 2 * 2**30),
        ("512 MB", 512 * 10**6),
        (" 7 b ", 7),
        ("1.5KiB", 1536),  # 1.5 * 1024
        ("1e3", 1000),
        (".5GB", 500_000_000),
        ("3 tib", 3 * 2**40),
        (6e9, 6_000_000_000),
        (123456, 123456),
        (1234.9, 1234),  # whole bytes, rounded down
    ],
)
def test_budget_parse_absolute(text, expected):
    budget = Budget.parse(text)
    assert budget.bytes == expected
    assert budget.fraction is None
    assert budget.resolve(10**15) == expected  # an absolute budget ignores the unplanned peak


@pytest.mark.parametrize(
    ("text", "fraction", "peak", "resolved"),
    [
        ("60%", 0.6, 1000, 600),  # 0.6 * 1000
        ("50 %", 0.5, 1001, 500),  # floor(500.5)
        ("150%", 1.5, 200, 300),  # above the unplanned peak is allowed
    ],
)
def test_budget_parse_percent(text, fraction, peak, resolved):
    budget = Budget.parse(text)
    assert budget.bytes is None
    assert budget.fraction == pytest.approx(fraction)
    assert budget.resolve(peak) == resolved


@pytest.mark.parametrize(
    ("text", "peak", "resolved"),
    [
        ("29%", 100, 29),  # 29/100 * 100; a float gives 28.999... and floors to 28
        ("57%", 10000, 5700),  # 5699.999... in floats
        ("58 %", 100, 58),  # 57.999... in floats
        ("33.3333%", 3, 0),  # 0.999999: floored, not rounded to 1
        ("2.5e1%", 10, 2),  # 25% of 10 is 2.5, floored
        ("150%", 7, 10),  # 10.5, floored
    ],
)
def test_budget_percent_resolves_exactly(text, peak, resolved):
    assert Budget.parse(text).resolve(peak) == resolved


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1.001 KB", 1001),  # 1.001 * 1000; in floats 1000.999..., floored to 1000
        ("8.2 MB", 8_200_000),  # 8199999.999... in floats
        ("4.1GB", 4_100_000_000),  # 4099999999.999... in floats
        ("0.1e1KiB", 1024),  # 1 KiB: the exponent is exact too
        ("1.0009765625 KiB", 1025),  # 1 + 1/1024 KiB, exactly
        ("1.9999 B", 1),  # whole bytes are floored, not rounded
        ("9223372036854775807", 2**63 - 1),  # the largest budget, no float in between
    ],
)
def test_budget_decimal_size_parses_exactly(text, expected):
    assert Budget.parse(text).bytes == expected


def test_budget_fraction_is_stored_exactly():
    assert Budget.parse("29%").fraction == Fraction(29, 100)
    # a float fraction is the decimal it prints as, so it resolves like the text
    assert Budget(fraction=0.29) == Budget.parse("29%")
    assert Budget(fraction=0.29).resolve(100) == 29
    assert Budget(fraction=Fraction(1, 3)).resolve(10) == 3  # 3.33, floored
    assert str(Budget.parse("57.3%")) == "57.3%"


@pytest.mark.parametrize(
    "value",
    [
        0,
        -1,
        0.0,
        -2.5,
        0.5,
        math.nan,
        math.inf,
        -math.inf,
        "abc",
        "5 parsecs",
        "",
        "%",
        "GB",
        "0GiB",
        "0%",
        "-5GB",
        "nan",
        "inf",
        True,
        False,
        None,
        [1],
        b"1GB",
    ],
)
def test_budget_parse_rejects(value):
    with pytest.raises(BudgetError):
        Budget.parse(value)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("1e400", r"budget '1e400' is too large: at most 2\*\*63 - 1 bytes"),
        (10**400, r"budget 1\.000e\+400 is too large"),  # not 400 digits
        (-(10**400), r"positive number of bytes, got -1\.000e\+400"),
        (2**63, "too large"),
        ("9223372036854775808", "too large"),  # 2**63: one byte over
        ("8.1 EB", "unknown unit 'EB'"),
        ("8388608 TiB", "too large"),  # 2**63 bytes
        (1e300, "too large"),
        ("1e99999999999999999999", "too large"),  # an exponent int() refuses to read
        ("1e-999999999 GB", "less than 1 byte"),  # not built exactly: that takes minutes
        ("0.5", "less than 1 byte"),
        ("1e400%", r"too large: at most 2\*\*63 - 1 times the peak"),
        ("1e-999999999%", "too small: under 1 byte of any peak"),
        ("1e-18%", "too small"),  # 1e-20 * (2**63 - 1) bytes is under 1 byte
    ],
)
def test_budget_parse_rejects_out_of_range(value, message):
    with pytest.raises(BudgetError, match=message) as caught:
        Budget.parse(value)
    assert "\n" not in str(caught.value)
    assert len(str(caught.value)) < 120


def test_budget_bounds_are_inclusive():
    assert Budget.parse(2**63 - 1).bytes == 2**63 - 1
    assert Budget.parse("1 B").bytes == 1
    assert Budget.parse("1.1e-17%").fraction == Fraction(11, 10**20)  # 1.01 B of 2**63 - 1
    assert Budget(fraction=Fraction(1, 2**63 - 1)).resolve(2**63 - 1) == 1
    with pytest.raises(BudgetError, match="too large"):
        Budget(bytes=2**63)
    with pytest.raises(BudgetError, match="too large"):
        Budget(fraction=1e19)
    with pytest.raises(BudgetError, match="too small"):
        Budget(fraction=Fraction(1, 2**63))
    with pytest.raises(BudgetError, match="too small"):
        Budget.parse("1e-17%")  # 1e-19 * (2**63 - 1) is 0.92 bytes


def test_budget_error_is_a_memplan_value_error():
    with pytest.raises(MemplanError, match="parsecs"):
        Budget.parse("5 parsecs")
    assert issubclass(BudgetError, ValueError)


@pytest.mark.parametrize(
    "fields",
    [
        {},
        {"bytes": 1, "fraction": 0.5},
        {"bytes": 0},
        {"fraction": 0.0},
        {"fraction": math.nan},
        {"fraction": math.inf},
        {"fraction": "50%"},
        {"fraction": True},
    ],
)
def test_budget_constructor_validates(fields):
    with pytest.raises(BudgetError):
        Budget(**fields)


def test_budget_parse_passes_budgets_through_and_prints():
    budget = Budget(fraction=0.25)
    assert Budget.parse(budget) is budget
    assert str(budget) == "25%"
    assert str(Budget.parse("2GiB")) == "2.00 GiB"
    assert format_bytes(1536) == "1.50 KiB"  # 1536 / 1024
    assert format_bytes(999) == "999 B"
    assert format_bytes(3 * 2**20) == "3.00 MiB"


# --- Graph validation --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("nodes", "outputs", "message"),
    [
        ((Node(1, "a", "f"),), (), "expected 0"),  # ids must be 0..n-1
        ((Node(0, "a", "f"), Node(0, "b", "f")), (), "expected 1"),
        ((Node(0, "a", "f", (0,)),), (), "not an earlier node"),  # reads itself
        ((Node(0, "a", "f", (1,)), Node(1, "b", "f")), (), "not an earlier node"),  # forward ref
        ((Node(0, "a", "f", (-1,)),), (), "not an earlier node"),
        ((Node(0, "a", "f"), Node(1, "v", "view", (0,), alias_of=1)), (), "alias_of=1"),
        ((Node(0, "a", "f"), Node(1, "g", "getitem", (0,), carved_from=5)), (), "carved_from=5"),
        ((Node(0, "a", "f", bytes=-1),), (), "negative"),
        ((Node(0, "a", "f", time=-1.0),), (), "negative"),
        ((Node(0, "a", "f", time=math.nan),), (), "negative"),
        ((Node(0, "a", "f", time=math.inf),), (), "negative"),
        ((Node(0, "a", "f"),), (1,), "output 1"),
        ((Node(0, "a", "f"),), (-1,), "output -1"),
    ],
)
def test_graph_rejects_malformed(nodes, outputs, message):
    with pytest.raises(GraphError, match=message):
        Graph(nodes=nodes, outputs=outputs)


def test_graph_queries():
    g = small_graph()
    assert len(g) == 5
    assert [n.name for n in g] == ["p", "a", "b", "c", "d"]
    assert g[2].name == "b"
    assert g.by_name == {"p": 0, "a": 1, "b": 2, "c": 3, "d": 4}
    # c reads a twice; it is one user of a
    assert g.users == ((1, 4), (2, 3), (3,), (), ())
    assert g.resident_inputs == [0]
    assert g.forward_ids == [1, 2, 3, 4]
    assert g.backward_ids == []
    assert g.total_time == 10.0  # 1 + 2 + 3 + 4


def test_graph_replace_times():
    g = small_graph()
    timed = g.replace_times([0, 5, 5, 5, 5])
    assert [n.time for n in timed] == [0.0, 5.0, 5.0, 5.0, 5.0]
    assert timed.outputs == g.outputs
    assert timed.total_time == 20.0  # 4 * 5
    with pytest.raises(GraphError, match="got 2 times for 5 nodes"):
        g.replace_times([1.0, 2.0])


def test_storage_owner_follows_views_to_their_base():
    g = Graph(
        nodes=(
            Node(0, "p", "param", bytes=100, kind=PARAM),
            Node(1, "pt", "t", (0,), alias_of=0),
            Node(2, "a", "f", (1,), bytes=10),
            Node(3, "v", "view", (2,), alias_of=2),
            Node(4, "vv", "view", (3,), alias_of=3),  # a view of a view lives in a
            Node(5, "g", "getitem", (2,), bytes=4, carved_from=2),  # carved: its own storage
        )
    )
    assert g.storage_owner == (0, 0, 2, 2, 2, 5)


def test_saved_candidates_are_forward_nodes_the_backward_reads():
    g = Graph(
        nodes=(
            Node(0, "x", "input", bytes=8, kind=INPUT),
            Node(1, "a", "f", (0,), bytes=10),  # read by the backward: a candidate
            Node(2, "b", "f", (1,), bytes=10),  # read by the forward only
            Node(3, "out", "f", (2,), bytes=4),  # read by the backward, but an output
            Node(4, "t", "tangent", bytes=4, kind=TANGENT),
            Node(5, "db", "f", (4, 1, 3, 0), bytes=10, is_backward=True),
        ),
        outputs=(3, 5),
    )
    assert g.saved_candidates == (1,)
    assert g.backward_ids == [5]
    assert g.forward_ids == [1, 2, 3]


# --- with_frees --------------------------------------------------------------------------


def test_with_frees_frees_after_last_read():
    g = small_graph()
    steps = with_frees(g, [Compute(1), Compute(2), Compute(3), Compute(4)])
    # a and b are last read by c; c is an output; d is never read: freed as soon as made
    assert steps == [
        Compute(1), Compute(2), Compute(3), Free(1), Free(2), Compute(4), Free(4),
    ]  # fmt: skip


def test_with_frees_keep_outputs_and_resident_inputs():
    g = small_graph()
    steps = with_frees(g, [Compute(1), Compute(2), Compute(3), Compute(4)], keep=[4, 2])
    assert steps == [Compute(1), Compute(2), Compute(3), Free(1), Compute(4)]
    assert Free(0) not in steps  # p is read by a and d, but it is a param


def test_with_frees_recompute_frees_the_previous_copy():
    g = small_graph()
    steps = with_frees(g, [Compute(1), Compute(2), Compute(1), Compute(3)])
    # the first copy of a dies after b reads it; the second after c reads it
    assert steps == [
        Compute(1), Compute(2), Free(1), Compute(1), Compute(3), Free(1), Free(2),
    ]  # fmt: skip


def test_with_frees_offload_is_a_read_and_wait_makes_a_copy():
    g = small_graph()
    steps = with_frees(g, [Compute(1), Offload(1), Compute(2), Prefetch(1), Wait(1), Compute(3)])
    # a's device copy dies after b; the prefetched copy is made at the Wait, read by c
    assert steps == [
        Compute(1), Offload(1), Compute(2), Free(1), Prefetch(1), Wait(1), Compute(3),
        Free(1), Free(2),
    ]  # fmt: skip


def test_with_frees_offload_as_last_read():
    g = small_graph()
    steps = with_frees(g, [Compute(4), Offload(4)])
    assert steps == [Compute(4), Offload(4), Free(4)]


@settings(max_examples=50, deadline=None)
@given(random_graphs())
def test_with_frees_frees_every_non_output_once_after_its_last_read(g):
    steps = with_frees(g, topological_steps(g))
    frees = [s.node for s in steps if isinstance(s, Free)]
    never_free = set(g.outputs) | set(g.resident_inputs)
    assert sorted(frees) == sorted(n.id for n in g if n.id not in never_free)
    position = {step: i for i, step in enumerate(steps)}
    for v in frees:
        readers = [position[Compute(u)] for u in g.users[v]]
        assert position[Free(v)] > max(readers, default=position[Compute(v)])
        # and it comes right after the step that last needed it, ahead of the next Compute
        last = max(readers, default=position[Compute(v)])
        assert all(isinstance(s, Free) for s in steps[last + 1 : position[Free(v)]])


# --- Schedule ----------------------------------------------------------------------------


def test_schedule_json_round_trip():
    schedule = Schedule(
        steps=(Compute(1), Offload(1), Free(1), Prefetch(1), Wait(1), Compute(2)),
        backward_start=3,
    )
    data = json.loads(json.dumps(schedule.to_json()))
    assert data == {
        "steps": [["compute", 1], ["offload", 1], ["free", 1], ["prefetch", 1], ["wait", 1],
                  ["compute", 2]],
        "backward_start": 3,
    }  # fmt: skip
    assert Schedule.from_json(data) == schedule
    assert schedule.split == 3
    assert schedule.computes() == [1, 2]
    unsplit = Schedule(steps=(Compute(0),))
    assert unsplit.split == 1
    assert Schedule.from_json(json.loads(json.dumps(unsplit.to_json()))) == unsplit


_STEPS = st.builds(
    lambda kind, node: kind(node),
    st.sampled_from([Compute, Free, Offload, Prefetch, Wait]),
    st.integers(0, 10**6),
)


@settings(max_examples=50, deadline=None)
@given(st.lists(_STEPS, max_size=20), st.none() | st.integers(0, 20))
def test_schedule_json_round_trip_property(steps, start):
    schedule = Schedule(steps=tuple(steps), backward_start=start)
    assert Schedule.from_json(json.loads(json.dumps(schedule.to_json()))) == schedule


@pytest.mark.parametrize(
    "data",
    [
        {},
        {"steps": "compute 1"},
        {"steps": [["compute"]]},
        {"steps": [["jump", 1]]},
        {"steps": [("compute", 1)]},
        {"steps": [["compute", 1, 2]]},
    ],
)
def test_schedule_from_json_rejects(data):
    with pytest.raises(GraphError):
        Schedule.from_json(data)


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ({"steps": [["compute", None]]}, r"'steps'\[0\] .*node id must be an integer, got None"),
        ({"steps": [["compute", 1], ["free", "a"]]}, r"'steps'\[1\] .*got 'a'"),
        ({"steps": [["compute", 1.5]]}, "got 1.5"),  # not truncated to 1
        ({"steps": [["compute", 1.0]]}, "got 1.0"),
        ({"steps": [["compute", True]]}, "got True"),  # JSON true is no node id
        ({"steps": [[["compute"], 1]]}, r"'steps'\[0\] .*not \[kind, node id\]"),
        ({"steps": [], "backward_start": "x"}, "'backward_start' must be an integer or null"),
        ({"steps": [], "backward_start": 1.5}, "'backward_start'"),
        ([["compute", 1]], "must be an object"),
    ],
)
def test_schedule_from_json_rejects_non_integer_ids(data, message):
    with pytest.raises(GraphError, match=message):
        Schedule.from_json(data)


@settings(max_examples=30, deadline=None)
@given(training_graphs())
def test_training_graphs_are_well_formed(g):
    # every backward layer reads a saved forward tensor or x; grads are outputs
    assert g.backward_ids
    assert set(g.outputs) <= set(g.backward_ids) | {g.by_name["loss"]}
    assert all(not g[v].is_backward for v in g.saved_candidates)
