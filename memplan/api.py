"""The Python API: `plan` a model's training step, or `optimize` it into a planned module."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from memplan.core.budget import Budget
from memplan.planner.module import PlannedModule, plan_module
from memplan.planner.options import keyword_options
from memplan.planner.plan_file import Plan


def plan(
    model: nn.Module,
    example_inputs: Sequence[Any],
    budget: Budget | str | float = "100%",
    solver: str = "greedy",
    **options: Any,
) -> Plan:
    """Plan one training step of `model(*example_inputs)` under `budget` ("2GiB", 2e9,
    "60%" or 0.6)."""
    return optimize(model, example_inputs, budget, solver, **options).plan


def optimize(
    model: nn.Module,
    example_inputs: Sequence[Any],
    budget: Budget | str | float = "100%",
    solver: str = "greedy",
    *,
    reuse: Plan | None = None,
    optimizer: torch.optim.Optimizer | str | None = None,
    **options: Any,
) -> PlannedModule:
    """A module that trains like `model` with peak memory within `budget`.

    `options` are PlanOptions fields (offload, bandwidth, measure, time_limit, seed, ...);
    `reuse` applies a saved Plan's decisions instead of solving again; `optimizer` (an
    Optimizer, or "adamw", "adam", "sgd") has the budget count its state
    (planner/outside.py).
    """
    parsed = Budget.parse(budget)
    planning = keyword_options(("budget", "reuse", "optimizer"), solver=solver, **options)
    return plan_module(model, example_inputs, parsed, planning, reuse=reuse, optimizer=optimizer)
