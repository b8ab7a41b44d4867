"""Pricing as Inductor runs the graphs (planner/fusion.py): a view, and a pointwise op
inlined into every kernel that reads it, cost 0 s in the graph a backend with Inductor
solves; a pointwise op read by a matrix product keeps its time, as do unfused graphs.
Those the other graph does not read hold no memory there, and their readers keep what
they read live."""

from __future__ import annotations

import copy
from typing import Any

import pytest
import torch
from torch import nn
from torch.fx.experimental.proxy_tensor import make_fx

import memplan
from memplan import compat
from memplan.core.budget import Budget
from memplan.core.graph import Graph, NodeKind
from memplan.planner.capture import compile_training_step
from memplan.planner.fusion import fused_away, fused_memory
from memplan.planner.options import PlanOptions
from memplan.planner.partitioner import Partitioner
from memplan.planner.plan import unplanned_step


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


class _Squared(nn.Module):
    """A linear layer whose loss is its output squared and averaged, as a language model's
    is of its logits: the backward's pointwise chain Inductor makes one kernel of."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = nn.Linear(64, 4096)  # outputs beyond its weights, as logits are

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x).pow(2).mean()


def _solved(
    fused: bool,
    model: nn.Module | None = None,
    inputs: tuple[torch.Tensor, ...] | None = None,
    decompositions: dict[Any, Any] | None = None,
) -> tuple[Graph, Partitioner]:
    """The graph the solver is given for a small model's training step (its ops decomposed
    with `decompositions` where given), and its partitioner."""
    torch.manual_seed(0)
    model = model if model is not None else _Scaled()
    inputs = inputs if inputs is not None else (torch.randn(32, 64),)
    seen: list[Graph] = []

    def look(graph: Graph) -> Graph:
        seen.append(graph)
        return graph

    options = PlanOptions(progress=False, fused_pointwise=fused)
    partitioner = Partitioner(Budget.parse("100%"), options, name="scaled")
    partitioner.before_solving = look
    compile_training_step(copy.deepcopy(model), inputs, partitioner, decompositions)
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


def test_what_inductor_never_writes_holds_no_memory_and_keeps_what_it_reads_live():
    graph, partitioner = _solved(fused=False, model=_Squared())
    nodes = partitioner.lowered[0].fx_nodes
    solved = fused_memory(graph, nodes)
    name = {n.name: n.id for n in graph}
    # The forward's square, read by the mean alone, is never written.
    (square,) = [n for n in graph if n.op == "aten.pow.Tensor_Scalar" and not n.is_backward]
    assert square.bytes > 0 and solved[square.id].bytes == 0
    # In the backward, the gradient the matrix products read is written; the pointwise
    # ops that make it are not, and it reads what they read (the forward's output).
    written = [n for n in graph if n.is_backward and n.bytes and solved[n.id].bytes]
    unwritten = [n for n in graph if n.is_backward and n.bytes and not solved[n.id].bytes]
    assert unwritten and all(fused_away(nodes[n.id]) for n in unwritten)
    (linear,) = [n.id for n in graph if n.op == "aten.addmm.default"]
    assert any(linear in solved[n.id].inputs and linear not in n.inputs for n in written)
    # Nothing read across the forward and backward split is unwritten: it is saved.
    assert all(solved[v].bytes == graph[v].bytes for v in graph.saved_candidates)
    assert all(n.bytes == solved[n.id].bytes for n in graph if n.kind is not NodeKind.COMPUTE)
    # The mean reads the linear output in place of the square inlined into it.
    assert linear in solved[name["mean"]].inputs and linear not in graph[name["mean"]].inputs
    # The step as written holds less in the backward by an unwritten output at least.
    _, fused_step = unplanned_step(solved, partitioner.options.solver_options("cpu"))
    _, unfused_step = unplanned_step(graph, partitioner.options.solver_options("cpu"))
    less = [u - f for u, f in zip(unfused_step.live, fused_step.live, strict=True)]
    assert min(less) >= 0 and max(less) >= min(graph[n.id].bytes for n in unwritten)


class _Embedded(nn.Module):
    """Token embeddings, all but the first position read: the backward makes the
    embedding's gradient by scattering into a fill of zeros, and the slice's by padding
    with one."""

    def __init__(self) -> None:
        super().__init__()
        self.embedding, self.linear = nn.Embedding(4096, 64), nn.Linear(64, 64)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.linear(self.embedding(ids)[:, 1:]).pow(2).mean()


def test_a_fill_that_inductor_writes_into_a_copy_of_is_never_written():
    """Inductor lowers a scatter by cloning its destination into the buffer it returns,
    so a fill of zeros there is computed in the clone's kernel: counted as written, it
    doubled the embedding gradient's bytes at the backward's end."""
    ids = torch.randint(0, 4096, (8, 32))
    decompositions = compat.inductor_decompositions()  # as the backend traces for Inductor
    graph, partitioner = _solved(False, _Embedded(), (ids,), decompositions)
    nodes = partitioner.lowered[0].fx_nodes
    solved = fused_memory(graph, nodes)
    weight = 4096 * 64 * 4
    (scatter,) = [n for n in graph if "index_put" in n.op]
    destination = graph[scatter.inputs[0]]
    assert destination.op == "aten.full.default" and destination.bytes == weight
    assert fused_away(nodes[destination.id]) and solved[destination.id].bytes == 0
    assert solved[scatter.id].bytes == weight  # the clone's buffer, which it returns
    # What it scatters is read as written, not inlined: it keeps its bytes.
    values = [i for i in scatter.inputs[1:] if graph[i].bytes]
    assert values and all(solved[i].bytes == graph[i].bytes for i in values)
    # The slice's gradient pads with zeros in one kernel: its fill is never written.
    (pad,) = [n for n in graph if n.op == "aten.slice_scatter.default"]
    fills = [i for i in pad.inputs if graph[i].op == "aten.full.default"]
    assert fills and all(solved[i].bytes == 0 < graph[i].bytes for i in fills)
    # The step as written holds the embedding's gradient once at the scatter, not twice.
    options = partitioner.options.solver_options("cpu")
    (_, fused_step), (_, unfused_step) = (unplanned_step(g, options) for g in (solved, graph))
    assert unfused_step.peak - fused_step.peak >= weight


@pytest.mark.usefixtures("private_cache")  # planned here, not read from an earlier run
def test_under_inductor_the_first_round_is_planned_as_it_compiles():
    """A plan made before it is compiled peaks where the step compiled from it does: it
    was planned 12.6 MB above it on a language model whose loss squares its logits (three
    logits-sized outputs of the backward's pointwise ops that one kernel never writes),
    and the search compiled twice more to use the room (2-core CPU, 2026-12-07)."""
    torch._dynamo.reset()
    backend = memplan.backend(budget="100%", progress=False)
    model = _Squared()
    compiled = torch.compile(copy.deepcopy(model), backend=backend)
    compiled(torch.randn(512, 64)).backward()  # the gradient's chain is the step's peak
    (plan,) = backend.plans
    ((_, as_compiled, *_),) = plan.options["compiled_rounds"]
    assert plan.predicted_peak == as_compiled
