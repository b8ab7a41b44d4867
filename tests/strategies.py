"""Hypothesis strategies for memplan Graphs: random DAGs and training-shaped chains.

Sizes and times are small integers so that every simulated byte count and time is exact.
No torch here.
"""

from __future__ import annotations

from hypothesis import strategies as st

from memplan.core.graph import Compute, Graph, Node, NodeKind, Step

SIZES = st.integers(min_value=1, max_value=100)
TIMES = st.integers(min_value=0, max_value=5).map(float)
# A kernel's own buffers, held while it runs: none for most nodes, as in real graphs.
WORKSPACES = st.one_of(st.just(0), st.just(0), st.just(0), SIZES)


class _Builder:
    """Appends Nodes with consecutive ids."""

    def __init__(self) -> None:
        self.nodes: list[Node] = []

    def add(self, name: str, op: str, inputs: tuple[int, ...] = (), **fields: object) -> int:
        node_id = len(self.nodes)
        self.nodes.append(Node(id=node_id, name=name, op=op, inputs=inputs, **fields))  # type: ignore[arg-type]
        return node_id


@st.composite
def random_graphs(draw: st.DrawFn, max_nodes: int = 12) -> Graph:
    """A random DAG: a few params/inputs, then compute nodes reading earlier nodes.

    Some compute nodes are views (alias_of one of their inputs, 0 bytes) and some are
    carved out of a multi-output producer they read; the carved children of a producer
    never take more than its bytes, as getitems of a real tuple output never do. Some hold
    a workspace while they run.
    """
    b = _Builder()
    for i in range(draw(st.integers(0, 3))):
        kind = draw(st.sampled_from([NodeKind.PARAM, NodeKind.INPUT]))
        b.add(f"in{i}", kind.value, bytes=draw(SIZES), kind=kind)
    capacity: dict[int, int] = {}  # carvable producer -> bytes not yet carved out of it
    for i in range(draw(st.integers(1, max_nodes))):
        earlier = list(range(len(b.nodes)))
        inputs = tuple(
            draw(st.lists(st.sampled_from(earlier), max_size=3, unique=True)) if earlier else []
        )
        shape = draw(st.sampled_from(["plain", "plain", "view", "carved"]))
        carvable = [s for s in inputs if capacity.get(s, 0) > 0]
        fields: dict[str, object] = {"time": draw(TIMES), "workspace": draw(WORKSPACES)}
        if shape == "view" and inputs:
            fields.update(bytes=0, alias_of=draw(st.sampled_from(inputs)))
        elif shape == "carved" and carvable:
            parent = draw(st.sampled_from(carvable))
            taken = draw(st.integers(1, capacity[parent]))
            capacity[parent] -= taken
            fields.update(bytes=taken, carved_from=parent)
        else:
            fields["bytes"] = draw(SIZES)
        node = b.add(f"n{i}", "op", inputs, **fields)
        if shape == "plain" and fields.get("alias_of") is None and "carved_from" not in fields:
            capacity[node] = b.nodes[node].bytes
    outputs = draw(st.lists(st.sampled_from(range(len(b.nodes))), max_size=3, unique=True))
    return Graph(nodes=tuple(b.nodes), outputs=tuple(outputs), name="random")


