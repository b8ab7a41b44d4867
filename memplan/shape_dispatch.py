"""Graphs of dynamic shapes under the backend: which plan runs a call at given sizes.

A graph Dynamo traced with symbolic sizes is planned at its hints, and that plan runs at
any sizes where its prediction holds the budget; elsewhere the graph is planned and
compiled again for the call's sizes, up to MAX_SHAPE_PLANS per graph.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import torch

from memplan.budget import Budget
from memplan.errors import MemplanWarning
from memplan.planner.options import PlanOptions
from memplan.planner.plan import Partitioner
from memplan.planner.shapes import ShapeSignature, SizeSymbol, describe, signature_of
from memplan.units import format_bytes

# Per graph of dynamic shapes: how many sizes may get plans of their own. Each costs a
# trace, a profile and a compile; past the bound, calls run the plan made at the hints.
MAX_SHAPE_PLANS = 8


class Planner(Protocol):
    """What a ShapeDispatch needs of the backend that made it (backends.MemplanBackend)."""

    budget: Budget
    options: PlanOptions

    def compile(
        self, gm: torch.fx.GraphModule, example_inputs: Sequence[Any], partitioner: Partitioner
    ) -> Callable[..., Any]: ...


class ShapeDispatch:
    """Runs a graph of dynamic shapes: the plan made at its hints where its prediction at
    a call's sizes holds the budget, else a plan made for those sizes (kept per size
    signature, at most MAX_SHAPE_PLANS)."""

    def __init__(
        self,
        backend: Planner,
        gm: torch.fx.GraphModule,
        symbols: tuple[SizeSymbol, ...],
        generic: Partitioner,
        compiled: Callable[..., Any],
    ) -> None:
        self.backend = backend
        self.gm = gm
        self.symbols = symbols
        self.generic = generic
        self.compiled = compiled
        self.runs: dict[ShapeSignature, Callable[..., Any]] = {generic.sizes: compiled}
        self.specialized = 0

    def __call__(self, *args: Any) -> Any:
        # AOTAutograd's boxed convention hands one list of arguments (and empties it).
        flat = args[0] if len(args) == 1 and isinstance(args[0], list) else args
        sizes = signature_of(self.symbols, flat)
        run = self.runs.get(sizes)
        if run is None:
            # Planning raises (best_effort=False) before anything of the step has run.
            run = self.runs[sizes] = self._run_for(sizes, list(flat))
        return run(*args)

    def _run_for(self, sizes: ShapeSignature, args: list[Any]) -> Callable[..., Any]:
        """The generic plan where it holds the budget at `sizes`, else a plan of its own."""
        budget = self.backend.budget
        peaks = self.generic.peaks_at(sizes)
        held = [(p, self.generic.resident.budget_of(budget, u)) for p, u in peaks]
        if all(peak <= asked for peak, asked in held):
            return self.compiled
        peak, asked = max(held, key=lambda h: h[0] - h[1])
        if self.specialized >= MAX_SHAPE_PLANS:
            warnings.warn(
                f"{self.generic.name} at sizes {describe(sizes)}: the plan made at "
                f"{describe(self.generic.sizes)} predicts {format_bytes(peak)}, above the "
                f"budget of {format_bytes(asked)}; {MAX_SHAPE_PLANS} sizes have plans of "
                "their own already, so it runs as planned",
                MemplanWarning,
                stacklevel=3,
            )
            return self.compiled
        self.specialized += 1
        partitioner = Partitioner(
            budget,
            self.backend.options,
            name=f"{self.generic.name}[{describe(sizes)}]",
            keep_plans=True,
        )
        partitioner.sizes = sizes
        partitioner.resident = self.generic.resident
        # Traced again on the call's own tensors: a graph of these sizes only.
        return self.backend.compile(self.gm, args, partitioner)
