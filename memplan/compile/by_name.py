"""The backend `torch.compile(model, backend="memplan")` finds by name.

Dynamo calls a backend once per graph it compiles: once per graph break, once per
recompile. A budget holds for the step only where one backend plans all of a step's
graphs (each for what the graphs before it hold, backend.MemplanBackend), so the
backend by name keeps one MemplanBackend per torch.compile call, built from that call's
`options`. Dynamo calls backends of torch.compile through torch's `_TorchCompileWrapper`,
one per call: the backend of a call is found by that wrapper, the caller's frame.
Called any other way (torch._dynamo.optimize), each graph is planned alone, with a
warning. Modules compiled by separate
torch.compile calls (each block of a model compiled alone, or two models trained in one
step) share one budget through one `memplan.backend(...)` object passed to each.
"""

from __future__ import annotations

import sys
import warnings
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch

from memplan import compat
from memplan.compile.backend import MemplanBackend
from memplan.core.errors import MemplanWarning

# How far up the stack the wrapper's frame may be from the backend's (it calls it
# directly in torch 2.13).
WRAPPER_DEPTH = 4


class BackendByName:
    """A Dynamo backend that hands each graph to the MemplanBackend of its torch.compile
    call (the module's docstring)."""

    def __init__(self) -> None:
        self.of_call: dict[int, MemplanBackend] = {}  # by id of torch.compile's wrapper
        self.warned_alone = False  # whether a graph was planned alone, and said so

    def __call__(
        self,
        gm: torch.fx.GraphModule,
        example_inputs: Sequence[Any],
        options: dict[str, Any] | None = None,
        mode: str | None = None,
    ) -> Callable[..., Any]:
        wrapper = _torch_compile_call()
        if wrapper is None:
            if not self.warned_alone:  # Dynamo called it some other way
                self.warned_alone = True
                warnings.warn(
                    "memplan: the backend by name was not called through torch.compile, "
                    "so each graph is planned alone; for one budget across graph breaks, "
                    "use torch.compile or pass one memplan.backend(...) object",
                    MemplanWarning,
                    stacklevel=2,
                )
            return MemplanBackend(**(options or {}))(gm, example_inputs, mode)
        backend = self.of_call.get(id(wrapper))
        if backend is None:
            backend = self.of_call[id(wrapper)] = MemplanBackend(**(options or {}))
            # The wrapper lives as long as what torch.compile returned (and Dynamo's
            # cache of backends, until torch._dynamo.reset()).
            weakref.finalize(wrapper, self.of_call.pop, id(wrapper), None)
        return backend(gm, example_inputs, mode)

    def reset(self) -> None:
        """torch._dynamo.reset(): every call's backend forgets its step."""
        for backend in self.of_call.values():
            backend.reset()


def _torch_compile_call() -> object | None:
    """torch.compile's wrapper calling the backend, from the stack; None where none is."""
    wrapper_code = compat.torch_compile_wrapper_code()
    frame = sys._getframe(2)  # the caller of BackendByName.__call__
    for _ in range(WRAPPER_DEPTH):
        if frame is None:
            return None
        if frame.f_code is wrapper_code:
            return frame.f_locals.get("self")
        frame = frame.f_back
    return None


memplan_backend = BackendByName()
