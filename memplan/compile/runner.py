"""The graph runner: what the backend hands Dynamo for each graph it planned.

One runner per compile of a graph runs one plan per size signature (a `replanner.Run`):
a graph of static shapes has one; a graph Dynamo traced with symbolic sizes is planned at
its hints, and that plan runs at any sizes where its prediction holds the budget, while at
sizes where it does not the graph is planned and compiled again for them (a NEW_SIZES
re-plan of the step ledger, at most ledger.MAX_SHAPE_PLANS per compile). The run that
runs a call is the graph's in the step (StepLedger.runs): the graphs after it count what
it holds at those sizes.

Each run has an explicit state (runner_state.RunState), and each call goes through its
transitions: where a step of the graph begins (none of its own calls waits for its
backward), the re-plans the ledger has pending for it are carried out (replanner.py);
then, until the run is trusted, the call is checked against what calls waiting for their
backward hold (waiting.py): found over, the user is told, and the rest of the step runs
the least-memory plan. As the step's first graph begins a step, what the step holds
outside its graphs is read again, and every graph is refreshed where it grew.
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Hashable, Sequence
from typing import Any

import torch

from memplan.compile.ledger import MAX_SHAPE_PLANS, Held
from memplan.compile.replanner import Backend, Replanner, Run
from memplan.compile.room import make_room, shapes_of
from memplan.compile.runner_state import (
    Action,
    Phase,
    at_call,
    checked,
    over_plan,
    planned_again,
    step_begins,
)
from memplan.compile.step import later_parameters, resident_before
from memplan.compile.waiting import WaitingCalls, fake
from memplan.core.errors import MemplanWarning
from memplan.core.units import format_bytes
from memplan.planner.partitioner import Partitioner
from memplan.planner.plan import Resident
from memplan.planner.plan_file import Plan
from memplan.planner.shapes import ShapeSignature, SizeSymbol, describe, signature_of

# Why calls held over a plan: said where the step is found over.
HELD_OVER_CAUSES = (
    "A module compiled on its own and called more than once before backward does this (a "
    "siamese encoder, or each block of a model compiled alone), as does an output kept "
    "from a call with gradients whose backward never runs (an evaluation outside "
    "torch.no_grad)"
)


class GraphRunner:
    """Runs graph `key` of `backend`'s step (`gm`, named `name`), as one compile of it:
    at each size signature of `symbols` (none for static shapes) a run of its own (the
    module's docstring). `generic` planned it at its traced sizes, as `plan`, `compiled`,
    with `resident` held by the graphs before it."""

    def __init__(
        self,
        backend: Backend,
        replanner: Replanner,
        waiting: WaitingCalls,
        gm: torch.fx.GraphModule,
        key: Hashable,
        symbols: tuple[SizeSymbol, ...],
        generic: Partitioner,
        compiled: Callable[..., Any],
    ) -> None:
        self.backend = backend
        self.replanner = replanner
        self.waiting = waiting
        self.gm = gm
        self.key = key
        self.symbols = symbols
        self.generic = generic
        self.compiled = compiled  # the plan made at the traced sizes, compiled
        plan = generic.plans[-1]
        run = self._enter(generic.sizes, generic.name, compiled, plan, generic.resident)
        self.runs: dict[ShapeSignature, Run] = {generic.sizes: run}

    def __call__(self, *args: Any) -> Any:
        # AOTAutograd's boxed convention hands one list of arguments (and empties it).
        flat = args[0] if len(args) == 1 and isinstance(args[0], list) else args
        sizes = signature_of(self.symbols, flat) if self.symbols else self.generic.sizes
        run = self.runs.get(sizes)
        # DDP's optimizer runs the compiled graphs on fake tensors while it compiles: no
        # call of the step, and no storage to read.
        if fake(flat):
            return (run.compiled if run is not None else self.compiled)(*args)
        if run is None:
            # Planning raises (best_effort=False) before anything of the step has run.
            run = self.runs[sizes] = self._run_for(sizes, list(flat))
        elif self.symbols:
            self.backend.ledger.runs(self.key, run, run.plan)
        return self._call(run, args, flat)

    def _enter(
        self,
        sizes: ShapeSignature,
        name: str,
        compiled: Callable[..., Any],
        plan: Plan,
        resident: Resident,
    ) -> Run:
        """A run of `plan` at `sizes`, the graph's in the step from now; the graphs before
        it that it leaves over the budget are told (make_room)."""
        run = Run(self.key, self.gm, name, sizes, resident, compiled, plan, plan)
        ledger = self.backend.ledger
        ledger.enter(run, self.key, plan)
        make_room(ledger, self.key, self.backend.parameters)
        return run

    def _run_for(self, sizes: ShapeSignature, args: list[Any]) -> Run:
        """A run at `sizes`, new to the graph: the plan made at its traced sizes where its
        prediction there holds the budget, with what the graphs before it hold now and the
        parameters of those after it, with their gradients (later_parameters: the step's
        graphs are known by now); else a plan of its own (NEW_SIZES)."""
        backend = self.backend
        name = f"{self.generic.name}[{describe(sizes)}]"
        step = backend.ledger.step
        later = sum(later_parameters(step, self.key, backend.parameters))
        before = resident_before(step, self.key, backend.outside.total)
        resident = dataclasses.replace(before, later=later)
        plan = self.generic.at_sizes(sizes)
        asked = resident.budget_of(backend.budget, plan.unplanned_peak)
        plan = dataclasses.replace(
            plan,
            name=name,
            resident=resident.held,
            outside=resident.outside,
            unplanned_step_peak=resident.step_unplanned(plan.unplanned_peak),
            requested_budget=asked,
            budget=asked if plan.peak <= asked else plan.peak,
        )
        compiled = self.compiled
        replan = backend.ledger.new_sizes(self, self.key, holds=plan.peak <= asked)
        if replan is None and plan.peak > asked:
            warnings.warn(
                f"{self.generic.name} at sizes {describe(sizes)}: the plan made at "
                f"{describe(self.generic.sizes)} predicts {format_bytes(plan.peak)}, above "
                f"the budget of {format_bytes(asked)}; {MAX_SHAPE_PLANS} sizes have plans "
                "of their own already, so it runs as planned",
                MemplanWarning,
                stacklevel=4,
            )
        elif replan is not None:
            partitioner = Partitioner(backend.budget, backend.options, name=name)
            partitioner.sizes = sizes
            partitioner.resident = resident
            # Traced again on the call's own tensors: a graph of these sizes only.
            compiled = backend.compile(self.gm, args, partitioner)
            plan = partitioner.plans[-1]
        return self._enter(sizes, name, compiled, plan, resident)

    def _call(self, run: Run, args: tuple[Any, ...], flat: Sequence[Any]) -> Any:
        """A call of `run` on real tensors, through its state's transitions."""
        ledger = self.backend.ledger
        if ledger.entries[run].replannable and ledger.entries[run].shapes is None:
            ledger.first_call(run, shapes_of(flat))
        if not self.waiting.waiting_of(run):  # a step of the graph begins
            if self._outside_grew(run, flat):
                ledger.refresh_all()
            due = frozenset(request.reason for request in ledger.due(run))
            run.state, actions = step_begins(run.state, due)
            for action in actions:
                if action is Action.PLAN_FOR_THE_STEP:
                    if self.replanner.for_the_step(run, list(flat)):
                        run.state = planned_again(run.state, for_what_was_held=False)
                elif action is Action.PLAN_FOR_WHAT_WAS_HELD:
                    self.replanner.for_what_was_held(run, list(flat))
                    run.state = planned_again(run.state, for_what_was_held=True)
        waiting = run.state.phase is not Phase.TRUSTED and self.waiting.any()
        run.state, actions = at_call(run.state, waiting)
        if Action.CHECK in actions:
            self._check(run, self.waiting.held_beyond(flat, run), list(flat))
        outputs = run.compiled(*args)
        if Action.RECORD in actions:
            self.waiting.add(outputs, run.running, run)
        return outputs

    def _outside_grew(self, run: Run, flat: Sequence[Any]) -> bool:
        """At a call that begins the step's first graph, whether what the step holds
        outside its graphs grew past what the graphs were planned for (an optimizer's
        first step made state memplan was not told of: MemplanBackend.outside_grew)."""
        ledger = self.backend.ledger
        if next(iter(ledger.step), None) != self.key or not ledger.entries[run].replannable:
            return False
        return self.backend.outside_grew(flat, run.plan.step_budget)

    def _check(self, run: Run, held: Held, args: list[Any]) -> None:
        """What the calls waiting for their backward hold (`held`) against `run`'s plan:
        the transition of what was found, and its actions carried out."""
        entry = self.backend.ledger.entries[run]
        bytes_held = held.resident.held
        over = over_plan(run.plan, bytes_held, final=not entry.replannable)
        most = entry.over is None or bytes_held > entry.over.resident.held
        run.state, actions = checked(run.state, over > 0, most, entry.replannable)
        for action in actions:
            if action is Action.WARN:
                self._warn(run.plan, bytes_held, over, entry.replannable)
            elif action is Action.NOTE_OVER:
                self.backend.ledger.found_over(run, held)
            elif action is Action.RUN_LEAST:
                self.replanner.least_for_now(run, args, held)

    def _warn(self, plan: Plan, held: int, over: int, replannable: bool) -> None:
        """The user told that calls waiting for their backward held `held` bytes while
        `plan` ran, taking the step `over` its budget."""
        if held <= plan.resident:
            # Over by its own peak alone: planned again for more than is held now, it is
            # the least found for what its budget then left (best effort).
            message = (
                f"{plan.name}, planned again for {format_bytes(plan.resident)} held by earlier "
                f"calls, peaks at {format_bytes(plan.peak)} on its own, the least found for "
                f"what that left of the budget: with the {format_bytes(held)} they hold "
                f"now, this step peaks about {format_bytes(over)} over its budget of "
                f"{format_bytes(plan.step_budget)}"
            )
        else:
            then = (
                "; the step's later calls run its least-memory plan, and it is planned "
                "again for them at its next step"
                if replannable
                else ""
            )
            message = (
                f"{plan.name} ran while earlier calls still held {format_bytes(held)} "
                f"for their backward: with its own peak of {format_bytes(plan.peak)}, this "
                f"step peaks about {format_bytes(over)} or more over its budget of "
                f"{format_bytes(plan.step_budget)}. {HELD_OVER_CAUSES}{then}"
            )
        warnings.warn(message, MemplanWarning, stacklevel=6)
