"""The step of a model Dynamo compiles as several graphs (graph breaks), as its plans
predict it: what the graphs before a graph hold while it runs, the parameters only the
graphs after it take, and the step's predicted peak while each graph runs.

`step` is ledger.StepLedger.step: each graph's plan in the step (at the sizes the
step runs at, for a graph of dynamic shapes), in the order the graphs first compiled.
"""

from __future__ import annotations

import itertools
from collections.abc import Hashable, Sequence
from typing import Any, NamedTuple

from memplan.planner.plan import Resident
from memplan.planner.plan_file import Plan


class StepKey(NamedTuple):
    """A graph's entry in the step (ledger.StepLedger.step)."""

    frame: int  # Dynamo's frame id, -1 outside one
    index: int  # the graph's place among its frame compile's graphs
    parameters: frozenset[int]  # ids of the parameters it takes as inputs


def graph_key(
    example_inputs: Sequence[Any],
    graphs_of: dict[object, int],
    parameters: dict[int, tuple[int, int]],
) -> StepKey:
    """The entry in the step of the graph Dynamo compiles now, of `example_inputs`: (Dynamo
    frame, index of the graph in the frame's compile, ids of the parameters it takes);
    (-1, n, ...) outside a frame. `graphs_of` counts the graphs so far per Dynamo compile
    id; `parameters` gets the bytes of each parameter taken, and of its gradient."""
    # Imported here: the rest of the module is arithmetic on plans, which the step ledger
    # (ledger.py) uses without torch.
    import torch

    from memplan import compat

    compile_id = compat.current_compile_id()
    index = graphs_of.get(compile_id, 0)
    graphs_of[compile_id] = index + 1
    frame = -1 if compile_id is None or compile_id.frame_id is None else compile_id.frame_id
    taken = [x for x in example_inputs if isinstance(x, torch.nn.Parameter)]
    for parameter in taken:
        gradient = parameter.nbytes if parameter.requires_grad else 0
        parameters[id(parameter)] = (parameter.nbytes, gradient)
    return StepKey(frame, index, frozenset(id(x) for x in taken))


def keys_before(step: dict[Any, Plan], key: Hashable) -> list[Hashable]:
    """The graphs of `step` (ledger.StepLedger.step) compiled before graph `key`
    first was, in the step's order."""
    return list(itertools.takewhile(lambda seen: seen != key, step))


def resident_before(step: dict[Any, Plan], key: Hashable, outside: int) -> Resident:
    """What the graphs of `step` (ledger.StepLedger.step) compiled before graph `key`
    first was hold, with `outside`, what the step holds outside its graphs."""
    earlier = [step[seen] for seen in keys_before(step, key)]
    return Resident(
        held=sum(p.held for p in earlier),
        unplanned_held=sum(p.unplanned_held for p in earlier),
        unplanned_step_peak=max((p.unplanned_step_peak for p in earlier), default=0),
        outside=outside,
    )


def held_between(step: dict[Any, Plan], first: Hashable, later: Hashable) -> int:
    """What the graphs of `step` (ledger.StepLedger.step) between graph `first` and
    graph `later` hold."""
    before_later = keys_before(step, later)
    return sum(step[key].held for key in before_later[before_later.index(first) + 1 :])


def later_parameters(
    step: dict[Any, Plan], key: Hashable, parameters: dict[int, tuple[int, int]]
) -> tuple[int, int]:
    """The bytes of the parameters that only graphs of `step` after graph `key` take, and of
    their gradients (`parameters`: by id, as StepKey.parameters names them). The step holds
    the parameters while graph `key` runs; the later graphs' backwards make the gradients
    before its backward runs. 0 and 0 for a graph last in the step."""
    keys = list(step)
    at = keys.index(key) + 1
    counted = set().union(*(k.parameters for k in keys[:at]))
    later = set().union(*(k.parameters for k in keys[at:])) - counted
    return sum(parameters[p][0] for p in later), sum(parameters[p][1] for p in later)


def step_peaks(step: dict[Any, Plan], parameters: dict[int, tuple[int, int]]) -> dict[Any, int]:
    """The predicted peak of the step (ledger.StepLedger.step) while each of its
    graphs runs: its own peak and what the graphs before it hold (Plan.step_peak), with
    the parameters only graphs after it take and, during its backward, their gradients
    (later_parameters). There, a graph followed by others no longer holds its forward's
    outputs (their inputs), which its own backward's peak counts (Plan.output_bytes). Its
    forward's peak is not known apart: its own peak stands for it."""
    peaks = {}
    for index, (key, plan) in enumerate(step.items()):
        held, made = later_parameters(step, key, parameters)
        outputs = plan.output_bytes if index + 1 < len(step) else 0
        own = max(plan.peak, plan.backward_peak - outputs + made)
        peaks[key] = plan.resident + plan.outside + held + own
    return peaks
