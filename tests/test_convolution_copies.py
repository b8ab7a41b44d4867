"""Where a convolution's input of another layout is made contiguous: inside the kernel, in
the graph (passes/contiguous.py), or memplan's choice of the two (PlanOptions)."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import memplan
from memplan.core.budget import Budget
from memplan.core.errors import MemplanError
from memplan.passes.contiguous import channels_last_convolution_inputs
from memplan.planner.capture import compile_training_step, module_copy
from memplan.planner.lower import lower
from memplan.planner.options import PlanOptions
from memplan.planner.partitioner import Partitioner
from memplan.tools.verify import compare_grads, training_step


class ChannelsLastBlock(nn.Module):
    """A Linear over channels-last activations, then a depthwise convolution handed the
    permuted (not contiguous) result, as in a ConvNeXt block."""

    def __init__(self, channels: int = 8) -> None:
        super().__init__()
        self.mix = nn.Linear(channels, channels)
        self.depthwise = nn.Conv2d(channels, channels, 7, padding=3, groups=channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mixed = self.mix(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        return self.depthwise(torch.relu(mixed)).square().mean()


@pytest.fixture
def example() -> tuple[nn.Module, tuple[torch.Tensor]]:
    torch.manual_seed(0)
    return ChannelsLastBlock(), (torch.randn(4, 8, 16, 16),)


def _planned(model: nn.Module, inputs: tuple[torch.Tensor], copies: str) -> Partitioner:
    """The partitioner after planning `model` at 100% with `copies`."""
    options = PlanOptions(convolution_copies=copies, progress=False)
    part = Partitioner(Budget.parse("100%"), options, name="block")
    compile_training_step(copy.deepcopy(model), inputs, part)
    return part


def _clones(part: Partitioner) -> int:
    """Copies in the planned graph."""
    return sum("clone" in node.op for node in part.lowered[0].graph)


def test_the_graph_way_copies_in_the_graph(example) -> None:
    model, inputs = example
    kernel, graph = _planned(model, inputs, "kernel"), _planned(model, inputs, "graph")
    assert kernel.plans[0].options["convolution_copies"] == "kernel"
    assert graph.plans[0].options["convolution_copies"] == "graph"
    assert _clones(graph) > _clones(kernel)  # the permuted input, copied in the graph
    chosen = _planned(model, inputs, "choose")
    way = chosen.plans[0].options["convolution_copies"]
    assert _clones(chosen) == _clones(graph if way == "graph" else kernel)


@pytest.mark.parametrize("copies", ["kernel", "graph", "choose"])
def test_each_way_trains_like_eager(example, copies: str) -> None:
    model, inputs = example
    eager = copy.deepcopy(model)
    training_step(eager, inputs)()
    expected = {n: p.grad for n, p in eager.named_parameters()}
    ours = copy.deepcopy(model)
    planned = memplan.optimize(ours, inputs, "100%", convolution_copies=copies, progress=False)
    training_step(planned, inputs)()
    assert compare_grads(ours, expected)[1]


class FlattenedBlock(ChannelsLastBlock):
    """The block with the convolution's result permuted back to channels-last and
    flattened by `view`, as a ConvNeXt block feeds its Linear: a view the traced layout
    allows, and a contiguous copy of the convolution's input no longer does."""

    def __init__(self, channels: int = 8) -> None:
        super().__init__(channels)
        self.out = nn.Linear(channels, channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mixed = self.mix(x.permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
        result = self.depthwise(torch.relu(mixed)).permute(0, 2, 3, 1) * 2
        return self.out(result.view(-1, result.shape[-1])).square().mean()


def test_a_view_the_copy_disallows_gets_a_copy_and_trains_like_eager() -> None:
    torch.manual_seed(0)
    model, inputs = FlattenedBlock(), (torch.randn(4, 8, 16, 16),)
    eager = copy.deepcopy(model)
    training_step(eager, inputs)()
    expected = {n: p.grad for n, p in eager.named_parameters()}
    # The graph way copies the flattening view's input, as well as the convolution's.
    joint = _planned(model, inputs, "graph").lowered[0].joint.graph
    views = joint.find_nodes(op="call_function", target=torch.ops.aten.view.default)
    assert any(v.args[0].target == torch.ops.aten.clone.default for v in views)
    ours = copy.deepcopy(model)
    planned = memplan.optimize(ours, inputs, "100%", convolution_copies="graph", progress=False)
    training_step(planned, inputs)()
    assert compare_grads(ours, expected)[1]


def test_an_unknown_way_is_one_line_error() -> None:
    with pytest.raises(MemplanError, match="convolution_copies must be one of choose, kernel"):
        PlanOptions(convolution_copies="both")


class TwoConvolutions(nn.Module):
    """Two 2-D convolutions, whose weights and input Inductor's layout optimization copies
    to channels-last."""

    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Conv2d(3, 16, 3, padding=1)
        self.second = nn.Conv2d(16, 16, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.second(torch.relu(self.first(x))).square().mean()


def test_the_channels_last_copies_are_one_per_input_read_forward_and_backward() -> None:
    """Each graph input a convolution reads (the batch, both weights) is copied once, the
    copy read by its convolution and by that convolution's backward, laid out
    channels-last, and lowered as a tensor the plan keeps."""
    torch.manual_seed(0)
    part = _planned(TwoConvolutions(), (torch.randn(4, 3, 32, 32),), "kernel")
    joint = module_copy(part.lowered[0].joint)
    assert channels_last_convolution_inputs(joint) == 3
    copies = joint.graph.find_nodes(op="call_function", target=torch.ops.aten.clone.default)
    assert len(copies) == 3
    for copy_node in copies:
        assert copy_node.args[0].op == "placeholder"
        assert copy_node.meta["val"].is_contiguous(memory_format=torch.channels_last)
        readers = {user.target for user in copy_node.users}
        assert readers == {
            torch.ops.aten.convolution.default,
            torch.ops.aten.convolution_backward.default,
        }, readers
    lowered = lower(joint, part.lowered[0].num_fwd_outputs)
    kept = [n for n in lowered.graph if n.name in {c.name for c in copies}]
    assert len(kept) == 3 and not any(n.recomputable for n in kept)


@pytest.mark.parametrize("layout_optimization", [True, False])
def test_under_inductors_layout_optimization_the_plan_has_its_channels_last_copies(
    layout_optimization: bool,
) -> None:
    """Under Inductor with its layout optimization (on by default, and always on a CPU
    with convolutions), the graph planned is the one with the channels-last copies;
    with it off, the graph as traced. Either trains like eager (in float64, so that a
    reordered reduction cannot hide a wrong gradient)."""
    torch.manual_seed(0)
    model, inputs = TwoConvolutions().double(), (torch.randn(8, 3, 32, 32).double(),)
    eager = copy.deepcopy(model)
    training_step(eager, inputs)()
    torch._dynamo.reset()
    settings = {"layout_optimization": layout_optimization}
    backend = memplan.backend(budget="100%", inductor_config=settings, progress=False)
    ours = copy.deepcopy(model)
    training_step(torch.compile(ours, backend=backend), inputs)()
    (plan,) = backend.plans
    way = plan.options["convolution_copies"]
    assert way == ("channels_last" if layout_optimization else "kernel"), way
    for (name, p), q in zip(ours.named_parameters(), eager.parameters(), strict=True):
        torch.testing.assert_close(p.grad, q.grad, msg=name)
