"""The simulator on hand-sized graphs (bytes and times worked out in comments) and random DAGs."""

from __future__ import annotations

import dataclasses
import math

import pytest
from hypothesis import given, settings
from strategies import random_graphs, topological_steps

from memplan.core import remat
from memplan.core.errors import GraphError, InvalidSchedule
from memplan.core.graph import (
    Compute,
    Free,
    Graph,
    Node,
    NodeKind,
    Offload,
    Prefetch,
    Schedule,
    Step,
    Wait,
    with_frees,
)
from memplan.core.simulate import simulate

PARAM, INPUT, TANGENT = NodeKind.PARAM, NodeKind.INPUT, NodeKind.TANGENT
C, F, Off, P, W = Compute, Free, Offload, Prefetch, Wait


def run(graph: Graph, *steps: Step, **kwargs: object):
    return simulate(graph, Schedule(steps=steps), **kwargs)  # type: ignore[arg-type]


def small_graph() -> Graph:
    """p (param, 100 B); a = f(p) 10 B 1 s; b = g(a) 10 B 2 s; c = h(a, b) 10 B 3 s (output);
    d = k(p) 5 B 4 s; e = l(a) 10 B, not offloadable."""
    return Graph(
        nodes=(
            Node(0, "p", "param", bytes=100, kind=PARAM),
            Node(1, "a", "f", (0,), bytes=10, time=1.0),
            Node(2, "b", "g", (1,), bytes=10, time=2.0),
            Node(3, "c", "h", (1, 2), bytes=10, time=3.0),
            Node(4, "d", "k", (0,), bytes=5, time=4.0),
            Node(5, "e", "l", (1,), bytes=10, time=1.0, offloadable=False),
        ),
        outputs=(3,),
    )


# --- peak and time -----------------------------------------------------------------------


def test_peak_and_time_with_frees():
    g = small_graph()
    steps = with_frees(g, [C(1), C(2), C(3), C(4)])
    trace = simulate(g, Schedule(tuple(steps)))
    # p 100; +a 110; +b 120; +c 130; -a 120; -b 110; +d 115; -d 110
    assert trace.live == (110, 120, 130, 120, 110, 115, 110)
    assert (trace.peak, trace.peak_step, trace.baseline) == (130, 2, 100)
    assert trace.live_at_peak == {0, 1, 2, 3}
    assert trace.time == 10.0  # 1 + 2 + 3 + 4
    assert trace.clock == (1.0, 3.0, 6.0, 6.0, 6.0, 10.0, 10.0)
    assert trace.stall == 0.0


def test_empty_schedule_is_the_resident_inputs():
    g = Graph(nodes=(Node(0, "p", "param", bytes=100, kind=PARAM), Node(1, "x", "in", bytes=8)))
    trace = run(g)
    # p 100; x is a compute node that never runs
    assert (trace.peak, trace.peak_step, trace.time, trace.baseline) == (100, -1, 0.0, 100)
    assert trace.live == ()


def test_tangent_holds_bytes_but_takes_no_time():
    g = Graph(
        nodes=(
            Node(0, "x", "input", bytes=8, kind=INPUT),
            Node(1, "t", "tangent", bytes=4, time=5.0, kind=TANGENT),
            Node(2, "g", "mul", (1, 0), bytes=8, time=2.0, is_backward=True),
        ),
        outputs=(2,),
    )
    trace = run(g, C(1), C(2), F(1))
    # x 8; +t 12; +g 20; -t 16. time: only g's 2 s
    assert trace.live == (12, 20, 16)
    assert trace.time == 2.0


def test_recomputation_costs_time_again():
    g = small_graph()
    trace = run(g, C(1), C(2), F(1), C(1), C(3))
    # p 100; +a 110; +b 120; -a 110; +a 120; +c 130. time a 1 + b 2 + a 1 + c 3 = 7
    assert trace.live == (110, 120, 110, 120, 130)
    assert (trace.peak, trace.time) == (130, 7.0)


