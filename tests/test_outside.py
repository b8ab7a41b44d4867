"""What a step holds outside its graphs (planner/outside.py), and a budget that counts it:
the optimizer's state as its first step makes it, a budget below it refused in one line,
and each graph planned for the budget less it (planner/plan.Resident)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

import memplan
from memplan.core.budget import Budget
from memplan.core.errors import BudgetError, MemplanError
from memplan.planner.outside import Outside, check_room, optimizer_state_bytes, outside_of
from memplan.planner.plan import Resident

CPU = torch.device("cpu")
MiB = 2**20


class _MLP(torch.nn.Module):
    """Two layers, the first's bias frozen: an optimizer keeps no state for it."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = torch.nn.Sequential(
            torch.nn.Linear(64, 128), torch.nn.GELU(), torch.nn.Linear(128, 8)
        )
        self.body[0].bias.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


def _model() -> torch.nn.Module:
    return _MLP()


def _stepped_state(optimizer: torch.optim.Optimizer, model: torch.nn.Module) -> int:
    """The bytes of the state `optimizer` holds after one step of `model`, its per-tensor
    step counters (0-dim, on the CPU unless fused or capturable) left out."""
    model(torch.randn(4, 64)).sum().backward()
    optimizer.step()
    tensors = [t for state in optimizer.state.values() for t in state.values()]
    return sum(t.nbytes for t in tensors if isinstance(t, torch.Tensor) and t.dim())


MAKERS: dict[str, Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer]] = {
    "adamw": lambda p: torch.optim.AdamW(p),
    "adam amsgrad": lambda p: torch.optim.Adam(p, amsgrad=True),
    "sgd momentum": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
    "sgd": lambda p: torch.optim.SGD(p, lr=0.1),
    "adagrad": lambda p: torch.optim.Adagrad(p),  # a kind memplan counts as it holds
}


@pytest.mark.parametrize("kind", MAKERS)
def test_the_state_counted_before_the_first_step_is_what_that_step_makes(kind: str):
    model = _model()
    trainable = [p for p in model.parameters() if p.requires_grad]
    optimizer = MAKERS[kind](list(model.parameters()))
    before = optimizer_state_bytes(optimizer, model.parameters(), CPU)
    after = _stepped_state(optimizer, model)
    if kind == "adagrad":  # held from the start, its 0-dim step counters included
        assert after < before <= after + 64 * len(trainable)
    else:
        assert before == after
    assert (before > 0) == (kind != "sgd")
    assert before <= 3 * sum(p.nbytes for p in trainable)
    # Once it has stepped, the state it holds is counted: its 0-dim step counters too.
    counted = optimizer_state_bytes(optimizer, model.parameters(), CPU)
    assert after <= counted <= after + 64 * len(trainable)


def test_a_kind_by_name_counts_its_copies_of_the_trainable_parameters():
    model = _model()
    trainable = sum(p.nbytes for p in model.parameters() if p.requires_grad)
    assert optimizer_state_bytes("adamw", model.parameters(), CPU) == 2 * trainable
    assert optimizer_state_bytes("SGD", model.parameters(), CPU) == trainable
    assert optimizer_state_bytes(None, model.parameters(), CPU) == 0
    outside = outside_of("adam", list(model.parameters()), list(model.parameters()), CPU)
    assert outside == Outside(optimizer_state=2 * trainable)  # no allocator read on a CPU


@pytest.mark.parametrize("optimizer", ["lamb", 3])
def test_an_optimizer_memplan_cannot_read_is_refused_in_one_line(optimizer: object):
    with pytest.raises(MemplanError) as raised:
        memplan.backend(budget="1MiB", optimizer=optimizer)
    message = str(raised.value)
    assert "\n" not in message
    assert message.startswith("optimizer must be a torch.optim.Optimizer or one of adamw")


def test_a_budget_not_above_what_is_outside_is_refused_naming_both():
    outside = Outside(optimizer_state=3 * MiB)
    with pytest.raises(BudgetError) as raised:
        check_room(Budget.parse("2MiB"), outside)
    message = str(raised.value)
    assert "\n" not in message and "2.00 MiB" in message and "3.00 MiB" in message
    check_room(Budget.parse("4MiB"), outside)  # above it: planned
    check_room(Budget.parse("10%"), outside)  # a share is of a peak that counts it


def test_memplan_optimize_refuses_such_a_budget_before_planning():
    model = _model()
    with pytest.raises(BudgetError, match="optimizer state"):
        memplan.optimize(model, (torch.randn(4, 64),), budget="40KiB", optimizer="adamw")


def test_a_graph_is_planned_for_the_budget_less_what_is_outside():
    budget, share = Budget.parse("10MiB"), Budget.parse("50%")
    resident = Resident(held=MiB, later=MiB, outside=3 * MiB)
    assert resident.budget_of(budget, unplanned_peak=20 * MiB) == 5 * MiB
    # A share is of the step's unplanned peak, which holds what is outside too.
    assert resident.step_unplanned(8 * MiB) == 11 * MiB
    assert resident.budget_of(share, unplanned_peak=8 * MiB) == MiB // 2


def test_memplan_optimize_plans_within_the_budget_with_the_optimizer_state_beside():
    model = _model()
    optimizer = torch.optim.AdamW(model.parameters())
    x = (torch.randn(256, 64),)
    planned = memplan.optimize(model, x, budget="600KiB", optimizer=optimizer, progress=False)
    plan = planned.plan
    assert plan.outside == _stepped_state(optimizer, model) > 0
    assert plan.requested_budget == 600 * 1024 - plan.outside
    assert plan.step_peak == plan.predicted_peak + plan.outside <= 600 * 1024


def test_master_weights_beside_a_bf16_model_are_counted_with_their_gradients():
    model = _model().to(torch.bfloat16)
    trainable = [p for p in model.parameters() if p.requires_grad]
    masters = [p.detach().float() for p in trainable]  # no module's: outside the graph
    for master in masters:
        master.grad = torch.zeros_like(master)
    optimizer = torch.optim.AdamW(masters)
    inputs = [*model.parameters(), torch.randn(4, 64, dtype=torch.bfloat16)]
    outside = outside_of(optimizer, masters, inputs, CPU)
    fp32 = sum(m.nbytes for m in masters)
    assert fp32 == 2 * sum(p.nbytes for p in trainable)
    assert outside == Outside(optimizer_state=2 * fp32, masters=2 * fp32)
    assert "master weights" in outside.describe()


def test_state_an_optimizer_makes_unforeseen_is_planned_for_at_the_next_step():
    """RMSprop, a kind memplan does not foresee, makes its state at its first step: the
    first graph's next call reads it, and the step is planned again with it outside."""
    torch._dynamo.reset()
    model = _model()
    optimizer = torch.optim.RMSprop(model.parameters())
    backend = memplan.backend(budget="1MiB", optimizer=optimizer, progress=False)
    model.compile(backend=backend)
    x = torch.randn(256, 64)
    for _ in range(3):
        model(x).sum().backward()
        optimizer.step()
        optimizer.zero_grad()
    first, *again = backend.plans
    assert first.outside == 0 and again
    # Its square averages, one per trainable parameter, and a 0-dim step counter each.
    tensors = [t for state in optimizer.state.values() for t in state.values()]
    made = sum(t.nbytes for t in tensors if t.dim())
    assert made == sum(p.nbytes for p in model.parameters() if p.requires_grad)
    assert made <= again[-1].outside == backend.outside.total <= made + 64 * 3
    assert again[-1].requested_budget == first.requested_budget - again[-1].outside
