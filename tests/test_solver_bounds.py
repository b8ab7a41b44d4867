"""The general problem's peak lower bound (memplan/solvers/bounds.py) against the true
least peak, found by brute force on graphs small enough to search every schedule."""

from __future__ import annotations

import heapq
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_fuzz import VGG

from memplan.cli.main import main
from memplan.core import remat
from memplan.core.errors import InfeasibleBudget
from memplan.core.graph import Graph, Node
from memplan.planner.solve import solve_within_budget
from memplan.solvers import SolverOptions
from memplan.solvers.bounds import peak_lower_bound

GENERAL = SolverOptions(problem="general", time_limit=5.0)


def least_peak(graph: Graph) -> tuple[int, list[int]]:
    """The least peak of any schedule, recomputation included, and a sequence reaching it.

    A search over (resident copies, nodes computed at least once), cheapest bottleneck
    first: computing v needs its inputs resident and holds the residents, v and its
    workspace; a copy may be dropped at any time, which is the rules' "resident through its
    last read" once each copy is dropped right after its last read.
    """
    everything = frozenset(range(len(graph)))
    start: tuple[frozenset[int], frozenset[int]] = (frozenset(), frozenset())
    frontier: list[tuple[int, int, frozenset[int], frozenset[int], list[int]]] = [
        (0, 0, *start, [])
    ]
    settled: set[tuple[frozenset[int], frozenset[int]]] = set()
    tie = 0
    while frontier:
        peak, _, resident, computed, sequence = heapq.heappop(frontier)
        if computed == everything:
            return peak, sequence
        if (resident, computed) in settled:
            continue
        settled.add((resident, computed))
        held = sum(graph[c].bytes for c in resident)
        moves = [(resident - {c}, computed, peak, sequence) for c in resident]
        for v in everything - resident:
            if set(graph[v].inputs) <= resident:
                step = held + graph[v].bytes + graph[v].workspace
                moves.append((resident | {v}, computed | {v}, max(peak, step), [*sequence, v]))
        for after, done, cost, path in moves:
            if (after, done) not in settled:
                tie += 1
                heapq.heappush(frontier, (cost, tie, after, done, path))
    raise AssertionError("every node of a DAG can be computed")


@st.composite
def small_dags(draw: st.DrawFn) -> Graph:
    """Up to six nodes, each reading up to three earlier ones, some with a workspace."""
    nodes = []
    for v in range(draw(st.integers(1, 6))):
        inputs = draw(st.lists(st.integers(0, v - 1), max_size=3, unique=True)) if v else []
        nodes.append(
            Node(
                id=v,
                name=f"n{v}",
                op="op",
                inputs=tuple(sorted(inputs)),
                bytes=draw(st.integers(1, 20)),
                workspace=draw(st.sampled_from([0, 0, 3])),
                time=1.0,
            )
        )
    return Graph(nodes=tuple(nodes), name="small")


@settings(max_examples=60, deadline=None)
@given(small_dags())
def test_the_bound_is_never_above_the_least_peak(graph: Graph) -> None:
    least, sequence = least_peak(graph)
    assert remat.score(graph, sequence).peak == least  # the search scores by the rules
    assert peak_lower_bound(graph) <= least


def two_branches() -> Graph:
    """v reads a and b, each made from a large source: whichever of a, b comes second is
    computed while the other and its own source are resident (12 bytes), though no single
    node's inputs and output hold more than 11."""
    sizes = {"x": 10, "y": 10, "a": 1, "b": 1, "v": 1}
    reads = {"x": (), "y": (), "a": (0,), "b": (1,), "v": (2, 3)}
    nodes = tuple(
        Node(id=i, name=name, op="op", inputs=reads[name], bytes=sizes[name], time=1.0)
        for i, name in enumerate(sizes)
    )
    return Graph(nodes=nodes, name="two-branches")


def test_looking_back_proves_more_than_one_nodes_inputs() -> None:
    graph = two_branches()
    assert peak_lower_bound(graph, depth=0) == 11
    assert peak_lower_bound(graph) == 12 == least_peak(graph)[0]


def test_a_budget_below_the_bound_is_proved_infeasible() -> None:
    graph = two_branches()
    assert least_peak(graph)[0] > 11  # brute force: no schedule meets 11 bytes
    with pytest.raises(InfeasibleBudget, match="proved infeasible") as raised:
        solve_within_budget(graph, 11, "director", GENERAL)
    assert raised.value.proved and raised.value.lower_bound == 12


def test_an_unmet_budget_above_the_bound_is_not_called_proved() -> None:
    unmet = InfeasibleBudget(100, 120, "director", lower_bound=90)
    assert not unmet.proved
    assert "no schedule found, not proved infeasible" in str(unmet)
    assert "proved infeasible:" not in str(unmet)


def test_solve_reports_the_bound_under_its_peak(tmp_path, capsys) -> None:
    out = tmp_path / "schedule.json"
    assert main(["solve", str(VGG), "--budget", "0.9", "--solver", "director", "-o", str(out)]) == 0
    report = json.loads(out.read_text())
    assert 0 < report["peak_lower_bound"] <= report["peak"] <= report["budget"]
    assert "no schedule peaks below" in capsys.readouterr().out


def test_vgg16_at_80_percent_is_proved_infeasible(tmp_path, capsys) -> None:
    """The least peak found on VGG16's training graph is its bound: 0.8 cannot be met."""
    out = tmp_path / "schedule.json"
    argv = ["solve", str(VGG), "--budget", "0.8", "--solver", "director", "-o", str(out)]
    assert main(argv) == 2
    error = capsys.readouterr().err
    assert "proved infeasible" in error and "\n" not in error.strip()
    assert not out.exists()
