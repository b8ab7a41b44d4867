"""Pricing as Inductor runs the graphs (planner/fusion.py): a view, and a pointwise op
inlined into every kernel that reads it, cost 0 s in the graph a backend with Inductor
solves; a pointwise op read by a matrix product keeps its time, as do unfused graphs."""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch.fx.experimental.proxy_tensor import make_fx

import memplan
from memplan.core.budget import Budget
from memplan.core.graph import Graph
from memplan.planner.capture import compile_training_step
from memplan.planner.fusion import fused_away
from memplan.planner.options import PlanOptions
from memplan.planner.partitioner import Partitioner


def test_what_inductor_fuses_away():
    def step(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        scaled = x * 2  # read by a pointwise op and a reduction: inlined into both
        active = torch.relu(scaled)  # read by a matrix product: a kernel of its own
        return (active @ w.t()).sum() + scaled.sum()

    gm = make_fx(step)(torch.randn(4, 8), torch.randn(3, 8))
    by_op = {str(n.target): fused_away(n) for n in gm.graph.nodes if n.op == "call_function"}
    assert by_op == {
        "aten.mul.Tensor": True,
        "aten.relu.default": False,
        "aten.t.default": True,  # a view
        "aten.mm.default": False,
        "aten.sum.default": False,
        "aten.add.Tensor": False,  # the graph's output
    }


def test_a_view_not_marked_as_one_is_fused_away_and_seen_through():
    def step(x: torch.Tensor) -> torch.Tensor:
        return torch.ops.aten._unsafe_view(x * 2, (-1,)).sum()  # the mul inlined into the sum

    gm = make_fx(step)(torch.randn(4, 8))
    by_op = {str(n.target): fused_away(n) for n in gm.graph.nodes if n.op == "call_function"}
    assert by_op == {
        "aten.mul.Tensor": True,
        "aten._unsafe_view.default": True,
        "aten.sum.default": False,
    }


class _Scaled(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = nn.Linear(64, 256), nn.Linear(256, 64)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(nn.functional.gelu(self.up(x) * 2))


def _solved(fused: bool) -> tuple[Graph, Partitioner]:
    """The graph the solver is given for a small model's training step, and its partitioner."""
    torch.manual_seed(0)
    model, inputs = _Scaled(), (torch.randn(32, 64),)
    seen: list[Graph] = []

    def look(graph: Graph) -> Graph:
        seen.append(graph)
        return graph

    options = PlanOptions(progress=False, fused_pointwise=fused)
    partitioner = Partitioner(Budget.parse("100%"), options, name="scaled")
    partitioner.before_solving = look
    compile_training_step(copy.deepcopy(model), inputs, partitioner)
    (graph,) = seen
    return graph, partitioner


def test_the_solver_is_given_the_fused_times():
    fused, partitioner = _solved(fused=True)
    unfused, _ = _solved(fused=False)  # the same profile, from the profile cache
    nodes = partitioner.lowered[0].fx_nodes
    away = [fused_away(n) for n in nodes]
    assert any(away) and not all(away)
    for node, gone, priced, profiled in zip(nodes, away, fused, unfused, strict=True):
        assert priced.time == (0.0 if gone else profiled.time), node.name
    # the forward's `* 2` is read only by the GELU and its backward; the GELU by a matmul
    assert [fused_away(n) for n in nodes if n.name in ("mul", "gelu")] == [True, False]
    assert any(p.time > 0 for p, gone in zip(fused, away, strict=True) if not gone)


def test_the_backend_prices_as_its_inner_compiler_runs():
    assert memplan.backend(inner="inductor").options.fused_pointwise
    assert not memplan.backend(inner="eager").options.fused_pointwise
    # the user's choice wins
    assert not memplan.backend(inner="inductor", fused_pointwise=False).options.fused_pointwise
