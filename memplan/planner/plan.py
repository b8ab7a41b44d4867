"""The pipeline on one joint graph (lower, profile, solve, simulate, rewrite) and the Plan.

`Partitioner` is the partition function memplan hands to AOTAutograd; the Python API,
the .pt2 path and the torch.compile backend all plan through it. A Plan is what a user
reads before launching a job: predicted peak and time, and the decision per tensor.
"""

from __future__ import annotations

import dataclasses
import json
import math
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

import torch
import torch.fx as fx

from memplan.errors import InfeasibleBudget, MemplanError, PlanFileError
from memplan.files import write_atomically
from memplan.graph import Budget, Decision, Graph, Schedule, SolveResult, format_bytes
from memplan.passes.rewrite import rewrite
from memplan.planner.fragmentation import MOVES, ArenaFit, fit_arena
from memplan.planner.layout import (
    ALLOCATOR_ALIGNMENT,
    EXACT_TIME_LIMIT,
    METHODS,
    Layout,
    check_layout,
    lay_out,
)
from memplan.planner.lower import DEFAULT_OFFLOAD_THRESHOLD, Lowered, drop_checked_asserts, lower
from memplan.planner.profile import ProfileCache, profile_graph
from memplan.planner.simulate import MemoryTrace, simulate
from memplan.solvers import SolverOptions, get_solver
from memplan.solvers.training import build_schedule

PLAN_FORMAT = 1
# Host link bandwidth assumed when offloading and none is given: PCIe 4.0 x16 in practice.
DEFAULT_BANDWIDTH = {"cuda": 2.5e10, "cpu": 1.0e10}
FRAGMENTATION = ("live", "arena")


@dataclass(frozen=True)
class PlanOptions:
    """How to plan: the solver and its options, profiling, and whether to offload."""

    solver: str = "greedy"
    seed: int = 0
    time_limit: float = 60.0
    offload: bool | None = None  # None: offload where the device is not the host
    bandwidth: float | None = None  # host link bytes/s; None: DEFAULT_BANDWIDTH
    offload_threshold: int = DEFAULT_OFFLOAD_THRESHOLD
    measure: bool = True  # profile by running each node; False: roofline estimate
    progress: bool = True
    # When no schedule fits: plan for the smallest feasible peak with a warning (the
    # torch.compile default, where each graph of a graph break is planned on its own)
    # instead of raising InfeasibleBudget.
    best_effort: bool = False
    # What the budget bounds: "live", the sum of live bytes (what the simulator counts);
    # "arena", the arena of the plan's layout, fragmentation included (planner/layout.py).
    fragmentation: str = "live"
    layout: str = "best"  # the layout method, one of layout.METHODS

    def __post_init__(self) -> None:
        if self.fragmentation not in FRAGMENTATION:
            raise MemplanError(
                f"fragmentation must be one of {', '.join(FRAGMENTATION)}, "
                f"got {self.fragmentation!r}"
            )
        if self.layout not in METHODS:
            raise MemplanError(f"layout must be one of {', '.join(METHODS)}, got {self.layout!r}")

    def solver_options(self, device: torch.device) -> SolverOptions:
        offload = self.offload if self.offload is not None else device.type != "cpu"
        bandwidth = None
        if offload:
            bandwidth = self.bandwidth or DEFAULT_BANDWIDTH.get(device.type, 1.0e10)
        return SolverOptions(seed=self.seed, time_limit=self.time_limit, bandwidth=bandwidth)


@dataclass(frozen=True)
class Plan:
    """A planned training step: what the simulator predicts and the decision per tensor."""

    name: str
    solver: str
    status: str
    device: str
    budget: int
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
        if not (isinstance(data, dict) and _is_int(version) and version == PLAN_FORMAT):
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
            if name not in data:
                continue
            try:
                fields[name] = _PLAN_FIELDS[name](data[name])
            except _Mismatch as mismatch:
                raise PlanFileError(f"plan field {name!r} {mismatch}") from None
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
        path = Path(path)
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise PlanFileError(f"{path}: no such file") from None
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise PlanFileError(f"{path}: not valid JSON ({error})") from None
        except RecursionError:
            raise PlanFileError(f"{path}: JSON nested too deeply to be a plan") from None
        try:
            return cls.from_json(data)
        except TypeError as error:
            raise PlanFileError(f"{path}: malformed plan ({error})") from None


# --- checking a plan file's fields (Plan.from_json) -------------------------------------


class _Mismatch(Exception):
    """A plan field's value is not of the field's type; the message says what it must be."""


