"""Graphs of dynamic shapes under the backend: which plan runs a call at given sizes.

A graph Dynamo traced with symbolic sizes is planned at its hints, and that plan runs at
any sizes where its prediction holds the budget; elsewhere the graph is planned and
compiled again for the call's sizes (a NEW_SIZES re-plan of the step ledger), up to
ledger.MAX_SHAPE_PLANS per compile of the graph. Either way, what the graphs before it in
the step hold is what they hold at the sizes they ran at in this step, and the plan that
runs at a call's sizes is the graph's plan in the step while the step runs at them (the
backend's `watched`: so the graphs after it count what it holds there, and across graph
breaks it leaves them room at those sizes).
"""

from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Callable, Hashable
from typing import Any

import torch

from memplan.compile.held_watch import Backend, HeldWatch
from memplan.compile.ledger import MAX_SHAPE_PLANS
from memplan.compile.step import later_parameters, resident_before
from memplan.core.errors import MemplanWarning
from memplan.core.units import format_bytes
from memplan.planner.partitioner import Partitioner
from memplan.planner.shapes import ShapeSignature, SizeSymbol, describe, signature_of


class ShapeDispatch:
    """Runs graph `key` of the step, of dynamic shapes: at each size signature, the plan
    made at its hints where its prediction there holds the budget, else a plan made for
    those sizes (at most MAX_SHAPE_PLANS), each run as the backend watches it."""

    def __init__(
        self,
        backend: Backend,
        gm: torch.fx.GraphModule,
        symbols: tuple[SizeSymbol, ...],
        generic: Partitioner,
        compiled: Callable[..., Any],
        key: Hashable,
        run: HeldWatch,
    ) -> None:
        self.backend = backend
        self.gm = gm
        self.symbols = symbols
        self.generic = generic
        self.compiled = compiled  # the plan made at the hints, compiled
        self.key = key
        self.runs: dict[ShapeSignature, HeldWatch] = {generic.sizes: run}

    def __call__(self, *args: Any) -> Any:
        # AOTAutograd's boxed convention hands one list of arguments (and empties it).
        flat = args[0] if len(args) == 1 and isinstance(args[0], list) else args
        sizes = signature_of(self.symbols, flat)
        run = self.runs.get(sizes)
        if run is None:
            # Planning raises (best_effort=False) before anything of the step has run.
            run = self.runs[sizes] = self._run_for(sizes, list(flat))
        else:
            self.backend.running(self.key, run)
        return run(*args)

    def _run_for(self, sizes: ShapeSignature, args: list[Any]) -> HeldWatch:
        """The generic plan where it holds the budget at `sizes`, with what the graphs
        before it hold now and the parameters of those after it, with their gradients
        (step.later_parameters: the step's graphs are known by now), else a plan of its
        own."""
        name = f"{self.generic.name}[{describe(sizes)}]"
        step = self.backend.step
        later = sum(later_parameters(step, self.key, self.backend.parameters))
        before = resident_before(step, self.key, self.backend.outside.total)
        resident = dataclasses.replace(before, later=later)
        plan = self.generic.at_sizes(sizes)
        asked = resident.budget_of(self.backend.budget, plan.unplanned_peak)
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
        replan = self.backend.ledger.new_sizes(self, self.key, holds=plan.peak <= asked)
        if replan is None and plan.peak > asked:
            warnings.warn(
                f"{self.generic.name} at sizes {describe(sizes)}: the plan made at "
                f"{describe(self.generic.sizes)} predicts {format_bytes(plan.peak)}, above "
                f"the budget of {format_bytes(asked)}; {MAX_SHAPE_PLANS} sizes have plans "
                "of their own already, so it runs as planned",
                MemplanWarning,
                stacklevel=3,
            )
        elif replan is not None:
            partitioner = Partitioner(self.backend.budget, self.backend.options, name=name)
            partitioner.sizes = sizes
            partitioner.resident = resident
            # Traced again on the call's own tensors: a graph of these sizes only.
            compiled = self.backend.compile(self.gm, args, partitioner)
            plan = partitioner.plans[-1]
        return self.backend.watched(self.gm, self.key, name, compiled, plan, resident, sizes)
