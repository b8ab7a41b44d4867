"""Random layered DAGs like the literature's random_layered graphs, of any size: the
bundled ones stop at 1000 nodes, and the director's 10,000-node target is measured on
this generator's."""

from __future__ import annotations

import random

from memplan.core.graph import Graph, Node


def random_layered_graph(n: int, width: int = 20, seed: int = 0) -> Graph:
    """Layers of `width` nodes, each reading 1-3 nodes of the previous 1-3 layers, with
    1-1000 bytes and 1-100 time units."""
    rng = random.Random(seed)
    nodes: list[Node] = []
    layers: list[list[int]] = []
    while len(nodes) < n:
        layer = []
        for _ in range(min(width, n - len(nodes))):
            v = len(nodes)
            pool = [u for previous in layers[-rng.randint(1, 3) :] for u in previous]
            inputs = tuple(sorted(rng.sample(pool, min(len(pool), rng.randint(1, 3)))))
            size, duration = rng.randint(1, 1000), float(rng.randint(1, 100))
            nodes.append(
                Node(id=v, name=f"n{v}", op="op", inputs=inputs, bytes=size, time=duration)
            )
            layer.append(v)
        layers.append(layer)
    return Graph(nodes=tuple(nodes), name=f"layered{n}")
