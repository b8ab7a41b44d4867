"""Solvers without torch: the registry, decisions -> schedule, baselines, greedy; every
schedule judged by the simulator."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from strategies import chain_graph, training_graphs

from memplan.core.errors import InfeasibleBudget, InvalidSchedule, UnknownSolver, UnsupportedProblem
from memplan.core.graph import (
    Compute,
    Decision,
    Free,
    Graph,
    Node,
    NodeKind,
    Offload,
    Prefetch,
    Wait,
)
from memplan.core.simulate import simulate
from memplan.planner import solve as solve_module
from memplan.planner.solve import solve_within_budget
from memplan.solvers import REGISTRY, SolverOptions, available, director_training, get_solver
from memplan.solvers import greedy as greedy_module
from memplan.solvers.baselines import as_written, chen_sqrt, keep_all
from memplan.solvers.greedy import _cheapest_release, _cost_per_byte
from memplan.solvers.greedy import solve as greedy
from memplan.solvers.training import (
    build_schedule,
    decider,
    recompute_chain_time,
    saved_storages,
    simulate_decisions,
)

STATUSES = {"optimal", "feasible", "infeasible", "timeout"}
NO_LINK = SolverOptions()
PROPERTY = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def peak_of(graph: Graph, result, bandwidth: float | None = None) -> int:
    return simulate(graph, result.schedule, bandwidth=bandwidth).peak


# --- registry ----------------------------------------------------------------------------


def test_registry_lists_and_loads_solvers():
    assert available() == sorted(REGISTRY)
    assert {"keep_all", "chen_sqrt", "greedy"} <= set(available())
    assert get_solver("keep_all") is keep_all
    assert get_solver("chen_sqrt") is chen_sqrt
    assert get_solver("greedy") is greedy


def test_solvers_name_the_problems_they_solve():
    assert {"keep_all", "greedy", "director", "cpsat", "milp"} <= set(available("training"))
    assert {"keep_all", "cpsat", "milp", "director"} <= set(available("general"))
    assert "greedy" not in available("general") and "chen_sqrt" not in available("general")
    assert set(available("training")) | set(available("general")) == set(available())


def test_a_solver_refuses_a_problem_it_does_not_solve():
    general = SolverOptions(problem="general")
    for name in sorted(set(available()) - set(available("general"))):
        with pytest.raises(UnsupportedProblem):
            get_solver(name)(chain_graph(2), 10**9, general)


def test_unknown_solver_names_the_available_ones():
    with pytest.raises(UnknownSolver) as caught:
        get_solver("simulated_annealing")
    message = str(caught.value)
    assert "'simulated_annealing'" in message
    for name in available():
        assert name in message
    assert isinstance(caught.value, KeyError)


def test_solver_options_to_json():
    options = SolverOptions(seed=3, bandwidth=1e9)
    assert options.to_json() == {
        "seed": 3, "time_limit": 60.0, "bandwidth": 1e9,
        "problem": "training",
    }  # fmt: skip


def test_solver_options_name_a_known_problem():
    with pytest.raises(ValueError, match="problem"):
        SolverOptions(problem="scheduling")


# --- decisions -> schedule -----------------------------------------------------------------


def test_build_schedule_keep_all_on_a_two_layer_chain():
    # p 0, x 1, f0 2, f1 3, loss 4, tangent 5, dloss 6, dp1 7, dx1 8, dp0 9, dx0 10
    g = chain_graph(2)
    schedule = build_schedule(g, {})
    assert schedule.steps == (
        Compute(2), Compute(3), Compute(4),  # forward
        Compute(5), Compute(6), Free(3), Compute(7), Compute(8), Free(2), Free(6),
        Compute(9), Compute(10), Free(8), Free(10),
    )  # fmt: skip
    # the tangent (5) is never freed: the autograd engine holds it until the backward ends
    assert Free(5) not in schedule.steps
    assert schedule.backward_start == 3
    trace = simulate(g, schedule)
    # p 100 + x 10 = 110; f0 120; f1 130; loss 134; tangent 138; dloss 148; -f1 138;
    # dp1 238; dx1 248; -f0 -dloss 228; dp0 328; dx0 338; -dx1 -dx0 318
    assert trace.live == (120, 130, 134, 138, 148, 138, 238, 248, 238, 228, 328, 338, 328, 318)
    # p 100 + x 10 + loss 4 + tangent 4 + dp1 100 + dx1 10 + dp0 100 + dx0 10
    assert (trace.peak, trace.peak_step) == (338, 11)
    assert trace.live[-1] == 318  # p 100 + x 10 + loss 4 + tangent 4 + dp1 100 + dp0 100
    assert trace.time == 8.0  # 3 forward + 5 backward; the tangent takes no time


def test_build_schedule_recomputes_before_first_use():
    g = chain_graph(2)
    schedule = build_schedule(g, {2: Decision.RECOMPUTE})
    assert schedule.steps == (
        Compute(2), Compute(3), Free(2), Compute(4),  # f0 dies after f1 reads it
        Compute(5), Compute(6), Free(3), Compute(2), Compute(7), Compute(8),  # f0 again
        Free(2), Free(6), Compute(9), Compute(10), Free(8), Free(10),
    )  # fmt: skip
    assert schedule.backward_start == 4
    trace = simulate(g, schedule)
    # 110; f0 120; f1 130; -f0 120; loss 124; tangent 128; dloss 138; -f1 128; f0 138;
    # then as keep_all from dp1 on: 238, 248, 238, 228, 328, 338, 328, 318
    assert trace.live == (
        120, 130, 120, 124, 128, 138, 128, 138, 238, 248, 238, 228, 328, 338, 328, 318,
    )  # fmt: skip
    assert trace.time == 9.0  # keep_all's 8 + f0 again
    assert trace.peak == 338  # the gradients' peak is unchanged: f0 is gone by then


def _checkpointing(graph: Graph, *names: str) -> Graph:
    """`graph` with the nodes named `names` recomputed by the model's own checkpointing."""
    nodes = tuple(dataclasses.replace(n, checkpointed=n.name in names) for n in graph.nodes)
    return dataclasses.replace(graph, nodes=nodes)


