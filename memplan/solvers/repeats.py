"""Repeated structure: which nodes of a graph play the same part in repeated blocks.

A model of 32 identical layers has 32 copies of each saved activation, each released the
same way at the same cost. Two nodes are alike when they agree in op, bytes, kind and
direction, and so do their inputs and readers, `depth` steps out: a Weisfeiler-Lehman
colouring of the graph, computed from the graph itself and not from module names, so
that it finds blocks whatever the model calls them. Nodes near a block's edge whose
surroundings differ (the first layer reads the embedding) get classes of their own.
"""

from __future__ import annotations

from collections import defaultdict

from memplan.core.graph import Graph

# Steps of neighbourhood two nodes must agree in: enough to tell a layer's tensors apart
# from each other, few enough that a layer's copies meet before the model's ends differ.
DEPTH = 3


def alike(graph: Graph, depth: int = DEPTH) -> list[int]:
    """A class id per node: equal ids for nodes whose neighbourhoods of `depth` steps
    (inputs and readers) agree in op, bytes, kind and direction."""
    colour = [hash((n.op, n.bytes, n.kind, n.is_backward, n.alias_of is None)) for n in graph]
    for _ in range(depth):
        colour = [
            hash(
                (
                    colour[n.id],
                    tuple(colour[i] for i in n.inputs),
                    tuple(sorted(colour[u] for u in graph.users[n.id])),
                )
            )
            for n in graph
        ]
    ids: dict[int, int] = {}
    return [ids.setdefault(c, len(ids)) for c in colour]


def classes(graph: Graph, nodes: list[int], depth: int = DEPTH) -> dict[int, list[int]]:
    """Each of `nodes` -> the nodes among them alike to it (itself included), in order."""
    colour = alike(graph, depth)
    members: dict[int, list[int]] = defaultdict(list)
    for v in nodes:
        members[colour[v]].append(v)
    return {v: members[colour[v]] for v in nodes}
