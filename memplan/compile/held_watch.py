"""Calls of a planned graph made while earlier calls still hold tensors for their backward.

The backend plans a graph for what the graphs compiled before it in the step hold while
it runs (`Plan.resident`: graph breaks, in the order Dynamo compiled them). A module
compiled on its own and called twice before one backward (a siamese encoder, two
micro-batches summed into one loss, each block of a model compiled alone) holds its
first call's saved tensors while the second runs, and no compile sees that: the step can
peak well over its budget.

`HeldWatch` runs a compiled graph and, until CHECKED_STEPS of its steps were checked,
sums at each call what the calls still waiting for their backward (of any graph of the
backend) keep, beyond what this call takes as inputs: their autograd nodes' saved tensors
(what AOTAutograd keeps is what the plan keeps) and their outputs still alive. Where that
exceeds what the plan allowed for (its resident bytes and the room it left under its
budget), it warns, with the bytes; the step's later calls of the graph run its
least-memory plan (`HeldWatch._least_for_now`: the step's count of calls is known only
when it ends), and at the graph's first call of the next step the graph is planned again
for them (`GraphAgain`, `HeldWatch._plan_again`), once. What runs outside the compiled
graphs is not seen.

Across graph breaks a graph before one left under its least (room.make_room, which
warns) is planned again at its next step, once, with the most a later graph left short
needs (ledger.Room: its peak, with what the graphs between hold) taken as resident; or at
its first call, where it made that room before at the same shapes. The later graph
runs only between their forwards and their backwards, so the round kept is the fastest
whose own peak holds the budget with that room given back and whose bytes kept for the
backward hold it with the room taken (`Partitioner.room`). The graphs after one whose
plan changed are planned again for what the graphs before them then hold
(`HeldWatch._plan_for_the_step`); where one then peaks over what they left, they leave it
room in turn, or, where they can leave no more, the user is told. While a graph runs,
the step also holds the parameters only the graphs after it take, and in its backward
their gradients (`step_peaks`): where a graph compiled later takes an earlier graph's step
over the budget so, the earlier one is planned again at its next step with them resident
(room.make_room). Which of these re-plans are pending, and why, the step ledger keeps
(ledger.StepLedger); the watches carry them out.
"""

from __future__ import annotations

import dataclasses
import warnings
import weakref
from collections.abc import Callable, Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from torch._subclasses.fake_tensor import is_fake
from torch.autograd.function import BackwardCFunction

from memplan.compile.ledger import Held, Reason, StepLedger, room_for
from memplan.compile.room import make_room, shapes_of
from memplan.compile.step import later_parameters, resident_before, step_peaks
from memplan.core.budget import Budget
from memplan.core.errors import MemplanWarning
from memplan.core.units import format_bytes
from memplan.planner.options import PlanOptions
from memplan.planner.partitioner import Partitioner
from memplan.planner.plan import Resident
from memplan.planner.plan_file import Plan
from memplan.planner.shapes import ShapeSignature

# Per graph: after how many of its steps whose calls found earlier calls waiting, and
# held no more than its plan allowed for, its calls are no longer checked (counted again
# after it is planned again). Checking every call would cost every step; a step with no
# earlier call waiting costs little. A graph's step begins at a call while none of its
# earlier calls waits for its backward.
CHECKED_STEPS = 2
# How many view nodes may lie between an output and the Function that computed it.
VIEW_DEPTH = 4

# How many more plans bisect what a graph whose earlier calls are its own may take as
# held, after the first plan for what they kept (each is a compile), and how close (a
# share) the bounds may come before the bisection stops.
FIXED_POINT_ROUNDS = 3
SAME_HELD = 0.05


@dataclass
class _Waiting:
    """A call whose backward has not run: its autograd node and outputs, while they
    live, the plan it ran and the watch that ran it."""

    node: weakref.ref[Any]
    outputs: list[weakref.ref[torch.Tensor]]
    plan: Plan
    watch: HeldWatch
    done: bool = False

    @property
    def waits(self) -> bool:
        return not self.done and self.node() is not None

    def kept(self, storages: set[int]) -> dict[int, int]:
        """{storage address: bytes} of what the call keeps for its backward and of its
        outputs still alive (the caller's to hold, as a siamese step holds its first
        embedding), but for the storages in `storages`; nothing once its backward ran or
        its node was freed."""
        node = self.node()
        if self.done or node is None:
            return {}
        try:
            saved = list(node.saved_tensors)
        except RuntimeError:  # freed by a backward run without the hook seeing it
            return {}
        alive = [t for t in (ref() for ref in self.outputs) if t is not None]
        tensors = (t.untyped_storage() for t in saved + alive if isinstance(t, torch.Tensor))
        return {s.data_ptr(): s.nbytes() for s in tensors if s.data_ptr() not in storages}


