"""torch.compile as users run it, for numbers: Inductor compiles the planned graphs
(recomputations and memplan's transfer ops among them) and trains like eager, within the
budget as predicted; BatchNorm's statistics, recurrent layers, a retained graph, mixed
precision, dropout and a model's own checkpointing."""

from __future__ import annotations

import copy
import dataclasses
import io
import re
import warnings
from typing import Any

import pytest
import torch
import torch.utils.checkpoint
from compile_support import (
    LEAST,
    _assert_same_buffers,
    _assert_same_grads,
    _train_and_compare,
    in_float64,
    inductor_errors,
    max_grad_errors,
)
from test_e2e import eager_grads, example_of, train_step

import memplan
import memplan.compile.backend as memplan_backends
import memplan.compile.rounds as memplan_rounds
import memplan.compile.spinner
import memplan.planner.plan
import memplan.planner.profile
import memplan.planner.solve
from benchmarks.blocks import Block
from memplan.core.errors import (
    InfeasibleBudgetWarning,
    MemplanWarning,
    UnsupportedModel,
)
from memplan.core.units import format_bytes
from memplan.passes.offload import OFFLOAD, PREFETCH, RELEASE, WAIT
from memplan.tools.verify import steady_step_peak
from memplan.tools.zoo import ZOO, Example


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


def test_inductor_runs_an_offload_plan(monkeypatch: pytest.MonkeyPatch) -> None:
    # The roofline estimate, so that the plan is the same in every run: on times measured
    # under the load of a full test run (2-core CPU), the round kept offloaded nothing,
    # recomputing instead (at 50% on 2026-11-29, at 40% on 11-30). On the estimate the
    # MLP's plan at 40% offloads 10 tensors in every run.
    check_offload_plan_under_inductor(example_of("mlp"), monkeypatch, measure=False)


def check_offload_plan_under_inductor(
    example: Example, monkeypatch: pytest.MonkeyPatch, measure: bool
) -> None:
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
    compiled_graphs = _recording_inner(monkeypatch)
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


def _recording_inner(monkeypatch: pytest.MonkeyPatch) -> list[tuple[list, str]]:
    """Make the rounds' Inductor compiles record each graph they compile: the planned
    graph's (op, first input) in order, and the code Inductor made of it."""
    compiled_graphs: list[tuple[list, str]] = []
    compile_reading = memplan_rounds.compile_reading

    def recording(gm: torch.fx.GraphModule, *args: Any) -> Any:
        planned = [
            (n.target, n.args[0].name if n.args and isinstance(n.args[0], torch.fx.Node) else "")
            for n in gm.graph.nodes
        ]
        read = compile_reading(gm, *args)
        compiled_graphs.append((planned, read.compiled.source_code))
        return read

    monkeypatch.setattr(memplan_rounds, "compile_reading", recording)
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
# At the least, where 70%'s margin does not matter, ResNet with one block per stage and a
# smaller batch, and GPT-2 with one layer: at the zoo's size ResNet's least was the suite's
# longest test (171 s on a 2-core CPU with an empty Inductor cache, 2026-12-05).
LEAST_EXAMPLES = {
    **INDUCTOR_EXAMPLES,
    "gpt2": lambda: ZOO["gpt2"](layers=1),
    "resnet": lambda: ZOO["resnet"](batch=8, depths=(1, 1, 1)),
}


# In float64 a reordered reduction moves a gradient by about 1e-14 of its largest element;
# one float32 rounding anywhere in the step would move it by about 1e-7.
FLOAT64_TOLERANCE = 1e-9


# Inductor (the default) compiles the planned graphs, recomputation included: at the least,
# gradients equal to eager's as far as plain Inductor's are; at 70% and at the least, the
# allocator's peak of the compiled step within the budget and within 5% of the prediction
# of what Inductor runs (ResNet's kernels hold more than its planned graphs: it is planned
# again lower). The least and 70% are two tests, so that the test workers share them.


@pytest.mark.parametrize("name", list(LEAST_EXAMPLES))
def test_inductor_trains_like_eager_at_the_least(name: str) -> None:
    check_inductor_numerics(in_float64(LEAST_EXAMPLES[name]()))


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
    peaks above their least-memory plan; as Inductor compiles it, it can peak below, so it
    is compiled as one more round (the written lane, compile/search.py), and the lowest
    round is kept. Without that round, memplan's least peaked 10.76 MiB here, against
    torch.compile's 10.51 MiB (2-core CPU, 2026-11-30). Which round is lowest varies with
    the profiled times: the step as written in most runs, greedy's least-memory plan at
    10.01 MiB in one (2026-12-06). Gradients are eager's."""
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
    rounds = plan.options["compiled_rounds"]
    assert any(written for *_, written in rounds), rounds  # the step as written was compiled
    assert plan.compiled_peak == min(peak for _, peak, *_ in rounds), rounds
    if plan.solver == "as_written":
        assert "as the model is written" in plan.note, plan.note
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
