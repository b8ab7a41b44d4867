"""The IR without torch: Graph validation and queries, with_frees, Schedule JSON."""

from __future__ import annotations

import json
import math
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from strategies import random_graphs, topological_steps, training_graphs

from memplan.core.errors import GraphError
from memplan.core.graph import (
    Compute,
    Free,
    Graph,
    Node,
    NodeKind,
    Offload,
    Prefetch,
    Schedule,
    Wait,
    with_frees,
)
from memplan.core.schedule_file import schedule_from_json, schedule_to_json

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
        "import memplan.core.graph, memplan.core.simulate, memplan.solvers, memplan.core.remat\n"
        "import memplan.core.node_link\n"
        "import memplan.solvers.training, memplan.solvers.baselines, memplan.solvers.greedy\n"
        "from memplan.solvers import REGISTRY\n"
        "import importlib\n"
        "for target, _ in REGISTRY.values():\n"
        "    importlib.import_module(target.split(':')[0])\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr


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
    assert g.resident_inputs == (0,)
    assert g.forward_ids == (1, 2, 3, 4)
    assert g.backward_ids == ()
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
    assert g.backward_ids == (5,)
    assert g.forward_ids == (1, 2, 3)


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
    data = json.loads(json.dumps(schedule_to_json(schedule)))
    assert data == {
        "steps": [["compute", 1], ["offload", 1], ["free", 1], ["prefetch", 1], ["wait", 1],
                  ["compute", 2]],
        "backward_start": 3,
    }  # fmt: skip
    assert schedule_from_json(data) == schedule
    assert schedule.split == 3
    assert schedule.computes() == [1, 2]
    unsplit = Schedule(steps=(Compute(0),))
    assert unsplit.split == 1
    assert schedule_from_json(json.loads(json.dumps(schedule_to_json(unsplit)))) == unsplit


_STEPS = st.builds(
    lambda kind, node: kind(node),
    st.sampled_from([Compute, Free, Offload, Prefetch, Wait]),
    st.integers(0, 10**6),
)


@settings(max_examples=50, deadline=None)
@given(st.lists(_STEPS, max_size=20), st.none() | st.integers(0, 20))
def test_schedule_json_round_trip_property(steps, start):
    schedule = Schedule(steps=tuple(steps), backward_start=start)
    assert schedule_from_json(json.loads(json.dumps(schedule_to_json(schedule)))) == schedule


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
        schedule_from_json(data)


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
        schedule_from_json(data)


@settings(max_examples=30, deadline=None)
@given(training_graphs())
def test_training_graphs_are_well_formed(g):
    # every backward layer reads a saved forward tensor or x; grads are outputs
    assert g.backward_ids
    assert set(g.outputs) <= set(g.backward_ids) | {g.by_name["loss"]}
    assert all(not g[v].is_backward for v in g.saved_candidates)
