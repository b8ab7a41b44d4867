"""The values a profiling pass holds (planner/profile.py), within a cap on their bytes.

A pass runs a graph's nodes in order on values made up from its placeholders' meta. Run
as the graph is written, it holds what the step holds unplanned, and copies of the
graph's inputs besides: the very peak a plan is made to avoid, during the step that
plans. Given a cap, the pass lets values go before a node would take it over the cap,
the one read again farthest ahead first (none the node reads), and makes a value up
again from its meta when a node reads it next. Made-up values (random floats, zero
integers) are what placeholders already are, so a node's time and transient stay what
they were; only the values differ.
"""

from __future__ import annotations

import bisect
from collections.abc import Callable
from typing import Any

import torch
from torch import fx

from memplan import compat
from memplan.planner.shapes import hint


def value_bytes(value: object) -> dict[int, int]:
    """{storage address: bytes} of the tensors in `value`."""
    storages = (
        t.untyped_storage() for t in compat.tree_leaves(value) if isinstance(t, torch.Tensor)
    )
    return {s.data_ptr(): s.nbytes() for s in storages}


def meta_bytes(node: fx.Node) -> int:
    """The bytes of the tensors a node's meta says it returns (at the hints)."""
    total = 0
    for v in compat.tree_leaves(node.meta.get("val")):
        if isinstance(v, torch.Tensor):
            total += v.element_size() * max(1, hint(v.numel()))
    return total


class PassValues:
    """The values of one pass over `nodes`: those `kept` across passes (placeholders and
    attributes, made once, let go only to hold the cap), and those of this pass. `make`
    makes a node's value up from its meta. With `cap` None, nothing is let go."""

    def __init__(
        self,
        nodes: list[fx.Node],
        kept: dict[fx.Node, object],
        make: Callable[[fx.Node], object],
        cap: int | None,
    ) -> None:
        self.kept = kept
        self.make = make
        self.cap = cap
        self.values: dict[fx.Node, object] = {}
        # Where each value is read, by position in the pass: what is read farthest ahead
        # is let go first.
        position = {node: i for i, node in enumerate(nodes)}
        self.reads: dict[fx.Node, list[int]] = {node: [] for node in nodes}
        for node in nodes:
            for used in node.all_input_nodes:
                self.reads[used].append(position[node])
        self.position = position
        # What holds each storage, and its bytes: a view shares its base's.
        self.holders: dict[int, set[fx.Node]] = {}
        self.sizes: dict[int, int] = {}
        self.held = 0
        for node, value in kept.items():
            self._hold(node, value)

    def __getitem__(self, node: fx.Node) -> Any:
        if node in self.values:
            return self.values[node]
        if node not in self.kept:  # a placeholder not made yet, or a value let go
            self.kept[node] = value = self.make(node)
            self._hold(node, value)
        return self.kept[node]

    def __contains__(self, node: fx.Node) -> bool:
        return node in self.values or node in self.kept

    def set(self, node: fx.Node, value: object) -> None:
        self.values[node] = value
        self._hold(node, value)

    def drop(self, node: fx.Node) -> None:
        """This pass's value of `node` is read no more (a kept one stays)."""
        if node in self.values:
            self._release(node, self.values.pop(node))

    def room_for(self, node: fx.Node) -> None:
        """Let values go, the one read again farthest ahead first, until what `node` is
        to return, and those of its inputs to be made up again, fit under the cap with
        what is held; none that `node` reads."""
        if self.cap is None:
            return
        reading = set(node.all_input_nodes)
        # Its output, and its inputs to be made up again.
        needed = meta_bytes(node) + sum(meta_bytes(n) for n in reading if n not in self)
        if self.held + needed <= self.cap:
            return
        at = self.position[node]
        holding = [n for n in (*self.values, *self.kept) if n not in reading]
        holding.sort(key=lambda n: self._next_read(n, at))
        while holding and self.held + needed > self.cap:
            gone = holding.pop()
            if gone in self.values:
                self._release(gone, self.values.pop(gone))
            if gone in self.kept:
                self._release(gone, self.kept.pop(gone))

    def _next_read(self, node: fx.Node, at: int) -> int:
        reads = self.reads.get(node, [])
        after = bisect.bisect_right(reads, at)
        if after < len(reads):
            return reads[after]
        # Read no more in this pass: a kept value is read first in the next one.
        return len(self.position) + (reads[0] if reads else 0)

    def _hold(self, node: fx.Node, value: object) -> None:
        for address, nbytes in value_bytes(value).items():
            holders = self.holders.setdefault(address, set())
            if not holders:
                self.sizes[address] = nbytes
                self.held += nbytes
            holders.add(node)

    def _release(self, node: fx.Node, value: object) -> None:
        for address in value_bytes(value):
            holders = self.holders.get(address)
            if holders is None:
                continue
            holders.discard(node)
            if not holders:
                del self.holders[address]
                self.held -= self.sizes.pop(address)
