"""A kernel's own buffers: a custom op that allocates a large scratch buffer inside itself,
which no op returns. The profiler measures it, the plan leaves room for it, and the
allocator (the truth) agrees; with the workspace ignored, the same budget breaks."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import memplan
from memplan.core.budget import Budget
from memplan.planner import prepared as plan_module
from memplan.planner.capture import compile_training_step
from memplan.planner.options import PlanOptions
from memplan.planner.partitioner import Partitioner
from memplan.planner.profile import Profile
from memplan.tools.verify import compare_grads, steady_step_peak, training_step

SCRATCH = 2 * 2**20  # what each call of the op holds inside itself: 2 MiB
CPU = torch.device("cpu")


@torch.library.custom_op("memplan_tests::scratchy", mutates_args=())
def scratchy(x: torch.Tensor) -> torch.Tensor:
    """x * 1, through a scratch buffer of SCRATCH bytes made and freed inside the kernel."""
    scratch = torch.ones(SCRATCH // 4, dtype=torch.float32, device=x.device)
    return x * scratch[0]


@scratchy.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def _backward(ctx: object, grad: torch.Tensor) -> torch.Tensor:
    return scratchy(grad)


scratchy.register_autograd(_backward)


class Scratchy(nn.Module):
    """Six Linear+ReLU layers of 256 x 256 floats (256 KiB activations), then the op, whose
    backward runs first, with every saved activation still live: the unplanned peak."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(*(m for _ in range(6) for m in (nn.Linear(256, 256), nn.ReLU())))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return scratchy(self.body(x)).square().mean()


@pytest.fixture(scope="module")
def example() -> tuple[nn.Module, tuple[torch.Tensor]]:
    torch.manual_seed(0)
    return Scratchy(), (torch.randn(256, 256),)


def test_the_plan_leaves_room_for_a_kernels_own_buffers(example, monkeypatch):
    model, inputs = example
    full = memplan.plan(copy.deepcopy(model), inputs, "100%", progress=False)
    # Below the unplanned peak by half the scratch buffer: only activations released before
    # the op's backward make room, as the buffer itself cannot be released.
    budget = full.unplanned_peak - SCRATCH // 2

    eager = copy.deepcopy(model)
    training_step(eager, inputs)()
    expected = {n: p.grad for n, p in eager.named_parameters()}
    aware = copy.deepcopy(model)
    planned = memplan.optimize(aware, inputs, budget, progress=False)
    measured = steady_step_peak(planned, aware, inputs)
    assert planned.plan.counts()["recompute"] > 0
    assert measured <= budget
    assert abs(measured - planned.plan.predicted_peak) <= 0.02 * planned.plan.predicted_peak
    assert compare_grads(aware, expected)[1]  # the measured step's gradients

    # The same budget with every workspace taken as 0 (what the live-storage tracker sees):
    # the planner believes the unplanned step fits, and the allocator proves it does not.
    real = plan_module.profile_graph

    def blind(*args: object, **kwargs: object) -> Profile:
        found = real(*args, **kwargs)
        return Profile(found.seconds, dict.fromkeys(found.workspace, 0), found.estimated)

    monkeypatch.setattr(plan_module, "profile_graph", blind)
    unaware = copy.deepcopy(model)
    misplanned = memplan.optimize(unaware, inputs, Budget(bytes=budget), progress=False)
    assert misplanned.plan.predicted_peak <= budget
    assert steady_step_peak(misplanned, unaware, inputs) > budget


def test_the_profiler_measures_the_buffer(example):
    model, inputs = example
    part = Partitioner(Budget.parse("100%"), PlanOptions(progress=False), name="scratchy")
    compile_training_step(copy.deepcopy(model), inputs, part)
    graph = part.lowered[0].graph
    held = [n.workspace for n in graph if "scratchy" in n.op]
    assert len(held) == 2  # the forward call and the backward's
    assert all(SCRATCH <= w <= SCRATCH + 4096 for w in held), held
    # the rest of the graph (Linear, ReLU) holds almost nothing of its own
    assert sum(n.workspace for n in graph if "scratchy" not in n.op) < 2**16
