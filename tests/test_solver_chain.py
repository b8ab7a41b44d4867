"""The chain checkpoint solvers (Hong et al. 2025): the DP against exhaustive search over
checkpoint subsets, the linear selector against chen_sqrt, and both on the shared
benchmark graphs, every schedule judged by the simulator. No torch."""

from __future__ import annotations

import itertools
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import chain_graph, training_graphs

from memplan import remat
from memplan.graph import Graph, Node, load_node_link
from memplan.planner.simulate import simulate
from memplan.solvers import SolverOptions
from memplan.solvers.baselines import chen_sqrt
from memplan.solvers.chain import (
    build_chain,
    chain_dp,
    cut_points,
    forward_nodes,
    linear,
    sequence_for_checkpoints,
)

GENERAL = SolverOptions(problem="general")
LEAST_GENERAL = SolverOptions(problem="general", minimize_memory=True)
LEAST_TRAINING = SolverOptions(minimize_memory=True)
PROPERTY = settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SHARED = sorted((Path(__file__).resolve().parents[1] / "benchmarks" / "graphs").glob("*.json"))
BIG = 10**12


def mirrored_chain(sizes: list[int], grads: list[int], times: list[float]) -> Graph:
    """f0..f{n-1} (f_k reads f_{k-1}), a backward `loss` reading the last, then b_k for k
    from the last: reads f_{k-1}, f_k and the previous gradient, as Checkmate's graphs do."""
    nodes: list[Node] = []
    for k, (size, spent) in enumerate(zip(sizes, times, strict=True)):
        inputs = (k - 1,) if k else ()
        nodes.append(Node(id=k, name=f"f{k}", op="op", inputs=inputs, bytes=size, time=spent))
    grad = len(nodes)
    nodes.append(
        Node(id=grad, name="loss", op="op", inputs=(grad - 1,), bytes=1, time=1.0, is_backward=True)
    )
    for k in reversed(range(len(sizes))):
        inputs = (k - 1, k, grad) if k else (k, grad)
        node = Node(
            id=len(nodes), name=f"b{k}", op="op", inputs=inputs, bytes=grads[k], time=1.0,
            is_backward=True,
        )  # fmt: skip
        nodes.append(node)
        grad = node.id
    return Graph(nodes=tuple(nodes), name=f"mirrored{len(sizes)}")


@st.composite
def mirrored_chains(draw: st.DrawFn, max_stages: int = 9) -> Graph:
    n = draw(st.integers(1, max_stages))
    sizes = draw(st.lists(st.integers(1, 60), min_size=n, max_size=n))
    grads = draw(st.lists(st.integers(1, 60), min_size=n, max_size=n))
    times = draw(st.lists(st.integers(0, 5).map(float), min_size=n, max_size=n))
    return mirrored_chain(sizes, grads, times)


def exhaustive(graph: Graph) -> list[tuple[int, float]]:
    """(simulated peak, duration) of every checkpoint subset (the last cut always kept)."""
    chain = build_chain(graph, "general")
    found = []
    for r in range(chain.n):
        for subset in itertools.combinations(range(1, chain.n), r):
            keep = {chain.cuts[k - 1] for k in (*subset, chain.n)}
            sequence = sequence_for_checkpoints(graph, keep)
            trace = simulate(graph, remat.to_schedule(graph, sequence))
            found.append((trace.peak, remat.score(graph, sequence).duration))
    return found


def judged(graph: Graph, result, budget: int) -> int:
    """The simulated peak; a feasible or optimal status must fit the budget."""
    assert result.schedule is not None
    peak = simulate(graph, result.schedule).peak
    if result.status in ("feasible", "optimal"):
        assert peak <= budget
    else:
        assert result.status == "infeasible" and peak > budget
    assert result.objective is not None and result.message
    return peak


# --- the chain -----------------------------------------------------------------------------


