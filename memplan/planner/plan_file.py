"""The Plan: what a user reads before launching a job, and its JSON file.

Predicted peak and time, the decision per tensor, the timelines and the arena layout.
`Plan.save` writes it atomically; `Plan.load` checks every field through memplan.core.checks,
so that a damaged or hand-edited file is one PlanFileError naming the field. No torch
here: `memplan show` reads plans without loading it.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memplan.core import checks
from memplan.core.errors import PlanFileError
from memplan.core.files import write_atomically
from memplan.core.graph import Decision

PLAN_FORMAT = 1


@dataclass(frozen=True)
class Plan:
    """A planned training step: what the simulator predicts and the decision per tensor."""

    name: str
    solver: str
    status: str
    device: str
    budget: int  # bytes the plan is held to (in best-effort mode, the least peak found)
    unplanned_peak: int
    predicted_peak: int
    unplanned_time: float
    predicted_time: float
    solve_seconds: float
    fingerprint: str
    decisions: dict[str, str]  # saved tensor name -> keep | recompute | offload
    tensor_bytes: dict[str, int]
    timeline: list[int]  # predicted live bytes after each step
    clock: list[float]  # predicted compute time after each step
    unplanned_timeline: list[int]
    unplanned_clock: list[float]
    backward_start: int
    options: dict[str, Any] = field(default_factory=dict)
    # The layout of the plan's allocations in one arena (planner/layout.py); absent (0,
    # "", []) in plans written before layouts were planned.
    arena: int = 0
    arena_bound: int = 0  # the least arena any layout can have: the rounded live peak
    layout_method: str = ""
    layout_status: str = ""  # optimal | feasible | heuristic (layout.Layout.status)
    placements: list[list[int]] = field(default_factory=list)  # [start, end, bytes, offset]
    # The budget as the user asked for it, in bytes and as given ("60%"), and which
    # schedule this is where it is not simply the solver's answer; absent (0, "", "") in
    # plans written before they were recorded, where `budget` is what was asked.
    requested_budget: int = 0
    requested_as: str = ""
    note: str = ""
    # A graph traced with dynamic shapes: the sizes (symbol -> value) its prediction holds
    # at; empty for a graph of static shapes.
    sizes: dict[str, int] = field(default_factory=dict)
    # A step of several graphs (graph breaks): the bytes this graph's forward keeps for its
    # backward beyond its outputs (planned and unplanned), the bytes earlier graphs of the
    # step hold while it runs, and the step's unplanned peak as far as known when planned.
    held: int = 0
    unplanned_held: int = 0
    resident: int = 0
    unplanned_step_peak: int = 0
    # What the step holds on the device outside its graphs for the whole step (optimizer
    # state, planner/outside.py), which the budget counts.
    outside: int = 0
    # The bytes of the graph's forward outputs, which its peaks count to the end of its
    # backward: in a step of several graphs, the next graph's inputs, freed by then unless
    # the caller holds them (memplan.compile.step.step_peaks). 0 in plans written before.
    output_bytes: int = 0
    # Graphs compiled by Inductor: the predicted peak of what Inductor runs, simulated
    # from what the compiled graphs allocate (compile/inductor.py, core/emitted.py); 0
    # where memplan runs the planned graphs itself.
    compiled_peak: int = 0
    compiled_backward_peak: int = 0  # of its backward (in plans written since)
    # Whether a solve behind the plan ran to its time limit: its schedule is the best found
    # by then, which depends on how busy the machine was (such plans are not cached).
    cut_short: bool = False

    @property
    def peak(self) -> int:
        """The predicted peak of the graph as it runs: Inductor's where it compiled it."""
        return self.compiled_peak or self.predicted_peak

    @property
    def backward_peak(self) -> int:
        """The predicted peak of the graph's backward as it runs: Inductor's where it
        compiled it (and a plan recorded it), else the simulator's."""
        if self.compiled_backward_peak:
            return self.compiled_backward_peak
        return max(self.timeline[self.backward_start :], default=0)

    @property
    def step_peak(self) -> int:
        """The step's predicted peak while this graph runs, as far as the plan knows: its own
        and what the graphs before it hold. The parameters of later graphs, and their
        gradients, are the step's to count (memplan.compile.step.step_peaks)."""
        return self.peak + self.resident + self.outside

    @property
    def step_budget(self) -> int:
        """The step's budget in bytes, less the parameters and gradients of graphs after
        this one: what the graph was asked to hold, with what the graphs before it and
        the step outside them hold."""
        return self.asked + self.resident + self.outside

    @property
    def asked(self) -> int:
        """The budget the user asked for, in bytes."""
        return self.requested_budget or self.budget

    @property
    def fragmentation(self) -> float:
        """Arena bytes above the predicted live peak, as a fraction of it."""
        return self.arena / self.predicted_peak - 1 if self.arena and self.predicted_peak else 0.0

    @property
    def overhead(self) -> float:
        """Predicted step-time increase over the unplanned step, as a fraction."""
        return self.predicted_time / self.unplanned_time - 1 if self.unplanned_time else 0.0

    def counts(self) -> dict[str, int]:
        counts = {d.value: 0 for d in Decision}
        for decision in self.decisions.values():
            counts[decision] += 1
        return counts

    def to_json(self) -> dict[str, Any]:
        return {"format": PLAN_FORMAT, **dataclasses.asdict(self)}

    @classmethod
    def from_json(cls, data: object) -> Plan:
        """The plan that to_json wrote, each field checked against the type it holds.

        A plan file is edited and passed around by people, and a field of the wrong type
        would otherwise surface far away (a TypeError in a report, a silent misplot), so
        any mismatch is a PlanFileError naming the field. Integer fields take JSON integers
        only (not 1.5, not true); time fields take any finite number and store a float.
        Keys the plan does not know are ignored, so that newer files still load.
        """
        version = data.get("format") if isinstance(data, dict) else None
        if not (isinstance(data, dict) and checks.is_int(version) and version == PLAN_FORMAT):
            raise PlanFileError("not a memplan plan (missing or unknown 'format')")
        names = [f.name for f in dataclasses.fields(cls)]
        required = [
            f.name
            for f in dataclasses.fields(cls)
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        ]
        missing = sorted(set(required) - data.keys())
        if missing:
            raise PlanFileError(f"plan is missing fields: {', '.join(missing)}")
        fields: dict[str, Any] = {}
        for name in names:
            if name in data:
                fields[name] = checks.field(data, name, _PLAN_FIELDS[name], _field_error)
        for steps, times in (("timeline", "clock"), ("unplanned_timeline", "unplanned_clock")):
            if len(fields[steps]) != len(fields[times]):
                raise PlanFileError(
                    f"plan fields {steps!r} and {times!r} differ in length "
                    f"({len(fields[steps])} and {len(fields[times])}): one entry per step each"
                )
        return cls(**fields)

    def save(self, path: str | Path) -> None:
        """Write the plan as JSON atomically: a reader never sees half a file."""
        write_atomically(path, lambda out: json.dump(self.to_json(), out))

    @classmethod
    def load(cls, path: str | Path) -> Plan:
        """The plan in the file at `path`; PlanFileError, one line, for anything else."""
        data = checks.read_json(path, PlanFileError, "a memplan plan")
        try:
            return cls.from_json(data)
        except TypeError as error:
            raise PlanFileError(f"{path}: malformed plan ({error})") from None


