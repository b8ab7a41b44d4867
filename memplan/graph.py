"""The solver-neutral IR: Graph, Node, Budget, Schedule and its steps.

Frozen dataclasses with no torch in them. Solvers take a Graph and return a Schedule;
the simulator judges schedules; the torch-facing stages produce and consume these.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from fractions import Fraction
from functools import cached_property
from pathlib import Path
from typing import Any

from memplan.errors import BudgetError, GraphError


class NodeKind(str, enum.Enum):
    """What a node is in the training step."""

    PARAM = "param"  # parameter or buffer: resident for the whole step
    INPUT = "input"  # user input: resident for the whole step
    TANGENT = "tangent"  # incoming gradient: materialised when the backward starts
    COMPUTE = "compute"  # an operation


class Decision(str, enum.Enum):
    """What happens to a forward tensor between its forward use and its backward use."""

    KEEP = "keep"
    RECOMPUTE = "recompute"
    OFFLOAD = "offload"


@dataclass(frozen=True)
class Node:
    """One value of the joint graph.

    `bytes` is the storage the node allocates when it runs. A view owns 0 bytes and keeps
    `alias_of` (the storage's owner) alive. A node `carved_from` a multi-output producer
    takes its bytes out of the producer's allocation instead of allocating anew.
    """

    id: int
    name: str
    op: str
    inputs: tuple[int, ...] = ()
    bytes: int = 0
    time: float = 0.0
    kind: NodeKind = NodeKind.COMPUTE
    is_backward: bool = False
    alias_of: int | None = None
    carved_from: int | None = None
    recomputable: bool = True
    offloadable: bool = True

    @property
    def is_resident_input(self) -> bool:
        """Present before the step starts and never freed by it."""
        return self.kind in (NodeKind.PARAM, NodeKind.INPUT)


@dataclass(frozen=True)
class Graph:
    """A DAG of Nodes whose ids are 0..n-1 in a topological (reference) order.

    `outputs` stay resident until the end of the step (forward outputs held by the caller
    and the gradients the backward produces). `source_ids`, when set, maps each id to the
    node's id in the file it was loaded from (see load_node_link).
    """

    nodes: tuple[Node, ...]
    outputs: tuple[int, ...] = ()
    name: str = "graph"
    source_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        for index, node in enumerate(self.nodes):
            if node.id != index:
                raise GraphError(f"node {node.name!r} has id {node.id}, expected {index}")
            for source in node.inputs:
                if not 0 <= source < index:
                    raise GraphError(
                        f"node {node.name!r} reads {source}, which is not an earlier node"
                    )
            for ref, what in ((node.alias_of, "alias_of"), (node.carved_from, "carved_from")):
                if ref is not None and not 0 <= ref < index:
                    raise GraphError(f"node {node.name!r} has {what}={ref}, not an earlier node")
            if node.bytes < 0 or not math.isfinite(node.time) or node.time < 0:
                raise GraphError(f"node {node.name!r} has negative bytes or time")
        if self.source_ids and len(self.source_ids) != len(self.nodes):
            raise GraphError("source_ids must name every node")
        for out in self.outputs:
            if not 0 <= out < len(self.nodes):
                raise GraphError(f"output {out} is not a node id")

    def __len__(self) -> int:
        return len(self.nodes)

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes)

    def __getitem__(self, node_id: int) -> Node:
        return self.nodes[node_id]

    @cached_property
    def users(self) -> tuple[tuple[int, ...], ...]:
        """users[v]: the nodes that read v, in increasing id order."""
        readers: list[list[int]] = [[] for _ in self.nodes]
        for node in self.nodes:
            for source in dict.fromkeys(node.inputs):
                readers[source].append(node.id)
        return tuple(tuple(r) for r in readers)

    @cached_property
    def storage_owner(self) -> tuple[int, ...]:
        """storage_owner[v]: the node whose allocation v's bytes live in (v itself if it owns)."""
        owner: list[int] = []
        for node in self.nodes:
            owner.append(owner[node.alias_of] if node.alias_of is not None else node.id)
        return tuple(owner)

    @cached_property
    def carved_outputs(self) -> dict[int, tuple[int, ...]]:
        """carved_outputs[v]: the nodes carved out of multi-output node v, in id order."""
        carved: dict[int, list[int]] = {}
        for node in self.nodes:
            if node.carved_from is not None:
                carved.setdefault(node.carved_from, []).append(node.id)
        return {parent: tuple(children) for parent, children in carved.items()}

    @cached_property
    def by_name(self) -> dict[str, int]:
        return {node.name: node.id for node in self.nodes}

    @property
    def forward_ids(self) -> list[int]:
        return [n.id for n in self.nodes if n.kind is NodeKind.COMPUTE and not n.is_backward]

    @property
    def backward_ids(self) -> list[int]:
        return [n.id for n in self.nodes if n.kind is NodeKind.COMPUTE and n.is_backward]

    @property
    def resident_inputs(self) -> list[int]:
        return [n.id for n in self.nodes if n.is_resident_input]

    @cached_property
    def saved_candidates(self) -> tuple[int, ...]:
        """Forward compute nodes that some backward node reads: what a planner decides on.

        Graph outputs are not candidates: they stay resident through the step anyway."""
        outputs = set(self.outputs)
        return tuple(
            v
            for v in self.forward_ids
            if v not in outputs and any(self.nodes[u].is_backward for u in self.users[v])
        )

    @property
    def total_time(self) -> float:
        return sum(n.time for n in self.nodes)

    def replace_times(self, times: Sequence[float]) -> Graph:
        """The same graph with node times replaced (the profiler's output)."""
        if len(times) != len(self.nodes):
            raise GraphError(f"got {len(times)} times for {len(self.nodes)} nodes")
        nodes = tuple(
            dataclasses.replace(n, time=float(t)) for n, t in zip(self.nodes, times, strict=True)
        )
        return Graph(nodes=nodes, outputs=self.outputs, name=self.name)


# --- schedule steps -------------------------------------------------------------------


@dataclass(frozen=True)
class Compute:
    """Run the node (again, if it ran before: a recomputation)."""

    node: int


@dataclass(frozen=True)
class Free:
    """Drop the device copy of the node."""

    node: int


@dataclass(frozen=True)
class Offload:
    """Start a device-to-host copy of the node on the copy stream."""

    node: int


@dataclass(frozen=True)
class Prefetch:
    """Start a host-to-device copy of the node's host copy on the copy stream."""

    node: int


@dataclass(frozen=True)
class Wait:
    """Make the compute stream wait until the node's prefetch has landed."""

    node: int


Step = Compute | Free | Offload | Prefetch | Wait
STEP_TYPES: dict[str, type[Step]] = {
    cls.__name__.lower(): cls for cls in (Compute, Free, Offload, Prefetch, Wait)
}


@dataclass(frozen=True)
class Schedule:
    """An ordered list of steps over a Graph's nodes; the only thing a solver returns.

    `backward_start` is the index of the first step that belongs to the backward pass
    (len(steps) when the schedule is not split into a forward and a backward).
    """

    steps: tuple[Step, ...]
    backward_start: int | None = None

    @property
    def split(self) -> int:
        return len(self.steps) if self.backward_start is None else self.backward_start

    def computes(self) -> list[int]:
        return [s.node for s in self.steps if isinstance(s, Compute)]

    def to_json(self) -> dict[str, object]:
        return {
            "steps": [[type(s).__name__.lower(), s.node] for s in self.steps],
            "backward_start": self.backward_start,
        }

    @classmethod
    def from_json(cls, data: object) -> Schedule:
        """The schedule that to_json wrote; GraphError naming the bad field otherwise.

        Node ids and backward_start must be JSON integers: a float or a numeric string is
        refused rather than converted, as int() would silently truncate 1.5 to 1.
        """
        if not isinstance(data, dict):
            raise GraphError(f"schedule JSON must be an object, got {type(data).__name__}")
        raw = data.get("steps")
        if not isinstance(raw, list):
            raise GraphError("schedule JSON has no 'steps' list")
        steps: list[Step] = []
        for index, item in enumerate(raw):
            well_formed = isinstance(item, list) and len(item) == 2 and isinstance(item[0], str)
            if not (well_formed and item[0] in STEP_TYPES):
                raise GraphError(
                    f"schedule JSON 'steps'[{index}] is {item!r}, "
                    f"not [kind, node id] with kind one of {', '.join(STEP_TYPES)}"
                )
            if not _is_int(item[1]):
                raise GraphError(
                    f"schedule JSON 'steps'[{index}] is {item!r}: "
                    f"its node id must be an integer, got {item[1]!r}"
                )
            steps.append(STEP_TYPES[item[0]](item[1]))
        start = data.get("backward_start")
        if start is not None and not _is_int(start):
            raise GraphError(
                f"schedule JSON 'backward_start' must be an integer or null, got {start!r}"
            )
        return cls(steps=tuple(steps), backward_start=start)


def _is_int(value: object) -> bool:
    """A JSON integer: an int that is not a bool (json loads true as True, an int)."""
    return isinstance(value, int) and not isinstance(value, bool)


def with_frees(graph: Graph, steps: Iterable[Step], keep: Iterable[int] = ()) -> list[Step]:
    """Insert a Free after the last read of every device copy, as Python frees fx values.

    A read is a Compute that takes the copy as input or an Offload of it. A copy is made by
    a Compute or a Wait (a landed prefetch); a copy that is never read is freed right after
    it is made. Nodes in `keep`, graph outputs and resident inputs are never freed.
    """
    steps = list(steps)
    never_free = set(keep) | set(graph.outputs) | set(graph.resident_inputs)
    last_read: dict[int, int] = {}  # node -> index of the step that last read its live copy
    made_at: dict[int, int] = {}
    free_after: dict[int, list[int]] = {}

    def close(node: int) -> None:
        if node in made_at and node not in never_free:
            free_after.setdefault(last_read.get(node, made_at[node]), []).append(node)
        made_at.pop(node, None)
        last_read.pop(node, None)

    for index, step in enumerate(steps):
        if isinstance(step, Compute):
            for source in dict.fromkeys(graph[step.node].inputs):
                last_read[source] = index
            close(step.node)
            made_at[step.node] = index
        elif isinstance(step, Offload):
            last_read[step.node] = index
        elif isinstance(step, Wait):
            close(step.node)
            made_at[step.node] = index
    for node in list(made_at):
        close(node)

    out: list[Step] = []
    for index, step in enumerate(steps):
        out.append(step)
        out.extend(Free(v) for v in sorted(free_after.get(index, ())))
    return out


def load_node_link(source: str | Path | Mapping[str, Any]) -> Graph:
    """A benchmark graph of the literature (networkx node-link JSON, a path or parsed data)
    as a Graph in its reference order; see memplan.node_link."""
    from memplan.node_link import load_node_link as load  # it builds on this module

    return load(source)


# --- budgets ---------------------------------------------------------------------------

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}
_BUDGET_RE = re.compile(r"^\s*([0-9]*\.?[0-9]+)(?:[eE]([+-]?[0-9]+))?\s*([a-zA-Z%]*)\s*$")
# The most bytes a budget may name: allocators and torch count device memory in int64, and
# a budget anywhere near it is a typo. A fraction is bounded by the same number.
MAX_BUDGET_BYTES = 2**63 - 1
# A numeral beyond 10**+-_MAX_EXPONENT is no budget either way (too large, or under a byte);
# it is clamped before its exact value is built, which for 1e-999999999 would take minutes.
_MAX_EXPONENT = 20