def test_cut_points_of_a_chain_with_a_skip():
    # f0 -> f1 -> f2 -> f3 with f0 -> f2: f1 is spanned by the skip, the others are cuts
    nodes = (
        Node(id=0, name="f0", op="op", bytes=1),
        Node(id=1, name="f1", op="op", inputs=(0,), bytes=1),
        Node(id=2, name="f2", op="op", inputs=(0, 1), bytes=1),
        Node(id=3, name="f3", op="op", inputs=(2,), bytes=1),
    )
    graph = Graph(nodes=nodes)
    assert cut_points(graph, forward_nodes(graph, "general")) == [0, 2, 3]
    assert build_chain(graph, "general").stages == ((0,), (1, 2), (3,))


def test_model_peak_by_hand():
    # sizes 10, 20, 30; grads 5 each; loss 1. Keeping only f2 (stage 3): while b2 runs,
    # f0, f1 are recomputed (30) + f2 (30) + loss (1) + b2 (5) = 66, the peak.
    graph = mirrored_chain([10, 20, 30], [5, 5, 5], [1.0, 1.0, 1.0])
    chain = build_chain(graph, "general")
    assert chain.model_peak([3]) == 66
    keep = {chain.cuts[2]}
    assert remat.score(graph, sequence_for_checkpoints(graph, keep)).peak == 66


def test_sequence_recomputes_dropped_values_before_their_use():
    # f0 0, f1 1, loss 2, b1 3, b0 4; keep only f1: b1 reads f0, recomputed just before
    graph = mirrored_chain([10, 20], [5, 5], [1.0, 1.0])
    sequence = sequence_for_checkpoints(graph, {1})
    assert sequence == [0, 1, 2, 0, 3, 4]
    assert remat.score(graph, sequence).duration == graph.total_time + 1.0


def test_sequence_without_backward_labels_drops_at_checkpoints():
    # a -> b -> c, a -> c; keeping b drops a after b, so c recomputes a
    nodes = (
        Node(id=0, name="a", op="op", bytes=1, time=1.0),
        Node(id=1, name="b", op="op", inputs=(0,), bytes=1, time=1.0),
        Node(id=2, name="c", op="op", inputs=(0, 1), bytes=1, time=1.0),
    )
    graph = Graph(nodes=nodes)
    assert sequence_for_checkpoints(graph, {1}) == [0, 1, 0, 2]
    assert sequence_for_checkpoints(graph, set()) == [0, 1, 2]


# --- chain_dp against exhaustive search ----------------------------------------------------


@PROPERTY
@given(mirrored_chains())
def test_model_is_the_simulators_peak_on_mirrored_chains(graph):
    chain = build_chain(graph, "general")
    for r in range(chain.n):
        for subset in itertools.combinations(range(1, chain.n), r):
            keep = {chain.cuts[k - 1] for k in (*subset, chain.n)}
            sequence = sequence_for_checkpoints(graph, keep)
            assert chain.model_peak(subset) == remat.score(graph, sequence).peak


@PROPERTY
@given(mirrored_chains())
def test_chain_dp_least_peak_matches_exhaustive_search(graph):
    result = chain_dp(graph, BIG, LEAST_GENERAL)
    assert result.status == "optimal"
    assert judged(graph, result, BIG) == min(peak for peak, _ in exhaustive(graph))


@PROPERTY
@given(mirrored_chains(), st.floats(0.3, 1.0))
def test_chain_dp_least_time_matches_exhaustive_search(graph, share):
    found = exhaustive(graph)
    budget = max(1, int(share * max(peak for peak, _ in found)))
    result = chain_dp(graph, budget, GENERAL)
    peak = judged(graph, result, budget)
    fitting = [duration for p, duration in found if p <= budget]
    if not fitting:
        assert result.status == "infeasible"
        assert peak == min(p for p, _ in found)
        return
    assert result.status == "optimal"
    assert result.objective == min(fitting)


