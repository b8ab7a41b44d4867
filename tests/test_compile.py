"""torch.compile as users run it: inductor (the default inner compiler), memplan's transfer
ops as custom operators, shapes that change between steps, and graph breaks under one
budget for the step."""

from __future__ import annotations

import copy
import dataclasses
import io
import itertools
import re
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.utils.checkpoint
from rich.console import Console
from strategies import chain_graph
from test_e2e import eager_grads, example_of, train_step

import memplan
import memplan.backends as memplan_backends
import memplan.planner.plan
import memplan.planner.profile
import memplan.planner.rounds as memplan_rounds
import memplan.planner.solve
import memplan.spinner
from benchmarks.blocks import Block, checkpointed_parts, large_head
from memplan.budget import Budget
from memplan.errors import (
    AllocatorUnreadable,
    InfeasibleBudget,
    InfeasibleBudgetWarning,
    MemplanError,
    MemplanWarning,
    PlanFileError,
    UnknownSolver,
    UnsupportedModel,
    cause_of,
)
from memplan.graph import Graph, Schedule
from memplan.named_backend import memplan_backend
from memplan.passes.offload import OFFLOAD, PREFETCH, RELEASE, WAIT
from memplan.planner.measure import measure_peak
from memplan.planner.options import PlanOptions
from memplan.planner.plan_cache import plan_key
from memplan.planner.plan_file import Plan
from memplan.tools.verify import resident_tensors, steady_step_peak, training_step
from memplan.tools.zoo import ZOO, Example
from memplan.units import format_bytes

# Bytes: far under any model's least peak, so that the backend plans for its least.
LEAST = 1024


def max_grad_errors(model: torch.nn.Module, expected: dict[str, torch.Tensor]) -> list[float]:
    """Per parameter, the largest absolute difference of its gradient from `expected`."""
    return [(p.grad - expected[n]).abs().max().item() for n, p in model.named_parameters()]


def inductor_errors(example: Example, expected: dict[str, torch.Tensor]) -> list[float]:
    """Inductor's own tolerance: per parameter, twice the larger distance from eager's
    gradients of plain torch.compile and of memplan's backend keeping everything (or
    1e-6). Fused kernels reduce in another order than eager's (BatchNorm's gradients
    differ most), and memplan hands Inductor the step decomposed by Inductor's own table
    before it is planned: what a plan recomputes or offloads must add nothing to that."""
    distances = []
    for backend in ("inductor", memplan.backend(budget="100%", progress=False)):
        torch._dynamo.reset()
        model = copy.deepcopy(example.model)
        train_step(torch.compile(model, backend=backend), example.inputs)()
        distances.append(max_grad_errors(model, expected))
    return [max(2 * a, 2 * b, 1e-6) for a, b in zip(*distances, strict=True)]