def _exact(mantissa: str, exponent: str | None) -> Fraction:
    """The exact value of the numeral `mantissa`e`exponent` ("1.001", "2e9", ".5e-3").

    Values beyond 10**+-_MAX_EXPONENT are clamped to 10**+-(_MAX_EXPONENT + 1): whatever the
    unit, Budget's bounds reject the clamped value exactly as they would the real one.
    """
    number = Decimal(mantissa)  # exact, and cheap however many digits it has
    if not number:
        return Fraction(0)
    digits = (exponent or "").lstrip("+-").lstrip("0") or "0"
    shift = int(digits) if len(digits) <= 9 else 10**9  # int() refuses very long strings
    if (exponent or "").startswith("-"):
        shift = -shift
    magnitude = number.adjusted() + shift
    if magnitude > _MAX_EXPONENT:
        return Fraction(10 ** (_MAX_EXPONENT + 1))
    if magnitude < -_MAX_EXPONENT:
        return Fraction(1, 10 ** (_MAX_EXPONENT + 1))
    return Fraction(number) * Fraction(10) ** shift


def exact_number(text: str) -> Fraction | None:
    """The exact value of a plain numeral with no unit ("0.8", "2e9", ".5e-3"), clamped
    as a budget's is (see _exact), so that "1e-999999999" takes no time; None for any
    other text, a unit, a sign or a fraction like "3/4" included."""
    match = _BUDGET_RE.match(text)
    if match is None or match.group(3):
        return None
    return _exact(match.group(1), match.group(2))


