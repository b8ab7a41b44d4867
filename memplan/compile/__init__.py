"""The torch.compile path: the backend Dynamo calls, and what it needs of Inductor.

The package is also callable: `memplan.compile(model, budget=..., **options)` compiles
`model` in place with memplan's backend (module.py). A function named `compile` in the
package `memplan` would be replaced by this package as soon as any module of it loads.
"""

from __future__ import annotations

import sys
import types
from typing import TYPE_CHECKING, Any

from memplan.core.budget import Budget

if TYPE_CHECKING:
    from memplan.compile.module import Module


class _CallablePackage(types.ModuleType):
    """This package, with a call that compiles a model (module.compile_module)."""

    def __call__(
        self, model: Module, budget: Budget | str | float = "100%", **options: Any
    ) -> Module:
        from memplan.compile.module import compile_module

        return compile_module(model, budget, **options)


sys.modules[__name__].__class__ = _CallablePackage