def test_the_step_as_written_recomputes_what_the_models_checkpointing_does():
    """as_written: the nodes the model's own checkpointing recomputes are recomputed, the
    rest of what the backward reads kept; a graph without checkpointing is keep_all's."""
    g = chain_graph(3)
    assert (
        as_written(g, None, SolverOptions()).decisions
        == keep_all(g, None, SolverOptions()).decisions
    )
    f0, f1 = g.by_name["f0"], g.by_name["f1"]
    written = _checkpointing(g, "f0", "f1")
    result = as_written(written, None, SolverOptions())
    recomputed = {v for v, d in result.decisions.items() if d is Decision.RECOMPUTE}
    assert recomputed == {f0, f1}
    assert peak_of(written, result) <= peak_of(g, keep_all(g, None, SolverOptions()))
    assert result.schedule.steps.count(Compute(f0)) == 2  # once more in the backward


def test_a_budget_at_the_step_as_written_holds_where_the_solvers_miss_it(monkeypatch):
    """The driver takes the step as written where the named solver and the fallback find
    nothing within the budget: 100% of it holds. Both are made to answer keep_all here,
    which peaks above the step as written (on models, greedy's least missed it by 12 B)."""
    activations_dominate = chain_graph(3, act_bytes=100, param_bytes=10)
    written = _checkpointing(activations_dominate, "f0")
    reference = as_written(written, None, SolverOptions())
    budget = peak_of(written, reference)
    assert peak_of(written, keep_all(written, None, SolverOptions())) > budget
    monkeypatch.setattr(solve_module, "get_solver", lambda name: keep_all)
    with pytest.raises(InfeasibleBudget):
        solve_within_budget(written, budget, "greedy", SolverOptions())
    solved = solve_within_budget(written, budget, "greedy", SolverOptions(), as_written=reference)
    assert solved.result.decisions == reference.decisions and solved.trace.peak == budget
    assert solved.note.endswith("this is the step as written")