# --- views and carved nodes --------------------------------------------------------------


def view_graph() -> Graph:
    """x (input, 8 B); a = relu(x) 100 B; v = view(a); w = view(v); c = mm(w) 10 B (output)."""
    return Graph(
        nodes=(
            Node(0, "x", "input", bytes=8, kind=INPUT),
            Node(1, "a", "relu", (0,), bytes=100, time=1.0),
            Node(2, "v", "view", (1,), alias_of=1),
            Node(3, "w", "view", (2,), alias_of=2),
            Node(4, "c", "mm", (3,), bytes=10, time=1.0),
        ),
        outputs=(4,),
    )


def test_views_hold_the_owners_storage_until_the_last_view_dies():
    g = view_graph()
    trace = run(g, C(1), C(2), C(3), F(1), F(2), C(4), F(3))
    # x 8; +a 108; views add 0; freeing a and v keeps a's 100 B (w holds it); +c 118;
    # w, the last member, dies: -100 = 18
    assert trace.live == (108, 108, 108, 108, 108, 118, 18)
    assert (trace.peak, trace.peak_step) == (118, 5)
    assert trace.live_at_peak == {0, 3, 4}


def test_view_freed_before_its_base():
    g = view_graph()
    trace = run(g, C(1), C(2), C(3), C(4), F(3), F(2), F(1))
    # x 8; +a 108; views 108; +c 118; the views die first, a still holds 100: 118; -a 18
    assert trace.live == (108, 108, 108, 118, 118, 118, 18)


def test_view_of_a_resident_input_costs_nothing():
    g = Graph(
        nodes=(
            Node(0, "p", "param", bytes=100, kind=PARAM),
            Node(1, "pt", "t", (0,), alias_of=0),
            Node(2, "y", "mm", (1,), bytes=10, time=1.0),
        ),
        outputs=(2,),
    )
    trace = run(g, C(1), C(2), F(1))
    # p 100; +pt 0; +y 110; -pt: p still holds the storage, 110
    assert trace.live == (100, 110, 110)


def test_recomputed_base_is_a_new_storage_while_a_view_keeps_the_old_one():
    g = Graph(
        nodes=(
            Node(0, "x", "input", bytes=8, kind=INPUT),
            Node(1, "a", "relu", (0,), bytes=100, time=1.0),
            Node(2, "v", "view", (1,), alias_of=1),
            Node(3, "c", "mm", (1,), bytes=10, time=1.0),
            Node(4, "d", "mm", (2, 3), bytes=10, time=1.0),
        ),
        outputs=(4,),
    )
    trace = run(g, C(1), C(2), F(1), C(1), C(3), F(1), C(4), F(2), F(3))
    # x 8; +a 108; +v 108; -a (v holds it) 108; recompute a: a new 100 B storage 208;
    # +c 218; -a: the new storage dies 118; +d 128; -v: the old storage dies 28; -c 18
    assert trace.live == (108, 108, 108, 208, 218, 118, 128, 28, 18)
    assert trace.peak == 218


def test_each_recomputation_of_a_base_is_its_own_storage():
    g = Graph(
        nodes=(
            Node(0, "x", "input", bytes=8, kind=INPUT),
            Node(1, "a", "relu", (0,), bytes=100, time=1.0),
            Node(2, "v", "view", (1,), alias_of=1),
            Node(3, "u", "view", (1,), alias_of=1),
            Node(4, "w", "view", (2,), alias_of=1),  # lowered style: alias_of names the owner
            Node(5, "c", "mm", (1, 3, 4), bytes=10, time=1.0),
        ),
        outputs=(5,),
    )
    steps = (C(1), C(2), F(1), C(1), C(3), F(1), C(1), C(4), F(2), C(5), F(1), F(3), F(4))
    trace = run(g, *steps)
    # x 8; +a 108; +v 108; -a (v holds copy 1) 108; recompute a: copy 2 208; +u 208;
    # -a (u holds copy 2) 208; recompute a: copy 3 308; w, made from v, joins copy 1 308;
    # -v (w holds copy 1) 308; +c 318; -a: copy 3 dies 218; -u: copy 2 dies 118;
    # -w: copy 1 dies 18
    assert trace.live == (108, 108, 108, 208, 208, 208, 308, 308, 308, 318, 218, 118, 18)
    assert (trace.peak, trace.peak_step) == (318, 9)


