"""A graph called again before its backward (a siamese encoder, an evaluation kept with
its gradients, each block of a model compiled alone): planned again for what the
earlier calls hold."""

from __future__ import annotations

import copy
import warnings
from collections.abc import Callable

import pytest
import torch
import torch.utils.checkpoint

import memplan
import memplan.compile.spinner
import memplan.planner.plan
import memplan.planner.profile
import memplan.planner.solve
from benchmarks.blocks import Block
from memplan.core.errors import (
    MemplanWarning,
)
from memplan.planner.measure import measure_peak


def test_a_module_called_twice_before_its_backward_is_planned_again_for_the_first_call() -> None:
    """An encoder compiled on its own and called on two inputs before one backward (a
    siamese network) holds its first call's saved tensors while the second runs: no
    compile sees that, and the first step peaks over the budget. It warns, with the bytes
    held, and its second call runs the least-memory plan: the first step peaks lower than
    eager's (it did not before), though over the budget, its first call having kept what
    the first plan keeps. At the next step the graph is planned again for them, and the
    step holds the budget, with eager's gradients. Accumulating gradients (each call's
    backward before the next call) and graph breaks (test above) do not warn."""
    torch.manual_seed(0)
    layers = [m for _ in range(4) for m in (torch.nn.Linear(128, 128), torch.nn.GELU())]
    encoder = torch.nn.Sequential(*layers, torch.nn.Linear(128, 8))
    first, second = torch.randn(1024, 128), torch.randn(1024, 128)

    def siamese_step(model: torch.nn.Module) -> Callable[[], None]:
        def step() -> None:
            model.zero_grad(set_to_none=True)
            (model(first) * model(second)).mean().backward()

        return step

    cpu = torch.device("cpu")
    resident = [*encoder.parameters(), first, second]
    eager = measure_peak(siamese_step(encoder), resident=resident, device=cpu)
    budget = int(0.7 * eager.peak_bytes)
    expected = [p.grad.clone() for p in encoder.parameters() if p.grad is not None]
    torch._dynamo.reset()
    model = copy.deepcopy(encoder)
    backend = memplan.backend(budget=budget, progress=False)
    compiled = torch.compile(model, backend=backend)
    with warnings.catch_warnings():
        warnings.simplefilter("error", MemplanWarning)
        for x in (first, second, first):
            compiled(x).square().mean().backward()
    step = siamese_step(compiled)
    with pytest.warns(MemplanWarning, match=r"graph0\S* ran while earlier calls still held"):
        first_step = measure_peak(step, resident=[*model.parameters(), first, second], device=cpu)
    with warnings.catch_warnings():
        warnings.simplefilter("error", MemplanWarning)
        step()  # planned again
        measured = measure_peak(step, resident=[*model.parameters(), first, second], device=cpu)
    assert measured.peak_bytes <= budget, (measured.peak_bytes, budget)
    unplanned, least, again = backend.plans
    assert least.name.startswith("graph0 (least, for the step)")
    # Its second call saved at least half of what the least plan saves on a call (without
    # it, step 1 peaked as eager's, 10.30 MB: 32 bytes under).
    saved = unplanned.peak - least.peak
    assert first_step.peak_bytes < eager.peak_bytes - saved // 2, (first_step, eager, saved)
    assert least.counts()["recompute"] >= again.counts()["recompute"]
    assert again.resident > 0 and again.counts()["recompute"] > unplanned.counts()["recompute"]
    for grad, want in zip((p.grad for p in model.parameters()), expected, strict=True):
        torch.testing.assert_close(grad, want, rtol=1e-4, atol=1e-5)


def test_a_plan_made_for_what_an_evaluation_kept_says_it_is_over_on_its_own() -> None:
    """An evaluation's output, kept with its gradients through the next training steps,
    holds what that call saved: the training graph warns of it, and is planned again for
    it. At 70% (under the graph's least) that plan is its least, over its budget on its
    own; once the output is gone, the warning says so, where it said the step was over
    because earlier calls "still held 0 B" (2-core CPU, 2026-12-01)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(256, 512),
        torch.nn.ReLU(),
        torch.nn.Dropout(0.1),
        torch.nn.Linear(512, 512),
        torch.nn.GELU(),
        torch.nn.BatchNorm1d(512),
        torch.nn.Linear(512, 10),
    )
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=memplan.backend(budget="70%", progress=False))
    x = torch.randn(128, 256)

    def step() -> None:
        compiled(x).square().mean().backward()

    with warnings.catch_warnings():  # each graph's budget is under its least
        warnings.simplefilter("ignore", MemplanWarning)
        step()
        model.eval()
        kept = compiled(x)
        model.train()
    with pytest.warns(MemplanWarning) as said:
        step()
        step()
        del kept
        step()
        step()
    messages = [str(w.message) for w in said]
    assert any("ran while earlier calls still held" in m for m in messages), messages
    assert not any("still held 0 B" in m for m in messages), messages
    (own,) = [m for m in messages if "held by earlier calls" in m]
    assert own.startswith("graph0 (with") and "with the 0 B they hold now" in own


def test_each_block_compiled_alone_is_planned_again_for_every_block_before_it() -> None:
    """Regional compilation: each of twelve blocks compiled alone under one backend, one
    graph serving the later blocks. Dynamo compiles it as a recompile of the first
    block's frame, for other parameters: it joins the step, planned with what the first
    block holds. The watch sees every block's call, and the graph is planned again with
    what the eleven blocks before the last hold: under the first plans (one of four
    activations recomputed) each keeps three activations of its input's size, and a
    watch that saw nine blocks or fewer would find less."""
    torch.manual_seed(0)
    width, batch, count = 64, 512, 12
    blocks = torch.nn.ModuleList(Block(width) for _ in range(count))
    x = torch.randn(batch, width)
    torch._dynamo.reset()
    backend = memplan.backend(budget="70%", progress=False)
    for block in blocks:
        block.compile(backend=backend)

    def step() -> None:
        y = x
        for block in blocks:
            y = block(y)
        y.square().mean().backward()

    with pytest.warns(MemplanWarning) as said:  # 70% of two blocks' step is under the least
        step()
    assert any("ran while earlier calls still held" in str(w.message) for w in said)
    first, later, least = backend.plans  # the later blocks of step 1 ran the least plan
    assert first.resident == 0 and later.resident == first.held > 0
    assert least.name.startswith(f"{later.name} (least, for the step)")
    step()  # planned again
    again = backend.plans[-1]
    assert "held" in again.name
    assert again.resident >= 3 * (count - 1) * x.nbytes