def _as_fraction(fraction: object) -> Fraction:
    """A budget fraction given to Budget(), as an exact Fraction.

    A float is read as the shortest decimal that prints as it (0.29 is 29/100, not the
    binary 0.28999999999999998): a float share is a decimal someone typed, and its binary
    value would floor 29% of 100 bytes to 28.
    """
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float, Fraction)):
        raise BudgetError(
            f"budget fraction must be a number, got {fraction!r} of type {type(fraction).__name__}"
        )
    if isinstance(fraction, float):
        if not math.isfinite(fraction):
            raise BudgetError(f"budget fraction must be positive, got {fraction}")
        return Fraction(repr(fraction))
    return Fraction(fraction)


def _brief(number: int | Fraction) -> str:
    """A number for an error message, in scientific notation when it is long."""
    if isinstance(number, int) and abs(number) < 10**21:
        return str(number)
    return f"{Decimal(number.numerator) / Decimal(number.denominator):.4g}"


@dataclass(frozen=True)
class Budget:
    """A peak-memory budget: absolute bytes, or a fraction of the unplanned peak.

    Both are exact so that float rounding never costs a byte: `fraction` is stored as a
    Fraction (a float given for it is converted by _as_fraction), and parse and resolve
    floor the exact rational value to whole bytes: "29%" of 100 bytes is 29, "1.001 KB"
    is 1001 bytes, 1234.9 is 1234 and "50%" of 1001 bytes is 500.

    Bytes are 1 to MAX_BUDGET_BYTES. A fraction is at most MAX_BUDGET_BYTES and at least
    1 / MAX_BUDGET_BYTES: below that it is 0 bytes of any peak a device could have.
    """

    bytes: int | None = None
    fraction: Fraction | float | None = None

    def __post_init__(self) -> None:
        if (self.bytes is None) == (self.fraction is None):
            raise BudgetError("a Budget has exactly one of bytes or fraction")
        if self.bytes is not None:
            if self.bytes <= 0:
                raise BudgetError(f"budget must be positive, got {_brief(self.bytes)} bytes")
            if self.bytes > MAX_BUDGET_BYTES:
                raise BudgetError(
                    f"budget of {_brief(self.bytes)} bytes is too large: at most 2**63 - 1 bytes"
                )
            return
        share = _as_fraction(self.fraction)
        if share <= 0:
            raise BudgetError(f"budget fraction must be positive, got {self.fraction}")
        _check_share(share, f"fraction {_brief(share)}")
        object.__setattr__(self, "fraction", share)  # frozen: store the exact value

    @classmethod
    def parse(cls, value: Budget | str | float | int) -> Budget:
        """Accept "6GiB", "512 MB", 6e9, 123456 or "60%" (of the unplanned peak).

        Sizes are floored to whole bytes from their exact value. Anything that is not a
        positive budget within the bounds above ("1e400", 10**400, "0.5") is a BudgetError.
        """
        if isinstance(value, Budget):
            return value
        if isinstance(value, bool):
            raise BudgetError(f"budget must be bytes or a percentage, got {value!r}")
        if isinstance(value, (int, float)):
            # no float() or isfinite() of an int: 10**400 overflows a float
            shown = _brief(value) if isinstance(value, int) else repr(value)
            if (isinstance(value, float) and not math.isfinite(value)) or value <= 0:
                raise BudgetError(f"budget must be a positive number of bytes, got {shown}")
            return cls(bytes=_whole_bytes(Fraction(value), shown))
        if not isinstance(value, str):
            raise BudgetError(
                f"budget must be a str, int or float, got {value!r} of type {type(value).__name__}"
            )
        match = _BUDGET_RE.match(value)
        if match is None and _BUDGET_RE.match(value.strip().removeprefix("-")):
            raise BudgetError(f"budget must be positive, got {value!r}")
        if match is None:
            raise BudgetError(
                f"cannot parse budget {value!r}; "
                "use bytes (2e9), a size ('2GiB') or a share ('60%')"
            )
        unit = match.group(3).lower()
        if unit != "%" and unit not in _UNITS:
            raise BudgetError(f"unknown unit {match.group(3)!r} in budget {value!r}")
        number = _exact(match.group(1), match.group(2))
        if number <= 0:
            raise BudgetError(f"budget must be positive, got {value!r}")
        if unit == "%":
            share = number / 100
            _check_share(share, repr(value))
            return cls(fraction=share)
        return cls(bytes=_whole_bytes(number * _UNITS[unit], repr(value)))

    def resolve(self, unplanned_peak: int) -> int:
        """The budget in bytes, given the unplanned (keep-all) peak: a fraction of it is
        floored from the exact product (50% of 1001 bytes is 500)."""
        if self.bytes is not None:
            return self.bytes
        assert isinstance(self.fraction, Fraction)
        return math.floor(self.fraction * unplanned_peak)

    def __str__(self) -> str:
        if self.fraction is not None:
            return f"{float(self.fraction * 100):g}%"
        return format_bytes(self.bytes or 0)