# --- checking a plan file's fields (Plan.from_json) -------------------------------------


def _field_error(what: str) -> PlanFileError:
    return PlanFileError(f"plan field {what}")


def _placement(value: object) -> list[int]:
    """[start, end, bytes, offset]: integers, start at least -1 (resident before step 0)."""
    if not (
        isinstance(value, list)
        and len(value) == 4
        and all(checks.is_int(x) for x in value)
        and value[0] >= -1
        and value[1] >= value[0]
        and min(value[2:]) >= 0
    ):
        raise checks.Mismatch("must be [start, end, bytes, offset] integers with start <= end")
    return value


_DECISIONS = tuple(d.value for d in Decision)
_DECISION_NAMES = ", ".join(_DECISIONS[:-1]) + f" or {_DECISIONS[-1]}"
_COUNTS = checks.list_of(checks.count, "non-negative integers")
_SECONDS = checks.list_of(checks.seconds, "finite non-negative numbers")
# One check per Plan field: each returns the value as the Plan holds it or raises Mismatch.
_PLAN_FIELDS: dict[str, checks.Check] = {
    "name": checks.text,
    "solver": checks.text,
    "status": checks.text,
    "device": checks.text,
    "budget": checks.count,
    "unplanned_peak": checks.count,
    "predicted_peak": checks.count,
    "unplanned_time": checks.seconds,
    "predicted_time": checks.seconds,
    "solve_seconds": checks.seconds,
    "fingerprint": checks.text,
    "decisions": checks.names_to(checks.one_of(_DECISIONS), _DECISION_NAMES),
    "tensor_bytes": checks.names_to(checks.count, "non-negative integers"),
    "timeline": _COUNTS,
    "clock": _SECONDS,
    "unplanned_timeline": _COUNTS,
    "unplanned_clock": _SECONDS,
    "backward_start": checks.count,
    "options": checks.obj,
    "arena": checks.count,
    "arena_bound": checks.count,
    "layout_method": checks.text,
    "layout_status": checks.text,
    "placements": checks.list_of(_placement, "[start, end, bytes, offset] lists"),
    "requested_budget": checks.count,
    "requested_as": checks.text,
    "note": checks.text,
    "sizes": checks.names_to(checks.count, "non-negative integers"),
    "held": checks.count,
    "unplanned_held": checks.count,
    "resident": checks.count,
    "unplanned_step_peak": checks.count,
    "outside": checks.count,
    "output_bytes": checks.count,
    "compiled_peak": checks.count,
    "compiled_backward_peak": checks.count,
    "cut_short": checks.flag,
}
