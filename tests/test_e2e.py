"""End to end on real models: planned gradients equal eager's, and the measured peak is
within the budget and within 5% of the simulator's prediction."""

from __future__ import annotations

import copy
import math

import pytest
import torch

import memplan
from memplan.budget import Budget
from memplan.errors import InfeasibleBudget
from memplan.planner.measure import measure_peak
from memplan.tools.zoo import ZOO, Example

MODELS = ["mlp", "cnn", "gpt2", "bert", "vit", "resnet"]
CPU = torch.device("cpu")


def train_step(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...]):
    def step() -> None:
        model(*inputs).backward()

    return step


def resident(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> list[torch.Tensor]:
    return [*model.parameters(), *model.buffers(), *inputs]


def eager_grads(example: Example) -> dict[str, torch.Tensor]:
    model = copy.deepcopy(example.model)
    train_step(model, example.inputs)()
    return {n: p.grad for n, p in model.named_parameters() if p.grad is not None}


def assert_grads_equal(model: torch.nn.Module, expected: dict[str, torch.Tensor]) -> None:
    got = {n: p.grad for n, p in model.named_parameters() if p.grad is not None}
    assert got.keys() == expected.keys()
    for name, grad in expected.items():
        torch.testing.assert_close(got[name], grad, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize("name", MODELS)
def test_planned_step_matches_eager_and_prediction(name: str) -> None:
    example = ZOO[name]()
    expected = eager_grads(example)
    with pytest.raises(InfeasibleBudget) as info:
        memplan.optimize(copy.deepcopy(example.model), example.inputs, budget="1 B", progress=False)
    smallest = info.value.smallest_feasible
    assert smallest > 1

    for budget in ["100%", "70%", "50%", smallest]:
        model = copy.deepcopy(example.model)
        planned = memplan.optimize(model, example.inputs, budget=budget, progress=False)
        plan = planned.plan
        measured = measure_peak(
            train_step(planned, example.inputs),
            resident=resident(model, example.inputs),
            device=CPU,
        ).peak_bytes
        assert_grads_equal(model, expected)
        assert plan.predicted_peak <= plan.budget
        assert measured <= plan.budget, (budget, measured, plan.budget)
        assert abs(measured - plan.predicted_peak) <= 0.05 * plan.predicted_peak, (
            budget,
            measured,
            plan.predicted_peak,
        )
        if budget == "50%":
            assert plan.counts()["recompute"] > 0
            assert plan.budget == math.ceil(0.5 * plan.unplanned_peak)  # shares round up


# Every solver of the training problem that takes a budget (greedy, the default, is
# above), with a budget it reaches on all six models. chain_dp and linear checkpoint only
# at cut points of the forward chain (on ResNet linear's least peak is 58% of eager's,
# chain_dp's 50%), and the director's ranking stops short of greedy on some models, so 50%
# is out of their reach on some (docs/training-solvers.md has each solver's least peak).
SOLVER_BUDGETS = [
    ("chain_dp", "60%"),
    ("linear", "70%"),
    ("director", "70%"),
    ("milp", "50%"),
    ("cpsat", "50%"),
]


@pytest.mark.parametrize(("solver", "budget"), SOLVER_BUDGETS)
@pytest.mark.parametrize("name", MODELS)
def test_every_solver_trains_the_models_within_its_budget(
    name: str, solver: str, budget: str
) -> None:
    """Each solver through the pipeline: eager's gradients, measured peak within the
    budget and within 5% of the prediction."""
    example = ZOO[name]()
    expected = eager_grads(example)
    model = copy.deepcopy(example.model)
    planned = memplan.optimize(
        model, example.inputs, budget=budget, solver=solver, time_limit=10, progress=False
    )
    measured = measure_peak(
        train_step(planned, example.inputs), resident=resident(model, example.inputs), device=CPU
    ).peak_bytes
    assert_grads_equal(model, expected)
    plan = planned.plan
    assert plan.solver == solver
    assert plan.budget == plan.requested_budget == Budget.parse(budget).resolve(plan.unplanned_peak)
    assert measured <= plan.budget, (measured, plan.budget)
    assert abs(measured - plan.predicted_peak) <= 0.05 * plan.predicted_peak


def test_offload_on_cpu_keeps_numerics_and_moves_bytes_to_host() -> None:
    example = ZOO["cnn"]()
    expected = eager_grads(example)
    model = copy.deepcopy(example.model)
    planned = memplan.optimize(
        model, example.inputs, budget="50%", offload=True, offload_threshold=0, progress=False
    )
    assert planned.plan.counts()["offload"] > 0
    measured = measure_peak(
        train_step(planned, example.inputs), resident=resident(model, example.inputs), device=CPU
    ).peak_bytes
    assert_grads_equal(model, expected)
    # Host copies are not device memory: the tracker leaves them out, as the simulator does.
    assert abs(measured - planned.plan.predicted_peak) <= 0.05 * planned.plan.predicted_peak


def allocator_peak(model: torch.nn.Module, run: torch.nn.Module, example: Example) -> int:
    for p in model.parameters():
        p.grad = None
    return measure_peak(
        train_step(run, example.inputs),
        resident=resident(model, example.inputs),
        device=CPU,
        method="allocator",
    ).peak_bytes


@pytest.mark.parametrize("name", MODELS)
def test_torch_compile_runs_the_same_plan_as_the_api(name: str) -> None:
    """Through torch.compile the same plans come out and use memory exactly as through
    the API, whose tracker readings the test above holds to the budget and prediction.

    A compiled model runs eagerly under a dispatch mode, so the compiled step is read by
    the allocator, which also sees kernel scratch buffers (the CPU convolution's unfolded
    input): hence compare it with the API step read the same way, and, on the models
    without such scratch, with the prediction directly.
    """
    example = ZOO[name]()
    expected = eager_grads(example)
    with pytest.raises(InfeasibleBudget) as info:
        memplan.optimize(copy.deepcopy(example.model), example.inputs, budget="1 B", progress=False)
    for budget in ["100%", "70%", "50%", info.value.smallest_feasible]:
        torch._dynamo.reset()
        backend = memplan.backend(budget=budget, progress=False)
        compiled_model = copy.deepcopy(example.model)
        compiled = torch.compile(compiled_model, backend=backend)
        train_step(compiled, example.inputs)()  # compiles and plans
        assert_grads_equal(compiled_model, expected)
        (plan,) = backend.plans  # one graph: no graph break, no recompile

        api_model = copy.deepcopy(example.model)
        planned = memplan.optimize(api_model, example.inputs, budget=budget, progress=False)
        assert plan.decisions == planned.plan.decisions
        assert plan.predicted_peak == planned.plan.predicted_peak <= plan.budget
        measured = allocator_peak(compiled_model, compiled, example)
        assert measured == allocator_peak(api_model, planned, example), budget
        if name not in ("cnn", "resnet"):
            assert measured <= plan.budget, (budget, measured, plan.budget)
            assert abs(measured - plan.predicted_peak) <= 0.05 * plan.predicted_peak


def test_torch_compile_finds_the_backend_by_name() -> None:
    example = ZOO["bert"]()
    expected = eager_grads(example)
    torch._dynamo.reset()
    by_name = copy.deepcopy(example.model)
    options = {"budget": "70%", "progress": False}
    train_step(torch.compile(by_name, backend="memplan", options=options), example.inputs)()
    assert_grads_equal(by_name, expected)


class TwoGraphs(torch.nn.Module):
    """Two MLPs with a graph break between them: Dynamo hands over two graphs."""

    def __init__(self, width: int = 64, depth: int = 16) -> None:
        super().__init__()
        layers = [m for _ in range(depth) for m in (torch.nn.Linear(width, width), torch.nn.GELU())]
        self.first = torch.nn.Sequential(*layers[:depth])
        self.second = torch.nn.Sequential(*layers[depth:])

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        hidden = self.first(x)
        torch._dynamo.graph_break()
        return self.second(hidden).square().mean()


def test_torch_compile_with_a_graph_break_plans_each_graph() -> None:
    torch.manual_seed(0)
    example = Example("two_graphs", TwoGraphs(), (torch.randn(4096, 64),))
    expected = eager_grads(example)
    torch._dynamo.reset()
    backend = memplan.backend(budget="60%", progress=False)
    model = copy.deepcopy(example.model)
    train_step(torch.compile(model, backend=backend), example.inputs)()
    assert len(backend.plans) == 2  # one plan per graph
    for plan in backend.plans:
        assert plan.predicted_peak <= plan.budget <= 0.6 * plan.unplanned_peak + 1
    assert_grads_equal(model, expected)