def test_build_schedule_recomputes_every_output_of_a_multi_output_node_at_once():
    g = Graph(
        nodes=(
            Node(0, "x", "input", bytes=8, kind=NodeKind.INPUT),
            Node(1, "m", "multi", (0,), bytes=100, time=2.0),
            Node(2, "g0", "getitem", (1,), bytes=60, carved_from=1),
            Node(3, "g1", "getitem", (1,), bytes=40, carved_from=1),
            Node(4, "y", "mm", (2, 3), bytes=10, time=1.0),
            Node(5, "loss", "sum", (4,), bytes=4, time=1.0),
            Node(6, "tangent", "tangent", bytes=4, kind=NodeKind.TANGENT),
            Node(7, "dy", "mm", (6, 2), bytes=10, time=1.0, is_backward=True),  # reads g0 only
        ),
        outputs=(5, 7),
    )
    schedule = build_schedule(g, {2: Decision.RECOMPUTE})
    assert schedule.steps[schedule.split :] == (
        Compute(6),
        Compute(1), Compute(2), Compute(3),  # m, then both its outputs, so that m dies
        Free(1), Free(3),  # g1, which no backward node reads, is dropped at once
        Compute(7), Free(2),
    )  # fmt: skip
    trace = simulate(g, schedule)
    # forward: 108 (g0 and g1 carve m's 100), 118 with y; at its end x 8 + loss 4 = 12;
    # tangent 16; m 116, carved into g0 and g1: 116, 116; -m 116; -g1 76; dy 86; -g0 26
    assert trace.live[schedule.split - 1 :] == (12, 16, 116, 116, 116, 116, 76, 86, 26)
    assert trace.time == 7.0  # forward m 2 + y 1 + loss 1, backward m 2 + dy 1


def test_build_schedule_offload_needs_a_link():
    g = chain_graph(2)
    with pytest.raises(InvalidSchedule, match="needs a host link bandwidth"):
        build_schedule(g, {2: Decision.OFFLOAD})
    schedule = build_schedule(g, {2: Decision.OFFLOAD}, bandwidth=1e6)
    kinds = {type(s) for s in schedule.steps}
    assert {Offload, Prefetch, Wait} <= kinds
    simulate(g, schedule, bandwidth=1e6)


# --- what a recompute chain reads ---------------------------------------------------------


def _normalised() -> Graph:
    """x; m = mean(x), costly; ms = a view of m, which the backward reads; y = x - m, which
    the backward reads too; out = sum(y). A batch norm's saved mean is such a view."""
    return Graph(
        nodes=(
            Node(0, "x", "input", bytes=8, kind=NodeKind.INPUT),
            Node(1, "m", "mean", (0,), bytes=4, time=5.0),
            Node(2, "ms", "squeeze", (1,), alias_of=1),
            Node(3, "y", "sub", (0, 1), bytes=10, time=1.0),
            Node(4, "out", "sum", (3,), bytes=4, time=1.0),
            Node(5, "t", "tangent", bytes=4, kind=NodeKind.TANGENT),
            Node(6, "dy", "backward", (5, 3, 2), bytes=10, time=1.0, is_backward=True),
        ),
        outputs=(4, 6),
    )


def test_a_recompute_reads_what_a_kept_view_pins_instead_of_running_it_again():
    graph = _normalised()
    assert graph.saved_candidates == (2, 3)
    decisions = {2: Decision.KEEP, 3: Decision.RECOMPUTE}
    # The kept view ms holds m's storage until dy reads it: recomputing y reads m there,
    # so only sub runs again, and no second m is allocated.
    schedule = build_schedule(graph, decisions)
    computed = [s.node for s in schedule.steps if isinstance(s, Compute)]
    assert computed.count(1) == 1 and computed.count(3) == 2  # m once, y again
    assert simulate(graph, schedule).time == 9.0  # 5 + 1 + 1 + 1 + 1
    # Solvers may price the chain that way, or as running m again.
    assert recompute_chain_time(graph, [3], decider(graph, decisions, read_pinned=True)) == 1.0
    assert recompute_chain_time(graph, [3], decider(graph, decisions)) == 6.0
    # With the view released too, nothing pins m: the chain runs the mean again.
    released = {2: Decision.RECOMPUTE, 3: Decision.RECOMPUTE}
    computed = [s.node for s in build_schedule(graph, released).steps if isinstance(s, Compute)]
    assert computed.count(1) == 2


