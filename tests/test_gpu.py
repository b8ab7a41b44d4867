"""On a GPU: the end-to-end checks, read with max_memory_allocated; offload lowering the
device peak; and torch.compile as users run it (inductor, the transfer ops on the copy
stream, changing shapes, graph breaks under one budget), by the CPU tests' own checks.
Skipped where CUDA is not available (the CPU runs: test_e2e.py, test_compile_*.py).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator

import pytest
import torch
from compile_support import max_grad_errors, small_gpt2
from test_compile_breaks import check_three_graph_breaks
from test_compile_numerics import (
    check_inductor_within_budget,
    check_offload_plan_under_inductor,
    check_transfer_ops,
)
from test_compile_shapes import check_changing_shapes
from test_e2e import eager_grads, example_of, train_step
from test_verify import check_blocks_live_at_peak

import memplan
from memplan.tools.verify import Verification, verify
from memplan.tools.zoo import ZOO, Example

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
MODELS = ["mlp", "cnn", "gpt2", "bert", "vit", "resnet"]
CUDA = torch.device("cuda")


@pytest.fixture(autouse=True)
def full_precision_convolutions() -> Iterator[None]:
    """cuDNN runs float32 convolutions in TF32 by default (matrix products it leaves in
    float32): rounded to 10 bits, a planned step and eager's differ by the choice of
    kernel, not by the plan. The checks compare the plan's numerics, in float32."""
    before = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = False
    yield
    torch.backends.cudnn.allow_tf32 = before


def traced_error(example: Example) -> float:
    """Twice the largest distance of the step AOTAutograd traces, run eagerly ("aot_eager"),
    from eager's gradients (or 1e-6). On a GPU the traced graph may run other kernels than
    eager does (batch norm's, say), reducing in another order: a plan must add nothing to
    that, but cannot remove it."""
    expected = eager_grads(example)
    torch._dynamo.reset()
    model = copy.deepcopy(example.model)
    train_step(torch.compile(model, backend="aot_eager"), example.inputs)()
    return max(2 * max(max_grad_errors(model, expected)), 1e-6)


def check_planned(example: Example, plan: memplan.Plan) -> Verification:
    """The planned step against eager's: on the GPU's allocator, within the budget and the
    prediction's tolerance, with eager's gradients (or as near as the traced step is)."""
    check = verify(example.model, example.inputs, plan)
    assert check.method == "cuda"
    assert check.within_budget, check.problems()
    assert abs(check.prediction_error) <= check.tolerance, check.problems()
    if not check.grads_match:
        assert check.max_grad_error <= traced_error(example), check.problems()
    return check


@pytest.mark.parametrize("name", MODELS)
def test_planned_step_on_gpu_matches_eager_and_prediction(name: str) -> None:
    example = ZOO[name]().to(CUDA)
    # ResNet's least is 58% of its unplanned peak on CPU: 50% is refused.
    for budget in ["100%", "70%", "65%" if name == "resnet" else "50%"]:
        plan = memplan.plan(example.model, example.inputs, budget=budget, progress=False)
        check_planned(example, plan)


# On an H100 recomputing these small models is faster than any host link: given the
# link's real speed, greedy offloads nothing. An (unreal) link of 10 TB/s makes offloads
# the cheaper choice, so that they run and lower the peak; the peak does not depend on it.
@pytest.mark.parametrize(("name", "budget"), [("gpt2", "50%"), ("resnet", "65%")])
def test_offload_lowers_the_device_peak(name: str, budget: str) -> None:
    example = ZOO[name]().to(CUDA)
    plan = memplan.plan(
        example.model,
        example.inputs,
        budget=budget,
        offload=True,
        bandwidth=1e13,
        offload_threshold=0,
        progress=False,
    )
    assert plan.counts()["offload"] > 0
    check = check_planned(example, plan)
    assert check.measured_peak < check.eager_peak


@pytest.mark.parametrize("name", ["mlp", "gpt2", "resnet"])
def test_inductor_on_gpu_trains_like_eager_within_the_budget(name: str) -> None:
    check_inductor_within_budget(example_of(name).to(CUDA))


def test_transfer_ops_on_the_copy_stream_under_inductor_and_export() -> None:
    check_transfer_ops(CUDA)


def test_inductor_runs_an_offload_plan_on_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    # Measured: on the H200's roofline estimate the MLP's plans recompute rather than
    # offload, even over a 1 TB/s link (memplan.plan at 50-70%, 2026-11-30); measured, the
    # test's plan offloaded on an H200 (2026-11-27, at 50%).
    check_offload_plan_under_inductor(example_of("mlp").to(CUDA), monkeypatch, measure=True)


def test_changing_shapes_on_gpu_train_like_eager() -> None:
    # The CPU test's GPT-2 at 85%, not 60%. The CUDA allocator rounds every tensor up to
    # 512 B, and Inductor's kernels for the graph with batch and sequence length both
    # symbolic hold more than the planned graph: on an H200 (2026-11-28), at batch 4 and
    # sequence 16, its five plans compiled to 890-931 KiB whatever they recomputed
    # (predicted 719-875 KiB). The least of them is 80.6% of the graph's unplanned peak,
    # over an 80% budget (883.92 KiB), where memplan warns that it cannot hold it.
    # docs/gpu.md has the figures.
    check_changing_shapes(small_gpt2().to(CUDA), "85%")


def test_three_graph_breaks_hold_one_budget_on_gpu() -> None:
    check_three_graph_breaks(CUDA)


def test_the_blocks_live_at_the_peak_on_gpu_are_named_by_their_python_frames() -> None:
    """The CUDA allocator's recorded history: blocks grouped by size, each named by the
    innermost frames outside torch's files (the step's own, in test_verify.py)."""
    groups = check_blocks_live_at_peak(CUDA)
    assert all("test_verify.py" in g.site for g in groups)


def _outside_on_gpu(other_bytes: int) -> tuple[int, int]:
    """The optimizer state and other tensors a backend counts outside a small GPT-2's
    graph, with `other_bytes` more allocated on the GPU; and AdamW's moments' bytes."""
    torch._dynamo.reset()
    example = small_gpt2()
    model = example.model.to(CUDA)
    inputs = [x.to(CUDA) for x in example.inputs]
    other = torch.empty(other_bytes, dtype=torch.uint8, device=CUDA)  # another model's
    optimizer = torch.optim.AdamW(model.parameters())
    backend = memplan.backend(budget="95%", optimizer=optimizer, progress=False)
    model.compile(backend=backend)
    model(*inputs).backward()
    del other
    assert backend.plans and backend.plans[-1].outside == backend.outside.total
    moments = 2 * sum(p.nbytes for p in model.parameters() if p.requires_grad)
    assert backend.outside.optimizer_state == moments
    return backend.outside.other, moments


def test_what_else_is_allocated_on_the_gpu_is_counted_outside_the_graph() -> None:
    without, _ = _outside_on_gpu(0)
    with_more, _ = _outside_on_gpu(8 * 2**20)
    # The allocator rounds blocks up to 512 bytes; the rest allocated (cuBLAS's workspace)
    # is there in both.
    assert abs(with_more - without - 8 * 2**20) <= 2**20
