"""On a GPU: the end-to-end checks, read with max_memory_allocated; offload lowering the
device peak; and torch.compile as users run it (inductor, the transfer ops on the copy
stream, changing shapes, graph breaks under one budget), by the CPU tests' own checks.
Skipped where CUDA is not available (the CPU runs are in test_e2e.py and test_compile.py).
"""

from __future__ import annotations

import pytest
import torch
from test_compile import (
    _gpt2,
    check_changing_shapes,
    check_inductor_within_budget,
    check_offload_plan_under_inductor,
    check_three_graph_breaks,
    check_transfer_ops,
)
from test_e2e import example_of

import memplan
from memplan.tools.verify import verify
from memplan.tools.zoo import ZOO

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
MODELS = ["mlp", "cnn", "gpt2", "bert", "vit", "resnet"]
CUDA = torch.device("cuda")


@pytest.mark.parametrize("name", MODELS)
def test_planned_step_on_gpu_matches_eager_and_prediction(name: str) -> None:
    example = ZOO[name]().to(CUDA)
    for budget in ["100%", "70%", "50%"]:
        plan = memplan.plan(example.model, example.inputs, budget=budget, progress=False)
        check = verify(example.model, example.inputs, plan)
        assert check.method == "cuda"
        assert check.ok, (budget, check.problems())


@pytest.mark.parametrize("name", ["gpt2", "resnet"])
def test_offload_lowers_the_device_peak(name: str) -> None:
    example = ZOO[name]().to(CUDA)
    plan = memplan.plan(
        example.model,
        example.inputs,
        budget="50%",
        offload=True,
        offload_threshold=0,
        progress=False,
    )
    assert plan.counts()["offload"] > 0
    check = verify(example.model, example.inputs, plan)
    assert check.ok, check.problems()
    assert check.measured_peak < check.eager_peak


@pytest.mark.parametrize("name", ["mlp", "gpt2", "resnet"])
def test_inductor_on_gpu_trains_like_eager_within_the_budget(name: str) -> None:
    check_inductor_within_budget(example_of(name).to(CUDA))


def test_transfer_ops_on_the_copy_stream_under_inductor_and_export() -> None:
    check_transfer_ops(CUDA)


def test_inductor_runs_an_offload_plan_on_gpu() -> None:
    check_offload_plan_under_inductor(example_of("mlp").to(CUDA))


def test_changing_shapes_on_gpu_train_like_eager() -> None:
    check_changing_shapes(_gpt2().to(CUDA))


def test_three_graph_breaks_hold_one_budget_on_gpu() -> None:
    check_three_graph_breaks(CUDA)
