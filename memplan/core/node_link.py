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

import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from memplan.core import checks
from memplan.core.budget import MAX_BUDGET_BYTES
from memplan.core.errors import GraphError
from memplan.core.graph import Graph, Node

# A node's bytes: whole, and at most what a budget may name. Its time: any finite number.
_BYTES = checks.at_most(checks.count, MAX_BUDGET_BYTES, "2**63 - 1 bytes")


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
                bytes=_number(record, ("cost_ram", "out_cost"), original, _BYTES),
                time=_number(record, ("cost_cpu", "duration"), original, checks.seconds),
                is_backward=_flag(record, "backward", original),
            )
        )
    _check_totals(built)
    # The file name is what the benchmark tables use; parsed JSON has only its own name.
    name = Path(source).stem if isinstance(source, (str, Path)) else str(meta.get("name", "graph"))
    return Graph(nodes=tuple(built), name=name, source_ids=tuple(order))


def _read(path: str | Path) -> Mapping[str, Any]:
    data = checks.read_json(path, GraphError, "a node-link graph")
    if not isinstance(data, dict):
        raise GraphError(f"{path}: expected a node-link JSON object")
    return data


def _node_id(record: object) -> int:
    if not isinstance(record, dict):
        raise GraphError(f"node entry {checks.shown(record)} is not an object")
    value = record.get("id", record.get("name"))
    if not checks.is_int(value):
        raise GraphError(
            f"node entry {checks.shown(record)} has no integer 'id' (or integer 'name')"
        )
    return value


def _edge(link: object) -> tuple[int, int]:
    if not isinstance(link, dict):
        raise GraphError(f"link entry {checks.shown(link)} is not an object")
    ends = (link.get("source"), link.get("target"))
    if ends == (None, None):
        ends = (link.get("0"), link.get("1"))
    if not all(checks.is_int(e) for e in ends):
        raise GraphError(f"link entry {checks.shown(link)} needs integer 'source' and 'target'")
    return ends[0], ends[1]  # type: ignore[return-value]


def _number(record: dict[str, Any], fields: tuple[str, ...], node: int, check: checks.Check) -> Any:
    """The first of `fields` in `record`, passed through `check`; GraphError if it fails or
    none is there."""
    for name in fields:
        if name in record:
            try:
                return check(record[name])
            except checks.Mismatch as mismatch:
                raise GraphError(f"node {node}: {name!r} {mismatch}") from None
    raise GraphError(f"node {node} has none of the fields {', '.join(fields)}")


def _flag(record: dict[str, Any], name: str, node: int) -> bool:
    """A boolean field, false where absent."""
    return bool(_number({name: False, **record}, (name,), node, checks.flag))


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
        and all(checks.is_int(v) for v in given)
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
