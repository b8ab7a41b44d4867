"""End to end on real models: planned gradients equal eager's, and the peak read from the
allocator (what an out-of-memory error counts, kernels' own buffers included) is within
the budget and within 2% of the simulator's prediction."""

from __future__ import annotations

import copy
import itertools
import math

import pytest
import torch

import memplan
from memplan.core.budget import Budget
from memplan.core.errors import InfeasibleBudget
from memplan.planner.measure import measure_peak
from memplan.tools.verify import steady_step_peak
from memplan.tools.zoo import ZOO, Example

# The zoo's models at sizes where half the unplanned peak can be met and a step is quick.
SIZES: dict[str, dict[str, int]] = {
    "mlp": {},
    "cnn": {"batch": 16, "blocks": 6},
    "gpt2": {},
    "bert": {},
    "vit": {},
    "resnet": {},  # its least feasible peak is 58% of the unplanned one: 50% is refused
    "resnet50": {"batch": 16, "width": 8},
    "llama": {},
    "convnext": {"batch": 32},
}
MODELS = list(SIZES)
TOLERANCE = 0.02  # measured peak vs predicted, as a fraction of the prediction
CPU = torch.device("cpu")


def example_of(name: str) -> Example:
    return ZOO[name](**SIZES[name])


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


def least_budget(example: Example) -> int:
    """The smallest feasible budget InfeasibleBudget names for a 1-byte one."""
    with pytest.raises(InfeasibleBudget) as info:
        memplan.optimize(copy.deepcopy(example.model), example.inputs, "1 B", progress=False)
    return info.value.smallest_feasible


# The default run keeps one model of each kind (MLP, CNN, ResNet, GPT-2); the others take
# 20-45 s each here, ResNet-50 over two minutes: they run with the slow tests (`make bench`
# runs those) and in the benchmarks (benchmarks.models, benchmarks.inductor_peaks).
DEFAULT_MODELS = ("mlp", "cnn", "resnet", "gpt2")


def default_or_slow(names: list[str], default: tuple[str, ...] = DEFAULT_MODELS) -> list[object]:
    """`names` as parameters, those outside `default` marked slow."""
    return [n if n in default else pytest.param(n, marks=pytest.mark.slow) for n in names]


@pytest.mark.parametrize("name", default_or_slow(MODELS))
def test_the_budget_holds_by_the_allocator(name: str) -> None:
    example = example_of(name)
    expected = eager_grads(example)
    least = least_budget(example)
    for budget in ["90%", "70%", "50%", least]:
        model = copy.deepcopy(example.model)
        try:
            planned = memplan.optimize(model, example.inputs, budget=budget, progress=False)
        except InfeasibleBudget as refused:
            # Which descent of the greedy reaches lowest depends on the profiled times, so
            # the least feasible peak moves a little between machines: ViT's sits just above
            # 50% on some. A refusal must name a least peak above the budget it refuses.
            assert budget == "50%", (budget, refused)
            assert refused.smallest_feasible > refused.budget
            continue
        assert not (budget == "50%" and name == "resnet"), "ResNet's least is 58%: 50% must fail"
        plan = planned.plan
        measured = steady_step_peak(planned, model, example.inputs)  # leaves one step's grads
        assert_grads_equal(model, expected)
        assert plan.predicted_peak <= plan.budget == plan.requested_budget
        assert measured <= plan.budget, (budget, measured, plan.budget)
        assert abs(measured - plan.predicted_peak) <= TOLERANCE * plan.predicted_peak, (
            budget,
            measured,
            plan.predicted_peak,
        )
        if budget == "50%":
            assert plan.counts()["recompute"] > 0
            assert plan.budget == math.ceil(0.5 * plan.unplanned_peak)  # shares round up


# GPT-2's twenty budgets take over a minute here: it runs with the slow tests.
@pytest.mark.parametrize("name", ["cnn", pytest.param("gpt2", marks=pytest.mark.slow)])
def test_a_lower_budget_never_raises_the_measured_peak(name: str) -> None:
    """Every 5% from the unplanned peak down to the least feasible budget, and that: the
    allocator's peak never rises as the budget falls."""
    example = example_of(name)
    least = least_budget(example)
    unplanned = memplan.plan(
        copy.deepcopy(example.model), example.inputs, "100%", progress=False
    ).unplanned_peak
    budgets = [b for b in (math.ceil(s / 100 * unplanned) for s in range(100, 0, -5)) if b > least]
    peaks = []
    for budget in [*budgets, least]:
        model = copy.deepcopy(example.model)
        planned = memplan.optimize(model, example.inputs, Budget(bytes=budget), progress=False)
        peaks.append(steady_step_peak(planned, model, example.inputs))
        assert peaks[-1] <= budget
    assert len(peaks) >= 5
    assert all(lower <= higher for higher, lower in itertools.pairwise(peaks)), peaks


# Every solver of the training problem that takes a budget (greedy, the default, is
# above), with a budget it reaches on these six models at the zoo's default sizes.
# chain_dp and linear checkpoint only at cut points of the forward chain, and the
# director's ranking stops short of greedy on some models, so 50% is out of their reach
# on some (docs/training-solvers.md has each solver's least peak); the convolutions' own
# buffers keep the CNN's and ResNet's least peaks above half of their unplanned ones.
SOLVER_BUDGETS = [
    ("chain_dp", "60%"),
    ("linear", "70%"),
    ("director", "70%"),
    ("milp", "60%"),
    ("cpsat", "60%"),
]