class Transfer(torch.nn.Module):
    """A value sent to the host and back, as an offload plan's graphs do."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        sine = torch.sin(x)
        host = OFFLOAD(sine)
        RELEASE(sine, host)
        landed = PREFETCH(host, x.device, [])
        WAIT(landed, [])
        return landed * 2 + 1


def test_transfer_ops_are_ordinary_ops_to_inductor_and_export() -> None:
    check_transfer_ops(torch.device("cpu"))


def check_transfer_ops(device: torch.device) -> None:
    """The transfer ops on `device`: compiled by inductor, exported, saved and loaded, with
    the numerics of the uncompiled module."""
    x = torch.randn(8, 8, device=device)
    expected = Transfer()(x)
    torch._dynamo.reset()
    torch.testing.assert_close(torch.compile(Transfer())(x), expected)
    exported = torch.export.export(Transfer(), (x,))
    targets = {n.target for n in exported.graph.nodes if n.op == "call_function"}
    assert {OFFLOAD, RELEASE, PREFETCH} <= targets
    saved = io.BytesIO()
    torch.export.save(exported, saved)
    saved.seek(0)
    torch.testing.assert_close(torch.export.load(saved).module()(x), expected)


def test_inductor_runs_an_offload_plan() -> None:
    # The roofline estimate, so that the plan is the same in every run: on times measured
    # under the load of a full test run (2-core CPU), the round kept offloaded nothing,
    # recomputing instead (at 50% on 2026-11-29, at 40% on 11-30). On the estimate the
    # MLP's plan at 40% offloads 10 tensors in every run.
    check_offload_plan_under_inductor(example_of("mlp"), measure=False)


def check_offload_plan_under_inductor(example: Example, measure: bool) -> None:
    """An offload plan at 40%, compiled by inductor, trains to inductor's tolerance;
    Inductor issues no prefetch earlier than the plan does, and frees or reuses no
    offloaded buffer before its release. `measure`: profile the nodes, or plan on the
    roofline estimate, which bounds the transient memory of ops it has no figure for and
    says so."""
    expected = eager_grads(example)
    tolerance = inductor_errors(example, expected)
    torch._dynamo.reset()
    backend = memplan.backend(
        budget="40%", offload=True, offload_threshold=0, measure=measure, progress=False
    )
    compiled_graphs = _recording_inner(backend)
    model = copy.deepcopy(example.model)
    with warnings.catch_warnings():
        # The estimate's warning; a measured profile gives none (warnings are errors).
        warnings.filterwarnings("ignore", "no measured bound on the transient memory")
        train_step(torch.compile(model, backend=backend), example.inputs)()
    (plan,) = backend.plans
    assert plan.counts()["offload"] > 0
    errors = max_grad_errors(model, expected)
    assert all(e <= t for e, t in zip(errors, tolerance, strict=True)), (errors, tolerance)
    backwards = [(g, code) for g, code in compiled_graphs if "memplan.prefetch" in code]
    assert backwards
    for planned, code in backwards:
        issued = _products_before_prefetches(code)
        expected = _planned_products_before_prefetches(planned)
        assert issued.keys() == expected.keys()
        for host, products in expected.items():
            assert issued[host] >= products, (host, issued[host], products)
    forwards = [code for _, code in compiled_graphs if "memplan.offload" in code]
    assert forwards
    for code in forwards:
        for buffer, line in _after_offloads(code).items():
            assert "memplan.release.default" in line, (buffer, line)


def _after_offloads(code: str) -> dict[str, str]:
    """Per buffer that Inductor's code offloads, the first line after the offload that
    releases, frees or reuses it (`del buf20  # reuse`): on a GPU the copy stream may
    still be reading it until the release, so it must come first."""
    lines = code.splitlines()
    found = {}
    for i, line in enumerate(lines):
        offload = re.search(r"memplan\.offload\.default\((\w+)", line)
        if offload:
            buffer = offload.group(1)
            pattern = rf"memplan\.release\.default\({buffer}\b|\bdel {buffer}\b"
            found[buffer] = next((x for x in lines[i + 1 :] if re.search(pattern, x)), "")
    return found


def _recording_inner(backend: memplan_backends.MemplanBackend) -> list[tuple[list, str]]:
    """Make `backend`'s Inductor record each graph it compiles: the planned graph's
    (op, first input) in order, and the code Inductor made of it."""
    compiled_graphs: list[tuple[list, str]] = []
    inner = backend.inner

    def recording(gm: torch.fx.GraphModule, example_inputs: list) -> object:
        planned = [
            (n.target, n.args[0].name if n.args and isinstance(n.args[0], torch.fx.Node) else "")
            for n in gm.graph.nodes
        ]
        compiled = inner(gm, example_inputs)
        compiled_graphs.append((planned, compiled.source_code))
        return compiled

    backend.inner = recording
    return compiled_graphs


PRODUCTS = (torch.ops.aten.mm.default, torch.ops.aten.addmm.default)


def _planned_products_before_prefetches(planned: list) -> dict[str, int]:
    """Per host copy, how many matrix products the planned backward runs before its
    prefetch."""
    before, products = {}, 0
    for target, first_input in planned:
        products += target in PRODUCTS
        if target is PREFETCH:
            before[first_input] = products
    return before


def _products_before_prefetches(code: str) -> dict[str, int]:
    """The same, read from Inductor's code: its matrix products are calls of
    extern_kernels.mm or addmm, one per product of the graph."""
    before, products = {}, 0
    for line in code.splitlines():
        products += bool(re.search(r"extern_kernels\.(mm|addmm)\(", line))
        prefetch = re.search(r"memplan\.prefetch\.default\((\w+)", line)
        if prefetch:
            before[prefetch.group(1)] = products
    return before


# Each model's graphs are compiled about ten times (the rounds at each budget): few
# layers keep GPT-2 and BERT quick. ResNet keeps the zoo's size: with one block per stage,
# 70% lies within a few percent of its least as Inductor compiles it, and some profiles put
# it over. BERT's joint graph is one that Inductor's joint-graph passes leave with a stale
# value (planner/inductor_steps._traced_again): with one layer as with two, the least fails
# without it (2-core CPU, 2026-12-02).
INDUCTOR_EXAMPLES = {
    "mlp": lambda: example_of("mlp"),
    "gpt2": lambda: ZOO["gpt2"](layers=2),
    "bert": lambda: ZOO["bert"](layers=1),
    "resnet": lambda: example_of("resnet"),
}


# In float64 a reordered reduction moves a gradient by about 1e-14 of its largest element;
# one float32 rounding anywhere in the step would move it by about 1e-7.
FLOAT64_TOLERANCE = 1e-9


def in_float64(example: Example) -> Example:
    """A copy of `example` with its model and floating inputs in float64."""
    inputs = tuple(x.double() if x.is_floating_point() else x for x in example.inputs)
    return dataclasses.replace(example, model=copy.deepcopy(example.model).double(), inputs=inputs)


# Inductor (the default) compiles the planned graphs, recomputation included: at the least,
# gradients equal to eager's as far as plain Inductor's are; at 70% and at the least, the
# allocator's peak of the compiled step within the budget and within 5% of the prediction
# of what Inductor runs (ResNet's kernels hold more than its planned graphs: it is planned
# again lower). The least and 70% are two tests, so that the test workers share them.


@pytest.mark.parametrize("name", list(INDUCTOR_EXAMPLES))
def test_inductor_trains_like_eager_at_the_least(name: str) -> None:
    check_inductor_numerics(in_float64(INDUCTOR_EXAMPLES[name]()))


@pytest.mark.parametrize("name", list(INDUCTOR_EXAMPLES))
def test_inductor_holds_70_percent(name: str) -> None:
    check_inductor_at_70_percent(INDUCTOR_EXAMPLES[name]())


def check_inductor_within_budget(example: Example) -> None:
    """The assertions of the two tests above, for `example` on its own device: the least in
    float64 (check_inductor_numerics), 70% in the example's own dtype. The least is not
    compiled again in float32: each compile at the least is a few of Inductor's rounds
    (ResNet's took 156 s on a 2-core CPU), and its peak is held and predicted alike."""
    check_inductor_numerics(in_float64(example))
    check_inductor_at_70_percent(example)


def check_inductor_at_70_percent(example: Example) -> None:
    """`example` planned at 70% under Inductor: the step's peak as check_compiled_peak
    holds it."""
    torch._dynamo.reset()
    backend = memplan.backend(budget="70%", progress=False)
    model = copy.deepcopy(example.model)
    compiled = torch.compile(model, backend=backend)
    train_step(compiled, example.inputs)()
    # Fusion alone may be enough at 70% (it is for GPT-2 and ResNet on an H100).
    check_compiled_peak(backend, compiled, model, example.inputs)


def check_compiled_peak(
    backend: memplan_backends.MemplanBackend,
    compiled: torch.nn.Module,
    model: torch.nn.Module,
    inputs: tuple[torch.Tensor, ...],
) -> None:
    """The allocator's peak of a steady step of `compiled` (`model` under `backend`, one
    plan) within the plan's budget and within 5% of its prediction of what Inductor runs."""
    (plan,) = backend.plans
    measured = steady_step_peak(compiled, model, inputs)
    assert plan.compiled_peak and plan.peak <= plan.budget
    assert measured <= plan.budget, (measured, plan.budget, plan.peak)
    assert abs(measured / plan.peak - 1) <= 0.05, (measured, plan.peak)


def check_inductor_numerics(example: Example) -> None:
    """`example` (in float64) planned at its least under Inductor: something is planned
    (recomputed, or offloaded where the device is not the host: on an H200, 2026-11-27,
    the MLP's least plan recomputed nothing); per parameter, the gradient no farther from
    eager's than plain Inductor's, give or take FLOAT64_TOLERANCE of its largest element;
    and the step's peak as check_compiled_peak holds it.

    Float64, because in float32 the order in which fused kernels reduce decides the last
    digits, and a recomputation changes what is fused: ResNet's least plan (27 recomputed)
    read up to 1.1e-3 from eager in float32, up to 2.4 times twice the larger distance of
    plain Inductor and of a plan keeping all; the same plan in float64 read 1.6e-15, as
    plain Inductor did. Plain Inductor itself is not exact in float64: on GPT-2 it reads
    3.5e-10 from eager, and so does every plan (CPU, 2026-11-29)."""
    expected = eager_grads(example)
    torch._dynamo.reset()
    inductor = copy.deepcopy(example.model)
    train_step(torch.compile(inductor, backend="inductor"), example.inputs)()
    torch._dynamo.reset()
    backend = memplan.backend(budget=LEAST, progress=False)
    model = copy.deepcopy(example.model)
    compiled = torch.compile(model, backend=backend)
    # The backend says it planned for less than asked (warnings are errors).
    with pytest.warns(MemplanWarning):
        train_step(compiled, example.inputs)()
    (plan,) = backend.plans
    counts = plan.counts()
    assert counts["recompute"] + counts["offload"] > 0
    errors, own_errors = max_grad_errors(model, expected), max_grad_errors(inductor, expected)
    for name, error, own in zip(expected, errors, own_errors, strict=True):
        scale = expected[name].abs().max().item()
        assert error <= own + FLOAT64_TOLERANCE * scale, (name, error, own, scale)
    _assert_same_buffers(model, inductor)
    check_compiled_peak(backend, compiled, model, example.inputs)


def small_gpt2() -> Example:
    return ZOO["gpt2"](batch=4, seq=32, layers=2, width=32)


def _cut(inputs: tuple[torch.Tensor, ...], batch: int, seq: int) -> tuple[torch.Tensor, ...]:
    return tuple(x[:batch, :seq].contiguous() for x in inputs)


def _train_and_compare(
    compiled: torch.nn.Module, model: torch.nn.Module, inputs: tuple[torch.Tensor, ...]
) -> None:
    """One step of the compiled model against one eager step of the same weights."""
    reference = copy.deepcopy(model)
    for m in (model, reference):
        m.zero_grad(set_to_none=True)
    train_step(compiled, inputs)()
    train_step(reference, inputs)()
    _assert_same_grads(model, reference)


def _assert_same_buffers(model: torch.nn.Module, reference: torch.nn.Module) -> None:
    """`model`'s buffers (BatchNorm's running statistics and its count of batches) are
    `reference`'s, within Inductor's tolerance."""
    for (name, got), want in zip(model.named_buffers(), reference.buffers(), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5, msg=name)


def test_batch_norm_statistics_are_updated_once_per_step_like_eager() -> None:
    """BatchNorm's running statistics are written in place inside the planned forward (as
    torch.compile's Inductor backend has AOTAutograd keep such writes in the graph): after
    two steps at 70% and at the least, where its normalizations are recomputed without
    them, they are eager's, and each layer has counted two batches. No output reads such
    a write: taken for a backward node, which the schedule runs only where a gradient
    drives it, it was dropped (found while making the change, 2-core CPU, 2026-11-30)."""
    example = example_of("resnet")
    for budget in ("70%", LEAST):
        torch._dynamo.reset()
        backend = memplan.backend(budget=budget, inner="eager", progress=False)
        model, reference = copy.deepcopy(example.model), copy.deepcopy(example.model)
        compiled = torch.compile(model, backend=backend)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", MemplanWarning)  # the least is planned for
            for run in (compiled, compiled, reference, reference):
                train_step(run, example.inputs)()
        (plan,) = backend.plans
        assert plan.counts()["recompute"] > 0
        _assert_same_buffers(model, reference)
        counts = [b for n, b in model.named_buffers() if n.endswith("num_batches_tracked")]
        assert counts and all(int(c) == 2 for c in counts)


def _assert_same_grads(model: torch.nn.Module, reference: torch.nn.Module) -> None:
    """`model`'s gradients are `reference`'s, within Inductor's tolerance."""
    for (name, got), want in zip(model.named_parameters(), reference.parameters(), strict=True):
        torch.testing.assert_close(got.grad, want.grad, rtol=1e-4, atol=1e-5, msg=name)


def test_a_changing_batch_and_sequence_length_train_like_eager() -> None:
    """An epoch's smaller last batch and a new sequence length: Dynamo recompiles with
    symbolic sizes, and memplan plans them at their hints, or again for a call's sizes."""
    check_changing_shapes(small_gpt2())


def check_changing_shapes(example: Example, budget: str = "60%") -> None:
    """Five steps of GPT-2 at changing batch sizes and sequence lengths under `budget`."""
    torch._dynamo.reset()
    backend = memplan.backend(budget=budget, progress=False)
    model = copy.deepcopy(example.model)
    compiled = torch.compile(model, backend=backend)
    for batch, seq in [(4, 32), (2, 32), (4, 16), (3, 24), (4, 32)]:
        _train_and_compare(compiled, model, _cut(example.inputs, batch, seq))
    dynamic = [plan for plan in backend.plans if plan.sizes]
    assert dynamic, "no graph of symbolic sizes was planned"
    assert all(plan.peak <= plan.budget for plan in backend.plans)


def test_dynamic_true_and_mark_dynamic() -> None:
    example = small_gpt2()
    torch._dynamo.reset()
    backend = memplan.backend(budget="70%", progress=False)
    model = copy.deepcopy(example.model)
    compiled = torch.compile(model, backend=backend, dynamic=True)
    for seq in (32, 20):
        _train_and_compare(compiled, model, _cut(example.inputs, 4, seq))
    assert backend.plans[0].sizes  # symbolic from the first compile on

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


def test_two_models_in_one_process() -> None:
    torch._dynamo.reset()
    options = {"budget": "70%", "progress": False}
    for example in (ZOO["mlp"](batch=256), small_gpt2()):
        model = copy.deepcopy(example.model)
        compiled = torch.compile(model, backend="memplan", options=options)
        _train_and_compare(compiled, model, example.inputs)


@pytest.mark.parametrize("by_name", [False, True], ids=["backend", "by-name"])
def test_a_mode_of_torch_compile_is_refused_with_the_inductor_settings_to_give(
    by_name: bool,
) -> None:
    """torch.compile hands a backend its mode (where not "default"); memplan takes
    Inductor's settings as inductor_config, and says how, before anything is planned."""
    torch._dynamo.reset()
    model = torch.nn.Linear(8, 8)
    backend = "memplan" if by_name else memplan.backend(progress=False)
    compiled = torch.compile(model, backend=backend, mode="max-autotune-no-cudagraphs")
    with pytest.raises(Exception) as raised:  # Dynamo wraps what a backend raises
        compiled(torch.randn(4, 8))
    refused = cause_of(raised.value, MemplanError)
    assert refused is not None and "list_mode_options('max-autotune-no-cudagraphs')" in str(refused)


class _Checkpointed(torch.nn.Module):
    """Four blocks, each recomputed in the backward where `checkpointed` (as users write
    activation checkpointing: torch.utils.checkpoint, non-reentrant unless `reentrant`),
    the loss inside."""

    def __init__(self, checkpointed: bool, reentrant: bool = False) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block(256) for _ in range(4))
        self.checkpointed = checkpointed
        self.reentrant = reentrant

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            if self.checkpointed:
                x = torch.utils.checkpoint.checkpoint(block, x, use_reentrant=self.reentrant)
            else:
                x = block(x)
        return x.square().mean()


def test_a_models_own_checkpointing_is_its_unplanned_step() -> None:
    """A model that checkpoints its blocks runs, as written, with each block recomputed in
    the backward: that is its unplanned step (a share is of it), and a plan at 100% peaks
    no higher. Before, the unplanned step kept every activation, and the plan at 100% of
    it peaked at the step without checkpointing, far above eager's step as written. The
    simulated step as written is of the unfused graph, above eager's (docs/pipeline.md,
    "lower"): the plan is held to within 25% of eager. Gradients are eager's."""
    torch.manual_seed(0)
    x = torch.randn(1024, 256)
    unplanned = {}
    for checkpointed in (False, True):
        model = _Checkpointed(checkpointed)
        torch._dynamo.reset()
        backend = memplan.backend(budget="100%", progress=False)
        planned = copy.deepcopy(model)
        compiled = torch.compile(planned, backend=backend)
        _train_and_compare(compiled, planned, (x,))
        (plan,) = backend.plans
        unplanned[checkpointed] = plan.unplanned_peak
    measured = steady_step_peak(compiled, planned, (x,))
    assert measured <= plan.budget == unplanned[True], (measured, plan.budget)
    # Each block's two activations and its gelus' are recomputed; its input is kept.
    assert unplanned[True] < 0.7 * unplanned[False], unplanned
    eager = steady_step_peak(model, model, (x,))
    assert measured < 1.25 * eager, (measured, eager)


