"""memplan: plan training memory in PyTorch: keep, recompute or offload each activation.

The torch-facing API is imported on first use, so that the IR, the simulator and the
solvers (memplan.core.graph, memplan.core.simulate, memplan.solvers) load without torch.
"""

from __future__ import annotations

import importlib
from typing import Any

from memplan.core.budget import Budget
from memplan.core.errors import InfeasibleBudget, MemplanError

_LAZY = {
    "optimize": "memplan.api",
    "plan": "memplan.api",
    "PlannedModule": "memplan.planner.module",
    "backend": "memplan.compile.backend",
    "Plan": "memplan.planner.plan_file",
    # The subpackage itself, which is callable: memplan.compile(model, budget=...).
    "compile": "memplan.compile",
}

__all__ = ["Budget", "InfeasibleBudget", "MemplanError", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        module = importlib.import_module(_LAZY[name])
        return module if module.__name__ == f"{__name__}.{name}" else getattr(module, name)
    raise AttributeError(f"module 'memplan' has no attribute {name!r}")
