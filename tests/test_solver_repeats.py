"""Repeated structure (memplan/solvers/repeats.py) and greedy's releases of alike
storages together on big graphs (memplan/solvers/greedy.py)."""

from __future__ import annotations

import pytest
from strategies import chain_graph
from test_solver_chain import mirrored_chain

from memplan.core.simulate import simulate
from memplan.solvers import SolverOptions, get_solver, greedy
from memplan.solvers.repeats import alike, classes
from memplan.solvers.training import saved_storages

# A 24-stage chain of 8 repeated blocks of 3 stages each (sizes 40, 12, 25).
BLOCKS, PATTERN = 8, (40, 12, 25)


def repeated_chain():
    sizes = list(PATTERN) * BLOCKS
    return mirrored_chain(sizes, [s // 2 + 1 for s in sizes], [1.0, 3.0, 2.0] * BLOCKS)


def test_the_same_stage_of_inner_blocks_is_alike_and_other_stages_are_not():
    graph = repeated_chain()
    colour = alike(graph)
    forward = [graph.by_name[f"f{k}"] for k in range(3 * BLOCKS)]
    inner = range(3, 3 * BLOCKS - 6)  # away from the chain's ends, whose neighbours differ
    for k in inner:
        assert colour[forward[k]] == colour[forward[k + 3]]
        assert colour[forward[k]] != colour[forward[k + 1]]
    assert colour[forward[0]] != colour[forward[3]]  # the first stage reads no input


def test_classes_group_the_given_nodes_by_likeness_in_order():
    graph = repeated_chain()
    owners = list(saved_storages(graph))
    grouped = classes(graph, owners)
    for owner, members in grouped.items():
        assert owner in members and members == sorted(members)
        assert {graph[m].bytes for m in members} == {graph[owner].bytes}
    assert max(len(m) for m in grouped.values()) >= BLOCKS - 3


@pytest.mark.parametrize("share", [0.7, 0.5])
def test_releasing_alike_storages_together_holds_the_budget_in_fewer_simulations(
    monkeypatch, share
):
    graph = chain_graph(40, act_bytes=100, param_bytes=4)  # 40 alike layers
    options = SolverOptions(time_limit=30)
    least = simulate(graph, greedy.solve(graph, None, options).schedule).peak
    keep_all = simulate(graph, get_solver("keep_all")(graph, None, options).schedule).peak
    budget = max(int(share * keep_all), least)
    assert budget < keep_all
    counted: dict[str, int] = {}
    simulate_decisions = greedy.simulate_decisions

    def counting(*args, **kwargs):
        counted[mode] += 1
        return simulate_decisions(*args, **kwargs)

    monkeypatch.setattr(greedy, "simulate_decisions", counting)
    results = {}
    for mode, bulk_from in (("one by one", 10**9), ("alike together", 0)):
        monkeypatch.setattr(greedy, "BULK_FROM", bulk_from)
        counted[mode] = 0
        results[mode] = greedy.solve(graph, budget, options)
        assert simulate(graph, results[mode].schedule).peak <= budget
    assert counted["alike together"] < counted["one by one"]
