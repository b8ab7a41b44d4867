"""On a GPU: the end-to-end checks, read with max_memory_allocated, and offload lowering the
device peak. Skipped where CUDA is not available (the CPU runs are in test_e2e.py)."""

from __future__ import annotations

import pytest
import torch

import memplan
from memplan.tools.verify import verify
from memplan.tools.zoo import ZOO, Example

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
MODELS = ["mlp", "cnn", "gpt2", "bert", "vit", "resnet"]


def on_gpu(example: Example) -> Example:
    cuda = torch.device("cuda")
    inputs = tuple(x.to(cuda) for x in example.inputs)
    return Example(example.name, example.model.to(cuda), inputs)


@pytest.mark.parametrize("name", MODELS)
def test_planned_step_on_gpu_matches_eager_and_prediction(name: str) -> None:
    example = on_gpu(ZOO[name]())
    for budget in ["100%", "70%", "50%"]:
        plan = memplan.plan(example.model, example.inputs, budget=budget, progress=False)
        check = verify(example.model, example.inputs, plan)
        assert check.method == "cuda"
        assert check.ok, (budget, check.problems())


@pytest.mark.parametrize("name", ["gpt2", "resnet"])
def test_offload_lowers_the_device_peak(name: str) -> None:
    example = on_gpu(ZOO[name]())
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