def _whole_bytes(size: Fraction, shown: str) -> int:
    """`size` bytes floored to whole bytes; BudgetError quoting `shown` if out of bounds."""
    if size > MAX_BUDGET_BYTES:
        raise BudgetError(f"budget {shown} is too large: at most 2**63 - 1 bytes")
    if size < 1:
        raise BudgetError(f"budget {shown} is less than 1 byte")
    return math.floor(size)


def _check_share(share: Fraction, shown: str) -> None:
    """BudgetError quoting `shown` unless 1 / MAX_BUDGET_BYTES <= share <= MAX_BUDGET_BYTES."""
    if share > MAX_BUDGET_BYTES:
        raise BudgetError(f"budget {shown} is too large: at most 2**63 - 1 times the peak")
    if share * MAX_BUDGET_BYTES < 1:
        raise BudgetError(f"budget {shown} is too small: under 1 byte of any peak")


def format_bytes(n: float) -> str:
    """1536 -> '1.50 KiB'."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= size:
            return f"{n / size:.2f} {unit}"
    return f"{int(n)} B"


@dataclass(frozen=True)
class SolveResult:
    """What a solver returns: the schedule plus how it was found."""

    solver: str
    status: str  # optimal | feasible | infeasible | timeout
    schedule: Schedule | None
    objective: float | None = None
    lower_bound: float | None = None
    gap: float | None = None
    solve_seconds: float = 0.0
    decisions: dict[int, Decision] = field(default_factory=dict)
    options: dict[str, object] = field(default_factory=dict)
    message: str = ""