def test_a_checkpointed_models_least_under_inductor_is_no_higher_than_torch_compiles() -> None:
    """Under Inductor, memplan's least on a model that checkpoints its own blocks peaks,
    by the allocator, no higher than torch.compile's default step, which carries out that
    checkpointing. The solvers rank plans on the unfused graphs, where the step as written
    peaks above their least-memory plan; as Inductor compiles it, it peaks below, so it is
    compiled as one more round (backends.MemplanBackend.compile). Without that
    round, memplan's least peaked 10.76 MiB here, against torch.compile's 10.51 MiB
    (2-core CPU, 2026-11-30). Gradients are eager's."""
    torch.manual_seed(0)
    x = torch.randn(1024, 256)
    model = _Checkpointed(True)
    torch._dynamo.reset()
    default = copy.deepcopy(model)
    theirs = steady_step_peak(torch.compile(default), default, (x,))
    torch._dynamo.reset()
    backend = memplan.backend(budget="1 B", progress=False)
    planned = copy.deepcopy(model)
    compiled = torch.compile(planned, backend=backend)
    with pytest.warns(InfeasibleBudgetWarning):
        _train_and_compare(compiled, planned, (x,))
    ours = steady_step_peak(compiled, planned, (x,))
    assert ours <= theirs, (format_bytes(ours), format_bytes(theirs))
    (plan,) = backend.plans
    assert plan.solver == "as_written" and "as the model is written" in plan.note, plan.note
    assert ours <= plan.compiled_peak, (ours, plan.compiled_peak)


def test_memplan_optimize_sees_a_models_own_checkpointing_too() -> None:
    """The Python API takes a model's own checkpointing as its unplanned step as well:
    AOTAutograd, tracing without Dynamo, tags nothing, so capture marks what runs inside
    torch.utils.checkpoint (planner/capture.py). At 100%, the plan peaks within 1% of eager
    as written (the API runs unfused, as eager does), with eager's gradients. Before, the
    API took every activation as kept: the unplanned step was the one without
    checkpointing (22.03 MB against 11.56 MB eager as written, 2-core CPU, 2026-11-30)."""
    torch.manual_seed(0)
    x = torch.randn(1024, 256)
    unplanned = {}
    for checkpointed in (False, True):
        model = _Checkpointed(checkpointed)
        planned_model = copy.deepcopy(model)
        planned = memplan.optimize(planned_model, (x,), budget="100%", progress=False)
        unplanned[checkpointed] = planned.plan.unplanned_peak
    assert unplanned[True] < 0.7 * unplanned[False], unplanned
    _train_and_compare(planned, planned_model, (x,))
    measured = steady_step_peak(planned, planned_model, (x,))
    eager = steady_step_peak(model, model, (x,))
    assert measured <= planned.plan.budget and measured <= 1.01 * eager, (measured, eager)


def test_memplan_optimize_refuses_a_reentrant_checkpoint_and_says_what_to_pass() -> None:
    """AOTAutograd traces the backward with torch.autograd.grad, which a reentrant
    checkpoint refuses: memplan.optimize raises UnsupportedModel with torch's reason, which
    names the way out. (Its input requires grad: with none that does, a reentrant
    checkpoint's output does not either, in eager too.)"""
    x = torch.randn(4, 256, requires_grad=True)
    model = _Checkpointed(checkpointed=True, reentrant=True)
    with pytest.raises(UnsupportedModel, match="use_reentrant=False"):
        memplan.optimize(model, (x,), budget="70%", progress=False)


def test_the_backend_by_name_called_outside_torch_compile_says_each_graph_is_planned_alone(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Dynamo's older entry (torch._dynamo.optimize) calls the backend without
    torch.compile's wrapper: the graphs cannot share one backend, and it says so, once."""
    monkeypatch.setattr(memplan_backend, "warned_alone", False)
    torch._dynamo.reset()
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU(), torch.nn.Linear(8, 1))
    optimized = torch._dynamo.optimize("memplan")(model)
    with pytest.warns(MemplanWarning, match="each graph is planned alone"):
        optimized(torch.randn(4, 8)).sum().backward()
    with warnings.catch_warnings():
        warnings.simplefilter("error", MemplanWarning)
        optimized(torch.randn(4, 8)).sum().backward()


def test_a_backend_used_again_after_dynamo_reset_starts_a_new_step() -> None:
    """torch._dynamo.reset() numbers Dynamo's frames and compiles from 0 again: a backend
    compiling a model after it plans the model's graph alone, not after the graph it
    compiled before the reset (which it would take to be still in the step)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(), torch.nn.Linear(64, 64))
    x = torch.randn(512, 64)
    backend = memplan.backend(budget="100%", inner="eager", progress=False)
    for _ in range(2):
        torch._dynamo.reset()
        planned = copy.deepcopy(model)
        torch.compile(planned, backend=backend)(x).square().mean().backward()
    before, after = backend.plans
    assert before.held > 0 and after.resident == 0 and len(backend.step) == 1


def test_an_evaluation_under_no_grad_between_steps_keeps_the_plan() -> None:
    """A training loop's validation: the compiled model called in eval mode under
    torch.no_grad between training steps. Dynamo compiles an inference graph, which has no
    backward to plan: it returns eager's outputs, and the training steps around it train
    like eager on the plan made first, planned once."""
    example = ZOO["mlp"](batch=256)
    torch._dynamo.reset()
    backend = memplan.backend(budget="70%", progress=False)
    model = copy.deepcopy(example.model)
    compiled = torch.compile(model, backend=backend)
    _train_and_compare(compiled, model, example.inputs)
    model.eval()
    with torch.no_grad():
        got = compiled(*example.inputs)
        expected = copy.deepcopy(model)(*example.inputs)
    torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
    model.train()
    _train_and_compare(compiled, model, example.inputs)
    assert len(backend.plans) == 1 and backend.graphs == 2


class _Recurrent(torch.nn.Module):
    """A layer, an LSTM and a head: what Dynamo does not trace by default."""

    def __init__(self, width: int = 16) -> None:
        super().__init__()
        self.first = torch.nn.Linear(width, width)
        self.lstm = torch.nn.LSTM(width, width, batch_first=True)
        self.head = torch.nn.Linear(width, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.lstm(self.first(x).relu())[0][:, -1]).square().mean()


@pytest.mark.parametrize("allow_rnn", [False, True])
def test_an_lstm_is_planned_only_where_dynamo_traces_it(allow_rnn: bool) -> None:
    """What the README says of recurrent layers: under torch.compile's defaults, Dynamo
    compiles no graph of a model with an nn.LSTM and memplan plans nothing; with
    `torch._dynamo.config.allow_rnn`, the step is planned and trains like eager."""
    torch.manual_seed(0)
    model, inputs = _Recurrent(), (torch.randn(8, 3, 16),)
    torch._dynamo.reset()
    backend = memplan.backend(budget="70%", progress=False)
    with torch._dynamo.config.patch(allow_rnn=allow_rnn), warnings.catch_warnings():
        warnings.simplefilter("ignore", MemplanWarning)  # 70% is under its least
        _train_and_compare(torch.compile(model, backend=backend), model, inputs)
    assert len(backend.plans) == int(allow_rnn)


def test_a_backward_that_retains_the_graph_runs_twice_like_eager() -> None:
    """`loss.backward(retain_graph=True)` then `loss.backward()` (two losses through one
    graph, as GAN and multi-task loops do): plain torch.compile runs it. memplan lowers the
    backward before any backward call, so it cannot learn from the first call, as
    torch.compile does, that the saved tensors must outlive it: it lowers the backward
    without donated buffers. Before, the first backward raised a RuntimeError that the
    backward was compiled with donated buffers (2-core CPU, 2026-11-30)."""
    example = ZOO["mlp"](batch=256)
    torch._dynamo.reset()
    backend = memplan.backend(budget="70%", progress=False)
    model, reference = copy.deepcopy(example.model), copy.deepcopy(example.model)
    for run in (torch.compile(model, backend=backend), reference):
        loss = run(*example.inputs)
        loss.backward(retain_graph=True)
        loss.backward()
    (plan,) = backend.plans
    assert plan.counts()["recompute"] > 0 and plan.compiled_peak
    _assert_same_grads(model, reference)


class _Autocast(torch.nn.Module):
    """`model` under bfloat16 autocast, as mixed-precision training runs it."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, *inputs: torch.Tensor) -> torch.Tensor:
        with torch.autocast(inputs[0].device.type, dtype=torch.bfloat16):
            return self.model(*inputs)


@pytest.mark.parametrize("best_effort", [True, False])
def test_mixed_precision_trains_within_the_budget(best_effort: bool) -> None:
    """Autocast to bfloat16, as mixed-precision training runs: the planned graphs hold the
    casts of the weights and the bfloat16 activations. At 70%, something is recomputed,
    the gradients are within Inductor's own tolerance of eager's under autocast, and the
    allocator's peak is within the budget and the prediction.

    70% (1.70 MiB) is under the unfused graphs' least (1.71 MiB), but not under the least
    as Inductor compiles them (1.44 MiB): the plan is one for the budget, with no warning
    (warnings are errors here) and, with best_effort=False, no error. Before, the backend
    warned that the budget was infeasible and kept the least-memory plan, and with
    best_effort=False raised InfeasibleBudget (2-core CPU, 2026-11-30)."""
    mlp = ZOO["mlp"](batch=256)
    example = dataclasses.replace(mlp, model=_Autocast(mlp.model))
    expected = eager_grads(example)
    tolerance = inductor_errors(example, expected)
    torch._dynamo.reset()
    backend = memplan.backend(budget="70%", best_effort=best_effort, progress=False)
    model = copy.deepcopy(example.model)
    compiled = torch.compile(model, backend=backend)
    train_step(compiled, example.inputs)()
    (plan,) = backend.plans
    assert plan.status == "feasible" and plan.counts()["recompute"] > 0
    errors = max_grad_errors(model, expected)
    assert all(e <= t for e, t in zip(errors, tolerance, strict=True)), (errors, tolerance)
    check_compiled_peak(backend, compiled, model, example.inputs)


