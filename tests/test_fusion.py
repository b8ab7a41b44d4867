"""Pricing as Inductor runs the graphs: pointwise ops and views cost 0 s in the graph a
backend with inductor solves (planner/fusion.py); the unfused graphs keep their times."""

from __future__ import annotations

import copy

import torch
from torch import nn

import memplan
from memplan.budget import Budget
from memplan.graph import Graph
from memplan.planner.capture import compile_training_step
from memplan.planner.options import PlanOptions
from memplan.planner.plan import Partitioner


def _mlp() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64))
    return model, (torch.randn(32, 64),)


def _solved_graph(fused: bool) -> Graph:
    """The graph of the MLP's training step as the solver is given it."""
    model, inputs = _mlp()
    seen: list[Graph] = []

    def look(graph: Graph) -> Graph:
        seen.append(graph)
        return graph

    options = PlanOptions(progress=False, fused_pointwise=fused)
    partitioner = Partitioner(Budget.parse("100%"), options, name="mlp")
    partitioner.before_solving = look
    compile_training_step(copy.deepcopy(model), inputs, partitioner)
    (graph,) = seen
    return graph


def _times(graph: Graph, op: str) -> list[float]:
    return [n.time for n in graph if n.op == op]


def test_pointwise_ops_and_views_are_priced_as_fused():
    fused, unfused = _solved_graph(fused=True), _solved_graph(fused=False)
    for op in ("aten.gelu.default", "aten.t.default"):  # pointwise, a view
        assert _times(unfused, op) and all(t > 0 for t in _times(unfused, op)), op
        assert _times(fused, op) and all(t == 0 for t in _times(fused, op)), op
    # a matrix product is its own kernel under Inductor: its time stays
    assert _times(fused, "aten.mm.default")
    assert all(t > 0 for t in _times(fused, "aten.mm.default"))


def test_the_backend_prices_as_its_inner_compiler_runs():
    assert memplan.backend(inner="inductor").options.fused_pointwise
    assert not memplan.backend(inner="eager").options.fused_pointwise
    # the user's choice wins
    assert not memplan.backend(inner="inductor", fused_pointwise=False).options.fused_pointwise
