"""The literature's benchmark graphs (networkx node-link JSON) as memplan Graphs.

Two dialects are read (see ../shared/graphs/README.md): the Checkmate graphs (node fields
`id`, `name`, `backward`, `cost_cpu`, `cost_ram`; edges `source`/`target`; ids ascending
are the reference order) and the random layered graphs (node `name` = id, `out_cost`,
`duration`; edges `"0"`/`"1"`; the reference order in `graph.order`). Nodes are renumbered
0..n-1 in the reference order, as Graph requires; `source_ids` maps them back to the
file's ids, which is what a written schedule names. No torch here.

Anything else is a GraphError: besides a malformed file, a graph with no nodes, and sizes
or times so large that the scores of a schedule would overflow (all sizes together at
most 2**63 - 1 bytes, as a budget; all times together, once per node, a finite float).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from memplan.errors import GraphError
from memplan.graph import MAX_BUDGET_BYTES, Graph, Node


def load_node_link(source: str | Path | Mapping[str, Any]) -> Graph:
    """The Graph of a node-link file (or its parsed JSON); GraphError on anything malformed:
    missing fields, unknown node ids in edges, cycles, negative sizes or times."""
    if isinstance(source, Mapping):
        data = source
    elif isinstance(source, (str, Path)):
        data = _read(source)
    else:
        raise GraphError(
            f"expected a node-link file path or JSON object, got {type(source).__name__}"
        )
    nodes, links = data.get("nodes"), data.get("links")
    if not isinstance(nodes, list) or not isinstance(links, list):
        raise GraphError("node-link JSON needs 'nodes' and 'links' lists")
    if not nodes:
        raise GraphError("node-link JSON has no nodes")
    if data.get("directed", True) is not True:
        raise GraphError("node-link JSON must be a directed graph ('directed': true)")
    meta = data.get("graph") if isinstance(data.get("graph"), dict) else {}
    records = {_node_id(n): n for n in nodes}
    if len(records) != len(nodes):
        raise GraphError("node-link JSON has repeated node ids")
    inputs: dict[int, list[int]] = {v: [] for v in records}
    for link in links:
        source_id, target_id = _edge(link)
        for end in (source_id, target_id):
            if end not in records:
                raise GraphError(f"edge {source_id} -> {target_id} names unknown node {end}")
        inputs[target_id].append(source_id)
    order = _reference_order(meta.get("order"), records, inputs)
    position = {v: i for i, v in enumerate(order)}
    built = []
    for index, original in enumerate(order):
        record = records[original]
        reads = tuple(sorted(dict.fromkeys(position[u] for u in inputs[original])))
        built.append(
            Node(
                id=index,
                name=str(record.get("name", original)),
                op="op",
                inputs=reads,
                bytes=_number(record, ("cost_ram", "out_cost"), original, int),
                time=float(_number(record, ("cost_cpu", "duration"), original, float)),
                is_backward=_flag(record, "backward", original),
            )
        )
    _check_totals(built)
    # The file name is what the benchmark tables use; parsed JSON has only its own name.
    name = Path(source).stem if isinstance(source, (str, Path)) else str(meta.get("name", "graph"))
    return Graph(nodes=tuple(built), name=name, source_ids=tuple(order))


def _read(path: str | Path) -> Mapping[str, Any]:
    try:
        raw = Path(path).read_bytes()
    except OSError as error:
        raise GraphError(f"{path}: cannot read: {error.strerror or error}") from error
    except ValueError as error:  # a path with a NUL byte in it
        raise GraphError(f"{path!r}: cannot read: {error}") from error
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as error:
        raise GraphError(f"{path}: not valid JSON (not UTF-8 text at byte {error.start})") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise GraphError(f"{path}: not valid JSON ({error.msg} at line {error.lineno})") from error
    except RecursionError:
        raise GraphError(f"{path}: not a node-link graph (JSON nested too deeply)") from None
    if not isinstance(data, dict):
        raise GraphError(f"{path}: expected a node-link JSON object")
    return data


def _node_id(record: object) -> int:
    if not isinstance(record, dict):
        raise GraphError(f"node entry {_brief(record)} is not an object")
    value = record.get("id", record.get("name"))
    if not isinstance(value, int) or isinstance(value, bool):
        raise GraphError(f"node entry {_brief(record)} has no integer 'id' (or integer 'name')")
    return value


def _edge(link: object) -> tuple[int, int]:
    if not isinstance(link, dict):
        raise GraphError(f"link entry {_brief(link)} is not an object")
    ends = (link.get("source"), link.get("target"))
    if ends == (None, None):
        ends = (link.get("0"), link.get("1"))
    if not all(isinstance(e, int) and not isinstance(e, bool) for e in ends):
        raise GraphError(f"link entry {_brief(link)} needs integer 'source' and 'target'")
    return ends[0], ends[1]  # type: ignore[return-value]


def _number(record: dict[str, Any], fields: tuple[str, ...], node: int, kind: type) -> Any:
    """The first of `fields` in `record`: a finite non-negative number, whole if `kind` is
    int (bytes, at most 2**63 - 1); GraphError if it is anything else or none is there."""
    for field in fields:
        if field in record:
            value = record[field]
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise GraphError(
                    f"node {node}: {field!r} must be a non-negative number, got {_brief(value)}"
                )
            # json reads NaN and Infinity; no float() of an int, which overflows past 1e308
            if (isinstance(value, float) and not math.isfinite(value)) or value < 0:
                raise GraphError(f"node {node}: {field!r} must be a finite non-negative number")
            if kind is int:
                if value != int(value):
                    raise GraphError(f"node {node}: {field!r} must be a whole number of bytes")
                if value > MAX_BUDGET_BYTES:
                    raise GraphError(f"node {node}: {field!r} is over 2**63 - 1 bytes")
                return int(value)
            try:
                return float(value)
            except OverflowError:
                raise GraphError(f"node {node}: {field!r} is too large for a float") from None
    raise GraphError(f"node {node} has none of the fields {', '.join(fields)}")


def _flag(record: dict[str, Any], field: str, node: int) -> bool:
    """A JSON boolean field, false where absent: "false" as a string is refused, not read
    as true."""
    value = record.get(field, False)
    if not isinstance(value, bool):
        raise GraphError(f"node {node}: {field!r} must be true or false, got {_brief(value)}")
    return value


def _check_totals(nodes: list[Node]) -> None:
    """GraphError where a schedule's peak could pass 2**63 - 1 bytes (no peak is more than
    all sizes together, one copy of a node being resident at a time) or where a schedule
    computing every node up to once per node of the graph could overflow a float."""
    if sum(node.bytes for node in nodes) > MAX_BUDGET_BYTES:
        raise GraphError("the node sizes add up to more than 2**63 - 1 bytes")
    if not math.isfinite(math.fsum(node.time for node in nodes) * len(nodes)):
        raise GraphError("the node times are too large: their sum overflows a float")


def _reference_order(
    given: object, records: Mapping[int, Any], inputs: Mapping[int, list[int]]
) -> list[int]:
    """`graph.order` if the file has one, else ids ascending; either must be topological."""
    if given is None:
        order = sorted(records)
    elif (
        isinstance(given, list)
        and all(isinstance(v, int) and not isinstance(v, bool) for v in given)
        and sorted(given) == sorted(records)
    ):
        order = list(given)
    else:
        raise GraphError("'graph.order' must list every node id exactly once")
    seen: set[int] = set()
    for v in order:
        missing = [u for u in inputs[v] if u not in seen]
        if missing:
            raise GraphError(
                f"node {v} reads node {missing[0]}, which comes later in the reference order "
                "(a cycle, or an order that is not topological)"
            )
        seen.add(v)
    return order


def _brief(value: object) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."
