"""The replanner: a run's graph planned and compiled again as the step ledger's re-plans
come due, at a step boundary, each plan kept by its reason's rule.

- For the step (ROOM, REFRESH): the graph is planned again for what the graphs before it
  hold now and, asked for room, with the room the later graphs need (a ledger.Room: a
  later graph's peak with what the graphs between hold) taken as resident; the round kept
  is the fastest whose own peak holds with the room given back and whose bytes kept for
  the backward hold it with the room taken (`Partitioner.room`). The new plan is kept by
  runner_state.keeps. Where what it holds changed, the graphs after it are refreshed in
  turn; where it still peaks over what the graphs before it left, they are asked for room
  (room.make_room), or, where they can leave no more, the user is told.
- For what was held (HELD_OVER), once: calls waiting for their backward held more than
  the plan allowed for. The graph's own calls keep what its new plan keeps, so the bytes
  taken as resident are bisected for the plan with the most room whose peak, with what
  would be held under it, holds the step's budget.
- For the rest of a step found over: the least-memory plan (all of the step's budget
  taken as resident), run until the graph's next step begins.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from memplan.compile.ledger import Held, Reason, StepLedger, room_for
from memplan.compile.room import make_room
from memplan.compile.runner_state import RunState, keeps
from memplan.compile.step import later_parameters, resident_before, step_peaks
from memplan.core.budget import Budget
from memplan.core.errors import MemplanWarning
from memplan.core.units import format_bytes
from memplan.planner.options import PlanOptions
from memplan.planner.outside import Outside
from memplan.planner.partitioner import Partitioner
from memplan.planner.plan import Resident
from memplan.planner.plan_file import Plan
from memplan.planner.shapes import ShapeSignature

# How many more plans bisect what a graph whose earlier calls are its own may take as
# held, after the first plan for what they kept (each is a compile), and how close (a
# share) the bounds may come before the bisection stops.
FIXED_POINT_ROUNDS = 3
SAME_HELD = 0.05


class Backend(Protocol):
    """What planning a graph again needs of the backend (backend.MemplanBackend): its
    budget, options and compile, its plans, its step ledger, the step's parameters' bytes
    (step_peaks) and what the step holds outside its graphs."""

    budget: Budget
    options: PlanOptions
    plans: list[Plan]
    ledger: StepLedger
    parameters: dict[int, tuple[int, int]]
    outside: Outside

    def compile(
        self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any], partitioner: Partitioner
    ) -> Callable[..., Any]: ...

    def outside_grew(self, inputs: Sequence[Any], step_budget: int) -> bool: ...


@dataclass(eq=False)  # by identity: the step ledger keeps its record by the run, weakly
class Run:
    """One plan of graph `key` of the step (`gm`, named `name`), at `sizes` for a graph of
    dynamic shapes (() for one of static shapes): the plan made last (`plan`), what the
    graphs before it held when it was (`resident`), `compiled`, carrying out `running`
    (the least-memory plan while the run's phase is LEAST_FOR_NOW, else `plan`), and its
    state (runner_state.RunState)."""

    key: Hashable
    gm: torch.fx.GraphModule
    name: str
    sizes: ShapeSignature
    resident: Resident
    compiled: Callable[..., Any]
    plan: Plan
    running: Plan
    state: RunState = field(default_factory=RunState)

    def runs(self, compiled: Callable[..., Any], plan: Plan) -> None:
        """`compiled` carries out `plan`, the run's plan from now on."""
        self.compiled, self.plan, self.running = compiled, plan, plan


class Replanner:
    """Plans runs of `backend`'s graphs again (the module's docstring)."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    def compile_again(
        self, run: Run, args: list[Any], held: Resident, why: str = "", room: int = 0
    ) -> tuple[Callable[..., Any], Plan]:
        """`run`'s graph compiled on a call's own tensors (a graph of those sizes only),
        planned with `held` resident (and at least what the graphs before it held when it
        was planned), `room` of it a later graph's (Partitioner.room); its plan, not yet
        the backend's, named with `why` (by default, the bytes held)."""
        later = f" and {format_bytes(held.later)} by later graphs" if held.later else ""
        name = f"{run.name} ({why or f'with {format_bytes(held.held)} held{later}'})"
        backend = self.backend
        # Best effort: the step is running, and the bound on what is held may be loose.
        options = dataclasses.replace(backend.options, best_effort=True)
        partitioner = Partitioner(backend.budget, options, name=name)
        partitioner.resident = run.resident.with_at_least(held)
        partitioner.room = room
        partitioner.sizes = run.sizes
        with warnings.catch_warnings():  # of a budget cut by a bound: the runner checks
            warnings.simplefilter("ignore", MemplanWarning)
            compiled = backend.compile(run.gm, args, partitioner)
        return compiled, backend.plans.pop()

    def resident_now(self, key: Hashable) -> Resident:
        """What the step's graphs compiled before graph `key` hold under their plans now,
        and the parameters of those after it, with their gradients (later_parameters);
        the step's unplanned peak, of all its graphs."""
        backend = self.backend
        step = backend.ledger.step
        before = resident_before(step, key, backend.outside.total)
        later = sum(later_parameters(step, key, backend.parameters))
        unplanned = max(
            [before.unplanned_step_peak, *(p.unplanned_step_peak for p in step.values())]
        )
        return dataclasses.replace(before, later=later, unplanned_step_peak=unplanned)

    def _keep(self, run: Run, plan: Plan, in_step: bool = True, in_plans: bool = True) -> None:
        """`plan` among the backend's plans (where `in_plans`) and, where `in_step`, as
        `run`'s graph's plan in the step."""
        if in_plans:
            self.backend.plans.append(plan)
        if in_step:
            self.backend.ledger.keep(run.key, plan)

    def for_the_step(self, run: Run, args: list[Any]) -> bool:
        """`run`'s graph planned again across graph breaks (ROOM or REFRESH, pending in
        the ledger), for what the graphs before it hold now, and with the room the later
        graphs asked of it taken as resident; kept by runner_state.keeps, the old plan
        staying otherwise. Whether the run's plan was replaced (its resident bytes and
        budget, at least): not where nothing was asked and nothing before it changed."""
        ledger = self.backend.ledger
        # Planned again for what the graphs before hold, it still leaves the room it left.
        asked, later = ledger.take_step(run)
        now = self.resident_now(run.key)
        if not asked and now == run.resident:
            return False
        run.resident = now
        needed, beyond = room_for(later, now)
        room = dataclasses.replace(
            now,
            held=now.held + beyond,
            unplanned_step_peak=max(
                [now.unplanned_step_peak, *(r.unplanned_step_peak for r in later.values())]
            ),
        )
        why = f"leaving {format_bytes(needed)} for later graphs" if later else ""
        held_before = run.plan.held
        compiled, plan = self.compile_again(run, args, room, why, beyond)
        step_budget = self.backend.budget.resolve(plan.unplanned_step_peak)
        freed = max(0, run.plan.resident - now.held)
        made = keeps(Reason.ROOM if asked else Reason.REFRESH, run.plan, plan, freed)
        if not made:
            compiled, plan = run.compiled, run.plan
        elif later:
            ledger.left(run, later)
        # Resident: what the graphs before and the step outside them hold (the room is a
        # later graph's, not resident while this one runs); asked, and held to where it
        # holds: the step's budget less that.
        asked_bytes = max(1, step_budget - now.held - now.later - now.outside)
        holds = plan.status != "best-effort" and plan.peak <= asked_bytes
        held_to = asked_bytes if holds else plan.budget
        plan = dataclasses.replace(
            plan, resident=now.held, requested_budget=asked_bytes, budget=held_to
        )
        self._keep(run, plan, in_plans=made)
        run.runs(compiled, plan)
        if plan.held != held_before:  # the graphs after it were planned for what it held
            ledger.refresh_after(run.key)
        if plan.peak > asked_bytes:
            self._over_as_planned_again(run, step_budget)
        return True

    def _over_as_planned_again(self, run: Run, step_budget: int) -> None:
        """`run`'s graph, planned again for the step (its plan, best effort, found no
        lower), peaks over what the graphs before it and the parameters of those after it
        left of `step_budget`: the graphs before it are to leave it room at their next
        step (room.make_room, which says so), or, where none can, the user is told how far
        over the step is."""
        backend, plan = self.backend, run.plan
        if make_room(backend.ledger, run.key, backend.parameters):
            return
        # The later graphs' gradients are held in its backward only (step_peaks).
        step_peak = step_peaks(backend.ledger.step, backend.parameters)[run.key]
        if step_peak <= step_budget:
            return
        warnings.warn(
            f"{plan.name}: planned again for the step, it peaks at {format_bytes(plan.peak)} "
            f"with the best plan found, and the step at {format_bytes(step_peak)}, "
            f"{format_bytes(step_peak - step_budget)} above its budget of "
            f"{format_bytes(step_budget)}; the graphs before it leave it no more room",
            MemplanWarning,
            stacklevel=5,
        )

    def least_for_now(self, run: Run, args: list[Any], held: Held) -> None:
        """`run`'s graph's least-memory plan (planned with all of the step's budget taken
        as held) to run the rest of the step: found over at a call, the step's later calls
        of it (the rest of a deep model's blocks) would each keep what the plan allowed
        for one, and on a device the step would run out of memory before the next one is
        planned for them. Not the graph's plan in the step: it runs only until the graph
        is planned again."""
        least = dataclasses.replace(held.resident, held=run.plan.step_budget)
        run.compiled, run.running = self.compile_again(run, args, least, "least, for the step")
        self._keep(run, run.running, in_step=False)

    def for_what_was_held(self, run: Run, args: list[Any]) -> None:
        """`run`'s graph planned again for what calls held at most (HELD_OVER, pending in
        the ledger), the last time. Its own earlier calls keep what its new plan keeps:
        planned with more held resident, it recomputes more, and they keep less. So what
        they would hold under a plan is predicted (Held.under), and the bytes taken as
        resident are bisected (FIXED_POINT_ROUNDS plans after the first, each a compile)
        for the plan with the most room whose peak, with what would be held under it, is
        predicted within the step's budget; where none is found, the least-memory plan
        (best effort). Where it leaves later graphs room, each plan leaves it too."""
        ledger = self.backend.ledger
        held = ledger.take_over(run)
        # It still leaves the later graphs the room it left them (make_room): taken as
        # resident, and given back for its own peak (Partitioner.room).
        leaving = ledger.entries[run].leaving
        needed, beyond = room_for(leaving, run.resident)
        why = f"leaving {format_bytes(needed)} for later graphs" if leaving else ""

        def tried(resident: int) -> tuple[Callable[..., Any], Plan, bool]:
            taken = dataclasses.replace(held.resident, held=resident + beyond)
            compiled, plan = self.compile_again(run, args, taken, why, beyond)
            # Its own peak, and what it keeps while a later graph runs in the room.
            peak = peak_with_room(plan, beyond) + beyond
            return compiled, plan, held.under(plan) + peak <= plan.step_budget

        high = held.resident.held  # what the calls held
        compiled, plan, holds = tried(high)
        step_budget = plan.step_budget
        if holds:  # what they would hold under it: less, but too little to plan for
            low = held.under(plan)
        elif held.own_calls:  # its calls keep more under it than under the old plan
            low, high = high, step_budget  # all of it resident: the least-memory plan
            compiled, plan, holds = tried(high)
        for _ in range(FIXED_POINT_ROUNDS if holds and held.own_calls else 0):
            if high - low <= SAME_HELD * step_budget:
                break
            middle = (low + high) // 2
            made, made_plan, made_holds = tried(middle)
            if made_holds:
                compiled, plan, high = made, made_plan, middle
            else:
                low = middle
        self._keep(run, plan)
        run.runs(compiled, plan)


def peak_with_room(plan: Plan, room: int) -> int:
    """A plan's peak against a budget `room` of whose resident bytes are a later graph's,
    needed only between the plan's forward and its backward (Partitioner.room): its own
    peak without them, and what it keeps for its backward, which they are resident with
    (compile/search.py's `holds`)."""
    return max(plan.peak - room, plan.held) if room else plan.peak