class _DropoutMLP(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(128, 128) for _ in range(4))
        self.drop = torch.nn.Dropout(0.3)
        self.head = torch.nn.Linear(128, 10)

    def forward(self, x: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = self.drop(torch.nn.functional.gelu(layer(x)))
        return torch.nn.functional.cross_entropy(self.head(x), target)


def test_dropout_draws_plain_inductors_masks_where_the_plan_recomputes() -> None:
    """A model with dropout, as transformers models train by default. Inductor's
    joint-graph passes turn its seeded random ops into Inductor's own, which draw from a
    seed per op; they must run under the trace's fake mode, as in Inductor's own compile
    (without it the backend raised on every model with dropout). Planned at the least, the
    masks are recomputed from their seeds: each step's gradients are plain Inductor's at
    the same seed, where a mask drawn again would differ in about a third of its
    elements."""
    torch.manual_seed(0)
    model = _DropoutMLP()
    inputs = (torch.randn(256, 128), torch.randint(0, 10, (256,)))

    def grads_of_two_steps(backend: Any) -> list[dict[str, torch.Tensor]]:
        torch._dynamo.reset()
        trained = copy.deepcopy(model)
        compiled = torch.compile(trained, backend=backend)
        steps = []
        for seed in (1, 2):
            trained.zero_grad(set_to_none=True)
            torch.manual_seed(seed)
            compiled(*inputs).backward()
            steps.append({n: p.grad.clone() for n, p in trained.named_parameters()})
        return steps

    expected = grads_of_two_steps("inductor")
    backend = memplan.backend(budget=LEAST, progress=False)
    with pytest.warns(MemplanWarning):  # planned for its least, not for 1 KiB
        got = grads_of_two_steps(backend)
    (plan,) = backend.plans
    # A mask: one byte per element of the 256 x 128 activations (Inductor's boolean).
    recomputed = [name for name, how in plan.decisions.items() if how == "recompute"]
    assert any(plan.tensor_bytes[name] == 256 * 128 for name in recomputed), recomputed
    for step, step_expected in zip(got, expected, strict=True):
        for name, grad in step_expected.items():
            torch.testing.assert_close(step[name], grad, msg=name)


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"solver": "gredy"}, UnknownSolver, "unknown solver 'gredy'"),
        ({"time_limit": -3}, ValueError, "time_limit must be a positive"),
        ({"bandwidth": 0.0}, ValueError, "bandwidth must be a positive"),
    ],
)
def test_a_bad_solver_or_solver_option_is_refused_where_the_backend_is_built(
    options: dict[str, Any], error: type[Exception], message: str
) -> None:
    """Not inside the first compiled step, wrapped in Dynamo's BackendCompilerFailed, as
    they were; a bad budget or inner compiler was refused here already."""
    with pytest.raises(error, match=message):
        memplan.backend(budget="60%", **options)
    with pytest.raises(error, match=message):
        PlanOptions(**options)


def test_a_terminal_is_told_what_each_compile_of_a_graph_is_doing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Planning a graph and compiling it with Inductor, again in each round, can take
    minutes: on a terminal, with progress on (the default), a spinner says which graph is
    planned for what."""
    shown = io.StringIO()
    terminal = Console(file=shown, force_terminal=True, width=200)
    monkeypatch.setattr(memplan.spinner, "get_console", lambda: terminal)
    for rank in ("RANK", "LOCAL_RANK"):  # a distributed run shows rank 0's only
        monkeypatch.delenv(rank, raising=False)
    example = ZOO["mlp"](batch=512)
    torch._dynamo.reset()
    backend = memplan.backend(budget="70%")
    train_step(torch.compile(copy.deepcopy(example.model), backend=backend), example.inputs)()
    assert "memplan: graph0: planning for 70%, then compiling with Inductor" in shown.getvalue()


@pytest.mark.parametrize(
    ("local_rank", "rank", "shown"),
    [("0", "0", True), ("1", "1", False), ("0", "4", True), ("2", "6", False), (None, "1", False)],
)
def test_only_each_nodes_first_rank_shows_the_spinner(
    monkeypatch: pytest.MonkeyPatch, local_rank: str | None, rank: str, shown: bool
) -> None:
    """Under torchrun every rank compiles: one spinner per node, its local rank 0's (rank 4
    is the first of the second node of four GPUs), not one per rank; where a launcher sets
    only `$RANK`, rank 0's. The profiling bar follows the same rule
    (config.shows_progress)."""
    terminal_text = io.StringIO()
    terminal = Console(file=terminal_text, force_terminal=True, width=200)
    monkeypatch.setattr(memplan.spinner, "get_console", lambda: terminal)
    monkeypatch.setenv("RANK", rank)
    if local_rank is None:
        monkeypatch.delenv("LOCAL_RANK", raising=False)
    else:
        monkeypatch.setenv("LOCAL_RANK", local_rank)
    with memplan.spinner.spinner("graph0: planning for 70%", progress=True):
        pass
    assert ("memplan: graph0: planning for 70%" in terminal_text.getvalue()) is shown


def _a_library_deprecation() -> None:
    warnings.warn("a library's own deprecation", DeprecationWarning, stacklevel=1)


def test_a_library_s_warning_while_planning_is_said_where_the_library_said_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # On a GPU (torch 2.11), a DeprecationWarning that Inductor's code said while memplan
    # planned was said again as memplan's, and the filters that make memplan's warnings
    # errors failed the compile.
    profile_graph = memplan.planner.plan.profile_graph

    def profiled(*args: Any, **kwargs: Any) -> Any:
        _a_library_deprecation()
        return profile_graph(*args, **kwargs)

    monkeypatch.setattr(memplan.planner.plan, "profile_graph", profiled)
    example = ZOO["mlp"]()
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        memplan.plan(example.model, example.inputs, budget="1 B", best_effort=True, progress=False)
    places = {(w.category, Path(w.filename).name) for w in said}
    assert (DeprecationWarning, Path(__file__).name) in places
    assert any(issubclass(category, MemplanWarning) for category, _ in places)  # still said


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
    with pytest.warns(MemplanWarning, match=r"s\d+=2048\]: .*smallest feasible peak"):
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
@pytest.mark.parametrize("name", ["mlp", pytest.param("cnn", marks=pytest.mark.slow)])
def test_the_least_an_error_names_under_inductor_is_a_budget_the_step_holds(name: str) -> None:
    """With best_effort=False, a budget below the least raises InfeasibleBudget before the
    step runs. Under Inductor it names the least peak of the graphs as compiled, and a step
    compiled with that budget holds it, with no warning; the plans made to find it are not
    kept. That least can be under the unfused graphs' least: on this machine the MLP's was
    8.78 MiB against 10.66 MiB, and the CNN's 4.33 MiB against 4.71 MiB, and before, the
    error named the unfused least (2-core CPU, 2026-11-30)."""
    example = ZOO[name]()
    least = strict_refusal(example, "1 B").smallest_feasible
    torch._dynamo.reset()
    held = memplan.backend(budget=f"{least} B", best_effort=False, progress=False)
    model = copy.deepcopy(example.model)
    with warnings.catch_warnings():
        warnings.simplefilter("error", MemplanWarning)  # no "above its budget"
        assert steady_step_peak(torch.compile(model, backend=held), model, example.inputs) <= least
    (plan,) = held.plans
    assert plan.status == "feasible" and plan.peak <= least


def both_phases(peak: Callable[..., int]) -> Callable[..., tuple[int, int]]:
    """A stand-in for compiled_peak from a mock of a plan's peak alone: its backward's
    taken to be that peak too."""
    return lambda plan, *rest: (peak(plan, *rest),) * 2


def test_with_best_effort_false_a_budget_no_round_holds_as_compiled_raises(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A budget above the planner's least that no round holds as Inductor compiled it
    (every round peaks 1 GiB over its prediction here): with best_effort=False the error
    comes after the rounds, before the step runs, naming the lowest round's peak, and no
    plan is kept. Before, it was only a warning."""

    def measured(plan: Plan, *_: object) -> int:
        return plan.predicted_peak + 2**30

    monkeypatch.setattr(memplan_rounds, "compiled_peak", both_phases(measured))
    infeasible = strict_refusal(ZOO["mlp"](), "90%")
    assert infeasible.what == "peak as compiled"
    assert 2**30 < infeasible.smallest_feasible < 2**30 + infeasible.budget


def strict_refusal(example: Example, budget: str) -> InfeasibleBudget:
    """The InfeasibleBudget a backend with best_effort=False raises for `example` at
    `budget`, checked to come before anything of the step ran, with no plan kept."""
    torch._dynamo.reset()
    strict = memplan.backend(budget=budget, best_effort=False, progress=False)
    model = copy.deepcopy(example.model)
    with pytest.raises(Exception) as raised:  # Dynamo wraps what a backend raises
        train_step(torch.compile(model, backend=strict), example.inputs)()
    infeasible = cause_of(raised.value, InfeasibleBudget)
    assert isinstance(infeasible, InfeasibleBudget)
    assert not strict.plans and all(p.grad is None for p in model.parameters())
    return infeasible


