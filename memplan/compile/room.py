"""Room across graph breaks: a graph compiled into the step asks the graphs before it for
room (the step ledger decides, ledger.StepLedger.ask_room), and the user is told why the
next step differs.

The graphs of a step are planned in the order Dynamo compiles them, and an earlier graph
knows nothing of the later ones: it can keep so much for its backward that a later graph
is left under its least. `make_room` then has each graph before it (the plan that ran in
this step, at this step's sizes) asked for the most that graph needs while they hold
their saved tensors (a ledger.Room: its peak, with what the graphs between hold), and
they are planned again for it at their next step (replanner.Replanner.for_the_step).
The room a graph made is kept by its place in the step and its inputs' shapes
(ledger.RoomsMade): a graph compiled again at shapes it ran at before (Dynamo's recompile
with dynamic sizes) makes the same room at once, not a step later.
"""

from __future__ import annotations

import warnings
from collections.abc import Hashable, Iterable
from typing import Any

import torch

from memplan.compile.ledger import Reason, Shapes, StepLedger
from memplan.compile.step import step_peaks
from memplan.core.errors import MemplanWarning
from memplan.core.units import format_bytes


def shapes_of(args: Iterable[Any]) -> Shapes:
    """The shapes of a call's tensor arguments, in order."""
    return tuple(tuple(x.shape) for x in args if isinstance(x, torch.Tensor))


def make_room(ledger: StepLedger, key: Hashable, parameters: dict[int, tuple[int, int]]) -> bool:
    """Graph `key` joined the step: the graphs before it that the parameters it takes
    (with their gradients, `parameters`) take over the step's budget are planned again
    at their next step for them, and those it peaks over what they left are to leave it
    room (StepLedger.ask_room); the user is told of each. Whether any graph is to leave
    it room at its next step."""
    asked = ledger.ask_room(key, parameters)
    step = ledger.step
    plan = step[key]
    step_budget = plan.step_budget
    peaks = step_peaks(step, parameters) if asked.requests else {}
    for request in asked.requests:
        if request.reason is not Reason.REFRESH:
            continue
        seen = request.key
        warnings.warn(
            f"{step[seen].name}: with the parameters of the graphs after it and their "
            f"gradients, the step peaks at {format_bytes(peaks[seen])} while it runs, "
            f"{format_bytes(peaks[seen] - step_budget)} above its budget of "
            f"{format_bytes(step_budget)}: at the next step it will be planned again for them",
            MemplanWarning,
            stacklevel=3,
        )
    making = [r.key for r in asked.requests if r.reason is Reason.ROOM]
    if making:  # the user sees this step over the budget, and why the next differs
        names = ", ".join(step[seen].name for seen in making)
        warnings.warn(
            f"{plan.name}: with what the graphs before it hold, the step peaks at "
            f"{format_bytes(plan.step_peak)}, {format_bytes(plan.peak - plan.asked)} "
            f"above its budget of {format_bytes(step_budget)}: at the next step {names} "
            "will be planned again to leave it room",
            MemplanWarning,
            stacklevel=3,
        )
    return asked.leaving