@dataclass
class WaitingCalls:
    """The calls of a backend's graphs whose backward has not run yet."""

    calls: list[_Waiting] = field(default_factory=list)

    def held_beyond(self, inputs: Iterable[Any], watch: HeldWatch) -> Held:
        """What the waiting calls keep for their backward while `watch`'s graph runs on
        `inputs`, beyond their storages (the parameters a repeated graph shares, the
        outputs the next graph takes); as unplanned, each call's plan's unplanned bytes
        held less what of its plan's held bytes it does not keep beyond `inputs`."""
        taken = {x.untyped_storage().data_ptr() for x in inputs if isinstance(x, torch.Tensor)}
        held: dict[int, int] = {}
        unplanned = own_calls = own_planned = 0
        for call in self.calls:
            kept = call.kept(taken)
            unplanned += max(0, call.plan.unplanned_held - call.plan.held + sum(kept.values()))
            if call.watch is watch:
                own_calls, own_planned = own_calls + 1, own_planned + call.plan.held
            held.update(kept)
        resident = Resident(held=sum(held.values()), unplanned_held=unplanned)
        return Held(resident, own_calls, own_planned)

    def any(self) -> bool:
        """Whether any call waits; those that do not are dropped."""
        self.calls = [c for c in self.calls if c.waits]
        return bool(self.calls)

    def waiting_of(self, watch: HeldWatch) -> bool:
        """Whether a call `watch` ran waits for its backward."""
        return any(c.watch is watch and c.waits for c in self.calls)

    def add(self, outputs: Any, plan: Plan, watch: HeldWatch) -> None:
        """The call that returned `outputs`, waiting for its backward where it has one."""
        tensors = [
            t
            for t in (outputs if isinstance(outputs, list | tuple) else (outputs,))
            if isinstance(t, torch.Tensor)
        ]
        node = _node_of(tensors)
        if node is None:
            return
        alive = [weakref.ref(t) for t in tensors]
        waiting = _Waiting(weakref.ref(node), alive, plan, watch)

        def ran(*_: object) -> None:
            waiting.done = True

        node.register_hook(ran)
        self.calls.append(waiting)


def _node_of(outputs: list[torch.Tensor]) -> Any:
    """The autograd node of a compiled graph's output tensors (one for all of them:
    AOTAutograd's autograd.Function), or None. An output that is a view of another has a
    view's node, whose next node is the Function's."""
    for output in outputs:
        if output.grad_fn is None:
            continue
        node = output.grad_fn
        for _ in range(VIEW_DEPTH):
            if isinstance(node, BackwardCFunction):
                return node
            nodes = [n for n, _ in node.next_functions if n is not None]
            if not nodes:
                break
            node = nodes[0]
    return None


def _fake(inputs: Iterable[Any]) -> bool:
    """Whether the call is on fake tensors: its first tensor is (they all are, or none)."""
    first = next((x for x in inputs if isinstance(x, torch.Tensor)), None)
    return first is not None and is_fake(first)


class Backend(Protocol):
    """What planning a graph again needs of the backend (backends.MemplanBackend), and
    running one of dynamic shapes (shape_dispatch.ShapeDispatch): its budget, options and
    compile, its plans and the step's, and how a graph's run joins the step."""

    budget: Budget
    options: PlanOptions
    plans: list[Plan]
    step: dict[Any, Plan]  # by each graph's place in the step (step.StepKey)
    ledger: StepLedger  # what is to be planned again, by the graphs' watches
    parameters: dict[int, tuple[int, int]]  # the graphs' parameters' bytes (step_peaks)

    def compile(
        self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any], partitioner: Partitioner
    ) -> Callable[..., Any]: ...

    def watched(
        self,
        gm: torch.fx.GraphModule,
        key: Any,
        name: str,
        compiled: Callable[..., Any],
        plan: Plan,
        resident: Resident,
        sizes: ShapeSignature = (),
    ) -> HeldWatch: ...

    def running(self, key: Any, watch: HeldWatch) -> None: ...