def carved_graph(carve_both: bool) -> Graph:
    """x (input, 8 B); p = multi(x) 100 B 2 s; g0 = p[0] carved 60 B; g1 = p[1] 40 B
    (carved when carve_both); c = mm(g0) 10 B (output)."""
    return Graph(
        nodes=(
            Node(0, "x", "input", bytes=8, kind=INPUT),
            Node(1, "p", "multi", (0,), bytes=100, time=2.0),
            Node(2, "g0", "getitem", (1,), bytes=60, carved_from=1),
            Node(3, "g1", "getitem", (1,), bytes=40, carved_from=1 if carve_both else None),
            Node(4, "c", "mm", (2,), bytes=10, time=1.0),
        ),
        outputs=(4,),
    )


def test_carved_nodes_move_bytes_out_of_the_producer():
    g = carved_graph(carve_both=True)
    trace = run(g, C(1), C(2), C(3), F(1), F(3), C(4), F(2))
    # x 8; +p 108; g0 and g1 take 60 and 40 of p's 100: 108, 108; -p (nothing left) 108;
    # -g1 68; +c 78; -g0 18
    assert trace.live == (108, 108, 108, 108, 68, 78, 18)
    assert trace.peak == 108  # not 208: the getitems are not counted twice


def test_carving_part_of_a_producer():
    g = carved_graph(carve_both=True)
    trace = run(g, C(1), C(2), F(1), C(4), F(2))
    # x 8; +p 108; g0 takes 60: 108; -p releases the 40 left: 68; +c 78; -g0 18
    assert trace.live == (108, 108, 68, 78, 18)


def test_carved_and_view_members_of_one_producer():
    g = Graph(
        nodes=(
            Node(0, "x", "input", bytes=8, kind=INPUT),
            Node(1, "p", "multi", (0,), bytes=100, time=2.0),
            Node(2, "g0", "getitem", (1,), bytes=60, carved_from=1),
            Node(3, "pv", "view", (1,), alias_of=1),
            Node(4, "c", "mm", (2, 3), bytes=10, time=1.0),
        ),
        outputs=(4,),
    )
    trace = run(g, C(1), C(2), C(3), F(1), C(4), F(2), F(3))
    # x 8; +p 108; g0 carves 60: 108; pv 108; -p: pv keeps the 40 left: 108; +c 118;
    # -g0 58; -pv 18
    assert trace.live == (108, 108, 108, 108, 118, 58, 18)


# --- invalid schedules -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("steps", "bandwidth", "message"),
    [
        ((C(2),), None, "input a is not on the device"),
        ((C(1), C(1)), None, "previous copy is still live"),
        ((C(1), Off(1), F(1), P(1), C(1)), 10.0, "previous copy is still live"),  # in flight
        ((F(1),), None, "no device copy"),
        ((C(1), F(1), F(1)), None, "no device copy"),
        ((F(0),), None, "frees a resident input"),
        ((C(0),), None, "computes a resident input"),
        ((C(1), P(1)), 10.0, "never offloaded"),
        ((C(1), Off(1)), None, "needs a host link bandwidth"),
        ((C(1), Off(1)), 0.0, "needs a host link bandwidth"),
        ((C(1), P(1)), None, "needs a host link bandwidth"),
        ((C(1), Off(1), P(1)), 10.0, "already on the device"),
        ((C(1), Off(1), F(1), P(1), P(1)), 10.0, "already on the device"),
        ((C(1), W(1)), None, "no prefetch in flight"),
        ((C(1), Off(1), F(1), P(1), W(1), W(1)), 10.0, "no prefetch in flight"),
        ((Off(1),), 10.0, "absent or not offloadable"),
        ((C(1), C(5), Off(5)), 10.0, "absent or not offloadable"),
        ((C(1), Off(1), F(1), P(1), C(2)), 10.0, "input a is not on the device"),  # no Wait
        ((C(1), C(2)), None, "outputs not on the device at the end: c"),
        ((C(1), C(2), C(3), F(3)), None, "outputs not on the device"),
        ((C(99),), None, "unknown node id 99"),
        ((C(-1),), None, "unknown node id -1"),
        ((F(6),), None, "unknown node id 6"),
    ],
)
def test_invalid_schedules_are_rejected(steps, bandwidth, message):
    with pytest.raises(InvalidSchedule, match=message):
        run(small_graph(), *steps, bandwidth=bandwidth)


