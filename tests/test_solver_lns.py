"""Large-neighbourhood search (memplan/solvers/lns.py): a window re-solved by CP-SAT is
valid and within the budget by the literature's rules and the simulator, without the
search's own check to catch it; the search never ends slower than it started; it removes
a recomputation that buys nothing; and cpsat runs it on large graphs."""

from __future__ import annotations

import dataclasses
import math
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks.layered import random_layered_graph
from memplan.core import remat
from memplan.core.graph import Graph, Node
from memplan.core.simulate import simulate
from memplan.solvers import SolverOptions, cpsat_remat, lns

PROPERTY = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def sequences_with_recomputation(
    draw: st.DrawFn, outputs: bool = False
) -> tuple[Graph, list[int], int]:
    """A layered graph of up to 16 nodes (with `outputs`, maybe its last node an output,
    which the simulator holds to the end), a valid sequence of it with random
    recomputations (a node computed again at any point after its inputs were), and a
    budget at or above that sequence's peak."""
    graph = random_layered_graph(draw(st.integers(4, 16)), width=3, seed=draw(st.integers(0, 99)))
    if outputs and draw(st.booleans()):
        graph = dataclasses.replace(graph, outputs=(len(graph) - 1,))
    sequence: list[int] = []
    for v in range(len(graph)):
        sequence.append(v)
        # Each has all its inputs computed (they precede it); an output is held from its
        # computation to the end, so it is never computed again.
        again = draw(
            st.lists(st.integers(0, v).filter(lambda u: u not in graph.outputs), max_size=2)
        )
        sequence.extend(again)
    peak = simulate(graph, remat.to_schedule(graph, sequence)).peak
    budget = peak + draw(st.integers(0, peak // 4))
    return graph, sequence, budget


def assert_valid_within(graph: Graph, sequence: list[int], budget: int) -> None:
    """Valid by the rules and accepted by the simulator within `budget`."""
    assert remat.score(graph, sequence).peak <= budget
    trace = simulate(graph, remat.to_schedule(graph, sequence), budget=budget)
    assert trace.peak <= budget


@PROPERTY
@given(case=sequences_with_recomputation(), width=st.integers(2, 8))
def test_every_window_the_model_returns_is_valid_and_within_the_budget(case, width):
    """The model alone, without improve's re-scoring: each window it returns, put in place,
    is a valid sequence within the budget."""
    graph, sequence, budget = case
    for start in range(0, len(sequence), max(1, width // 2)):
        stop = min(len(sequence), start + width)
        window = lns._solve_window(
            graph, sequence, start, stop, budget, time.perf_counter() + 10, seed=0, extra=3
        )
        if window is not None:
            assert_valid_within(graph, sequence[:start] + window + sequence[stop:], budget)


@PROPERTY
@given(case=sequences_with_recomputation(outputs=True))
def test_the_search_never_ends_slower_and_the_simulator_accepts_it(case):
    graph, sequence, budget = case
    improved, search = lns.improve(graph, sequence, budget, time.perf_counter() + 20, window=6)
    assert_valid_within(graph, improved, budget)
    before = remat.score(graph, sequence).duration
    after = remat.score(graph, improved).duration
    assert after <= before
    assert (after < before) == (search.improved > 0)


def test_a_recomputation_that_buys_nothing_is_removed():
    """a -> b -> c with a computed twice: nothing needs the second a."""
    nodes = tuple(
        Node(id=v, name=name, op="op", inputs=inputs, bytes=4, time=1.0)
        for v, (name, inputs) in enumerate([("a", ()), ("b", (0,)), ("c", (1,))])
    )
    graph = Graph(nodes=nodes, name="chain")
    improved, search = lns.improve(graph, [0, 1, 0, 2], budget=100, deadline=math.inf)
    assert improved == [0, 1, 2]
    assert search == lns.Search(windows=1, improved=1)


def test_the_same_seed_and_sequence_give_the_same_result():
    """Two searches from one sequence with one seed end at the same sequence. The start is
    built here, with recomputations to search: a solver's start (the director's, which
    this took before) depends on the clock, and with none to search the check held
    vacuously (no window searched)."""
    graph = random_layered_graph(20, width=6, seed=4)
    start = []
    for v in range(len(graph)):
        start.append(v)
        if v % 4 == 3:
            start.append(v - 2)  # computed again: its inputs were computed before it
    budget = remat.score(graph, start).peak
    first, again = (
        lns.improve(graph, start, budget, math.inf, seed=3, window=12)  # no clock: same work
        for _ in range(2)
    )
    assert first[1].windows > 1
    assert first == again


@pytest.mark.parametrize("share", [0.8, 0.7])
def test_cpsat_improves_the_directors_sequence_on_large_graphs(share, monkeypatch):
    """From WINDOWS_FROM nodes cpsat is the director plus the window search: within the
    budget by the simulator, and no slower than the director's sequence it started from."""
    monkeypatch.setattr(cpsat_remat, "WINDOWS_FROM", 100)  # the graph below has 150
    starts = []
    original = lns.improve

    def recorded(graph, sequence, *args):
        starts.append(list(sequence))
        return original(graph, sequence, *args)

    monkeypatch.setattr(lns, "improve", recorded)
    graph = random_layered_graph(150, seed=2)
    budget = math.ceil(share * remat.reference(graph).peak)
    result = cpsat_remat.solve(graph, budget, SolverOptions(problem="general", time_limit=8))
    assert "large-neighbourhood search" in result.message
    sequence = result.schedule.computes()
    assert_valid_within(graph, sequence, budget)
    (start,) = starts
    assert remat.score(graph, start).peak <= budget
    duration = remat.score(graph, sequence).duration
    assert duration <= remat.score(graph, start).duration
    # Its bound is the general problem's own: each node computed once. Met, it is optimal.
    reference = remat.reference(graph).duration
    assert result.lower_bound == reference <= duration
    assert result.status == ("optimal" if duration == reference else "feasible")
