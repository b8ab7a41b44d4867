"""The general rematerialization problem: the literature's graphs load, the scorer
reproduces the published reference figures, and the simulator agrees with it. No torch."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from memplan.core import remat
from memplan.core.errors import GraphError, InvalidSchedule
from memplan.core.graph import Graph, Node, SolveResult
from memplan.core.node_link import load_node_link
from memplan.core.schedule_file import solved_schedule
from memplan.core.simulate import simulate

GRAPHS = Path(__file__).resolve().parents[1] / "benchmarks" / "graphs"
ALL_GRAPHS = sorted(GRAPHS.glob("*.json"))

# The reference order's peak P0 and duration D0 as published with the graphs (README).
PUBLISHED = {
    "random_layered_n100": (46319, 47769),
    "random_layered_n250": (146840, 125569),
    "random_layered_n500": (284439, 255302),
    "random_layered_n1000": (608619, 497270),
    "checkmate_vgg16_b256_224x224_train": (15825108992, 15500),
    "checkmate_resnet50_b256_224x224_train": (38059356160, 405670),
    "checkmate_mobilenet_b512_224x224_train": (34701056000, 162080),
    "checkmate_fcn_8_vgg_b32_416x608_train": (13484795520, 10275337746048),
}


def test_the_shared_graphs_are_there():
    assert len(ALL_GRAPHS) == 18


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_reference_order_scores_the_published_peak_and_duration(name):
    graph = load_node_link(GRAPHS / f"{name}.json")
    assert (remat.reference(graph).peak, remat.reference(graph).duration) == PUBLISHED[name]


@pytest.mark.parametrize("path", ALL_GRAPHS, ids=lambda p: p.stem)
def test_simulator_agrees_with_the_scorer_on_the_reference_order(path):
    graph = load_node_link(path)
    trace = simulate(graph, remat.to_schedule(graph, range(len(graph))))
    reference = remat.reference(graph)
    assert (trace.peak, trace.time) == (reference.peak, pytest.approx(reference.duration))


def test_random_layered_graphs_keep_their_file_ids_and_order():
    graph = load_node_link(GRAPHS / "random_layered_n100.json")
    order = json.loads((GRAPHS / "random_layered_n100.json").read_text())["graph"]["order"]
    assert list(graph.source_ids) == order


def chain(n: int, size: int = 10) -> Graph:
    return Graph(
        nodes=tuple(
            Node(i, f"v{i}", "op", (i - 1,) if i else (), bytes=size + i, time=1.0 + i)
            for i in range(n)
        )
    )


def diamond() -> Graph:
    """a -> b, a -> c, (b, c) -> d."""
    return Graph(
        nodes=(
            Node(0, "a", "op", (), bytes=10, time=1.0),
            Node(1, "b", "op", (0,), bytes=20, time=2.0),
            Node(2, "c", "op", (0,), bytes=30, time=3.0),
            Node(3, "d", "op", (1, 2), bytes=5, time=4.0),
        )
    )


def test_score_by_hand_with_a_recomputation():
    g = diamond()
    # steps: a 10; a+b 30; a+b+c 60 (c reads a); b+c+d 55
    assert remat.score(g, [0, 1, 2, 3]) == remat.Score(peak=60, duration=10.0)
    # a's first copy dies after b reads it: a 10; a+b 30; b+a' 30; b+a'+c 60; b+c+d 55
    assert remat.score(g, [0, 1, 0, 2, 3]) == remat.Score(peak=60, duration=11.0)
    # a copy nobody reads lives for its own step only
    assert remat.score(g, [0, 1, 2, 3, 0]).peak == 60


@pytest.mark.parametrize(
    ("sequence", "message"),
    [([1, 0, 2, 3], "not computed before"), ([0, 1, 2], "never computed"), ([0, 9], "unknown")],
)
def test_score_rejects_invalid_sequences(sequence, message):
    with pytest.raises(InvalidSchedule, match=message):
        remat.score(diamond(), sequence)


@st.composite
def sequences(draw: st.DrawFn) -> tuple[Graph, list[int]]:
    """A random DAG and a valid sequence over it with random recomputations."""
    n = draw(st.integers(1, 9))
    nodes = []
    for i in range(n):
        inputs = tuple(sorted(draw(st.sets(st.integers(0, i - 1), max_size=3)))) if i else ()
        nodes.append(
            Node(i, f"v{i}", "op", inputs, bytes=draw(st.integers(0, 50)), time=float(i + 1))
        )
    graph = Graph(nodes=tuple(nodes))
    sequence: list[int] = []
    for v in range(n):
        sequence.append(v)
        if v and draw(st.integers(0, 2)) == 0:
            sequence.append(draw(st.integers(0, v)))  # a recomputation of a node already run
    return graph, sequence


@settings(max_examples=200, deadline=None)
@given(sequences())
def test_simulator_agrees_with_the_scorer_on_random_sequences(case):
    graph, sequence = case
    expected = remat.score(graph, sequence)
    trace = simulate(graph, remat.to_schedule(graph, sequence))
    assert trace.peak == expected.peak
    assert trace.time == pytest.approx(expected.duration)


def test_budget_shares_round_up_as_the_protocol_does():
    g = chain(3)  # reference peak: the two largest neighbours, 11 + 12 = 23
    assert remat.reference(g).peak == 23
    assert remat.resolve_budget(g, "0.9") == math.ceil(0.9 * 23) == 21
    assert remat.resolve_budget(g, "80%") == 19
    assert remat.resolve_budget(g, "1") == 23
    assert remat.resolve_budget(g, "100") == 100  # above 1: bytes
    assert remat.resolve_budget(g, "1KiB") == 1024


def test_solved_schedule_names_file_ids_and_refuses_a_false_claim():
    graph = load_node_link(GRAPHS / "random_layered_n100.json")
    schedule = remat.to_schedule(graph, range(len(graph)))
    peak = remat.reference(graph).peak
    ok = SolveResult(solver="keep_all", status="feasible", schedule=schedule)
    report = solved_schedule(graph, peak, ok)
    assert report["sequence"] == list(graph.source_ids)
    assert (report["peak"], report["duration"]) == PUBLISHED["random_layered_n100"]
    with pytest.raises(InvalidSchedule, match="over the budget"):
        solved_schedule(graph, peak - 1, ok)


def write(tmp_path: Path, data: object, name: str = "g.json") -> Path:
    path = tmp_path / name
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    return path


GOOD = {
    "nodes": [
        {"id": 0, "name": "a", "cost_cpu": 1, "cost_ram": 8},
        {"id": 1, "name": "b", "cost_cpu": 2, "cost_ram": 8, "backward": True},
    ],
    "links": [{"source": 0, "target": 1}],
}


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ("{not json", "not valid JSON"),
        ({"nodes": []}, "'nodes' and 'links'"),
        ({**GOOD, "links": [{"source": 0, "target": 7}]}, "unknown node 7"),
        ({**GOOD, "links": [{"source": 1, "target": 0}]}, "cycle"),
        ({**GOOD, "links": [*GOOD["links"], {"source": 1, "target": 0}]}, "cycle"),
        ({**GOOD, "nodes": [{"id": 0, "name": "a"}, GOOD["nodes"][1]]}, "none of the fields"),
        ({**GOOD, "nodes": [{"name": "a", "cost_ram": 1, "cost_cpu": 1}]}, "integer 'id'"),
        ({**GOOD, "nodes": [{**GOOD["nodes"][0], "cost_ram": -1}, GOOD["nodes"][1]]}, "non-neg"),
        ({**GOOD, "links": [{"from": 0}]}, "integer 'source'"),
        ({**GOOD, "graph": {"order": [1]}}, "every node id"),
    ],
)
def test_bad_graph_files_raise_graph_error(tmp_path, data, message):
    with pytest.raises(GraphError, match=message):
        load_node_link(write(tmp_path, data))


def test_a_missing_graph_file_raises_graph_error(tmp_path):
    with pytest.raises(GraphError, match="cannot read"):
        load_node_link(tmp_path / "absent.json")


def test_a_good_file_loads_with_its_labels(tmp_path):
    graph = load_node_link(write(tmp_path, GOOD))
    assert [(n.name, n.inputs, n.bytes, n.time, n.is_backward) for n in graph] == [
        ("a", (), 8, 1.0, False),
        ("b", (0,), 8, 2.0, True),
    ]
    assert graph.name == "g"