def test_budget():
    g = small_graph()
    steps = (C(1), C(2), C(3))
    assert run(g, *steps, budget=130).peak == 130  # p 100 + a 10 + b 10 + c 10
    with pytest.raises(InvalidSchedule, match="peak 130 B at step 2 exceeds the budget of 129 B"):
        run(g, *steps, budget=129)


def test_carved_from_an_absent_producer():
    g = Graph(
        nodes=(
            Node(0, "p", "multi", bytes=100),
            Node(1, "g", "getitem", bytes=60, carved_from=0),  # does not list p as an input
        )
    )
    with pytest.raises(InvalidSchedule, match="carved from p, which is absent"):
        run(g, C(1))


# --- offload and prefetch timing ---------------------------------------------------------


def transfer_graph(middle_bytes: int = 10) -> Graph:
    """p (param, 100 B); a = f(p) 10 B 1 s; b = g(a) 2 s; d = h(b) 1 s (b and d of
    `middle_bytes` each); c = k(a, d) 10 B 1 s (output). Compute alone takes 5 s."""
    return Graph(
        nodes=(
            Node(0, "p", "param", bytes=100, kind=PARAM),
            Node(1, "a", "f", (0,), bytes=10, time=1.0),
            Node(2, "b", "g", (1,), bytes=middle_bytes, time=2.0),
            Node(3, "d", "h", (2,), bytes=middle_bytes, time=1.0),
            Node(4, "c", "k", (1, 3), bytes=10, time=1.0),
        ),
        outputs=(4,),
    )


def test_transfer_hidden_under_compute_adds_no_stall():
    trace = run(transfer_graph(), C(1), Off(1), C(2), F(1), P(1), C(3), W(1), C(4), bandwidth=10.0)
    # 10 B at 10 B/s = 1 s per copy. a ends at 1; offload 1-2; b ends at 3 (a's copy done
    # at 2, so the Free waits for nothing); prefetch 3-4; d ends at 4; the Wait is free
    assert trace.clock == (1.0, 1.0, 3.0, 3.0, 3.0, 4.0, 4.0, 5.0)
    assert (trace.time, trace.stall) == (5.0, 0.0)
    # p 100; +a 110; +b 120; -a 110; the prefetch allocates on issue 120; +d 130; +c 140
    assert trace.live == (110, 110, 120, 110, 120, 130, 130, 140)
    assert trace.peak == 140


def test_prefetch_issued_late_stalls_exactly():
    trace = run(transfer_graph(), C(1), Off(1), C(2), F(1), P(1), W(1), C(3), C(4), bandwidth=10.0)
    # prefetch issued at 3 lands at 4: the Wait stalls 1 s; then d 5, c 6
    assert (trace.time, trace.stall) == (6.0, 1.0)
    assert trace.clock[5] == 4.0


def test_slow_link_cannot_hide():
    trace = run(transfer_graph(), C(1), Off(1), C(2), F(1), P(1), C(3), W(1), C(4), bandwidth=5.0)
    # 10 B at 5 B/s = 2 s. offload 1-3; b ends 3, the Free is on time; prefetch 3-5;
    # d ends 4; the Wait stalls 5 - 4 = 1; c ends 6
    assert (trace.time, trace.stall) == (6.0, 1.0)


