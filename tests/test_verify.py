"""memplan.tools.verify: it passes a sound plan and catches each way a plan can be wrong."""

from __future__ import annotations

import dataclasses
import io

import torch
from rich.console import Console
from torch import nn

import memplan
from memplan.planner.measure import resident_bytes
from memplan.planner.peak_contents import LiveBlocks, live_at_peak
from memplan.tools.report import verification_table
from memplan.tools.verify import resident_tensors, verify
from memplan.tools.zoo import mlp


def _model() -> tuple[nn.Module, tuple[torch.Tensor, ...]]:
    example = mlp()
    return example.model, example.inputs


def test_a_sound_plan_passes_and_the_model_is_left_as_it_was():
    model, inputs = _model()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    plan = memplan.plan(model, inputs, budget="50%", progress=False)
    check = verify(model, inputs, plan)
    assert check.ok, check.problems()
    assert check.grads_match and check.max_grad_error == 0.0
    assert check.measured_peak <= check.budget < check.eager_peak
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())


def test_a_wrong_prediction_or_budget_is_reported_with_what_the_peak_held():
    model, inputs = _model()
    plan = memplan.plan(model, inputs, budget="50%", progress=False)
    low = verify(model, inputs, dataclasses.replace(plan, predicted_peak=plan.predicted_peak // 2))
    assert not low.ok and "from the predicted" in low.problems()[0]
    # What the planned step held at its peak, above its resident tensors: the largest
    # group first, and no more than the measured peak (a second step, read the same way).
    held = [g.total for g in low.at_peak]
    resident = resident_bytes(resident_tensors(model, inputs), torch.device("cpu"))
    assert held == sorted(held, reverse=True) and 0 < sum(held) <= low.measured_peak - resident
    assert all(g.site.startswith("aten::") for g in low.at_peak[:3])
    rendered = io.StringIO()
    Console(file=rendered, width=200).print(verification_table(low))
    assert "held at the measured peak" in rendered.getvalue()
    sound = verify(model, inputs, plan)
    assert sound.ok and sound.at_peak == ()  # read only where a check fails


def test_the_blocks_live_at_the_peak_are_grouped_by_size_and_site():
    groups = check_blocks_live_at_peak(torch.device("cpu"))
    assert all(g.site.startswith("aten::empty") for g in groups)


def check_blocks_live_at_peak(device: torch.device) -> list[LiveBlocks]:
    """A step of known blocks, one freed before the peak and one after it, and a smaller
    one made after it: the groups live at the peak, the largest first (sizes that need no
    rounding by a GPU's allocator)."""
    kept: list[torch.Tensor] = []

    def step() -> None:
        kept.append(torch.empty(4096, dtype=torch.uint8, device=device))
        passing = torch.zeros(1024, device=device)  # 4 KiB, freed before the peak
        del passing
        kept.extend(torch.empty(2048, dtype=torch.uint8, device=device) for _ in range(3))
        kept.pop(0)  # the 4 KiB block, freed after the peak
        kept.append(torch.empty(1024, dtype=torch.uint8, device=device))

    groups = live_at_peak(step, device)
    assert [(g.nbytes, g.count) for g in groups] == [(2048, 3), (4096, 1)]
    return groups


class Drifting(nn.Module):
    """Scales its output by how many times it has run: a traced graph keeps the count it was
    traced at, so the planned step computes other numbers than the eager step it is
    compared with; a stand-in for a plan that changed the numerics."""

    def __init__(self, body: nn.Module) -> None:
        super().__init__()
        self.body = body
        self.calls = 0

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        return (self.body(x) * self.calls).square().mean()


def test_gradients_that_differ_are_reported():
    model, inputs = _model()
    drifting = Drifting(model.body)
    plan = memplan.plan(drifting, inputs, budget="100%", progress=False)
    check = verify(drifting, inputs, plan)
    assert not check.grads_match and check.max_grad_error > 0
    assert "gradients differ" in check.problems()[0]


class WithDropout(nn.Module):
    """The MLP's body with dropout on its output, in training mode."""

    def __init__(self, body: nn.Module) -> None:
        super().__init__()
        self.body = body

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return nn.functional.cross_entropy(nn.functional.dropout(self.body(x), 0.5), target)


def test_a_model_with_dropout_is_compared_on_the_same_masks_and_the_users_numbers_are_kept():
    """The eager and the planned step start from one seed: a sound plan of a model with
    dropout passes (it failed on the masks alone, two steps drawing different ones), and the
    user's random numbers after the check are those they would have had."""
    model, inputs = _model()
    dropped = WithDropout(model.body)
    plan = memplan.plan(dropped, inputs, budget="60%", progress=False)
    assert plan.counts()["recompute"] > 0
    before = torch.get_rng_state()
    check = verify(dropped, inputs, plan)
    assert check.ok, check.problems()
    assert check.max_grad_error == 0.0
    assert torch.equal(torch.get_rng_state(), before)