# Each solve's time limit. milp finds its first schedule within ResNet's 60% in 5 to 10 s
# on a 2-core CPU alone; at 10 s, beside another test, it found none and greedy stood in.
SOLVER_SECONDS = 30
SOLVER_MODELS = ["mlp", "cnn", "gpt2", "bert", "vit", "resnet"]
# The CNN's five take a minute here (the director's 35 s): ResNet has its convolutions.
SOLVER_DEFAULT_MODELS = ("mlp", "gpt2", "resnet")


@pytest.mark.parametrize(("solver", "budget"), SOLVER_BUDGETS)
@pytest.mark.parametrize("name", default_or_slow(SOLVER_MODELS, SOLVER_DEFAULT_MODELS))
def test_every_solver_trains_the_models_within_its_budget(
    name: str, solver: str, budget: str
) -> None:
    """Each solver through the pipeline: eager's gradients, the allocator's peak within
    the budget and within 2% of the prediction."""
    example = ZOO[name]()
    expected = eager_grads(example)
    model = copy.deepcopy(example.model)
    planned = memplan.optimize(
        model,
        example.inputs,
        budget=budget,
        solver=solver,
        time_limit=SOLVER_SECONDS,
        progress=False,
    )
    measured = steady_step_peak(planned, model, example.inputs)  # leaves one step's grads
    assert_grads_equal(model, expected)
    plan = planned.plan
    assert plan.solver == solver, plan.note
    assert plan.budget == plan.requested_budget == Budget.parse(budget).resolve(plan.unplanned_peak)
    assert measured <= plan.budget, (measured, plan.budget)
    assert abs(measured - plan.predicted_peak) <= TOLERANCE * plan.predicted_peak


def test_offload_on_cpu_keeps_numerics_and_moves_bytes_to_host() -> None:
    example = ZOO["cnn"]()
    expected = eager_grads(example)
    model = copy.deepcopy(example.model)
    planned = memplan.optimize(
        model, example.inputs, budget="50%", offload=True, offload_threshold=0, progress=False
    )
    assert planned.plan.counts()["offload"] > 0
    tracked = measure_peak(
        train_step(planned, example.inputs),
        resident=resident(model, example.inputs),
        device=CPU,
        method="tracker",
    ).peak_bytes
    assert_grads_equal(model, expected)
    # Host copies are not device memory, but on CPU they come from the same allocator as
    # the step's tensors: the allocator counts them, the prediction does not. The tracker,
    # told which storages are host copies, leaves them out, but it misses the kernels' own
    # buffers, which the prediction holds. So the prediction lies between the two.
    measured = steady_step_peak(planned, model, example.inputs)
    assert tracked <= planned.plan.predicted_peak <= measured


def test_a_planned_module_s_backward_may_retain_the_graph() -> None:
    """`loss.backward(retain_graph=True)`, then `loss.backward()` on the module
    memplan.optimize returns: the gradients, accumulated twice, are eager's. Before, the
    first backward raised that the backward was compiled with donated buffers."""
    example = ZOO["mlp"](batch=256)
    model, reference = copy.deepcopy(example.model), copy.deepcopy(example.model)
    planned = memplan.optimize(model, example.inputs, budget="70%", progress=False)
    assert planned.plan.counts()["recompute"] > 0
    for run in (planned, reference):
        loss = run(*example.inputs)
        loss.backward(retain_graph=True)
        loss.backward()
    assert_grads_equal(model, {n: p.grad for n, p in reference.named_parameters()})


@pytest.mark.parametrize("name", default_or_slow(["mlp", "cnn", "gpt2", "convnext"]))
def test_torch_compile_runs_the_same_plan_as_the_api(name: str) -> None:
    """Through torch.compile the same plans come out and use memory exactly as through
    the API: the allocator reads the compiled step at the API step's peak, within the
    budget and within 2% of the prediction."""
    example = example_of(name)
    expected = eager_grads(example)
    for budget in ["70%", least_budget(example)]:
        torch._dynamo.reset()
        # The eager runner runs the graphs as planned, as the API does (no fusion).
        backend = memplan.backend(budget=budget, inner="eager", progress=False)
        compiled_model = copy.deepcopy(example.model)
        compiled = torch.compile(compiled_model, backend=backend)
        train_step(compiled, example.inputs)()  # compiles and plans
        assert_grads_equal(compiled_model, expected)
        (plan,) = backend.plans  # one graph: no graph break, no recompile

        api_model = copy.deepcopy(example.model)
        planned = memplan.optimize(api_model, example.inputs, budget=budget, progress=False)
        assert plan.decisions == planned.plan.decisions
        assert plan.predicted_peak == planned.plan.predicted_peak <= plan.budget
        measured = steady_step_peak(compiled, compiled_model, example.inputs)
        assert measured == steady_step_peak(planned, api_model, example.inputs), budget
        assert measured <= plan.budget, (budget, measured, plan.budget)
        assert abs(measured - plan.predicted_peak) <= TOLERANCE * plan.predicted_peak


def test_torch_compile_finds_the_backend_by_name() -> None:
    example = ZOO["mlp"](batch=256)  # small: the name and the options are tested
    expected = eager_grads(example)
    torch._dynamo.reset()
    by_name = copy.deepcopy(example.model)
    options = {"budget": "70%", "progress": False}
    train_step(torch.compile(by_name, backend="memplan", options=options), example.inputs)()
    assert_grads_equal(by_name, expected)
