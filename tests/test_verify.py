"""memplan.tools.verify: it passes a sound plan and catches each way a plan can be wrong."""

from __future__ import annotations

import dataclasses

import torch
from torch import nn

import memplan
from memplan.tools.verify import verify
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


def test_a_wrong_prediction_or_budget_is_reported():
    model, inputs = _model()
    plan = memplan.plan(model, inputs, budget="50%", progress=False)
    low = verify(model, inputs, dataclasses.replace(plan, predicted_peak=plan.predicted_peak // 2))
    assert not low.ok and "from the predicted" in low.problems()[0]


class Noisy(nn.Module):
    """Dropout in training mode: every step draws new numbers, so no step can match another
    one; a stand-in for a plan that changed the numerics."""

    def __init__(self, body: nn.Module) -> None:
        super().__init__()
        self.body = body

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return nn.functional.dropout(self.body(x), 0.5).square().mean()


def test_gradients_that_differ_are_reported():
    model, inputs = _model()
    noisy = Noisy(model.body)
    plan = memplan.plan(noisy, inputs, budget="100%", progress=False)
    check = verify(noisy, inputs, plan)
    assert not check.grads_match and check.max_grad_error > 0
    assert "gradients differ" in check.problems()[0]