def test_chain_dp_on_sixteen_stages_matches_exhaustive_search_over_the_model():
    # 2**15 subsets: judged by the model, which the property test above checks against
    # the simulator on smaller chains
    stages = 16
    sizes = [(7 * k) % 23 + 5 for k in range(stages)]
    grads = [(5 * k) % 17 + 3 for k in range(stages)]
    graph = mirrored_chain(sizes, grads, [float(k % 4) for k in range(stages)])
    chain = build_chain(graph, "general")
    subsets = [s for r in range(stages) for s in itertools.combinations(range(1, stages), r)]
    peaks = [chain.model_peak(s) for s in subsets]
    least = chain_dp(graph, BIG, LEAST_GENERAL)
    assert judged(graph, least, BIG) == min(peaks)
    budget = (min(peaks) + max(peaks)) // 2
    result = chain_dp(graph, budget, GENERAL)
    judged(graph, result, budget)
    best = min(chain.model_time(s) for s, p in zip(subsets, peaks, strict=True) if p <= budget)
    assert result.status == "optimal"
    assert result.objective == graph.total_time + best


# --- linear ----------------------------------------------------------------------------------


@PROPERTY
@given(mirrored_chains(max_stages=12))
def test_linear_is_never_below_the_least_peak(graph):
    least = judged(graph, chain_dp(graph, BIG, LEAST_GENERAL), BIG)
    assert judged(graph, linear(graph, BIG, LEAST_GENERAL), BIG) >= least


@pytest.mark.parametrize("layers", [1, 4, 9, 16, 25])
def test_linear_is_never_worse_than_chen_sqrt_on_chains(layers):
    graph = chain_graph(layers, act_bytes=50, param_bytes=3)
    chen = simulate(graph, chen_sqrt(graph, BIG, LEAST_TRAINING).schedule).peak
    assert judged(graph, linear(graph, BIG, LEAST_TRAINING), BIG) <= chen
    # chain_dp is not asserted here: its model ignores the gradients that training
    # graphs accumulate as outputs, and on 16 layers it lands at 444 B against 423 B
    judged(graph, chain_dp(graph, BIG, LEAST_TRAINING), BIG)


@PROPERTY
@given(training_graphs(max_layers=8))
def test_training_schedules_are_accepted_by_the_simulator(graph):
    chen = simulate(graph, chen_sqrt(graph, BIG, LEAST_TRAINING).schedule).peak
    assert judged(graph, linear(graph, BIG, LEAST_TRAINING), BIG) <= chen
    for solver in (chain_dp, linear):
        least = judged(graph, solver(graph, BIG, LEAST_TRAINING), BIG)
        judged(graph, solver(graph, least, SolverOptions()), least)
        judged(graph, solver(graph, max(1, least - 1), SolverOptions()), max(1, least - 1))


def test_gap_of_linear_to_chain_dp_on_a_few_chains():
    # measured: linear's least peak is within 15% of the DP's on these chains
    for seed in range(5):
        sizes = [(seed * 13 + 7 * k) % 41 + 5 for k in range(14)]
        grads = [(seed * 3 + 5 * k) % 19 + 3 for k in range(14)]
        graph = mirrored_chain(sizes, grads, [1.0] * 14)
        least = judged(graph, chain_dp(graph, BIG, LEAST_GENERAL), BIG)
        greedy = judged(graph, linear(graph, BIG, LEAST_GENERAL), BIG)
        assert least <= greedy <= 1.15 * least


# --- the shared benchmark graphs -------------------------------------------------------------


@pytest.mark.skipif(not SHARED, reason="no shared graphs")
@pytest.mark.parametrize("path", SHARED, ids=lambda p: p.stem)
@pytest.mark.parametrize("solver", [chain_dp, linear], ids=lambda s: s.__name__)
def test_shared_graphs_general_problem(path, solver):
    graph = load_node_link(path)
    for share in ("0.9", "0.8"):
        budget = remat.resolve_budget(graph, share)
        started = time.perf_counter()
        result = solver(graph, budget, GENERAL)
        assert time.perf_counter() - started < 1.0
        peak = judged(graph, result, budget)
        sequence = [s.node for s in result.schedule.steps if type(s).__name__ == "Compute"]
        assert remat.score(graph, sequence).peak == peak
