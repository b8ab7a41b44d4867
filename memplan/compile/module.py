"""`memplan.compile(model, budget=...)`: a model compiled in place with memplan's backend.

`torch.compile(model)` returns an OptimizedModule whose `forward` takes `*args, **kwargs`
and whose state_dict keys start with `_orig_mod.`: frameworks that read the model's
forward signature (Hugging Face's Trainer drops the dataset columns it does not name)
see no arguments. Compiled in place, as `nn.Module.compile` does, the model keeps its
class, signature, attributes and state_dict keys; only its calls run compiled.
"""

from __future__ import annotations

from typing import Any, TypeVar

from torch import nn

from memplan.compile.backend import backend
from memplan.core.budget import Budget
from memplan.core.errors import MemplanError

Module = TypeVar("Module", bound=nn.Module)


def compile_module(model: Module, budget: Budget | str | float = "100%", **options: Any) -> Module:
    """`model`, its calls compiled by torch.compile with `memplan.backend(budget=budget,
    **options)` (in place: the same object is returned). A module of torch.nn's own
    classes is refused: Dynamo skips their code when called in place, and the model would
    run uncompiled."""
    made = backend(budget, **options)  # bad options are refused first
    if type(model).__module__.startswith("torch."):
        raise MemplanError(
            f"memplan.compile cannot compile a {type(model).__name__} in place, since Dynamo "
            "skips torch.nn's own modules called that way: wrap it in a module of your own, "
            "or use torch.compile(model, backend=memplan.backend(...))"
        )
    model.compile(backend=made)
    return model
