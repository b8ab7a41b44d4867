"""The paging pass (memplan/solvers/paging_pass.py): recomputations replaced by transfers
where the simulator says that is faster within the budget, and never anything worse."""

from __future__ import annotations

import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from test_solver_lns import sequences_with_recomputation

from memplan.core import remat
from memplan.core.graph import Graph, Node, Prefetch
from memplan.core.simulate import simulate
from memplan.solvers.paging_pass import page_recomputations

LATER = 10**9  # a deadline that never passes


def expensive_then_reused() -> Graph:
    """a (10 s, 10 B) feeds b and, at the end, e; b -> c -> d -> e, 1 s and 10 B each
    (e: 1 B). Within 21 B, a cannot stay through c: it is recomputed or paged."""
    nodes = (
        Node(0, "a", "op", (), bytes=10, time=10.0),
        Node(1, "b", "op", (0,), bytes=10, time=1.0),
        Node(2, "c", "op", (1,), bytes=10, time=1.0),
        Node(3, "d", "op", (2,), bytes=10, time=1.0),
        Node(4, "e", "op", (0, 3), bytes=1, time=1.0),
    )
    return Graph(nodes, outputs=(4,), name="reused")


def test_a_recomputation_the_link_can_hide_is_paged_instead():
    graph = expensive_then_reused()
    recomputing = remat.to_schedule(graph, [0, 1, 2, 3, 0, 4])
    assert simulate(graph, recomputing, budget=21).time == 24.0
    paged = page_recomputations(graph, recomputing, 21, bandwidth=100.0, deadline=LATER)
    trace = simulate(graph, paged, bandwidth=100.0, budget=21)
    assert Prefetch(0) in paged.steps
    assert paged.computes() == [0, 1, 2, 3, 4]
    # No room to page a in while d is computed (c, d and a: 30 B), so it is paged in
    # after: a stall of its transfer, 0.1 s, instead of a 10 s recomputation.
    assert trace.stall == pytest.approx(0.1)
    assert trace.time == pytest.approx(14.1)


def test_a_link_too_slow_to_pay_keeps_the_recomputation():
    graph = expensive_then_reused()
    recomputing = remat.to_schedule(graph, [0, 1, 2, 3, 0, 4])
    kept = page_recomputations(graph, recomputing, 21, bandwidth=0.1, deadline=LATER)
    assert kept == recomputing  # 100 s each way: a stall far above the 10 s it saves


@settings(max_examples=60, deadline=None)
@given(case=sequences_with_recomputation(outputs=True), bandwidth=st.floats(0.05, 50.0))
def test_the_pass_never_returns_an_invalid_or_slower_schedule(case, bandwidth):
    graph, sequence, budget = case
    schedule = remat.to_schedule(graph, sequence)
    before = simulate(graph, schedule, bandwidth=bandwidth)
    paged = page_recomputations(graph, schedule, budget, bandwidth, time.perf_counter() + 5)
    after = simulate(graph, paged, bandwidth=bandwidth, budget=budget)
    assert after.time <= before.time
    assert set(paged.computes()) == set(sequence)  # every node still computed
    assert len(paged.computes()) <= len(sequence)


def test_cpsat_with_paging_uses_the_pass_where_the_window_search_solves(monkeypatch):
    """On graphs the window search solves (here made so from 1 node), cpsat with a host
    link does not build the paging model: the pass over the remat schedule is the paging."""
    from memplan.solvers import SolverOptions, cpsat, cpsat_paging, cpsat_remat

    def no_model(*args, **kwargs):
        raise AssertionError("the paging model was built")

    monkeypatch.setattr(cpsat_remat, "WINDOWS_FROM", 1)
    monkeypatch.setattr(cpsat_paging, "_build", no_model)
    graph = expensive_then_reused()
    options = SolverOptions(problem="general", bandwidth=100.0, time_limit=10)
    result = cpsat.solve(graph, 21, options)
    assert result.status == "feasible" and Prefetch(0) in result.schedule.steps
    assert simulate(graph, result.schedule, bandwidth=100.0, budget=21).time < 24.0