def test_greedy_prices_releasing_a_pinning_view_with_what_it_pinned():
    """Released, the view ms pins m no more, and its chain runs the mean again (5 s for
    4 B): releasing y (1 s for 10 B) is cheaper per byte. Priced as if m stayed pinned,
    ms cost nothing, and on the CNN under Inductor a descent released every batch norm's
    saved mean first, adding each norm's reduction for no memory."""
    graph = _normalised()
    keep = {2: Decision.KEEP, 3: Decision.KEEP}
    _, trace = simulate_decisions(graph, keep, None)
    assert {graph.storage_owner[v] for v in trace.live_at_peak} >= {1, 3}
    groups = saved_storages(graph)
    move = _cheapest_release(
        graph, keep, trace, groups, set(), {}, NO_LINK, _cost_per_byte, read_pinned=True
    )
    assert move == (3, {3: Decision.RECOMPUTE})


# --- keep_all and chen_sqrt ----------------------------------------------------------------


def test_keep_all_status_around_its_peak():
    g = chain_graph(4, act_bytes=100, param_bytes=1)
    schedule = keep_all(g, 10**9, NO_LINK).schedule
    trace = simulate(g, schedule)
    peak = trace.peak
    # p 1 + x 100 + f0..f3 400 + loss 4 + tangent 4 + dloss 100 = 609; -f3 509; dp3 510;
    # dx3 610: the tangent, held until the backward ends, is still there when dx3 runs
    assert peak == 610
    assert schedule.steps[trace.peak_step] == Compute(g.by_name["dx3"])
    assert keep_all(g, peak, NO_LINK).status == "feasible"
    assert keep_all(g, peak - 1, NO_LINK).status == "infeasible"
    result = keep_all(g, peak, NO_LINK)
    assert result.objective == 14.0  # 5 forward + 9 backward nodes of 1 s
    assert set(result.decisions.values()) == {Decision.KEEP}


def test_chen_sqrt_keeps_about_sqrt_n_checkpoints():
    g = chain_graph(16, act_bytes=100, param_bytes=1)
    result = chen_sqrt(g, 10**9, NO_LINK)
    candidates = g.saved_candidates
    assert len(candidates) == 16  # f0..f15
    kept = sorted(v for v, d in result.decisions.items() if d is Decision.KEEP)
    assert abs(len(kept) - math.sqrt(len(candidates))) <= 1
    # 17 forward nodes of 1 s in 4 segments: cuts after 4.25, 8.5, 12.75 s keep f4, f8, f12
    assert [g[v].name for v in kept] == ["f4", "f8", "f12"]
    trace = simulate(g, result.schedule)
    full = simulate(g, keep_all(g, 10**9, NO_LINK).schedule)
    assert trace.peak < full.peak
    assert trace.time > full.time
    assert result.objective == trace.time


def test_chen_sqrt_keeps_what_cannot_be_recomputed():
    import dataclasses

    g = chain_graph(9, act_bytes=100, param_bytes=1)
    frozen = g.by_name["f1"]
    nodes = tuple(dataclasses.replace(n, recomputable=n.id != frozen) for n in g)
    g = Graph(nodes=nodes, outputs=g.outputs)
    result = chen_sqrt(g, 10**9, NO_LINK)
    assert result.decisions[frozen] is Decision.KEEP
    assert Compute(frozen) not in result.schedule.steps[result.schedule.split :]


# --- greedy ------------------------------------------------------------------------------


