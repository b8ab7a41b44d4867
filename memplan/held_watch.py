"""Calls of a planned graph made while earlier calls still hold tensors for their backward.

The backend plans a graph for what the graphs compiled before it in the step hold while
it runs (`Plan.resident`: graph breaks, in the order Dynamo compiled them). A module
compiled on its own and called twice before one backward (a siamese encoder, two
micro-batches summed into one loss) holds its first call's saved tensors while the second
runs, and no compile sees that: the step can peak well over its budget.

`HeldWatch` runs a compiled graph and, on its first CHECKED_CALLS calls, sums what the
calls still waiting for their backward (of any graph of the backend) keep for it, beyond
what this call takes as inputs. Where that exceeds what the plan allowed for (its
resident bytes and the room it left under its budget), it warns once per graph, with the
bytes. What the calls keep is read from their autograd nodes' saved tensors: what
AOTAutograd keeps is what the plan keeps.
"""

from __future__ import annotations

import warnings
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch._subclasses.fake_tensor import is_fake
from torch.autograd.function import BackwardCFunction

from memplan.errors import MemplanWarning
from memplan.planner.plan_file import Plan
from memplan.units import format_bytes

# Per graph: how many calls are checked. A loop that calls a module twice before its
# backward does so from its first step; checking every call would cost every step.
CHECKED_CALLS = 8
# How many view nodes may lie between an output and the Function that computed it.
VIEW_DEPTH = 4


@dataclass
class _Waiting:
    """A call whose backward has not run: its autograd node, while the node lives."""

    node: weakref.ref[Any]
    done: bool = False

    def kept(self, storages: set[int]) -> Iterable[tuple[int, int]]:
        """(storage address, bytes) of what the call keeps for its backward, but for the
        storages in `storages`; nothing once its backward ran or its node was freed."""
        node = self.node()
        if self.done or node is None:
            return
        try:
            saved = node.saved_tensors
        except RuntimeError:  # freed by a backward run without the hook seeing it
            return
        for tensor in saved:
            if isinstance(tensor, torch.Tensor):
                storage = tensor.untyped_storage()
                if storage.data_ptr() not in storages:
                    yield storage.data_ptr(), storage.nbytes()


@dataclass
class WaitingCalls:
    """The calls of a backend's graphs whose backward has not run yet."""

    calls: list[_Waiting] = field(default_factory=list)

    def held_beyond(self, inputs: Iterable[Any]) -> int:
        """The bytes the waiting calls keep for their backward, beyond `inputs`' storages
        (the parameters a repeated graph shares, the outputs the next graph takes)."""
        self.calls = [c for c in self.calls if not c.done and c.node() is not None]
        taken = {x.untyped_storage().data_ptr() for x in inputs if isinstance(x, torch.Tensor)}
        held = dict(kept for call in self.calls for kept in call.kept(taken))
        return sum(held.values())

    def add(self, outputs: Any) -> None:
        """The call that returned `outputs`, waiting for its backward where it has one."""
        node = _node_of(outputs)
        if node is None:
            return
        waiting = _Waiting(weakref.ref(node))

        def ran(*_: object) -> None:
            waiting.done = True

        node.register_hook(ran)
        self.calls.append(waiting)


def _node_of(outputs: Any) -> Any:
    """The autograd node of a compiled graph's outputs (one for all of them: AOTAutograd's
    autograd.Function), or None. An output that is a view of another has a view's node,
    whose next node is the Function's."""
    for output in outputs if isinstance(outputs, list | tuple) else (outputs,):
        if not isinstance(output, torch.Tensor) or output.grad_fn is None:
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


def _any_fake(inputs: Iterable[Any]) -> bool:
    return any(isinstance(x, torch.Tensor) and is_fake(x) for x in inputs)


class HeldWatch:
    """Runs `compiled` (a planned graph) and checks its first calls against what calls
    still waiting for their backward hold (the module's docstring)."""

    def __init__(self, compiled: Callable[..., Any], plan: Plan, waiting: WaitingCalls) -> None:
        self.compiled = compiled
        self.plan = plan  # of a graph of dynamic shapes, the plan made at its hints
        self.waiting = waiting
        self.calls = 0
        self.warned = False

    def __call__(self, *args: Any) -> Any:
        # AOTAutograd's boxed convention hands one list of arguments (and empties it).
        flat = args[0] if len(args) == 1 and isinstance(args[0], list) else args
        # DDP's optimizer runs the compiled graphs on fake tensors while it compiles: no
        # call of the step, and no storage to read.
        checking = self.calls < CHECKED_CALLS and not _any_fake(flat)
        if checking:
            self.calls += 1
        if checking and not self.warned and self.waiting.calls:
            self._check(self.waiting.held_beyond(flat))
        outputs = self.compiled(*args)
        if checking:
            self.waiting.add(outputs)
        return outputs

    def _check(self, held: int) -> None:
        plan = self.plan
        room = max(0, plan.asked - plan.peak)  # what the plan left under its budget
        over = held - plan.resident - room
        if over <= 0:
            return
        self.warned = True
        warnings.warn(
            f"{plan.name} ran while earlier calls still held {format_bytes(held)} for their "
            f"backward, where its plan allowed for {format_bytes(plan.resident)}: the step "
            f"peaks about {format_bytes(over)} or more over its budget. A module compiled on its "
            "own and called more than once before backward does this (a siamese encoder, or "
            "each block of a model compiled alone); compile the module that makes the calls, "
            "so that one graph holds them all",
            MemplanWarning,
            stacklevel=2,
        )