def test_free_during_offload_waits_for_the_copy():
    trace = run(transfer_graph(), C(1), Off(1), F(1), P(1), W(1), C(2), C(3), C(4), bandwidth=5.0)
    # offload 1-3: the Free stalls 2; prefetch 3-5: the Wait stalls 2; b 7, d 8, c 9
    assert trace.clock == (1.0, 1.0, 3.0, 3.0, 5.0, 7.0, 8.0, 9.0)
    assert (trace.time, trace.stall) == (9.0, 4.0)
    # p 100; +a 110; -a 100; the prefetch 110; then b 120, d 130, c 140
    assert trace.live == (110, 110, 100, 110, 110, 120, 130, 140)


def test_each_transfer_s_host_calls_take_compute_stream_time():
    graph = dataclasses.replace(transfer_graph(), transfer_seconds=0.25)
    trace = run(graph, C(1), Off(1), C(2), F(1), P(1), C(3), W(1), C(4), bandwidth=10.0)
    # The offload's calls end at 1.25, its copy 2.25; b ends 3.25 (the Free waits for
    # nothing); the prefetch's calls end 3.5, its copy 4.5; d ends 4.5, the Wait is free
    assert trace.clock == (1.0, 1.25, 3.25, 3.25, 3.5, 4.5, 4.5, 5.5)
    assert (trace.time, trace.stall) == (5.5, 0.0)


def test_a_graph_s_transfer_seconds_are_finite_and_not_negative():
    for bad in (-1e-6, math.inf, math.nan):
        with pytest.raises(GraphError, match="transfer_seconds"):
            dataclasses.replace(transfer_graph(), transfer_seconds=bad)


def test_copies_queue_on_one_stream():
    g = Graph(
        nodes=(
            Node(0, "p", "param", bytes=100, kind=PARAM),
            Node(1, "a", "f", (0,), bytes=10, time=1.0),
            Node(2, "b", "g", (0,), bytes=10, time=0.0),
            Node(3, "c", "h", (1, 2), bytes=10, time=1.0),
        ),
        outputs=(3,),
    )
    steps = (C(1), C(2), Off(1), Off(2), F(1), F(2), P(1), P(2), W(1), W(2), C(3))
    trace = run(g, *steps, bandwidth=10.0)
    # 1 s per copy: offloads 1-2 and 2-3 (queued); the Frees stall to 2 and 3;
    # prefetches 3-4 and 4-5; the Waits stall to 4 and 5; c ends 6
    assert trace.clock == (1.0, 1.0, 1.0, 1.0, 2.0, 3.0, 3.0, 3.0, 4.0, 5.0, 6.0)
    assert (trace.time, trace.stall) == (6.0, 4.0)
    # p 100; +a +b 120; -a -b 100; prefetches 110, 120; +c 130
    assert trace.peak == 130
    assert trace.live[5] == 100


def test_offload_lowers_the_peak_at_the_cost_of_a_stall():
    g = transfer_graph(middle_bytes=50)
    keep = run(g, *with_frees(g, [C(1), C(2), C(3), C(4)]))
    # p 100; +a 110; +b 160; +d 210 (the peak: p, a, b, d); -b 160; +c 170
    assert (keep.peak, keep.time) == (210, 5.0)
    steps = with_frees(g, [C(1), Off(1), C(2), C(3), P(1), W(1), C(4)])
    assert steps == [C(1), Off(1), C(2), F(1), C(3), F(2), P(1), W(1), C(4), F(1), F(3)]
    offloaded = run(g, *steps, bandwidth=10.0)
    # p 100; +a 110; +b 160; -a 150; +d 200 (the peak, 10 B lower); -b 150; prefetch 160;
    # +c 170; -a 160; -d 110
    assert offloaded.live == (110, 110, 160, 150, 200, 150, 160, 160, 170, 160, 110)
    # 1 s per copy: offload 1-2, b ends 3, d ends 4, prefetch 4-5: the Wait stalls 1 s
    assert (offloaded.peak, offloaded.time, offloaded.stall) == (200, 6.0, 1.0)


