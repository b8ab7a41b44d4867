"""The DELTA-style director on both problems, every schedule judged by the simulator."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import chain_graph, training_graphs

from benchmarks.layered import random_layered_graph
from memplan.core import remat
from memplan.core.errors import GraphError
from memplan.core.graph import Decision, Graph, Node
from memplan.core.node_link import load_node_link
from memplan.core.simulate import simulate
from memplan.solvers import SolverOptions
from memplan.solvers.director import solve

PROPERTY = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
GRAPHS = Path(__file__).resolve().parents[1] / "benchmarks" / "graphs"
SHARED = sorted(GRAPHS.glob("*.json"))
GENERAL = SolverOptions(problem="general")
# The sweeps over the bundled graphs: a short limit bounds the memory-aware order searches
# (the director's reference-order run alone takes well under a second on them).
SWEEP = SolverOptions(problem="general", time_limit=5.0)


def check_general(
    graph: Graph, budget: int, options: SolverOptions = GENERAL
) -> tuple[object, int]:
    """Solve; the simulator accepts the schedule, agrees with remat.score, and confirms
    the status. Returns the result and its peak."""
    result = solve(graph, budget, options)
    trace = simulate(graph, result.schedule)
    scored = remat.score(graph, result.schedule.computes())
    assert scored.peak == trace.peak
    assert result.objective == pytest.approx(scored.duration)
    assert result.status == ("feasible" if trace.peak <= budget else "infeasible")
    return result, trace.peak


# --- training problem -------------------------------------------------------------------


@PROPERTY
@given(
    graph=training_graphs(),
    share=st.integers(10, 110),
    bandwidth=st.sampled_from([None, 1.0, 50.0, 1e9]),
)
def test_training_schedules_are_valid_and_feasible_means_within_budget(graph, share, bandwidth):
    keep_peak = simulate(graph, solve(graph, 10**12, SolverOptions()).schedule).peak
    budget = max(1, keep_peak * share // 100)
    result = solve(graph, budget, SolverOptions(bandwidth=bandwidth))
    trace = simulate(graph, result.schedule, bandwidth=bandwidth)
    assert result.status in ("feasible", "infeasible")
    assert (result.status == "feasible") == (trace.peak <= budget)
    assert result.objective == trace.time
    if bandwidth is None:
        assert Decision.OFFLOAD not in result.decisions.values()


def test_training_fits_a_budget_by_recomputing_without_a_link():
    # Activations of 100 B, params 10 B: keep-all peaks at 1028 B; releasing three
    # activations over their idle interval saves 300 B.
    graph = chain_graph(8, act_bytes=100, param_bytes=10)
    result = solve(graph, 728, SolverOptions())
    assert result.status == "feasible"
    assert simulate(graph, result.schedule).peak <= 728
    assert set(result.decisions.values()) == {Decision.KEEP, Decision.RECOMPUTE}


def test_training_offloads_rather_than_recomputes_on_a_fast_link():
    # A 100 B round trip at 1e6 B/s takes 0.2 ms, hidden under any idle interval.
    graph = chain_graph(8, act_bytes=100, param_bytes=10)
    options = SolverOptions(bandwidth=1e6)
    result = solve(graph, 728, options)
    trace = simulate(graph, result.schedule, bandwidth=1e6)
    assert result.status == "feasible" and trace.peak <= 728
    assert Decision.OFFLOAD in result.decisions.values()
    assert Decision.RECOMPUTE not in result.decisions.values()
    # The transfers hide: no recompute and no stall, so the step costs what keep-all does.
    assert trace.stall == 0
    assert trace.time == solve(graph, 10**9, options).objective


def test_training_is_deterministic_per_seed():
    graph = chain_graph(12, act_bytes=100, param_bytes=10)
    first = solve(graph, 800, SolverOptions(seed=3))
    second = solve(graph, 800, SolverOptions(seed=3))
    assert first.schedule == second.schedule and first.decisions == second.decisions


# --- general problem --------------------------------------------------------------------


def test_general_releases_a_long_idle_value():
    # a (100 B) is read by b and again by d at the end; c and c2 (50 B each) run between.
    # Reference: peak a + c + c2 = 200 at c2. Dropping a after b and recomputing it
    # before d: peak a + c2 + d = 151 at d, and a's 10 time units more (24 in all).
    nodes = (
        Node(0, "a", "op", (), bytes=100, time=10.0),
        Node(1, "b", "op", (0,), bytes=10, time=1.0),
        Node(2, "c", "op", (1,), bytes=50, time=1.0),
        Node(3, "c2", "op", (2,), bytes=50, time=1.0),
        Node(4, "d", "op", (0, 3), bytes=1, time=1.0),
    )
    graph = Graph(nodes=nodes)
    assert remat.reference(graph).peak == 200  # a, c, c2 at c2's step
    result, peak = check_general(graph, 160)
    assert result.status == "feasible" and peak == 151
    assert result.schedule.computes() == [0, 1, 2, 3, 0, 4]
    assert result.objective == 24.0


def test_general_refuses_graphs_with_resident_inputs():
    with pytest.raises(GraphError, match="resident"):
        solve(chain_graph(2), 100, GENERAL)


@pytest.mark.parametrize("path", SHARED, ids=lambda p: p.stem)
@pytest.mark.parametrize("share", ["0.9", "0.8"])
def test_general_on_shared_graphs(path, share, record_property):
    graph = load_node_link(path)
    budget = remat.resolve_budget(graph, share)
    result, peak = check_general(graph, budget, SWEEP)
    record_property("status", result.status)
    record_property("peak_over_budget", round(peak / budget, 4))
    # Inference graphs peak at one step's inputs and output: no recompute lowers that.
    if path.stem.endswith("_test"):
        assert result.status == "infeasible"


def test_general_on_shared_graphs_feasible_where_expected():
    """The budgets the director meets today (a regression guard, not a bound)."""
    feasible = {
        "checkmate_fcn_8_vgg_b32_416x608_train": ("0.9", "0.8"),
        "checkmate_resnet50_b256_224x224_train": ("0.9", "0.8"),
        "checkmate_vgg16_b256_224x224_train": ("0.9",),
        "random_layered_n500": ("0.9", "0.8"),
        "random_layered_n1000": ("0.9", "0.8"),
    }
    for stem, shares in feasible.items():
        graph = load_node_link(GRAPHS / f"{stem}.json")
        for share in shares:
            result, _ = check_general(graph, remat.resolve_budget(graph, share), SWEEP)
            assert result.status == "feasible", (stem, share)


def test_general_minimize_memory_goes_below_the_budgeted_peak():
    graph = load_node_link(GRAPHS / "random_layered_n100.json")
    budget = remat.resolve_budget(graph, "0.9")
    _, budgeted = check_general(graph, budget, SWEEP)
    least = solve(graph, None, SWEEP)
    assert simulate(graph, least.schedule).peak <= budgeted


def test_general_is_deterministic_per_seed():
    """With no time limit that a loaded machine could reach first: its moves are counted."""
    graph = random_layered_graph(400, seed=1)
    budget = remat.resolve_budget(graph, "0.9")
    unlimited = dataclasses.replace(GENERAL, time_limit=1e9)
    first, second = solve(graph, budget, unlimited), solve(graph, budget, unlimited)
    assert first.schedule is not None and first.schedule == second.schedule


def test_general_scales_to_2000_nodes():
    graph = random_layered_graph(2000)
    check_general(graph, remat.resolve_budget(graph, "0.8"), SWEEP)


@pytest.mark.slow
def test_general_scales_to_10000_nodes():
    graph = random_layered_graph(10_000)
    for share in ("0.9", "0.8"):
        check_general(graph, remat.resolve_budget(graph, share))