class ThreeBreaks(torch.nn.Module):
    """Four MLP stages with a graph break between each two: Dynamo hands over 4 graphs."""

    def __init__(self, width: int = 64, depth: int = 6) -> None:
        super().__init__()
        self.stages = torch.nn.ModuleList(
            torch.nn.Sequential(
                *[m for _ in range(depth) for m in (torch.nn.Linear(width, width), torch.nn.GELU())]
            )
            for _ in range(4)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stages[0](x)
        torch._dynamo.graph_break()
        x = self.stages[1](x)
        torch._dynamo.graph_break()
        x = self.stages[2](x)
        torch._dynamo.graph_break()
        return self.stages[3](x).square().mean()


@pytest.mark.parametrize("by_name", [False, True], ids=["backend", "by-name"])
def test_three_graph_breaks_hold_one_budget_for_the_step(by_name: bool) -> None:
    check_three_graph_breaks(torch.device("cpu"), by_name)


def test_the_step_that_plans_the_graphs_holds_the_budget(tmp_path, monkeypatch) -> None:
    """Four graphs under 90% of eager's peak: the first step, in which each graph is
    traced, profiled, planned and compiled, stays within the budget as the allocator reads
    it. Profiling ran each graph as written on copies of its inputs, while the graphs
    before it held their saved tensors: that step peaked at 28.30 MB against a budget of
    25.37 MB (2-core CPU, 2026-12-01); it now holds its values under the graph's budget
    (planner/pass_values.py)."""
    monkeypatch.setenv("MEMPLAN_CACHE_DIR", str(tmp_path))  # nothing profiled before
    torch.manual_seed(0)
    model, inputs = ThreeBreaks(), (torch.randn(2048, 64),)
    budget = int(0.9 * steady_step_peak(model, model, inputs))
    torch._dynamo.reset()
    planned = copy.deepcopy(model)
    compiled = torch.compile(planned, backend=memplan.backend(budget=budget, progress=False))
    step, cpu = train_step(compiled, inputs), torch.device("cpu")
    with warnings.catch_warnings():
        # Inside the allocator's recording, the compiled graphs' check cannot read it.
        warnings.simplefilter("ignore", MemplanWarning)
        first = measure_peak(step, resident=[*planned.parameters(), *inputs], device=cpu)
    assert first.peak_bytes <= budget, (first.peak_bytes, budget)
    _train_and_compare(compiled, planned, inputs)


def check_three_graph_breaks(device: torch.device, by_name: bool = False) -> None:
    """Four graphs under one absolute budget, 90% of eager's peak, on `device`: the
    allocator's peak of the step stays within it and the gradients are eager's. By name
    (`backend="memplan"`), the graphs of one torch.compile call share one backend."""
    torch.manual_seed(0)
    model, inputs = ThreeBreaks().to(device), (torch.randn(2048, 64, device=device),)
    eager = steady_step_peak(model, model, inputs)
    budget = int(0.9 * eager)
    torch._dynamo.reset()
    planned = copy.deepcopy(model)
    if by_name:
        options = {"budget": budget, "progress": False}
        compiled = torch.compile(planned, backend="memplan", options=options)
    else:
        backend = memplan.backend(budget=budget, progress=False)
        compiled = torch.compile(planned, backend=backend)
    with warnings.catch_warnings():
        # No "ran while earlier calls still held": what the graphs before hold is planned.
        warnings.simplefilter("error", MemplanWarning)
        measured = steady_step_peak(compiled, planned, inputs)
    # By name, each graph planned alone (before a torch.compile call had one backend)
    # peaked 0.74 MB over on CPU, unseen.
    assert measured <= budget, (measured, budget)
    if by_name:  # the backend of the latest torch.compile call
        backend = list(memplan_backend.of_call.values())[-1]
    assert len(backend.plans) == 4
    # Each graph is planned with what the graphs before it keep for their backwards.
    residents = [plan.resident for plan in backend.plans]
    assert residents[0] == 0 and residents == sorted(residents) and residents[-1] > 0
    assert backend.predicted_step_peak <= budget
    _train_and_compare(compiled, planned, inputs)


def test_graph_breaks_hold_one_budget_as_the_batch_changes() -> None:
    """Four graphs under one absolute budget (90% of eager's peak at a batch of 2048) as
    the batch goes to 1536, where Dynamo compiles them again with a dynamic batch, back
    to 2048 and down to 1024: at each batch the allocator's peak of a steady step is
    within the budget and within 5% of the step's prediction at that batch, and the
    gradients are eager's. Each graph is checked against what the graphs before it hold
    at the batch they ran at: counted at the sizes their plans were made at, the step at
    2048 after 1536 peaked at 26.11 MB against 25.37 MB (2-core CPU, 2026-12-01)."""
    torch.manual_seed(0)
    model, x = ThreeBreaks(), torch.randn(2048, 64)
    budget = int(0.9 * steady_step_peak(model, model, (x,)))
    torch._dynamo.reset()
    planned = copy.deepcopy(model)
    backend = memplan.backend(budget=budget, progress=False)
    compiled = torch.compile(planned, backend=backend)
    for batch in (2048, 1536, 2048, 1024):
        inputs = (x[:batch],)
        measured = steady_step_peak(compiled, planned, inputs)
        assert measured <= budget, (batch, measured, budget)
        assert abs(measured / backend.predicted_step_peak - 1) <= 0.05, batch
    assert any(plan.sizes for plan in backend.plans)  # the batch became dynamic
    _train_and_compare(compiled, planned, (x[:1536],))


@pytest.mark.slow
def test_a_batch_seen_once_an_epoch_is_planned_for_what_the_graphs_before_hold_at_it() -> None:
    """Four parts of checkpointed blocks at 45 MiB, batches of 2048 and now and then one of
    1536 (an epoch's last): the first graph leaves the later ones room at 1536 only when
    1536 comes again, after steps at 2048. The graphs after it are then planned again for
    what it holds at 1536, not at the batch the step ran last, so at 1536 each graph's plan
    counts what the graphs before it hold there, and the step's prediction is within the
    budget and not below the allocator's peak. Told at the batch the step ran last, the
    graphs at 1536 kept plans made for what the first held before it made room: the step
    was predicted at 59.56 MiB against 34.06 MiB read (2-core CPU, 2026-12-01)."""
    budget = 45 * 2**20
    backend, planned, compiled, (x, y) = _compiled_parts(4, budget)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MemplanWarning)  # of the steps that make room
        for batch in (2048, 2048, 1536, 2048, 2048, 1536):
            train_step(compiled, (x[:batch], y[:batch]))()
            planned.zero_grad(set_to_none=True)
        inputs = (x[:1536], y[:1536])
        measured = steady_step_peak(compiled, planned, inputs)
    kept = list(backend.step.values())
    held_before = list(itertools.accumulate(p.held for p in kept[:-1]))
    assert [p.resident for p in kept[1:]] == held_before, [p.name for p in kept]
    assert measured <= backend.predicted_step_peak <= budget, (
        measured,
        backend.predicted_step_peak,
    )
    _train_and_compare(compiled, planned, inputs)


@pytest.mark.slow
def test_epochs_that_end_in_a_smaller_batch_hold_the_budget_once_planned() -> None:
    """The same four parts at 45 MiB as a loop whose epoch ends in a batch of 1536, every
    step read by the allocator (planning inside the recording, as the benchmark's epochs
    series does): once a size is planned, the next steps at it are within the budget and
    predicted within it. A graph planned again for what the graphs before it hold kept a
    plan that held more than the graphs after it were planned for (it peaked within its
    own budget), and the third epoch's steps at 2048 read 46.56 MiB against a prediction
    of 50.56 MiB, with no warning (2-core CPU, 2026-12-01)."""
    budget = 45 * 2**20
    backend, planned, compiled, (x, y) = _compiled_parts(4, budget)
    steady = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MemplanWarning)  # of the steps that plan
        for batch in (2048, 2048, 1536, 2048, 2048, 2048, 1536, 2048, 2048, 2048):
            inputs = (x[:batch], y[:batch])
            plans = len(backend.plans)
            step = training_step(compiled, inputs)
            held = resident_tensors(planned, inputs)
            peak = measure_peak(step, resident=held, device=torch.device("cpu")).peak_bytes
            planned.zero_grad(set_to_none=True)
            if len(backend.plans) == plans:
                steady.append((batch, peak, backend.predicted_step_peak))
    assert len(steady) >= 4, steady
    assert all(peak <= predicted <= budget for _, peak, predicted in steady), steady
    assert steady[-1][0] == 2048, steady  # the last epoch's steps at 2048 are among them


def _compiled_parts(
    parts: int, budget: str | int
) -> tuple[
    memplan_backends.MemplanBackend, torch.nn.Module, Callable[..., Any], tuple[torch.Tensor, ...]
]:
    """benchmarks.blocks.checkpointed_parts(parts) compiled afresh with memplan at `budget`:
    the backend, the module it trains (a copy of the model), the compiled module and the
    batch."""
    model, inputs = checkpointed_parts(parts)
    torch._dynamo.reset()
    backend = memplan.backend(budget=budget, progress=False)
    planned = copy.deepcopy(model)
    return backend, planned, torch.compile(planned, backend=backend), inputs


def _first_step_of_parts(
    parts: int, budget: str
) -> tuple[
    memplan_backends.MemplanBackend,
    torch.nn.Module,
    Callable[..., Any],
    tuple[torch.Tensor, ...],
    pytest.WarningsRecorder,
]:
    """benchmarks.blocks.checkpointed_parts(parts) compiled with memplan at `budget`, after
    its first step (planned, and found short): the backend, the module it trains, the
    compiled module, the inputs and the warnings the step gave."""
    backend, planned, compiled, inputs = _compiled_parts(parts, budget)
    with pytest.warns(MemplanWarning) as said:
        train_step(compiled, inputs)()
    return backend, planned, compiled, inputs, said


def _later_parameters(parts: torch.nn.Module, first: int) -> int:
    """The bytes of the parameters of a checkpointed_parts model's graphs from part `first`
    on (the last graph's include the head's)."""
    later = [*parts.parts[first:].parameters(), *parts.head.parameters()]
    return sum(p.nbytes for p in later) if first < len(parts.parts) else 0


def test_a_graph_before_a_break_makes_room_for_a_later_graph_left_under_its_least() -> None:
    """Two halves of checkpointed blocks with a break between them, at 85% of the step's
    unplanned peak (24.69 MiB): the first graph, planned for its share of its own step,
    keeps so much for its backward that the second is left under its least, and warns that
    room will be made. At the next step the first graph is planned again with the second's
    peak taken as resident; the second runs only between its forward and its backward, so
    the round kept is the one whose own peak holds the budget without that room and whose
    bytes kept hold it with the room: the step as the model is written (7.51 MiB kept),
    not the least-memory plan (9.51 MiB, with which the step would peak at 25.55 MiB). The
    second is then planned for what the first holds, and from the step after the step
    holds the budget, as predicted, with eager's gradients (2-core CPU, 2026-12-01)."""
    backend, planned, compiled, inputs, said = _first_step_of_parts(2, "85%")
    short = [str(w.message) for w in said if issubclass(w.category, InfeasibleBudgetWarning)]
    assert any(message.startswith("graph1") for message in short), short
    (room,) = [str(w.message) for w in said if "leave it room" in str(w.message)]
    assert room.startswith("graph1") and "at the next step graph0" in room
    measured = steady_step_peak(compiled, planned, inputs)  # the second plans again
    first, second = backend.plans[:2]
    budget = second.asked + second.resident  # 85% of the step's unplanned peak
    assert first.held + second.peak > budget  # the first step, as planned at first
    now_first, now_second = backend.step.values()  # each graph's plan now
    assert "leaving" in now_first.name and now_first.solver == "as_written"
    assert now_first.held < first.held and now_first.status == "feasible"
    assert now_first.resident == 0 and now_second.resident == now_first.held
    # The step's, less the parameters of the second graph (and their gradients), the room
    # given back.
    assert now_first.asked + now_first.resident + 2 * _later_parameters(planned, 1) == budget
    assert now_first.budget == now_first.asked and now_first.peak <= now_first.budget
    assert measured <= budget, (measured, budget)
    assert abs(measured / backend.predicted_step_peak - 1) <= 0.05
    made = len(backend.plans)
    _train_and_compare(compiled, planned, inputs)
    assert len(backend.plans) == made  # once: the later steps plan nothing


