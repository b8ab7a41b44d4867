"""memplan: plan training memory in PyTorch: keep, recompute or offload each activation."""

from memplan.api import PlannedModule, optimize, plan
from memplan.backend import backend
from memplan.errors import InfeasibleBudget, MemplanError
from memplan.graph import Budget
from memplan.planner.plan import Plan

__all__ = [
    "Budget",
    "InfeasibleBudget",
    "MemplanError",
    "Plan",
    "PlannedModule",
    "backend",
    "optimize",
    "plan",
]