# --- properties on random DAGs -------------------------------------------------------------


def resident_bytes(graph: Graph, live_nodes: set[int], computed: set[int]) -> int:
    """Device bytes of the storages that hold `live_nodes`, computed once each: an owner's
    bytes less what the carved nodes already computed took out of it."""
    owners = {graph.storage_owner[v] for v in live_nodes}
    return sum(
        graph[o].bytes - sum(c.bytes for c in graph if c.carved_from == o and c.id in computed)
        for o in owners
    )


@settings(max_examples=50, deadline=None)
@given(random_graphs())
def test_simulate_topological_order_with_frees(g):
    steps = with_frees(g, topological_steps(g))
    trace = simulate(g, Schedule(tuple(steps)))  # raises if an output is not resident
    assert min(trace.live, default=0) >= 0
    assert trace.peak == max(trace.baseline, *trace.live)
    assert trace.baseline == resident_bytes(g, set(g.resident_inputs), set())
    if trace.peak_step == -1:
        assert trace.live_at_peak == set(g.resident_inputs)
    # an independent replay: the bytes of the storages of the live nodes, step by step
    # (plus a computed node's workspace, in its own step)
    live, computed, elapsed = set(g.resident_inputs), set(), 0.0
    for index, step in enumerate(steps):
        held = 0
        if isinstance(step, Compute):
            live.add(step.node)
            computed.add(step.node)
            elapsed += g[step.node].time
            held = g[step.node].workspace
        else:
            live.discard(step.node)
        assert trace.live[index] == resident_bytes(g, live, computed) + held
        assert trace.clock[index] == elapsed
        if index == trace.peak_step:
            assert trace.live_at_peak == live
    # at the end exactly the resident inputs and the outputs hold device memory
    assert live == set(g.resident_inputs) | set(g.outputs)
    end = trace.live[-1] if trace.live else trace.baseline
    if steps and isinstance(steps[-1], Compute):
        end -= g[steps[-1].node].workspace
    assert end == resident_bytes(g, set(g.resident_inputs) | set(g.outputs), computed)
    assert trace.time == g.total_time


@settings(max_examples=50, deadline=None)
@given(random_graphs())
def test_without_frees_nothing_is_released(g):
    steps = topological_steps(g)
    trace = simulate(g, Schedule(tuple(steps)))
    # memory only grows (but for each step's own workspace), and ends at every storage's
    # bytes (carving moves, never adds)
    held = [trace.live[i] - g[step.node].workspace for i, step in enumerate(steps)]
    assert held == sorted(held)
    everything = set(range(len(g)))
    assert trace.peak == max(resident_bytes(g, everything, everything), *trace.live)


def test_a_workspace_is_held_in_its_step_and_at_every_recomputation():
    # a: 10 B, holding 50 B while it runs; b = g(a): 10 B; c = h(a, b): 10 B, the output
    g = Graph(
        nodes=(
            Node(0, "a", "f", bytes=10, workspace=50),
            Node(1, "b", "g", (0,), bytes=10),
            Node(2, "c", "h", (0, 1), bytes=10),
        ),
        outputs=(2,),
    )
    steps = (C(0), C(1), F(0), C(0), C(2), F(0), F(1))
    trace = simulate(g, Schedule(steps))
    # 10 + 50 | 20 | 10 | 20 + 50 (recomputed: the workspace again) | 30 | 20 | 10
    assert trace.live == (60, 20, 10, 70, 30, 20, 10)
    assert (trace.peak, trace.peak_step) == (70, 3)
    held = [a for a in trace.allocations if a.bytes == 50]
    assert [(a.start, a.end) for a in held] == [(0, 1), (3, 4)]  # each for its step only
    assert remat.score(g, [0, 1, 0, 2]).peak == 70  # the literature's rules count it too
