"""The predicted peak of a step Dynamo compiles as several graphs (compile/step.py's
step_peaks)."""

from __future__ import annotations

import dataclasses

from test_plan_file import hand_made_plan

from memplan.compile.step import StepKey, later_parameters, step_peaks
from memplan.planner.plan_file import Plan

MiB = 2**20


def _graph(peak: int, backward_peak: int, resident: int, outputs: int = 0) -> Plan:
    """A plan peaking at `peak` MiB (its backward at `backward_peak`), with `resident` MiB
    held by the graphs before it and `outputs` MiB of forward outputs."""
    return dataclasses.replace(
        hand_made_plan(),
        compiled_peak=peak * MiB,
        compiled_backward_peak=backward_peak * MiB,
        resident=resident * MiB,
        output_bytes=outputs * MiB,
    )


def step_peak(step: dict[StepKey, Plan], parameters: dict[int, tuple[int, int]]) -> int:
    return max(step_peaks(step, parameters).values())


def test_a_graph_counts_the_parameters_of_later_graphs_and_in_its_backward_their_gradients():
    """Two graphs: the first peaks at 30 MiB (its backward at 28), the second at 10 with
    the first's 12 MiB held. The second takes a 4 MiB parameter (4 MiB of gradient) and
    one the first takes too (a tied weight, counted in the first's own peak already)."""
    first_key = StepKey(0, 0, frozenset({1}))
    second_key = StepKey(1, 0, frozenset({1, 2}))
    parameters = {1: (4 * MiB, 4 * MiB), 2: (4 * MiB, 4 * MiB)}
    step = {first_key: _graph(30, 28, 0), second_key: _graph(10, 10, 12)}
    assert later_parameters(step, first_key, parameters) == (4 * MiB, 4 * MiB)
    assert later_parameters(step, second_key, parameters) == (0, 0)
    # While the first runs: its forward with the second's parameter (34), its backward
    # with its gradient too (28 + 8 = 36).
    assert step_peaks(step, parameters) == {first_key: 36 * MiB, second_key: 22 * MiB}
    # By its backward, the first's forward outputs (the second's inputs) are freed: its
    # backward with the gradient (28 - 2 + 4) is then under its own peak (30).
    step[first_key] = _graph(30, 28, 0, outputs=2)
    assert step_peak(step, parameters) == 34 * MiB
    # A backward lower than its own peak by more than the gradient: the peak stands.
    step[first_key] = _graph(30, 20, 0)
    assert step_peak(step, parameters) == 34 * MiB
    # A frozen parameter makes no gradient.
    assert step_peak(step, {1: (4 * MiB, 4 * MiB), 2: (4 * MiB, 0)}) == 34 * MiB
    # Where the second graph's own step is the higher, it is the step's; the last graph
    # keeps its outputs (the loss the caller holds).
    step[second_key] = _graph(30, 30, 12, outputs=2)
    assert step_peak(step, parameters) == 42 * MiB


def test_a_plan_without_a_compiled_backward_peak_gives_the_simulators() -> None:
    plan = hand_made_plan()  # timeline [100, 300, 950, 700, 400], backward from step 2
    assert plan.backward_peak == 950
    assert dataclasses.replace(plan, compiled_backward_peak=800).backward_peak == 800