@st.composite
def training_graphs(
    draw: st.DrawFn,
    min_layers: int = 1,
    max_layers: int = 6,
) -> Graph:
    """A training step shaped like a lowered joint graph.

    params and an input, a forward chain (each layer reads the previous activation and a
    param, sometimes an earlier activation too; some layers are views, some cannot be
    recomputed), a loss (output), a tangent, then the backward mirroring the forward:
    layer i's backward reads the incoming gradient, the layer's forward input (and
    sometimes its output) and its param, and emits the param's gradient (an output).
    Some backward layers read a gradient-free transpose of the param, as autograd does.
    Some layers hold a workspace while they run, as convolutions do.
    """
    b = _Builder()
    params = [
        b.add(f"p{i}", "param", bytes=draw(SIZES), kind=NodeKind.PARAM)
        for i in range(draw(st.integers(1, 3)))
    ]
    x = b.add("x", "input", bytes=draw(SIZES), kind=NodeKind.INPUT)
    acts = [x]  # acts[i]: the input of forward layer i
    layer_params: list[int] = []
    for i in range(draw(st.integers(min_layers, max_layers))):
        param = draw(st.sampled_from(params))
        is_view = i > 0 and draw(st.integers(0, 3)) == 0
        if is_view:
            layer = b.add(f"f{i}", "view", (acts[-1],), bytes=0, alias_of=acts[-1], time=0.0)
        else:
            inputs = [acts[-1], param]
            if len(acts) > 2 and draw(st.booleans()):
                inputs.append(draw(st.sampled_from(acts[:-1])))  # a skip connection
            recomputable = draw(st.integers(0, 5)) != 0
            layer = b.add(
                f"f{i}",
                "mm",
                tuple(dict.fromkeys(inputs)),
                bytes=draw(SIZES),
                time=draw(TIMES),
                recomputable=recomputable,
                offloadable=draw(st.integers(0, 4)) != 0,
                workspace=draw(WORKSPACES),
            )
        layer_params.append(param)
        acts.append(layer)
    loss = b.add("loss", "sum", (acts[-1],), bytes=4, time=1.0)
    tangent = b.add("tangent", "tangent", bytes=4, kind=NodeKind.TANGENT)
    grad = b.add(
        "dloss", "expand", (tangent, acts[-1]), bytes=draw(SIZES), time=1.0, is_backward=True
    )
    grads: list[int] = []
    for i in reversed(range(len(layer_params))):
        reads = [grad, acts[i]]
        if draw(st.booleans()):
            reads.append(acts[i + 1])  # e.g. relu's backward reads its own output
        if draw(st.integers(0, 3)) == 0:
            transposed = b.add(
                f"t{i}",
                "t",
                (layer_params[i],),
                bytes=0,
                alias_of=layer_params[i],
                is_backward=True,
            )
            reads.append(transposed)
        else:
            reads.append(layer_params[i])
        dparam = b.add(
            f"dp{i}",
            "mm",
            (grad, acts[i]),
            bytes=b.nodes[layer_params[i]].bytes,
            time=draw(TIMES),
            is_backward=True,
            workspace=draw(WORKSPACES),
        )
        grads.append(dparam)
        grad = b.add(
            f"dx{i}",
            "mm",
            tuple(dict.fromkeys(reads)),
            bytes=draw(SIZES),
            time=draw(TIMES),
            is_backward=True,
        )
    outputs = (loss, *grads)
    return Graph(nodes=tuple(b.nodes), outputs=outputs, name="training")


def chain_graph(
    layers: int, act_bytes: int = 10, param_bytes: int = 100, time: float = 1.0
) -> Graph:
    """A deterministic training chain, all times `time` except the tangent's.

    p (param, param_bytes), x (input, act_bytes), f0..f{n-1} (act_bytes, f_i reads f_{i-1}
    and p), loss (4 B, output), tangent (4 B), dloss (act_bytes, reads the tangent and the
    last activation), then per layer i from the last: dp_i (param_bytes, output) and dx_i
    (act_bytes), both reading the gradient and layer i's input.
    """
    b = _Builder()
    p = b.add("p", "param", bytes=param_bytes, kind=NodeKind.PARAM)
    acts = [b.add("x", "input", bytes=act_bytes, kind=NodeKind.INPUT)]
    for i in range(layers):
        acts.append(b.add(f"f{i}", "mm", (acts[-1], p), bytes=act_bytes, time=time))
    loss = b.add("loss", "sum", (acts[-1],), bytes=4, time=time)
    tangent = b.add("tangent", "tangent", bytes=4, kind=NodeKind.TANGENT)
    grad = b.add(
        "dloss", "expand", (tangent, acts[-1]), bytes=act_bytes, time=time, is_backward=True
    )
    grads = []
    for i in reversed(range(layers)):
        grads.append(
            b.add(f"dp{i}", "mm", (grad, acts[i]), bytes=param_bytes, time=time, is_backward=True)
        )
        grad = b.add(
            f"dx{i}", "mm", (grad, acts[i], p), bytes=act_bytes, time=time, is_backward=True
        )
    return Graph(nodes=tuple(b.nodes), outputs=(loss, *grads), name=f"chain{layers}")


def topological_steps(graph: Graph) -> list[Step]:
    """Compute every node that is not a resident input, once, in id order."""
    return [Compute(n.id) for n in graph if not n.is_resident_input]