def _is_int(value: object) -> TypeGuard[int]:
    """A JSON integer: an int that is not a bool (json loads true as True, an int)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _shown(value: object) -> str:
    """repr(value), cut short so that an error about a long list stays one line."""
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:57]}..."


def _text(value: object) -> str:
    if not isinstance(value, str):
        raise _Mismatch(f"must be a string, got {_shown(value)}")
    return value


def _count(value: object) -> int:
    """Bytes or a step index: a non-negative JSON integer."""
    if not (_is_int(value) and value >= 0):
        raise _Mismatch(f"must be a non-negative integer, got {_shown(value)}")
    return value


def _seconds(value: object) -> float:
    """A time: a finite non-negative number (JSON writes 2.0 as 2.0, but people write 2)."""
    try:
        seconds = float(value) if _is_int(value) or isinstance(value, float) else math.nan
    except OverflowError:  # an integer too large for a float
        seconds = math.inf
    if not (math.isfinite(seconds) and seconds >= 0):
        raise _Mismatch(f"must be a finite non-negative number, got {_shown(value)}")
    return seconds


def _list_of(item: Callable[[object], Any], what: str) -> Callable[[object], list[Any]]:
    """A check for a JSON list whose every item passes `item`."""

    def check(value: object) -> list[Any]:
        if not isinstance(value, list):
            raise _Mismatch(f"must be a list of {what}, got {_shown(value)}")
        out = []
        for index, entry in enumerate(value):
            try:
                out.append(item(entry))
            except _Mismatch:
                raise _Mismatch(
                    f"must be a list of {what}; item {index} is {_shown(entry)}"
                ) from None
        return out

    return check


def _names_to(item: Callable[[object], Any], what: str) -> Callable[[object], dict[str, Any]]:
    """A check for a JSON object from tensor names to values that pass `item`."""

    def check(value: object) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise _Mismatch(f"must map tensor names to {what}, got {_shown(value)}")
        out = {}
        for key, entry in value.items():
            try:
                out[_text(key)] = item(entry)
            except _Mismatch:
                raise _Mismatch(
                    f"must map tensor names to {what}; {_shown(key)} maps to {_shown(entry)}"
                ) from None
        return out

    return check


def _decision(value: object) -> str:
    if not (isinstance(value, str) and value in _DECISIONS):
        raise _Mismatch(f"must be one of {_DECISION_NAMES}, got {_shown(value)}")
    return value


def _placement(value: object) -> list[int]:
    """[start, end, bytes, offset]: integers, start at least -1 (resident before step 0)."""
    if not (
        isinstance(value, list)
        and len(value) == 4
        and all(_is_int(x) for x in value)
        and value[0] >= -1
        and value[1] >= value[0]
        and min(value[2:]) >= 0
    ):
        raise _Mismatch("must be [start, end, bytes, offset] integers with start <= end")
    return value


def _options(value: object) -> dict[str, Any]:
    if not (isinstance(value, dict) and all(isinstance(key, str) for key in value)):
        raise _Mismatch(f"must be an object, got {_shown(value)}")
    return value


_DECISIONS = tuple(d.value for d in Decision)
_DECISION_NAMES = ", ".join(_DECISIONS[:-1]) + f" or {_DECISIONS[-1]}"
# One check per Plan field: each returns the value as the Plan holds it or raises _Mismatch.
_PLAN_FIELDS: dict[str, Callable[[object], Any]] = {
    "name": _text,
    "solver": _text,
    "status": _text,
    "device": _text,
    "budget": _count,
    "unplanned_peak": _count,
    "predicted_peak": _count,
    "unplanned_time": _seconds,
    "predicted_time": _seconds,
    "solve_seconds": _seconds,
    "fingerprint": _text,
    "decisions": _names_to(_decision, _DECISION_NAMES),
    "tensor_bytes": _names_to(_count, "non-negative integers"),
    "timeline": _list_of(_count, "non-negative integers"),
    "clock": _list_of(_seconds, "finite non-negative numbers"),
    "unplanned_timeline": _list_of(_count, "non-negative integers"),
    "unplanned_clock": _list_of(_seconds, "finite non-negative numbers"),
    "backward_start": _count,
    "options": _options,
    "arena": _count,
    "arena_bound": _count,
    "layout_method": _text,
    "layout_status": _text,
    "placements": _list_of(_placement, "[start, end, bytes, offset] lists"),
}


def plan_graph(
    graph: Graph,
    budget: Budget,
    options: PlanOptions,
    *,
    device: torch.device,
    fingerprint: str = "",
    reuse: Plan | None = None,
) -> tuple[Plan, Schedule]:
    """Solve the graph for the budget (or re-apply `reuse`'s decisions), checked by the
    simulator, and lay its allocations out in one arena. Raises InfeasibleBudget with the
    least peak (in "arena" mode, the least arena) found when nothing fits."""
    solver_options = options.solver_options(device)
    bandwidth = solver_options.bandwidth
    reference = get_solver("keep_all")(graph, 0, solver_options)
    assert reference.schedule is not None
    unplanned = simulate(graph, reference.schedule)
    budget_bytes = budget.resolve(unplanned.peak)

    if reuse is not None:
        result = _reapply(graph, reuse, solver_options)
    else:
        result = get_solver(options.solver)(graph, budget_bytes, solver_options)
    result, trace, budget_bytes = _within_budget(
        graph, result, budget_bytes, options, solver_options
    )
    layout = lay_out(
        trace.allocations,
        options.layout,
        alignment=ALLOCATOR_ALIGNMENT,
        time_limit=_layout_seconds(options),
    )
    if options.fragmentation == "arena":
        # A reused plan's decisions are fixed, and a best-effort plan is already at the
        # least live peak found: their arenas are checked, not fitted.
        fixed = reuse is not None or result.status == "best-effort"
        moves = () if fixed else MOVES
        result, trace, layout, budget_bytes = _fit_arena(
            graph,
            ArenaFit(result, trace, layout, ()),
            budget_bytes,
            options,
            solver_options,
            moves,
        )
    assert result.schedule is not None
    # The judges: the simulator for the live peak, the invariant checker for the layout.
    simulate(graph, result.schedule, bandwidth=bandwidth, budget=budget_bytes)
    check_layout(trace.allocations, layout)
    plan = _make_plan(
        graph, result, trace, layout, unplanned, budget_bytes, device, fingerprint, options
    )
    return plan, result.schedule


def _within_budget(
    graph: Graph,
    result: SolveResult,
    budget: int,
    options: PlanOptions,
    solver_options: SolverOptions,
) -> tuple[SolveResult, MemoryTrace, int]:
    """The result and its trace if its peak fits; else, with best_effort, the least peak
    found and that peak as the budget; else InfeasibleBudget."""
    bandwidth = solver_options.bandwidth
    trace = (
        None if result.schedule is None else simulate(graph, result.schedule, bandwidth=bandwidth)
    )
    if trace is not None and trace.peak <= budget:
        return result, trace, budget
    least = get_solver("greedy")(
        graph, 0, dataclasses.replace(solver_options, minimize_memory=True)
    )
    assert least.schedule is not None
    least_trace = simulate(graph, least.schedule, bandwidth=bandwidth)
    if trace is not None and trace.peak <= least_trace.peak:
        least, least_trace = result, trace
    if least_trace.peak <= budget:
        raise MemplanError(
            f"solver {result.solver!r} found no schedule within {format_bytes(budget)}"
            f"; 'greedy' reaches {format_bytes(least_trace.peak)}"
        )
    if not options.best_effort:
        raise InfeasibleBudget(budget, least_trace.peak, result.solver)
    warnings.warn(
        f"{graph.name}: budget {format_bytes(budget)} is infeasible; planned for "
        f"its smallest feasible peak {format_bytes(least_trace.peak)} instead",
        stacklevel=3,
    )
    return dataclasses.replace(least, status="best-effort"), least_trace, least_trace.peak


def _layout_seconds(options: PlanOptions) -> float:
    """CP-SAT's limit per layout: the layout's own, within the plan's time limit."""
    return min(EXACT_TIME_LIMIT, options.time_limit)


def _fit_arena(
    graph: Graph,
    start: ArenaFit,
    budget: int,
    options: PlanOptions,
    solver_options: SolverOptions,
    moves: tuple[str, ...],
) -> tuple[SolveResult, MemoryTrace, Layout, int]:
    """Bound the arena of the layout, fragmentation included, by the budget (see
    planner/fragmentation.py); with best_effort, the least arena found becomes the budget."""
    solver = get_solver(options.solver)
    fit = fit_arena(
        graph,
        budget,
        start,
        lambda live_budget: solver(graph, live_budget, solver_options),
        solver_options,
        method=options.layout,
        alignment=ALLOCATOR_ALIGNMENT,
        layout_seconds=_layout_seconds(options),
        moves=moves,
    )
    # The moves are recorded in the plan's options, for reports and benchmarks.
    fitted = dataclasses.replace(
        fit.result, options={**fit.result.options, "arena_moves": list(fit.moves)}
    )
    if fit.layout.arena <= budget:
        return fitted, fit.trace, fit.layout, budget
    if not options.best_effort:
        raise InfeasibleBudget(budget, fit.layout.arena, fit.result.solver, what="arena")
    warnings.warn(
        f"{graph.name}: no layout found within {format_bytes(budget)}; planned for an "
        f"arena of {format_bytes(fit.layout.arena)} instead",
        stacklevel=3,
    )
    best_effort = dataclasses.replace(fitted, status="best-effort")
    return best_effort, fit.trace, fit.layout, fit.layout.arena


def _reapply(graph: Graph, reuse: Plan, options: SolverOptions) -> SolveResult:
    unknown = [name for name in reuse.decisions if name not in graph.by_name]
    if unknown:
        raise PlanFileError(f"plan does not match this model: no tensor named {unknown[0]!r}")
    decisions = {graph.by_name[k]: Decision(v) for k, v in reuse.decisions.items()}
    schedule = build_schedule(graph, decisions, bandwidth=options.bandwidth)
    return SolveResult(
        solver=reuse.solver,
        status=reuse.status,
        schedule=schedule,
        decisions=decisions,
        options=reuse.options,
        message="re-applied from a saved plan",
    )


def _make_plan(
    graph: Graph,
    result: SolveResult,
    trace: MemoryTrace,
    layout: Layout,
    unplanned: MemoryTrace,
    budget: int,
    device: torch.device,
    fingerprint: str,
    options: PlanOptions,
) -> Plan:
    assert result.schedule is not None
    decisions = {graph[v].name: d.value for v, d in sorted(result.decisions.items())}
    return Plan(
        name=graph.name,
        solver=result.solver,
        status=result.status,
        device=str(device),
        budget=budget,
        unplanned_peak=unplanned.peak,
        predicted_peak=trace.peak,
        unplanned_time=unplanned.time,
        predicted_time=trace.time,
        solve_seconds=result.solve_seconds,
        fingerprint=fingerprint,
        decisions=decisions,
        tensor_bytes={graph[v].name: graph[v].bytes for v in sorted(result.decisions)},
        timeline=list(trace.live),
        clock=list(trace.clock),
        unplanned_timeline=list(unplanned.live),
        unplanned_clock=list(unplanned.clock),
        backward_start=result.schedule.split,
        options={**dataclasses.asdict(options), **result.options},
        arena=layout.arena,
        arena_bound=layout.live_peak,
        layout_method=layout.method,
        layout_status=layout.status,
        placements=[
            [a.start, a.end, a.bytes, offset]
            for a, offset in zip(trace.allocations, layout.offsets, strict=True)
        ],
    )


class Partitioner:
    """memplan's partition function for AOTAutograd: plans each joint graph it is given
    and returns the rewritten forward and backward. `plans` collects one Plan per graph."""

    def __init__(
        self,
        budget: Budget,
        options: PlanOptions,
        *,
        name: str = "model",
        reuse: Plan | None = None,
        cache: ProfileCache | None = None,
    ) -> None:
        self.budget = budget
        self.options = options
        self.name = name
        self.reuse = reuse
        # Profiled times are cached on disk, so that planning the same model twice sees the
        # same times and makes the same decisions.
        self.cache = cache if cache is not None else ProfileCache()
        self.plans: list[Plan] = []
        self.lowered: list[Lowered] = []

    def __call__(
        self, joint: fx.GraphModule, joint_inputs: object, *, num_fwd_outputs: int, **_: object
    ) -> tuple[fx.GraphModule, fx.GraphModule]:
        drop_checked_asserts(joint)
        joint.graph.eliminate_dead_code()
        name = self.name if not self.plans else f"{self.name}.{len(self.plans)}"
        lowered = lower(
            joint, num_fwd_outputs, name=name, offload_threshold=self.options.offload_threshold
        )
        if self.reuse is not None and self.reuse.fingerprint != lowered.fingerprint:
            raise PlanFileError(
                f"plan {self.reuse.name!r} was made for another graph "
                f"(fingerprint {self.reuse.fingerprint}, this model {lowered.fingerprint})"
            )
        device = lowered.device
        times = profile_graph(
            joint,
            device=device,
            measure=self.options.measure,
            cache=self.cache,
            progress=self.options.progress,
        )
        graph = lowered.graph.replace_times([times.get(n.name, 0.0) for n in lowered.fx_nodes])
        lowered = dataclasses.replace(lowered, graph=graph)
        plan, schedule = plan_graph(
            graph,
            self.budget,
            self.options,
            device=device,
            fingerprint=lowered.fingerprint,
            reuse=self.reuse,
        )
        stamp = {
            "solver": plan.solver,
            "budget": plan.budget,
            "predicted_peak": plan.predicted_peak,
            "solve_seconds": plan.solve_seconds,
        }
        forward, backward = rewrite(lowered, schedule, stamp=stamp)
        self.plans.append(plan)
        self.lowered.append(lowered)
        return forward, backward
