"""The literature's benchmark graphs (networkx node-link JSON) as memplan Graphs.

Two dialects are read (see ../shared/graphs/README.md): the Checkmate graphs (node fields
`id`, `name`, `backward`, `cost_cpu`, `cost_ram`; edges `source`/`target`; ids ascending
are the reference order) and the random layered graphs (node `name` = id, `out_cost`,
`duration`; edges `"0"`/`"1"`; the reference order in `graph.order`). Nodes are renumbered
0..n-1 in the reference order, as Graph requires; `source_ids` maps them back to the
file's ids, which is what a written schedule names. No torch here.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from memplan.errors import GraphError
from memplan.graph import Graph, Node


def load_node_link(source: str | Path | Mapping[str, Any]) -> Graph:
    """The Graph of a node-link file (or its parsed JSON); GraphError on anything malformed:
    missing fields, unknown node ids in edges, cycles, negative sizes or times."""
    data = _read(source) if not isinstance(source, Mapping) else source
    nodes, links = data.get("nodes"), data.get("links")
    if not isinstance(nodes, list) or not isinstance(links, list):
        raise GraphError("node-link JSON needs 'nodes' and 'links' lists")
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
                is_backward=bool(record.get("backward", False)),
            )
        )
    # The file name is what the benchmark tables use; parsed JSON has only its own name.
    name = Path(source).stem if isinstance(source, (str, Path)) else str(meta.get("name", "graph"))
    return Graph(nodes=tuple(built), name=name, source_ids=tuple(order))


def _read(path: str | Path) -> Mapping[str, Any]:
    try:
        text = Path(path).read_text()
    except OSError as error:
        raise GraphError(f"{path}: cannot read: {error.strerror or error}") from error
    try:
        data = json.loads(text)
    except json.JSONDecodeError as error:
        raise GraphError(f"{path}: not valid JSON ({error.msg} at line {error.lineno})") from error
    if not isinstance(data, dict):
        raise GraphError(f"{path}: expected a node-link JSON object")
    return data


def _node_id(record: object) -> int:
    if not isinstance(record, dict):
        raise GraphError(f"node entry {record!r} is not an object")
    value = record.get("id", record.get("name"))
    if not isinstance(value, int) or isinstance(value, bool):
        raise GraphError(f"node entry {_brief(record)} has no integer 'id' (or integer 'name')")
    return value


def _edge(link: object) -> tuple[int, int]:
    if not isinstance(link, dict):
        raise GraphError(f"link entry {link!r} is not an object")
    ends = (link.get("source"), link.get("target"))
    if ends == (None, None):
        ends = (link.get("0"), link.get("1"))
    if not all(isinstance(e, int) and not isinstance(e, bool) for e in ends):
        raise GraphError(f"link entry {_brief(link)} needs integer 'source' and 'target'")
    return ends[0], ends[1]  # type: ignore[return-value]


def _number(record: dict[str, Any], fields: tuple[str, ...], node: int, kind: type) -> Any:
    for field in fields:
        if field in record:
            value = record[field]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise GraphError(f"node {node}: {field!r} must be a non-negative number")
            if kind is int and value != int(value):
                raise GraphError(f"node {node}: {field!r} must be a whole number of bytes")
            return kind(value)
    raise GraphError(f"node {node} has none of the fields {', '.join(fields)}")


def _reference_order(
    given: object, records: Mapping[int, Any], inputs: Mapping[int, list[int]]
) -> list[int]:
    """`graph.order` if the file has one, else ids ascending; either must be topological."""
    if given is None:
        order = sorted(records)
    elif isinstance(given, list) and sorted(given) == sorted(records):
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