@dataclass
class GraphAgain:
    """Graph `key` of `backend` (`gm`, named `name`, first planned with `resident` held
    by the graphs before it; of dynamic shapes, run at `sizes`), planned and compiled
    again for more held: at those sizes only, traced on a call's own tensors."""

    backend: Backend
    gm: torch.fx.GraphModule
    key: Hashable
    name: str
    resident: Resident
    sizes: ShapeSignature = ()

    def plan(
        self, args: list[Any], held: Resident, why: str = "", room: int = 0
    ) -> tuple[Callable[..., Any], Plan]:
        """The graph compiled on a call's own tensors, planned with `held` resident (and at
        least what the graphs before it hold), `room` of it a later graph's
        (Partitioner.room); its plan, not yet the backend's, named with `why` (by default,
        the bytes held)."""
        later = f" and {format_bytes(held.later)} by later graphs" if held.later else ""
        name = f"{self.name} ({why or f'with {format_bytes(held.held)} held{later}'})"
        # Best effort: the step is running, and the bound on what is held may be loose.
        options = dataclasses.replace(self.backend.options, best_effort=True)
        partitioner = Partitioner(self.backend.budget, options, name=name)
        partitioner.resident = self.resident.with_at_least(held)
        partitioner.room = room
        partitioner.sizes = self.sizes
        with warnings.catch_warnings():  # of a budget cut by a bound: HeldWatch checks
            warnings.simplefilter("ignore", MemplanWarning)
            compiled = self.backend.compile(self.gm, args, partitioner)
        return compiled, self.backend.plans.pop()

    def resident_now(self) -> Resident:
        """What the step's graphs compiled before this one hold under their plans now, and
        the parameters of those after it, with their gradients (later_parameters); the
        step's unplanned peak, of all its graphs."""
        step = self.backend.step
        before = resident_before(step, self.key, self.backend.outside.total)
        later = sum(later_parameters(step, self.key, self.backend.parameters))
        unplanned = max(
            [before.unplanned_step_peak, *(p.unplanned_step_peak for p in step.values())]
        )
        return dataclasses.replace(before, later=later, unplanned_step_peak=unplanned)

    def keep(self, plan: Plan, in_step: bool = True, in_plans: bool = True) -> None:
        """`plan` among the backend's plans (where `in_plans`) and, where `in_step`, as
        the graph's plan in the step."""
        if in_plans:
            self.backend.plans.append(plan)
        if in_step:
            self.backend.step[self.key] = plan


