"""Graphs Dynamo traces with symbolic sizes: planned at their hints, and again for a
call's sizes where the plan would not hold the budget there."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.utils.checkpoint
from compile_support import _cut, _train_and_compare, small_gpt2
from test_e2e import train_step

import memplan
import memplan.compile.spinner
import memplan.planner.plan
import memplan.planner.profile
import memplan.planner.solve
from memplan.core.errors import (
    InfeasibleBudget,
    MemplanWarning,
)
from memplan.tools.zoo import ZOO, Example


def test_a_changing_batch_and_sequence_length_train_like_eager() -> None:
    """An epoch's smaller last batch and a new sequence length: Dynamo recompiles with
    symbolic sizes, and memplan plans them at their hints, or again for a call's sizes.
    Unfused on CPU: the plans are what is tested, and four planned graphs under Inductor
    made this the suite's longest test (110 s with an empty Inductor cache, 2-core CPU,
    2026-12-05); the tests below and tests/test_gpu.py plan symbolic sizes under Inductor."""
    check_changing_shapes(small_gpt2(), inner="eager")


def check_changing_shapes(example: Example, budget: str = "60%", inner: str = "inductor") -> None:
    """Five steps of GPT-2 at changing batch sizes and sequence lengths under `budget`,
    the plans compiled by `inner`."""
    torch._dynamo.reset()
    backend = memplan.backend(budget=budget, inner=inner, progress=False)
    model = copy.deepcopy(example.model)
    compiled = torch.compile(model, backend=backend)
    for batch, seq in [(4, 32), (2, 32), (4, 16), (3, 24), (4, 32)]:
        _train_and_compare(compiled, model, _cut(example.inputs, batch, seq))
    dynamic = [plan for plan in backend.plans if plan.sizes]
    assert dynamic, "no graph of symbolic sizes was planned"
    assert all(plan.peak <= plan.budget for plan in backend.plans)


def test_dynamic_true_plans_symbolic_sizes_from_the_first_compile() -> None:
    example = small_gpt2()
    torch._dynamo.reset()
    backend = memplan.backend(budget="70%", progress=False)
    model = copy.deepcopy(example.model)
    compiled = torch.compile(model, backend=backend, dynamic=True)
    for seq in (32, 20):
        _train_and_compare(compiled, model, _cut(example.inputs, 4, seq))
    assert backend.plans[0].sizes  # symbolic from the first compile on


def test_mark_dynamic_plans_at_the_first_batch() -> None:
    mlp = ZOO["mlp"](batch=512)
    torch._dynamo.reset()
    backend = memplan.backend(budget="70%", progress=False)
    model = copy.deepcopy(mlp.model)
    compiled = torch.compile(model, backend=backend)
    for batch in (512, 200):
        inputs = tuple(x[:batch].clone() for x in mlp.inputs)
        for x in inputs:
            torch._dynamo.mark_dynamic(x, 0)
        _train_and_compare(compiled, model, inputs)
    # Planned at the first batch; the second is planned again only where the first plan
    # would not hold 70% of its own unplanned peak.
    assert list(backend.plans[0].sizes.values()) == [512]
    assert all(plan.sizes for plan in backend.plans)


def test_a_shape_the_budget_cannot_hold_warns_or_raises_before_the_step() -> None:
    """Planned at a small batch under an absolute budget that fits it, a call at a larger
    batch is planned again; where nothing fits, the warning names the sizes and the least
    peak, and with best_effort=False the error comes before anything of the step runs."""
    example = ZOO["mlp"](batch=2048)
    # Not 128, the width: Dynamo would take both for one size and specialize it.
    small = tuple(x[:64].clone() for x in example.inputs)
    torch._dynamo.reset()
    probe = memplan.backend(budget="100%", progress=False)
    train_step(torch.compile(copy.deepcopy(example.model), backend=probe, dynamic=True), small)()
    budget = probe.plans[0].unplanned_peak  # holds the small batch unplanned

    torch._dynamo.reset()
    backend = memplan.backend(budget=budget, progress=False)
    model = copy.deepcopy(example.model)
    compiled = torch.compile(model, backend=backend, dynamic=True)
    train_step(compiled, small)()
    with pytest.warns(MemplanWarning, match=r"s\d+=2048\]: .*the least peak found is"):
        train_step(compiled, example.inputs)()

    torch._dynamo.reset()
    strict = memplan.backend(budget=budget, best_effort=False, progress=False)
    model = copy.deepcopy(example.model)
    compiled = torch.compile(model, backend=strict, dynamic=True)
    train_step(compiled, small)()
    model.zero_grad(set_to_none=True)
    with pytest.raises(InfeasibleBudget):
        train_step(compiled, example.inputs)()
    assert all(p.grad is None for p in model.parameters())  # nothing of the step ran


# Inductor compiles the CNN about ten times here (50 s): it runs with the slow tests.