@pytest.mark.slow
def test_three_graphs_make_room_for_the_last_of_four_checkpointed_parts() -> None:
    """Four parts of checkpointed blocks, three breaks, at 100%: each of the first three
    graphs leaves the next short, and the last is left short by all of them. At the next
    step the first makes room for the most any later graph needs (35.05 MiB: what the
    second and third hold and the last's peak), keeping only its step as written, and the
    step holds the budget from the step after (42.56 against 44.06 MiB; left as first
    planned it peaked at 44.56 MiB), as predicted, with eager's gradients (2-core CPU,
    2026-12-01; benchmarks/graph_breaks.py measures it at 80% too)."""
    backend, planned, compiled, inputs, said = _first_step_of_parts(4, "100%")
    rooms = [str(w.message) for w in said if "leave it room" in str(w.message)]
    assert [m.split(":")[0] for m in rooms] == ["graph1", "graph2", "graph3.1"], rooms
    measured = steady_step_peak(compiled, planned, inputs)  # the second plans again
    kept = list(backend.step.values())
    last = kept[-1]
    budget = last.asked + last.resident
    assert "leaving" in kept[0].name and kept[0].solver == "as_written"
    assert kept[0].status == "feasible"
    assert kept[0].budget + 2 * _later_parameters(planned, 1) == budget
    assert all(
        p.asked + p.resident + 2 * _later_parameters(planned, k + 1) == budget
        for k, p in enumerate(kept)
    )
    assert [p.resident for p in kept[1:]] == list(itertools.accumulate(p.held for p in kept[:-1]))
    assert measured <= budget, (measured, budget)
    assert abs(measured / backend.predicted_step_peak - 1) <= 0.05
    _train_and_compare(compiled, planned, inputs)


def test_a_graph_before_a_break_counts_the_parameters_of_the_graphs_after_it() -> None:
    """benchmarks.blocks.large_head at 66% of the step's unplanned peak (35.21 MiB): the
    first graph peaks at 33.00 MiB as Inductor compiled it, within its share; but while it
    runs the step holds the head's parameters too (4.17 MiB), and in its backward their
    gradients. The step's prediction counts them: 37.35 MiB, as the allocator reads the
    step (each graph's own step said 33.48). Compiling the head warns that the first graph
    will be planned again for them; it is, with its budget less them, but its least is the
    plan it had, and the step stays over, as a warning then says (2-core CPU,
    2026-12-01)."""
    model, inputs = large_head()
    torch._dynamo.reset()
    backend = memplan.backend(budget="66%", progress=False)
    planned = copy.deepcopy(model)
    compiled = torch.compile(planned, backend=backend)
    with pytest.warns(MemplanWarning) as said:
        train_step(compiled, inputs)()
    later = [str(w.message) for w in said if "parameters of the graphs after it" in str(w.message)]
    assert len(later) == 1 and later[0].startswith("graph0"), later
    assert "planned again for them" in later[0]
    with pytest.warns(MemplanWarning) as said:  # the first graph plans again
        measured = steady_step_peak(compiled, planned, inputs)
    over = [str(w.message) for w in said]
    assert len(over) == 1 and over[0].startswith("graph0"), over
    assert f"and the step at {format_bytes(backend.predicted_step_peak)}" in over[0]
    assert "the graphs before it leave it no more room" in over[0]
    first, head = backend.step.values()
    budget = head.asked + head.resident
    wide = sum(p.nbytes for p in [*planned.wide.parameters(), *planned.out.parameters()])
    assert "by later graphs" in first.name and first.resident == 0
    assert first.asked + 2 * wide == budget  # the head's parameters, and their gradients
    assert max(first.step_peak, head.step_peak) < 0.95 * measured
    assert abs(measured / backend.predicted_step_peak - 1) <= 0.01, measured
    _train_and_compare(compiled, planned, inputs)


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