def test_greedy_meets_a_budget_between_its_minimum_and_keep_all():
    g = chain_graph(8, act_bytes=100, param_bytes=1)
    full = peak_of(g, keep_all(g, 10**9, NO_LINK))
    least = peak_of(g, greedy(g, None, SolverOptions()))
    assert least < full
    for budget in (least, (least + full) // 2, full - 1):
        result = greedy(g, budget, NO_LINK)
        assert result.status == "feasible"
        assert peak_of(g, result) <= budget


def test_greedy_reports_infeasible_with_its_least_peak():
    g = chain_graph(4, act_bytes=100, param_bytes=1)
    least = peak_of(g, greedy(g, None, SolverOptions()))
    result = greedy(g, least - 1, NO_LINK)
    assert result.status == "infeasible"
    assert f"least peak found: {least} B" in result.message
    assert peak_of(g, result) == least  # the best schedule it found comes back anyway


def test_a_graph_solved_again_reuses_what_its_first_solve_simulated(monkeypatch):
    """The planner solves a graph at a budget nothing meets and then for its least peak:
    the second solve runs only the simulations the first did not, the director not again,
    and returns what it returns alone."""
    g = chain_graph(6, act_bytes=100, param_bytes=1)
    runs = {"greedy": 0, "director": 0}

    def counted(module, name):
        simulate_decisions = module.simulate_decisions

        def simulate(*args):
            runs[name] += 1
            return simulate_decisions(*args)

        monkeypatch.setattr(module, "simulate_decisions", simulate)

    counted(greedy_module, "greedy")
    counted(director_training, "director")
    greedy_module._kept.cache_clear()
    alone = greedy(g, None, NO_LINK)
    alone_runs = dict(runs)
    greedy_module._kept.cache_clear()
    greedy(g, 1, NO_LINK)
    runs.update(greedy=0, director=0)
    again = greedy(g, None, NO_LINK)
    assert (again.schedule, again.decisions) == (alone.schedule, alone.decisions)
    assert runs["director"] == 0 < alone_runs["director"]
    assert runs["greedy"] < alone_runs["greedy"]


def one_release_under_keep_all(g: Graph) -> int:
    """A budget one byte under keep-all's peak: one release meets it, so the fastest
    release wins. (With budget None the least peak wins: on these chains recomputing one
    activation and offloading another, the director's least state, peaks 1 B under
    offloading one.)"""
    return peak_of(g, keep_all(g, 10**9, NO_LINK)) - 1


def test_greedy_offloads_over_a_fast_link_instead_of_recomputing():
    g = chain_graph(4, act_bytes=100, param_bytes=1)
    options = SolverOptions(bandwidth=1e6)  # 100 B copies take 0.1 ms
    result = greedy(g, one_release_under_keep_all(g), options)
    assert Decision.OFFLOAD in result.decisions.values()
    assert Decision.RECOMPUTE not in result.decisions.values()
    trace = simulate(g, result.schedule, bandwidth=1e6)
    assert trace.peak < peak_of(g, keep_all(g, 10**9, NO_LINK))
    assert (trace.time, trace.stall) == (14.0, 0.0)  # the copies hide: keep_all's time


@pytest.mark.parametrize(
    "transfer_seconds, chosen", [(0.3, Decision.OFFLOAD), (0.6, Decision.RECOMPUTE)]
)
def test_greedy_prices_a_transfer_s_host_calls(transfer_seconds, chosen):
    # Recomputing the released tensor takes 1 s; its round trip's copies hide, and its
    # two transfers' host calls take 2 x transfer_seconds: 0.6 s, not 1.2 s, or 1.2 s.
    g = dataclasses.replace(
        chain_graph(4, act_bytes=100, param_bytes=1), transfer_seconds=transfer_seconds
    )
    result = greedy(g, one_release_under_keep_all(g), SolverOptions(bandwidth=1e6))
    released = [d for d in result.decisions.values() if d is not Decision.KEEP]
    assert released == [chosen]
    trace = simulate(g, result.schedule, bandwidth=1e6)
    assert trace.time == pytest.approx(14.0 + min(2 * transfer_seconds, 1.0))


def test_greedy_offloads_where_only_offloading_reaches_the_budget():
    # The transfers' host calls outcost recomputing a layer a hundred times over, but
    # recomputing alone cannot reach the least peak offloading reaches: the least peak
    # does not depend on what a transfer costs, and that budget is met.
    free = chain_graph(8, act_bytes=100, param_bytes=1)
    costly = dataclasses.replace(free, transfer_seconds=100.0)
    options = SolverOptions(bandwidth=1e6)
    least = peak_of(free, greedy(free, None, options), 1e6)
    assert least < peak_of(costly, greedy(costly, None, NO_LINK))
    assert peak_of(costly, greedy(costly, None, options), 1e6) == least
    result = greedy(costly, least, options)
    assert result.status == "feasible"
    assert Decision.OFFLOAD in result.decisions.values()


def _needless_releases(g: Graph, decisions: dict[int, Decision], budget: int, link) -> list:
    """The saved storages `decisions` release whose keeping again would leave the peak
    within `budget` and make the step faster."""
    _, trace = simulate_decisions(g, decisions, link)
    needless = []
    for owner, members in saved_storages(g).items():
        if all(decisions.get(v) is Decision.KEEP for v in members):
            continue
        kept = {**decisions, **dict.fromkeys(members, Decision.KEEP)}
        try:
            _, again = simulate_decisions(g, kept, link)
        except InvalidSchedule:
            continue
        if again.peak <= budget and again.time < trace.time:
            needless.append(owner)
    return needless


def test_greedy_keeps_again_what_its_descent_released_needlessly():
    # At 70% of keep_all's peak, the descents on this chain end with a release of the last
    # activation that a later, larger release left needless (the step a unit slower).
    g = chain_graph(8, act_bytes=100, param_bytes=1)
    budget = int(0.7 * peak_of(g, keep_all(g, 10**9, NO_LINK)))
    result = greedy(g, budget, NO_LINK)
    assert result.status == "feasible" and peak_of(g, result) <= budget
    assert _needless_releases(g, result.decisions, budget, None) == []


def _inlined(backward_reads_a: bool) -> Graph:
    """x; a = f(x), 1 s; b = relu(a), priced at 0 s (Inductor inlines it into its readers);
    out = sum(b); the backward reads b, and a where `backward_reads_a`."""
    return Graph(
        nodes=(
            Node(0, "x", "input", bytes=8, kind=NodeKind.INPUT),
            Node(1, "a", "f", (0,), bytes=10, time=1.0),
            Node(2, "b", "relu", (1,), bytes=10, time=0.0),
            Node(3, "out", "sum", (2,), bytes=4, time=1.0),
            Node(4, "t", "tangent", bytes=4, kind=NodeKind.TANGENT),
            Node(5, "db", "backward", (4, 2), bytes=10, time=1.0, is_backward=True),
            Node(
                6,
                "da",
                "backward",
                (5, 1) if backward_reads_a else (5,),
                bytes=10,
                time=1.0,
                is_backward=True,
            ),
        ),
        outputs=(3, 6),
    )


@pytest.mark.parametrize("backward_reads_a", [True, False])
def test_greedy_recomputes_within_the_budget_what_costs_nothing_to_recompute(backward_reads_a):
    # Kept, b would be written by the forward and read back by the backward: time the
    # node times do not show. Recomputed from a kept a, it costs nothing; where a is not
    # kept, its chain runs f again, and b stays kept.
    graph = _inlined(backward_reads_a)
    budget = peak_of(graph, keep_all(graph, 10**9, NO_LINK))
    result = greedy(graph, budget, NO_LINK)
    assert result.status == "feasible" and peak_of(graph, result) <= budget
    expected = Decision.RECOMPUTE if backward_reads_a else Decision.KEEP
    assert result.decisions[2] is expected
    assert result.objective == simulate(graph, keep_all(graph, 10**9, NO_LINK).schedule).time


# --- properties on training-shaped graphs -------------------------------------------------


def _options(bandwidth: float | None) -> SolverOptions:
    return SolverOptions(bandwidth=bandwidth, time_limit=5.0)


def _end_bytes(g: Graph) -> int:
    """Device bytes after the last Free: the storages of the resident inputs, the outputs
    and the tangents, which the autograd engine holds until the backward returns
    (training graphs have no carved nodes, so each owner counts its whole bytes)."""
    held = [*g.resident_inputs, *g.outputs, *g.tangent_ids]
    return sum(g[o].bytes for o in {g.storage_owner[v] for v in held})


@PROPERTY
@given(training_graphs(), st.sampled_from([None, 20.0]), st.floats(0.2, 1.1))
def test_every_solver_schedule_is_accepted_by_the_simulator(g, bandwidth, share):
    options = _options(bandwidth)
    full = peak_of(g, keep_all(g, 10**12, options), bandwidth)
    budget = max(1, math.floor(share * full))
    for name in available("training"):
        result = get_solver(name)(g, budget, options)
        assert result.status in STATUSES, name
        if result.schedule is None:
            assert result.status in {"infeasible", "timeout"}, name
            continue
        trace = simulate(g, result.schedule, bandwidth=bandwidth)  # raises if invalid
        assert min(trace.live) >= 0, name
        assert trace.live[-1] == _end_bytes(g), name
        freed = {g[s.node].kind for s in result.schedule.steps if isinstance(s, Free)}
        assert NodeKind.TANGENT not in freed, name
        if result.status in {"optimal", "feasible"}:
            assert trace.peak <= budget, name
            if budget < full:
                assert trace.peak < full, name  # keep_all's peak bounds every feasible plan
        elif name in {"keep_all", "chen_sqrt", "greedy"}:
            assert trace.peak > budget, name
        again = get_solver(name)(g, budget, options)
        assert again.schedule == result.schedule, f"{name} is not deterministic"


@PROPERTY
@given(training_graphs(), st.sampled_from([None, 20.0]))
def test_greedy_meets_its_own_least_peak(g, bandwidth):
    least = peak_of(g, greedy(g, None, SolverOptions(bandwidth=bandwidth)), bandwidth)
    assert least <= peak_of(g, keep_all(g, 10**12, _options(bandwidth)), bandwidth)
    result = greedy(g, least, _options(bandwidth))
    assert result.status == "feasible"
    assert peak_of(g, result, bandwidth) <= least


@PROPERTY
@given(training_graphs(), st.sampled_from([None, 20.0]))
def test_greedy_reaches_the_director_s_least_peak(g, bandwidth):
    """Greedy's descents keep a release only if the peak does not rise, so alone they can
    stop above a peak that releases made together reach; they descend from the director's
    least state too, and meet any budget it meets."""
    directed = peak_of(g, get_solver("director")(g, None, _options(bandwidth)), bandwidth)
    assert peak_of(g, greedy(g, None, _options(bandwidth)), bandwidth) <= directed
    assert greedy(g, directed, _options(bandwidth)).status == "feasible"


@PROPERTY
@given(training_graphs(), st.floats(0.3, 1.0), st.sampled_from([None, 20.0]))
def test_greedy_leaves_no_release_that_the_budget_could_keep_faster(g, share, link):
    full = peak_of(g, keep_all(g, 10**12, _options(None)), None)
    budget = max(1, math.floor(share * full))
    result = greedy(g, budget, SolverOptions(bandwidth=link, time_limit=60))
    if result.status != "feasible":
        return
    assert _needless_releases(g, result.decisions, budget, link) == []


@PROPERTY
@given(training_graphs(), st.floats(0.2, 1.0), st.sampled_from([5.0, 20.0, 1e3]))
def test_greedy_with_a_host_link_is_never_slower_within_a_budget_than_without(g, share, link):
    full = peak_of(g, keep_all(g, 10**12, _options(None)), None)
    budget = max(1, math.floor(share * full))
    without = greedy(g, budget, SolverOptions(time_limit=60))
    if without.status != "feasible":
        return
    with_link = greedy(g, budget, SolverOptions(bandwidth=link, time_limit=60))
    assert with_link.status == "feasible"
    assert with_link.objective <= without.objective


@PROPERTY
@given(training_graphs(), st.sampled_from([None, 20.0]))
def test_baseline_objectives_are_the_simulated_time(g, bandwidth):
    options = _options(bandwidth)
    full = keep_all(g, 10**12, options)
    assert full.objective == simulate(g, full.schedule, bandwidth=bandwidth).time
    assert full.objective == g.total_time  # nothing recomputed, nothing transferred
    sqrt = chen_sqrt(g, 10**12, options)
    assert sqrt.objective == simulate(g, sqrt.schedule, bandwidth=bandwidth).time
    assert sqrt.objective >= full.objective
