"""torch.compile as users reach memplan: by name or by object, two models, Dynamo's
reset, evaluation between steps, what is refused and said, a terminal's spinner, and a
user's profiler or random numbers around the compiling step."""

from __future__ import annotations

import copy
import io
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.utils.checkpoint
from compile_support import _train_and_compare, small_gpt2
from rich.console import Console
from test_e2e import eager_grads, train_step

import memplan
import memplan.compile.spinner
import memplan.planner.plan
import memplan.planner.prepared
import memplan.planner.profile
import memplan.planner.solve
from memplan.compile.by_name import memplan_backend
from memplan.core.errors import (
    AllocatorUnreadable,
    MemplanError,
    MemplanWarning,
    UnknownSolver,
    cause_of,
)
from memplan.planner.measure import measure_peak
from memplan.planner.options import PlanOptions
from memplan.tools.zoo import ZOO


def test_two_models_in_one_process() -> None:
    """Each torch.compile call by name gets a backend of its own. Unfused: what one model's
    compile leaves behind is tested, not Inductor's rounds (by name under Inductor:
    test_three_graph_breaks_hold_one_budget_for_the_step)."""
    torch._dynamo.reset()
    options = {"budget": "70%", "inner": "eager", "progress": False}
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
    assert before.held > 0 and after.resident == 0 and len(backend.ledger.step) == 1


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
    monkeypatch.setattr(memplan.compile.spinner, "get_console", lambda: terminal)
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
    monkeypatch.setattr(memplan.compile.spinner, "get_console", lambda: terminal)
    monkeypatch.setenv("RANK", rank)
    if local_rank is None:
        monkeypatch.delenv("LOCAL_RANK", raising=False)
    else:
        monkeypatch.setenv("LOCAL_RANK", local_rank)
    with memplan.compile.spinner.spinner("graph0: planning for 70%", progress=True):
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
    profile_graph = memplan.planner.prepared.profile_graph

    def profiled(*args: Any, **kwargs: Any) -> Any:
        _a_library_deprecation()
        return profile_graph(*args, **kwargs)

    monkeypatch.setattr(memplan.planner.prepared, "profile_graph", profiled)
    example = ZOO["mlp"]()
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        memplan.plan(example.model, example.inputs, budget="1 B", best_effort=True, progress=False)
    places = {(w.category, Path(w.filename).name) for w in said}
    assert (DeprecationWarning, Path(__file__).name) in places
    assert any(issubclass(category, MemplanWarning) for category, _ in places)  # still said


def test_compiling_leaves_the_users_random_numbers() -> None:
    """Profiling runs the graph on random inputs, from a generator of its own, and the
    rounds run nothing: a user's random numbers after compiling are those they would have
    had."""
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
    memplan measures times only, bounds transients per op family and says so; the peak
    as Inductor compiles the plan needs no allocator, and the user's profile keeps the
    whole step."""
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
    (plan,) = backend.plans
    assert plan.compiled_peak > 0
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