def test_a_share_is_of_the_steps_unplanned_peak() -> None:
    """Four graphs under 60%: each one's budget is 60% of the step's unplanned peak (its
    own and what the graphs before it keep for their backwards), less what those keep as
    planned. The budgets are the planner's, whichever compiler runs the graphs: eager's,
    which compiles nothing (the graph-break test above runs Inductor's)."""
    torch.manual_seed(0)
    model, inputs = ThreeBreaks(depth=8), (torch.randn(4096, 64),)
    expected = {n: p.grad for n, p in _stepped(copy.deepcopy(model), inputs).named_parameters()}
    torch._dynamo.reset()
    backend = memplan.backend(budget="60%", inner="eager", progress=False)
    planned = copy.deepcopy(model)
    train_step(torch.compile(planned, backend=backend), inputs)()
    first, *later = backend.plans
    assert first.resident == 0 and first.budget == -(-6 * first.unplanned_peak // 10)
    for plan, before in zip(later, backend.plans, strict=False):
        assert plan.resident == before.resident + before.held
        assert plan.budget == -(-6 * plan.unplanned_step_peak // 10) - plan.resident
    step_unplanned = max(plan.unplanned_step_peak for plan in backend.plans)
    assert backend.predicted_step_peak <= 0.6 * step_unplanned + 1
    for name, param in planned.named_parameters():
        torch.testing.assert_close(param.grad, expected[name], rtol=1e-4, atol=1e-5, msg=name)


def _stepped(model: torch.nn.Module, inputs: tuple[torch.Tensor, ...]) -> torch.nn.Module:
    train_step(model, inputs)()
    return model


@pytest.fixture
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A profile and plan cache of the test's own. In the run-wide one, another worker
    profiling the same model between a test's two compiles rewrites the node times the
    plan's key holds, and the second compile plans again."""
    monkeypatch.setenv("MEMPLAN_CACHE_DIR", str(tmp_path))


@pytest.mark.usefixtures("private_cache")
def test_compiling_again_applies_the_kept_plan_without_solving_or_profiling(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """What a second process sees: a new backend, new caches read from disk."""
    example = ZOO["mlp"](batch=512)
    plans = []
    for again in (False, True):
        if again:
            # Neither the solver nor the profiler may run now.
            monkeypatch.setattr(memplan.planner.solve, "get_solver", _must_not_run)
            monkeypatch.setattr(memplan.planner.profile, "_measure", _must_not_run)
        torch._dynamo.reset()
        backend = memplan.backend(budget="60%", inner="eager", progress=False)
        model = copy.deepcopy(example.model)
        train_step(torch.compile(model, backend=backend), example.inputs)()
        plans.extend(backend.plans)
    first, second = plans
    assert first.counts()["recompute"] > 0
    assert (second.decisions, second.predicted_peak) == (first.decisions, first.predicted_peak)


@pytest.mark.usefixtures("private_cache")
def test_a_reused_plan_s_decisions_are_what_inductor_runs(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """`backend(reuse=plan)` carries out a backend's plan, edited and saved or not,
    without solving: Inductor compiles it once (no rounds at other aims), trains like
    eager, and the plan records its peak as compiled."""
    example = ZOO["mlp"](batch=512)
    expected = eager_grads(example)
    tolerance = inductor_errors(example, expected)
    torch._dynamo.reset()
    solved = memplan.backend(budget="60%", progress=False)
    train_step(torch.compile(copy.deepcopy(example.model), backend=solved), example.inputs)()
    (plan,) = solved.plans
    kept = [name for name, decision in plan.decisions.items() if decision == "keep"]
    assert kept, "the plan at 60% keeps something to turn into a recomputation"
    edited = dataclasses.replace(plan, decisions={**plan.decisions, kept[0]: "recompute"})
    edited.save(tmp_path / "graph0.json")
    monkeypatch.setattr(memplan.planner.solve, "get_solver", _must_not_run)
    compiles = _counted_compiles(monkeypatch)
    torch._dynamo.reset()
    reused = memplan.backend(
        budget="100%", progress=False, reuse=Plan.load(tmp_path / "graph0.json")
    )
    model = copy.deepcopy(example.model)
    train_step(torch.compile(model, backend=reused), example.inputs)()
    (applied,) = reused.plans
    assert applied.decisions == edited.decisions
    assert applied.compiled_peak > 0
    assert len(compiles) == 1
    errors = max_grad_errors(model, expected)
    assert all(e <= t for e, t in zip(errors, tolerance, strict=True))


def test_a_plan_reused_on_another_model_is_refused() -> None:
    example = ZOO["mlp"](batch=512)
    torch._dynamo.reset()
    solved = memplan.backend(budget="60%", inner="eager", progress=False)
    train_step(torch.compile(copy.deepcopy(example.model), backend=solved), example.inputs)()
    other = ZOO["mlp"](batch=256)  # other sizes: another graph
    torch._dynamo.reset()
    reused = memplan.backend(inner="eager", progress=False, reuse=solved.plans[0])
    with pytest.raises(Exception, match="was made for another graph") as raised:
        train_step(torch.compile(other.model, backend=reused), other.inputs)()
    assert isinstance(cause_of(raised.value, PlanFileError), PlanFileError)


def _counted_compiles(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """One entry per AOTAutograd compile the memplan backend makes from now on."""
    compiles: list[int] = []
    aot = memplan_backends.MemplanBackend._aot

    def counted(self: memplan_backends.MemplanBackend, *args: Any) -> Any:
        compiles.append(len(compiles))
        return aot(self, *args)

    monkeypatch.setattr(memplan_backends.MemplanBackend, "_aot", counted)
    return compiles


def _counted_solves(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the solvers the driver runs from now on, in order."""
    solved: list[str] = []
    get_solver = memplan.planner.solve.get_solver

    def counted(name: str) -> Callable[..., Any]:
        solved.append(name)
        return get_solver(name)

    monkeypatch.setattr(memplan.planner.solve, "get_solver", counted)
    return solved


def _plans_of_two_compiles(example: Example, budget: str, time_limit: float) -> list[Plan]:
    """The plans of two compiles of `example` by fresh backends (as two processes would)."""
    plans: list[Plan] = []
    for _ in range(2):
        torch._dynamo.reset()
        backend = memplan.backend(
            budget=budget, inner="eager", progress=False, time_limit=time_limit
        )
        train_step(torch.compile(copy.deepcopy(example.model), backend=backend), example.inputs)()
        assert len(backend.plans) == 1
        plans += backend.plans
    return plans


@pytest.mark.usefixtures("private_cache")
def test_a_plan_whose_solve_ran_to_its_time_limit_is_not_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """How far a search cut off by the clock gets depends on how busy the machine was, so
    its plan is not kept: compiling again solves again. (On ResNet-50, a greedy solve cut
    off at 20 s kept a best-effort plan at 41.33 MiB for the round aimed at 30.44 MiB,
    which every later process applied; solved with 60 s at 30.43 MiB, it planned within.)"""
    solved = _counted_solves(monkeypatch)
    # Any solve lasts longer than this limit (at 100% it is found at once).
    plans = _plans_of_two_compiles(ZOO["mlp"](batch=512), "100%", time_limit=1e-9)
    assert solved == ["greedy", "greedy"]
    assert all(plan.cut_short for plan in plans)


@pytest.mark.usefixtures("private_cache")
def test_the_time_limit_is_each_solve_s_not_the_whole_planning_s(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A plan is kept where every solve behind it ended within its limit, however long the
    work around them took (the layout here; on ResNet-50, the least-memory round's two
    greedy solves of about 35 s each, under a 60 s limit, made its plans never kept)."""
    limit = 0.5
    lay_out = memplan.planner.plan.lay_out

    def slow_layout(*args: Any, **kwargs: Any) -> Any:
        time.sleep(limit)  # planning now runs past the limit, outside any solve
        return lay_out(*args, **kwargs)

    monkeypatch.setattr(memplan.planner.plan, "lay_out", slow_layout)
    solved = _counted_solves(monkeypatch)
    first, second = _plans_of_two_compiles(ZOO["mlp"](batch=512), "95%", time_limit=limit)
    assert solved == ["greedy"]  # the second compile applied the kept plan
    assert not first.cut_short and first.solve_seconds < limit
    assert (second.decisions, second.predicted_peak) == (first.decisions, first.predicted_peak)


def test_a_kept_plan_is_not_applied_where_the_solver_is_given_other_costs() -> None:
    """The key holds the times and workspaces the solver is given: a memplan that prices a
    node differently (fused under Inductor, say) plans again rather than reuse a plan
    made for other costs."""
    graph, budget, options = chain_graph(4), Budget.parse("60%"), PlanOptions()
    cpu = torch.device("cpu")

    def key(solved: Graph) -> str:
        return plan_key("fingerprint", solved, budget, 0, options, cpu)

    times = [n.time for n in graph.nodes]
    fused = [0.0 if n.name == "f0" else n.time for n in graph.nodes]
    assert key(graph) == key(graph.replace_times(times))
    assert key(graph) != key(graph.replace_times(fused))
    workspaces = [n.workspace + 1 for n in graph.nodes]
    assert key(graph) != key(graph.replace_times(times, workspaces))


def _must_not_run(*_: object, **__: object) -> None:
    raise AssertionError("ran where the kept plan should have been applied")


def test_checking_the_compiled_graphs_leaves_the_users_random_numbers() -> None:
    """The check of Inductor's graphs runs them on random inputs, from a generator of its
    own: a user's random numbers after compiling are those they would have had."""
    example = ZOO["mlp"](batch=512)
    torch._dynamo.reset()
    backend = memplan.backend(budget="70%", progress=False)
    before = torch.get_rng_state()
    train_step(torch.compile(copy.deepcopy(example.model), backend=backend), example.inputs)()
    (plan,) = backend.plans
    assert plan.compiled_peak > 0
    assert torch.equal(torch.get_rng_state(), before)


def test_a_users_profiler_around_the_compiling_step_keeps_its_recording(
    monkeypatch: pytest.MonkeyPatch, tmp_path
) -> None:
    """memplan reads the CPU allocator with a profiler session of its own, and kineto runs
    one at a time: inside a user's session it would end the user's recording. There
    memplan measures times only, bounds transients per op family, leaves the Inductor
    check undone, says so, and the user's profile keeps the whole step."""
    monkeypatch.setenv("MEMPLAN_CACHE_DIR", str(tmp_path))  # nothing profiled before
    example = ZOO["mlp"](batch=512)
    expected = eager_grads(example)
    torch._dynamo.reset()
    model = copy.deepcopy(example.model)
    backend = memplan.backend(budget="70%", progress=False)
    activities = [torch.profiler.ProfilerActivity.CPU]
    with (
        pytest.warns(MemplanWarning) as said,
        torch.profiler.profile(activities=activities, profile_memory=True) as users,
    ):
        train_step(torch.compile(model, backend=backend), example.inputs)()
        after = torch.ones(7, 11) * 3  # after memplan's work, still recorded
    messages = [str(w.message) for w in said]
    assert any("transient memory is a conservative bound" in m for m in messages)
    assert any("could not be checked" in m and "torch.profiler" in m for m in messages)
    (plan,) = backend.plans
    assert plan.compiled_peak == 0  # unchecked, and not claimed
    recorded = {e.key for e in users.key_averages()}
    assert {"aten::mul", "aten::mm"} <= recorded
    allocated = [e for e in users.events() if e.cpu_memory_usage == after.nbytes]
    assert allocated, "the user's session lost the allocation made after compiling"
    torch.testing.assert_close(
        {n: p.grad for n, p in model.named_parameters()}, expected, rtol=1e-4, atol=1e-5
    )


def test_measuring_inside_a_users_profiler_is_a_clear_error() -> None:
    """verify and maxbatch read the allocator on request: inside a user's profiler session
    that is refused up front, and the session goes on recording."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=activities) as users:
        with pytest.raises(AllocatorUnreadable, match=r"torch\.profiler session"):
            measure_peak(lambda: torch.ones(3) + 1, resident=[], device=torch.device("cpu"))
        torch.ones(5).sum()
    assert "aten::sum" in {e.key for e in users.key_averages()}


def _layout_settings(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Inductor's layout_optimization setting at each graph it compiles from now on, in
    order (forward, then backward, per compile)."""
    import torch._inductor.compile_fx as compile_fx
    from torch._inductor import config as inductor_config

    settings: list[bool] = []
    inner = compile_fx.compile_fx_inner

    def recording(*args: object, **kwargs: object) -> object:
        settings.append(inductor_config.layout_optimization)
        return inner(*args, **kwargs)

    monkeypatch.setattr(compile_fx, "compile_fx_inner", recording)
    return settings


SMALL_CNN = {"batch": 2, "image": 16, "channels": 4, "blocks": 1}


def _small_cnn_plan(budget: str) -> Plan:
    """The one plan of a small CNN trained a step under memplan's backend at `budget`,
    its warnings of a budget not held silenced (where the test makes it so)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", MemplanWarning)
        return _the_plan_trained(ZOO["cnn"](**SMALL_CNN), budget)


def test_a_convolution_graph_planned_lower_keeps_layout_optimization(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first plan, compiled with layout optimization, peaks over the budget, and it
    would peak lower without it; a plan made lower holds the budget with it. The round
    kept is that one, with layout optimization (its kernels are faster), and no graph is
    compiled without it."""
    settings = _layout_settings(monkeypatch)
    with_layout: list[Plan] = []

    def measured(plan: Plan, *_: object) -> int:
        if not settings[-1]:
            return plan.predicted_peak  # without layout optimization: as planned
        with_layout.append(plan)
        # With it: the first plan 8 KiB over its budget, the later ones as planned.
        return plan.budget + 2**13 if len(with_layout) == 1 else plan.predicted_peak

    monkeypatch.setattr(memplan_rounds, "compiled_peak", both_phases(measured))
    plan = _small_cnn_plan("90%")  # above its least: planned lower, not best effort
    assert len(plan.options["compiled_rounds"]) > 1 and set(settings) == {True}
    assert "layout_optimization" not in plan.options
    assert plan.compiled_peak == plan.peak <= plan.budget


@pytest.mark.parametrize("lower_without", [True, False])
def test_a_convolution_graph_no_round_holds_is_tried_without_layout_optimization(
    monkeypatch: pytest.MonkeyPatch, lower_without: bool
) -> None:
    """Where no round with Inductor's layout optimization holds the budget, the graph is
    planned again without it: a round without it is kept where it holds the budget, and
    dropped where it peaks higher than the rounds with it."""
    settings = _layout_settings(monkeypatch)

    def measured(plan: Plan, *_: object) -> int:
        if settings[-1]:
            return 2**40  # with layout optimization: over any budget
        return plan.predicted_peak if lower_without else 2**41

    monkeypatch.setattr(memplan_rounds, "compiled_peak", both_phases(measured))
    plan = _small_cnn_plan("90%")
    # Rounds with it first (forward and backward each), then without it.
    dropped_at = settings.index(False)
    assert dropped_at >= 2 and set(settings[:dropped_at]) == {True}
    assert plan.options.get("layout_optimization", True) is not lower_without
    if lower_without:
        assert set(settings[dropped_at:]) == {False}  # none of the least's rounds
        assert plan.compiled_peak == plan.predicted_peak and plan.peak <= plan.budget
    else:
        assert plan.peak == 2**40


def _the_plan_trained(example: Example, budget: str) -> Plan:
    """The one plan of `example`'s model compiled with memplan's backend at `budget`, once
    a step trained with it has matched eager's gradients."""
    torch._dynamo.reset()
    backend = memplan.backend(budget=budget, progress=False)
    model = copy.deepcopy(example.model)
    _train_and_compare(torch.compile(model, backend=backend), model, example.inputs)
    (plan,) = backend.plans
    return plan


def test_where_no_round_holds_the_budget_the_least_memory_plan_is_tried_last(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """As Inductor compiles them, every plan made at a budget peaks as far over the first
    one's budget, however low it was made, and only the least-memory plan (planned for a
    1-byte budget, as the least an InfeasibleBudget names is found) fits. After one lowered
    round that peaked no lower, the least-memory plan is compiled next, and kept (before,
    three lowered rounds came first: on the benchmark's GPT-2 at its least, about 100 s
    each)."""
    example = ZOO["mlp"](batch=512)
    least_peak = _least_predicted(monkeypatch, example)
    least: list[bool] = []  # per plan compiled, whether it is the least-memory plan
    first: list[int] = []  # the budget of the first plan checked: the graph's

    def measured(plan: Plan, *_: object) -> int:
        least.append(plan.predicted_peak <= least_peak)
        first.append(plan.budget)
        return plan.predicted_peak if least[-1] else first[0] + 2**14

    monkeypatch.setattr(memplan_rounds, "compiled_peak", both_phases(measured))
    plan = _the_plan_trained(example, "70%")
    assert least == [False, False, True]
    assert len(plan.options["compiled_rounds"]) == len(least)
    assert plan.peak == plan.compiled_peak <= plan.budget


def _least_predicted(monkeypatch: pytest.MonkeyPatch, example: Example) -> int:
    """The predicted peak of `example`'s least-memory plan under the backend (compiled
    peaks as predicted). A mock of compiled peaks tells that plan by it, wherever the
    rounds make it (a round lowered far enough makes it, not only a 1-byte aim): as
    Inductor's, a mock's peak is one per plan."""
    with monkeypatch.context() as patched:
        patched.setattr(
            memplan_rounds, "compiled_peak", both_phases(lambda plan, *_: plan.predicted_peak)
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", MemplanWarning)
            return _the_plan_trained(example, f"{LEAST} B").predicted_peak


def test_under_the_least_the_plan_made_for_the_least_plans_compiled_peak_is_tried(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Planned under its least, the least-memory plan compiles well above its prediction
    (on the zoo's CNN at 50%, 195.69 MiB against 177.97 MiB, with 19 tensors recomputed).
    One more round is planned for that peak: it recomputes less, and here compiles as
    predicted, lower. That round is kept, as a best effort held to its own peak, and the
    warning names that peak (before, the least-memory plan was kept)."""
    example = ZOO["mlp"](batch=512)
    least_peak = _least_predicted(monkeypatch, example)
    checked: list[Plan] = []

    def measured(plan: Plan, *_: object) -> int:
        checked.append(plan)
        least = plan.predicted_peak <= least_peak
        return plan.predicted_peak + (plan.predicted_peak // 2 if least else 0)

    monkeypatch.setattr(memplan_rounds, "compiled_peak", both_phases(measured))
    found = r"graph0[.\d]*: as Inductor compiled it, the graph's least peak found is ([\d.]+ \w+)"
    with pytest.warns(MemplanWarning) as warned:  # the planner's, of its unfused least, too
        plan = _the_plan_trained(example, f"{LEAST} B")
    least, after = checked
    assert least.predicted_peak <= least_peak < after.predicted_peak  # it recomputes less
    compiled_least = least.predicted_peak + least.predicted_peak // 2
    assert after.requested_budget == compiled_least  # planned for that peak
    assert len(plan.options["compiled_rounds"]) == 2
    assert plan.status == "best-effort" and plan.note.startswith("planned at")
    assert plan.peak == plan.budget == after.predicted_peak < compiled_least
    named = {m.group(1) for w in warned if (m := re.search(found, str(w.message)))}
    assert named == {format_bytes(plan.peak)}


def test_under_the_least_only_the_lower_least_memory_round_is_followed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Under its least, a convolution graph's least-memory plan compiles well above its
    prediction with layout optimization (by half) and without it (by a quarter). Only the
    lower, without it, is followed by a round planned for its peak: three compiles, not
    four (on ResNet at its least, neither round after compiled lower: 31.85 MB after
    28.71 MB, 28.83 MB after 26.74 MB)."""
    settings = _layout_settings(monkeypatch)
    checked: list[tuple[Plan, bool]] = []  # each plan compiled, and with layout optimization

    def measured(plan: Plan, *_: object) -> int:
        checked.append((plan, settings[-1]))
        if plan.status != "best-effort":
            return plan.predicted_peak  # the round after: as planned
        return plan.predicted_peak + plan.predicted_peak // (2 if settings[-1] else 4)

    monkeypatch.setattr(memplan_rounds, "compiled_peak", both_phases(measured))
    plan = _small_cnn_plan(f"{LEAST} B")
    assert [(p.status, layout) for p, layout in checked] == [
        ("best-effort", True),
        ("best-effort", False),
        ("feasible", False),
    ]
    (least, _), (plain, _), (after, _) = checked
    plain_peak = plain.predicted_peak + plain.predicted_peak // 4
    assert after.requested_budget == plain_peak < least.predicted_peak * 3 // 2
    assert plan.peak == after.predicted_peak and plan.options["layout_optimization"] is False


def test_a_round_is_not_compiled_again_at_an_aim_a_few_bytes_off_one_tried(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The rounds' aims can come back to a few bytes off one already tried: the first plan
    peaks over its budget and is planned lower; that one peaks far under and is planned
    higher; that one peaks over by as much as brings the next aim back next to the
    second's. The plan there is the second's again, so it is not compiled again (on
    ResNet-50, a recompile of 30.44 MiB's plan)."""
    checked: list[Plan] = []
    peaks: list[int] = []

    def measured(plan: Plan, *_: object) -> int:
        checked.append(plan)
        target = checked[0].budget
        if len(checked) == 1:
            peaks.append(target + 2**16)
        elif len(checked) == 2:
            peaks.append(int(0.8 * target))
        else:  # next_aim: min(budget, predicted) + target - peak = the second's aim + 3
            peaks.append(target + min(plan.budget, plan.predicted_peak) - checked[1].budget - 3)
        return peaks[-1]

    monkeypatch.setattr(memplan_rounds, "compiled_peak", both_phases(measured))
    plan = _the_plan_trained(ZOO["mlp"](batch=512), "70%")
    assert peaks[2] > checked[0].budget  # the third round was over, as set up
    assert len(checked) == len(plan.options["compiled_rounds"]) == 3
    assert plan.peak == peaks[1]  # the second round, kept


def test_a_plan_made_again_at_a_raised_aim_is_not_compiled_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Fusion leaves half of every plan's prediction unused, so the rounds raise their aim;
    on GPT-2, more budget buys no other plan (what it recomputes costs nothing). A plan
    made again is not compiled again: every round compiled is a plan of its own (on the
    benchmark's GPT-2 at 90%, three Inductor compiles of one plan, 60 s of 97 s)."""
    made: list[Schedule] = []  # per plan made, its schedule (GPT-2 has one way to make it)
    plan_one = memplan.planner.plan.Partitioner._plan

    def recorded(self: memplan.planner.plan.Partitioner, *args: Any) -> Any:
        found = plan_one(self, *args)
        if not isinstance(found, InfeasibleBudget):
            made.append(found[2])
        return found

    checked: list[Plan] = []

    def measured(plan: Plan, *_: object) -> int:
        checked.append(plan)
        return plan.predicted_peak // 2

    monkeypatch.setattr(memplan.planner.plan.Partitioner, "_plan", recorded)
    monkeypatch.setattr(memplan_rounds, "compiled_peak", both_phases(measured))
    plan = _the_plan_trained(small_gpt2(), "90%")
    distinct = [m for i, m in enumerate(made) if m not in made[:i]]
    assert len(made) > len(distinct)  # a plan was made again, as set up
    assert len(checked) == len(plan.options["compiled_rounds"]) == len(distinct)


def test_a_graph_no_round_holds_is_named_with_how_far_over_its_budget(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Where every round, the least-memory plan's too, peaks over the budget as Inductor
    compiles it, the warning names the peak and how far it is over: a peak a few KiB over
    would otherwise print as the budget itself."""

    first: list[int] = []  # the budget of the first plan checked: the graph's

    def measured(plan: Plan, *_: object) -> int:
        first.append(plan.budget)
        return max(first[0], plan.predicted_peak) + 5000

    monkeypatch.setattr(memplan_rounds, "compiled_peak", both_phases(measured))
    over = r"graph0[.\d]*: as Inductor compiled it, the graph peaks at [^,]+, ([\d.]+ \w+) above"
    with pytest.warns(MemplanWarning, match=over) as warned:
        plan = _the_plan_trained(ZOO["mlp"](batch=512), "70%")
    (excess,) = {m.group(1) for w in warned if (m := re.search(over, str(w.message)))}
    assert plan.peak > plan.budget and excess == format_bytes(plan.peak - plan.budget)


def test_the_least_memory_plan_is_tried_with_layout_optimization_before_any_round_without(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No round made at a budget holds it with layout optimization (a plan's peak as
    compiled need not fall with its budget), but the least-memory plan does: it is
    compiled next, with layout optimization, and kept, and nothing is compiled without
    it. The plan holds the budget asked, so it says so, not that it is best effort."""
    least_peak = _least_predicted(monkeypatch, ZOO["cnn"](**SMALL_CNN))
    settings = _layout_settings(monkeypatch)
    first: list[int] = []  # the budget of the first plan checked: the graph's

    def measured(plan: Plan, *_: object) -> int:
        first.append(plan.budget)
        if plan.predicted_peak <= least_peak:
            return plan.predicted_peak
        return first[0] + 2**12  # over the budget, however low the plan was made

    monkeypatch.setattr(memplan_rounds, "compiled_peak", both_phases(measured))
    plan = _small_cnn_plan("90%")
    rounds = plan.options["compiled_rounds"]
    assert len(rounds) > 1 and rounds[-1][1] == plan.peak
    assert all(layout for *_, layout in rounds) and set(settings) == {True}
    assert plan.peak == plan.compiled_peak == plan.predicted_peak <= plan.budget
    assert plan.status == "feasible" and plan.note.startswith("the least-memory plan, so that")
    assert "layout_optimization" not in plan.options


def test_the_least_memory_plan_is_tried_without_layout_optimization_where_no_round_holds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No round holds the budget, with layout optimization (the least-memory plan's too)
    or without it: the last round is the least-memory plan compiled without it, once, and
    the least peak of all the rounds is kept."""
    least_peak = _least_predicted(monkeypatch, ZOO["cnn"](**SMALL_CNN))
    settings = _layout_settings(monkeypatch)
    first: list[int] = []  # the budget of the first plan checked: the graph's

    least_layouts: list[bool] = []  # per least-memory plan compiled: with layout optimization

    def measured(plan: Plan, *_: object) -> int:
        first.append(plan.budget)
        least = plan.predicted_peak <= least_peak
        if least:
            least_layouts.append(settings[-1])
        if settings[-1]:
            return first[0] + (2**11 if least else 2**13)
        return first[0] + (2**10 if least else 2**12)

    monkeypatch.setattr(memplan_rounds, "compiled_peak", both_phases(measured))
    plan = _small_cnn_plan("90%")
    rounds = plan.options["compiled_rounds"]
    assert least_layouts == [True, False] and rounds[-1][2] is False
    assert plan.peak == first[0] + 2**10 and plan.options["layout_optimization"] is False
    assert settings[-2:] == [False, False]  # the least plan, last compiled without it


def test_a_plan_says_where_the_user_turned_layout_optimization_off() -> None:
    """`inductor_config={"layout_optimization": False}`: the plan says it was compiled
    without it, as where the backend drops it (benchmarks read it there)."""
    example = ZOO["mlp"](batch=512)
    torch._dynamo.reset()
    off = {"layout_optimization": False}
    backend = memplan.backend(budget="70%", progress=False, inductor_config=off)
    model = copy.deepcopy(example.model)
    _train_and_compare(torch.compile(model, backend=backend), model, example.inputs)
    (plan,) = backend.plans
    assert plan.options["layout_optimization"] is False


def test_a_graph_the_check_cannot_run_is_compiled_without_layout_optimization(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Inductor's layout optimization saves channels-last copies only the check of the
    compiled graphs sees: where that check fails, the graph is compiled again without it,
    and a warning says the prediction is the unfused graphs'."""
    settings = _layout_settings(monkeypatch)

    def no_check(*_: object) -> int:
        raise RuntimeError("the check cannot run")

    monkeypatch.setattr(memplan_rounds, "compiled_peak", no_check)
    example = ZOO["mlp"](batch=512)
    torch._dynamo.reset()
    backend = memplan.backend(budget="70%", progress=False)
    model = copy.deepcopy(example.model)
    with pytest.warns(MemplanWarning, match="could not be checked"):
        _train_and_compare(torch.compile(model, backend=backend), model, example.inputs)
    assert settings == [True, True, False, False]  # forward and backward, twice
    (plan,) = backend.plans
    assert plan.compiled_peak == 0 and plan.peak <= plan.budget
