"""Matrix products kept where the plan runs them (compile/products.py): Inductor's addmm
rewrite undone where it moved a product, left where it did not."""

from __future__ import annotations

import copy
import warnings

import torch
from torch import fx
from torch.fx.experimental.proxy_tensor import make_fx

import memplan
from memplan.compile.products import SETTING, products_where_planned
from memplan.tools.verify import steady_step_peak
from memplan.tools.zoo import ZOO

aten = torch.ops.aten


def _traced(fn, *inputs: torch.Tensor) -> fx.GraphModule:
    return make_fx(fn, tracing_mode="fake")(*inputs)


def _targets(gm: fx.GraphModule) -> list[object]:
    return [n.target for n in gm.graph.nodes if n.op == "call_function"]


def test_a_moved_product_runs_again_where_its_inputs_are_ready():
    # addmm(c, a, b) after other work: the product moves back right after b, the add stays.
    def moved(a, b, c, d):
        ready = b.sin()
        e = torch.relu(d) * 2
        return torch.addmm(c, a, ready) + e.sum()

    gm = _traced(moved, *(torch.ones(8, 8) for _ in range(4)))
    products_where_planned(gm.graph)
    gm.recompile()
    names = [n for n in gm.graph.nodes if n.op == "call_function"]
    order = [n.target for n in names]
    assert aten.addmm.default not in order
    assert order.index(aten.mm.default) == order.index(aten.sin.default) + 1
    assert order.index(aten.add.Tensor) > order.index(aten.relu.default)
    a, b, c, d = (torch.randn(8, 8) for _ in range(4))
    torch.testing.assert_close(gm(a, b, c, d), moved(a, b, c, d))


def test_a_bias_and_a_product_added_at_once_are_left_whole():
    def linear(x, w, bias, c):
        return torch.addmm(bias, x, w), torch.addmm(c, x, w.cos())

    gm = _traced(linear, torch.ones(4, 8), torch.ones(8, 8), torch.ones(8), torch.ones(4, 8))
    before = _targets(gm)
    products_where_planned(gm.graph)
    assert _targets(gm) == before and before.count(aten.addmm.default) == 2


def _least_peak(settings: dict[str, object]) -> tuple[int, int]:
    """The zoo's BERT of two layers (its output layer shares the embedding's weight) at
    its least plan under Inductor: its peak as compiled, and measured."""
    example = ZOO["bert"](layers=2)
    backend = memplan.backend(budget="1 B", inductor_config=settings, progress=False)
    planned = copy.deepcopy(example.model)
    compiled = torch.compile(planned, backend=backend)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the least is planned best effort, with a warning
        measured = steady_step_peak(compiled, planned, example.inputs)
    return backend.plans[-1].peak, measured


def test_a_tied_weights_logits_gradient_is_freed_where_the_plan_frees_it():
    # With Inductor's rewrite kept (a post-grad pass of the user's own, None, stands in
    # for memplan's), the logits' gradient (2 MiB) lives to the backward's end.
    ours, measured = _least_peak({})
    theirs, _ = _least_peak({SETTING: None})
    assert measured == ours
    assert ours < theirs - 1024 * 1024, (ours, theirs)
