"""Graph breaks under one budget for the step: each graph planned with what the graphs
before it keep, room made for a later graph, the later graphs' parameters counted, and
all of it as the batch changes."""

from __future__ import annotations

import copy
import itertools
import warnings

import pytest
import torch
import torch.utils.checkpoint
from compile_support import (
    ThreeBreaks,
    _compiled_parts,
    _first_step_of_parts,
    _later_parameters,
    _train_and_compare,
)
from test_e2e import train_step

import memplan
import memplan.compile.spinner
import memplan.planner.plan
import memplan.planner.profile
import memplan.planner.solve
from benchmarks.blocks import large_head
from memplan.compile.by_name import memplan_backend
from memplan.core.errors import (
    InfeasibleBudgetWarning,
    MemplanWarning,
)
from memplan.core.units import format_bytes
from memplan.planner.measure import measure_peak
from memplan.tools.verify import resident_tensors, steady_step_peak, training_step


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
    2048 after 1536 peaked at 26.11 MB against 25.37 MB (2-core CPU, 2026-12-01). Unfused:
    what is tested is the step's accounting across graphs and sizes, which Inductor does
    not change, and its rounds are the cost (test_three_graph_breaks_hold_one_budget
    compiles breaks with Inductor)."""
    torch.manual_seed(0)
    model, x = ThreeBreaks(), torch.randn(2048, 64)
    budget = int(0.9 * steady_step_peak(model, model, (x,)))
    torch._dynamo.reset()
    planned = copy.deepcopy(model)
    backend = memplan.backend(budget=budget, inner="eager", progress=False)
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
    kept = list(backend.ledger.step.values())
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


def test_a_graph_before_a_break_makes_room_for_a_later_graph_left_under_its_least() -> None:
    """Two halves of checkpointed blocks with a break between them, at 24.69 MiB: the
    first graph, planned for the step's budget, keeps so much for its backward (17.51 MiB)
    that the second is left under its least (16.04 MiB), and warns that room will be made.
    At the next step the first graph is planned again with the second's peak taken as
    resident; the second runs only between its forward and its backward, so the round
    kept is the one whose own peak holds the budget without that room and whose bytes
    kept hold it with the room: the step as the model is written (7.51 MiB kept). The
    second is then planned for what the first holds, and from the step after the step
    holds the budget (23.55 MiB), as predicted, with eager's gradients (2-core CPU,
    2026-12-07). A budget in bytes: a share is of the unplanned step as Inductor runs it,
    whose first graph as written is its own least, so that no share under 100% leaves
    the first graph a plan that keeps more."""
    backend, planned, compiled, inputs, said = _first_step_of_parts(2, "24.69 MiB")
    short = [str(w.message) for w in said if issubclass(w.category, InfeasibleBudgetWarning)]
    assert any(message.startswith("graph1") for message in short), short
    (room,) = [str(w.message) for w in said if "leave it room" in str(w.message)]
    assert room.startswith("graph1") and "at the next step graph0" in room
    measured = steady_step_peak(compiled, planned, inputs)  # the second plans again
    first, second = backend.plans[:2]
    budget = second.step_budget  # 85% of the step's unplanned peak
    assert first.held + second.peak > budget  # the first step, as planned at first
    now_first, now_second = backend.ledger.step.values()  # each graph's plan now
    assert "leaving" in now_first.name and now_first.solver == "as_written"
    assert now_first.held < first.held and now_first.status == "feasible"
    assert now_first.resident == 0 and now_second.resident == now_first.held
    # The step's, less the parameters of the second graph (and their gradients), the room
    # given back.
    assert now_first.step_budget + 2 * _later_parameters(planned, 1) == budget
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
    kept = list(backend.ledger.step.values())
    last = kept[-1]
    budget = last.step_budget
    assert "leaving" in kept[0].name and kept[0].solver == "as_written"
    assert kept[0].status == "feasible"
    assert kept[0].budget + 2 * _later_parameters(planned, 1) == budget
    assert all(
        p.step_budget + 2 * _later_parameters(planned, k + 1) == budget for k, p in enumerate(kept)
    )
    assert [p.resident for p in kept[1:]] == list(itertools.accumulate(p.held for p in kept[:-1]))
    assert measured <= budget, (measured, budget)
    assert abs(measured / backend.predicted_step_peak - 1) <= 0.05
    _train_and_compare(compiled, planned, inputs)


def test_a_graph_before_a_break_counts_the_parameters_of_the_graphs_after_it() -> None:
    """benchmarks.blocks.large_head at 35.21 MiB: the first graph peaks at 33.25 MiB as
    Inductor compiled it, within the budget; but while it runs the step holds the head's
    parameters too (4.17 MiB), and in its backward their gradients, and it keeps so much
    for its backward (21.00 MiB) that the head is left short. The step's prediction counts
    them (37.60 MiB). Compiling the head warns that the first graph will be planned again
    for them; it is, with its budget less them, but its least is 33.00 MiB, and the step
    stays over at 37.35 MiB, as predicted and as a warning then says (2-core CPU,
    2026-12-07)."""
    model, inputs = large_head()
    torch._dynamo.reset()
    backend = memplan.backend(budget="35.21 MiB", progress=False)
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
    first, head = backend.ledger.step.values()
    budget = head.step_budget
    wide = sum(p.nbytes for p in [*planned.wide.parameters(), *planned.out.parameters()])
    assert "later graphs" in first.name and first.resident == 0
    assert first.asked + 2 * wide == budget  # the head's parameters, and their gradients
    assert max(first.step_peak, head.step_peak) < 0.95 * measured
    assert abs(measured / backend.predicted_step_peak - 1) <= 0.01, measured
    _train_and_compare(compiled, planned, inputs)


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
