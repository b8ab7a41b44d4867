"""Calls of the backend's graphs whose backward has not run yet, and what they hold.

A module compiled on its own and called twice before one backward (a siamese encoder, two
micro-batches summed into one loss, each block of a model compiled alone) holds its first
call's saved tensors while the second runs, and no compile sees that. The runner
(runner.GraphRunner) records each call of a plan it checks here, and sums at a later call
what those still waiting keep beyond what that call takes as inputs: their autograd nodes'
saved tensors (what AOTAutograd keeps is what the plan keeps) and their outputs still
alive. What runs outside the compiled graphs is not seen.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from memplan import compat
from memplan.compile.ledger import Held
from memplan.planner.plan import Resident
from memplan.planner.plan_file import Plan

# How many view nodes may lie between an output and the Function that computed it.
VIEW_DEPTH = 4


@dataclass
class _Waiting:
    """A call whose backward has not run: its autograd node and outputs, while they
    live, the plan it ran and the run (runner.Run) that ran it."""

    node: weakref.ref[Any]
    outputs: list[weakref.ref[torch.Tensor]]
    plan: Plan
    run: object
    done: bool = False

    @property
    def waits(self) -> bool:
        return not self.done and self.node() is not None

    def kept(self, storages: set[int]) -> dict[int, int]:
        """{storage address: bytes} of what the call keeps for its backward and of its
        outputs still alive (the caller's to hold, as a siamese step holds its first
        embedding), but for the storages in `storages`; nothing once its backward ran or
        its node was freed."""
        node = self.node()
        if self.done or node is None:
            return {}
        try:
            saved = list(node.saved_tensors)
        except RuntimeError:  # freed by a backward run without the hook seeing it
            return {}
        alive = [t for t in (ref() for ref in self.outputs) if t is not None]
        tensors = (t.untyped_storage() for t in saved + alive if isinstance(t, torch.Tensor))
        return {s.data_ptr(): s.nbytes() for s in tensors if s.data_ptr() not in storages}


@dataclass
class WaitingCalls:
    """The calls of a backend's graphs whose backward has not run yet."""

    calls: list[_Waiting] = field(default_factory=list)

    def held_beyond(self, inputs: Iterable[Any], run: object) -> Held:
        """What the waiting calls keep for their backward while `run`'s graph runs on
        `inputs`, beyond their storages (the parameters a repeated graph shares, the
        outputs the next graph takes); as unplanned, each call's plan's unplanned bytes
        held less what of its plan's held bytes it does not keep beyond `inputs`."""
        taken = {x.untyped_storage().data_ptr() for x in inputs if isinstance(x, torch.Tensor)}
        held: dict[int, int] = {}
        unplanned = own_calls = own_planned = 0
        for call in self.calls:
            kept = call.kept(taken)
            unplanned += max(0, call.plan.unplanned_held - call.plan.held + sum(kept.values()))
            if call.run is run:
                own_calls, own_planned = own_calls + 1, own_planned + call.plan.held
            held.update(kept)
        resident = Resident(held=sum(held.values()), unplanned_held=unplanned)
        return Held(resident, own_calls, own_planned)

    def any(self) -> bool:
        """Whether any call waits; those that do not are dropped."""
        self.calls = [c for c in self.calls if c.waits]
        return bool(self.calls)

    def waiting_of(self, run: object) -> bool:
        """Whether a call `run` ran waits for its backward."""
        return any(c.run is run and c.waits for c in self.calls)

    def add(self, outputs: Any, plan: Plan, run: object) -> None:
        """The call that returned `outputs`, waiting for its backward where it has one."""
        tensors = [
            t
            for t in (outputs if isinstance(outputs, list | tuple) else (outputs,))
            if isinstance(t, torch.Tensor)
        ]
        node = _node_of(tensors)
        if node is None:
            return
        alive = [weakref.ref(t) for t in tensors]
        waiting = _Waiting(weakref.ref(node), alive, plan, run)

        def ran(*_: object) -> None:
            waiting.done = True

        node.register_hook(ran)
        self.calls.append(waiting)


def _node_of(outputs: list[torch.Tensor]) -> Any:
    """The autograd node of a compiled graph's output tensors (one for all of them:
    AOTAutograd's autograd.Function), or None. An output that is a view of another has a
    view's node, whose next node is the Function's."""
    function_node = compat.autograd_function_node()
    for output in outputs:
        if output.grad_fn is None:
            continue
        node = output.grad_fn
        for _ in range(VIEW_DEPTH):
            if isinstance(node, function_node):
                return node
            nodes = [n for n, _ in node.next_functions if n is not None]
            if not nodes:
                break
            node = nodes[0]
    return None


def fake(inputs: Iterable[Any]) -> bool:
    """Whether the call is on fake tensors: its first tensor is (they all are, or none)."""
    first = next((x for x in inputs if isinstance(x, torch.Tensor)), None)
    return first is not None and compat.is_fake(first)