class HeldWatch:
    """Runs `compiled` (a planned graph) and checks its first calls against what calls
    still waiting for their backward hold (the module's docstring). Where they held more
    than its plan allowed for, the rest of the step runs the graph's least-memory plan,
    and the graph is planned again (`again`) at its first call after none of its own
    calls waits (the next step), for the most they held. What is to be planned again,
    and why, is the backend's step ledger's (ledger.StepLedger), by this watch."""

    def __init__(
        self, compiled: Callable[..., Any], plan: Plan, waiting: WaitingCalls, again: GraphAgain
    ) -> None:
        self.compiled = compiled
        self.plan = plan  # of a graph of dynamic shapes, the plan made at its hints
        self.running = plan  # the plan `compiled` carries out: the least-memory one for now
        self.waiting = waiting
        self.again = again
        self.ledger = again.backend.ledger
        self.replanned = self.warned = False
        self.checked_steps = 0
        self.checked = False  # whether a call of this step found earlier calls waiting

    def __call__(self, *args: Any) -> Any:
        # AOTAutograd's boxed convention hands one list of arguments (and empties it).
        flat = args[0] if len(args) == 1 and isinstance(args[0], list) else args
        # DDP's optimizer runs the compiled graphs on fake tensors while it compiles: no
        # call of the step, and no storage to read.
        real = not _fake(flat)
        if real and self._replannable and self.ledger.entries[self].shapes is None:
            self.ledger.first_call(self, shapes_of(flat))
        checking = self.checked_steps < CHECKED_STEPS and real
        # A step of this graph begins: what is pending for it is planned now.
        begins = real and not self.waiting.waiting_of(self)
        if begins and self._outside_grew(flat):
            self.ledger.refresh_all(list(self.again.backend.step))
        due = {request.reason for request in self.ledger.due(self)} if begins else set()
        if due & {Reason.ROOM, Reason.REFRESH}:
            self._plan_for_the_step(list(flat), self.again)
        if checking and begins:
            if self.checked and Reason.HELD_OVER not in due:
                self.checked_steps += 1
            self.checked = False
            if Reason.HELD_OVER in due:
                self._plan_again(list(flat))
        if checking and self.waiting.any():
            self.checked = True
            held = self.waiting.held_beyond(flat, self)
            if self._check(held) and self.running is self.plan and self._replannable:
                self._least_for_now(list(flat), held)
        outputs = self.compiled(*args)
        if checking:
            self.waiting.add(outputs, self.running, self)
        return outputs

    @property
    def _replannable(self) -> bool:
        """Whether the graph can be planned again: not once it was for what calls held."""
        return self.ledger.entries[self].replannable

    def _plan_for_the_step(self, args: list[Any], again: GraphAgain) -> None:
        """The graph planned again across graph breaks (make_room), for what the graphs
        before it hold now: with the room the later graphs asked of it (ROOM: the most, of
        a later graph's peak with what the graphs between hold) taken as resident too, the
        round kept the fastest that holds with the room given back for its own peak
        (Partitioner.room), kept where it holds less for its backward than the plan it
        had; else (REFRESH), with the room it leaves already, kept where it peaks no
        higher than that plan or within its budget and keeps no more than that plan did
        with what the graphs before it let go of, that plan staying otherwise. Where what
        it holds changed, the graphs after it are planned again in turn."""
        # Planned again for what the graphs before hold, it still leaves the room it left.
        asked, later = self.ledger.take_step(self)
        now = again.resident_now()
        if not asked and now == again.resident:
            return
        again.resident = now
        needed, beyond = room_for(later, now)
        room = dataclasses.replace(
            now,
            held=now.held + beyond,
            unplanned_step_peak=max(
                [now.unplanned_step_peak, *(r.unplanned_step_peak for r in later.values())]
            ),
        )
        why = f"leaving {format_bytes(needed)} for later graphs" if later else ""
        held_before = self.plan.held
        compiled, plan = again.plan(args, room, why, beyond)
        step_budget = again.backend.budget.resolve(plan.unplanned_step_peak)
        # Asked for more room, it is to keep less for its backward. Else it is to peak no
        # higher, and to keep no more than the graphs before it let go of: the graphs after
        # it were planned for what it and they held.
        freed = max(0, self.plan.resident - now.held)
        made = (
            plan.held < self.plan.held
            if asked
            else plan.peak <= max(self.plan.peak, plan.asked)
            and plan.held <= self.plan.held + freed
        )
        if not made:
            compiled, plan = self.compiled, self.plan
        elif later:
            self.ledger.left(self, later)
        # Resident: what the graphs before and the step outside them hold (the room is a
        # later graph's, not resident while this one runs); asked, and held to where it
        # holds: the step's budget less that.
        asked = max(1, step_budget - now.held - now.later - now.outside)
        holds = plan.status != "best-effort" and plan.peak <= asked
        held_to = asked if holds else plan.budget
        plan = dataclasses.replace(plan, resident=now.held, requested_budget=asked, budget=held_to)
        again.keep(plan, in_plans=made)
        self.compiled, self.plan, self.running = compiled, plan, plan
        self.checked_steps = 0  # its calls are checked again
        if plan.held != held_before:  # the graphs after it were planned for what it held
            self.ledger.refresh_after(list(again.backend.step), again.key)
        if plan.peak > asked:
            self._over_as_planned_again(again, step_budget)

    def _over_as_planned_again(self, again: GraphAgain, step_budget: int) -> None:
        """The graph, planned again for the step (its plan, best effort, found no lower),
        peaks over what the graphs before it and the parameters of those after it left of
        `step_budget`: the graphs before it are to leave it room at their next step
        (room.make_room, which says so), or, where none can, the user is told how far over
        the step is."""
        backend, plan = again.backend, self.plan
        if make_room(backend.ledger, backend.step, again.key, backend.parameters):
            return
        # The later graphs' gradients are held in its backward only (step_peaks).
        step_peak = step_peaks(backend.step, backend.parameters)[again.key]
        if step_peak <= step_budget:
            return
        warnings.warn(
            f"{plan.name}: planned again for the step, it peaks at {format_bytes(plan.peak)} "
            f"with the best plan found, and the step at {format_bytes(step_peak)}, "
            f"{format_bytes(step_peak - step_budget)} above its budget of "
            f"{format_bytes(step_budget)}; the graphs before it leave it no more room",
            MemplanWarning,
            stacklevel=4,
        )

    def _least_for_now(self, args: list[Any], held: Held) -> None:
        """The graph's least-memory plan (planned with all of the step's budget taken as
        held) to run the rest of the step, once: found over at this call, the step's later
        calls of it (the rest of a deep model's blocks) would each keep what the plan
        allowed for one, and on a device the step would run out of memory before the
        next one is planned for them. What it ran is what is planned again for (HELD_OVER)."""
        step_budget = self.plan.step_budget
        least = dataclasses.replace(held.resident, held=step_budget)
        self.compiled, self.running = self.again.plan(args, least, "least, for the step")
        # Not the graph's plan in the step: it was planned with all of the budget taken
        # as resident, and runs only until the graph is planned again.
        self.again.keep(self.running, in_step=False)

    def _outside_grew(self, flat: Sequence[Any]) -> bool:
        """At a call that begins the step's first graph, whether what the step holds
        outside its graphs grew past what the graphs were planned for (an optimizer's
        first step made state memplan was not told of: MemplanBackend.outside_grew)."""
        backend, key = self.again.backend, self.again.key
        if next(iter(backend.step), None) != key or not self._replannable:
            return False
        return backend.outside_grew(flat, self.plan.step_budget)

    def _check(self, held: Held) -> bool:
        """Whether `held` is over what the plan allowed for; the first time, warned."""
        plan, bytes_held = self.plan, held.resident.held
        # What the plan left under its budget. A best-effort plan was warned of, but one
        # made again for what earlier calls held, its budget cut by a bound on what they
        # hold: then the step's budget is what counts.
        room = plan.asked - plan.peak
        over = bytes_held - plan.resident - (room if self.replanned else max(0, room))
        if over <= 0:
            return False
        worst = self.ledger.entries[self].over  # the most held over the plan so far
        if worst is not None and bytes_held <= worst.resident.held:
            return True
        if not self.warned and bytes_held <= plan.resident:
            # Over by its own peak alone: planned again for more than is held now, it is
            # the least found for what its budget then left (best effort).
            warnings.warn(
                f"{plan.name}, planned again for {format_bytes(plan.resident)} held by earlier "
                f"calls, peaks at {format_bytes(plan.peak)} on its own, the least found for "
                f"what that left of the budget: with the {format_bytes(bytes_held)} they hold "
                f"now, this step peaks about {format_bytes(over)} over its budget of "
                f"{format_bytes(plan.step_budget)}",
                MemplanWarning,
                stacklevel=3,
            )
        elif not self.warned:
            why = (
                "A module compiled on its own and called more than once before backward "
                "does this (a siamese encoder, or each block of a model compiled alone), as "
                "does an output kept from a call with gradients whose backward never runs "
                "(an evaluation outside torch.no_grad)"
            )
            warnings.warn(
                f"{plan.name} ran while earlier calls still held {format_bytes(bytes_held)} "
                f"for their backward: with its own peak of {format_bytes(plan.peak)}, this "
                f"step peaks about {format_bytes(over)} or more over its budget of "
                f"{format_bytes(plan.step_budget)}. "
                + (
                    f"{why}; the step's later calls run its least-memory plan, and it is "
                    "planned again for them at its next step"
                    if self._replannable
                    else why
                ),
                MemplanWarning,
                stacklevel=3,
            )
        self.warned = True
        if self._replannable:
            self.ledger.found_over(self, held)
        return True

    def _plan_again(self, args: list[Any]) -> None:
        """The graph planned again for what earlier calls held at most, once. Its own
        earlier calls keep what its new plan keeps: planned with more held resident, it
        recomputes more, and they keep less. So what they would hold under a plan is
        predicted (what they held, moved per own call by how far the plan's held bytes
        differ from those of the plan it ran: Held.under), and the bytes taken as resident
        are bisected (FIXED_POINT_ROUNDS plans after the first, each a compile) for the
        plan with the most room whose peak, with what would be held under it, is predicted
        within the step's budget; where none is found, the least-memory plan (best
        effort). Where it leaves later graphs room, each plan leaves it too."""
        held, again = self.ledger.take_over(self), self.again
        # Its next calls are checked again, and said of where the step is still over.
        self.replanned, self.warned, self.checked_steps = True, False, 0
        # It still leaves the later graphs the room it left them (make_room): taken as
        # resident, and given back for its own peak (Partitioner.room).
        leaving = self.ledger.entries[self].leaving
        needed, beyond = room_for(leaving, again.resident)
        why = f"leaving {format_bytes(needed)} for later graphs" if leaving else ""

        def tried(resident: int) -> tuple[Callable[..., Any], Plan, bool]:
            taken = dataclasses.replace(held.resident, held=resident + beyond)
            compiled, plan = again.plan(args, taken, why, beyond)
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
        again.keep(plan)
        self.compiled, self.plan, self.running = compiled, plan, plan


def peak_with_room(plan: Plan, room: int) -> int:
    """A plan's peak against a budget `room` of whose resident bytes are a later graph's,
    needed only between the plan's forward and its backward (Partitioner.room): its own
    peak without them, and what it keeps for its backward, which they are resident with
    (compile/search.py's `holds`)."""
    return max(plan.peak - room, plan.held) if room else plan.peak
