"""Lower: an AOTAutograd joint fx graph -> the solver-neutral Graph.

Bytes are alias-aware, read from the FakeTensor storages AOTAutograd leaves on every node:
the first node holding a storage owns its bytes, later nodes on that storage are views
(0 bytes, keep the owner alive), and the outputs of a multi-output op are carved out of
its allocation by the getitems that extract them.
"""

from __future__ import annotations

import operator
from collections.abc import Callable

import torch
import torch.fx as fx
from torch.multiprocessing.reductions import StorageWeakRef
from torch.utils.checkpoint import CheckpointPolicy

from memplan import compat
from memplan.core.errors import UnsupportedModel
from memplan.core.graph import Graph, Node, NodeKind
from memplan.passes.contiguous import KEPT_COPY
from memplan.passes.recompute import can_recompute, is_input_mutation
from memplan.passes.rewrite import Lowered
from memplan.planner.capture import CHECKPOINT_REGION
from memplan.planner.granularity import allocated_bytes
from memplan.planner.options import DEFAULT_OFFLOAD_THRESHOLD
from memplan.planner.shapes import hint

# The tags torch.utils.checkpoint leaves on the joint graph's nodes inside a checkpointed
# region (under a selective policy, the ops it saves are tagged to be saved instead).
CHECKPOINT_RECOMPUTES = (CheckpointPolicy.MUST_RECOMPUTE, CheckpointPolicy.PREFER_RECOMPUTE)


def drop_checked_asserts(joint: fx.GraphModule) -> None:
    """Erase the joint graph's metadata assertions (`aten._assert_tensor_metadata`, which
    torch.export leaves around dtype casts): they return nothing, and tracing on the example
    inputs already checked them. A planned module only runs on inputs of those shapes and
    dtypes, so they would check nothing new, and they carry no value to plan."""
    for node in list(joint.graph.nodes):
        target = node.target
        if (
            node.op == "call_function"
            and compat.is_op_overload(target)
            and target.name().startswith("aten::_assert_tensor_metadata")
            and not node.users
        ):
            joint.graph.erase_node(node)


def lower(
    joint: fx.GraphModule,
    num_fwd_outputs: int,
    *,
    name: str = "graph",
    offload_threshold: int = DEFAULT_OFFLOAD_THRESHOLD,
    size: Callable[[object], int] = hint,
) -> Lowered:
    """The Graph of a joint module whose first `num_fwd_outputs` outputs are the forward's.

    A symbolic size (Dynamo's dynamic shapes) counts as `size` makes it: by default its
    hint, the size traced; `shapes.at(values)` evaluates it at other sizes."""
    fx_nodes = [
        n for n in joint.graph.nodes if n.op in ("placeholder", "get_attr", "call_function")
    ]
    for n in joint.graph.nodes:
        if n.op in ("call_module", "call_method"):
            raise UnsupportedModel(n.name, f"{n.op} nodes are not expected in an ATen joint graph")
    ids = {n: i for i, n in enumerate(fx_nodes)}
    outputs = compat.arg_tree_leaves(*next(iter(joint.graph.find_nodes(op="output"))).args)
    # The forward's mutations of its inputs (BatchNorm's running statistics, written in
    # place, as torch.compile's Inductor backend has AOTAutograd keep them in the graph)
    # read by no output: forward nodes all the same.
    forward_outputs = [o for o in outputs[:num_fwd_outputs] if isinstance(o, fx.Node)]
    forward = _ancestors(forward_outputs + _forward_mutations(joint, _reading_gradients(joint)))
    # The outputs of a forward op are extracted in the forward even if only the backward
    # reads them: a tuple cannot be handed to the backward.
    forward |= {n for n in fx_nodes if n.target is operator.getitem and n.args[0] in forward}

    mutated = _mutated_inputs(joint)

    owner_of_storage: dict[StorageWeakRef, int] = {}
    nodes: list[Node] = []
    for i, n in enumerate(fx_nodes):
        val = n.meta.get("val")
        if n.op == "call_function" and "val" not in n.meta:
            raise UnsupportedModel(n.name, f"{n.target} has no traced value (unsupported op)")
        inputs = tuple(ids[a] for a in dict.fromkeys(n.all_input_nodes))
        alias_of = carved_from = None
        if isinstance(val, torch.Tensor):
            key = StorageWeakRef(val.untyped_storage())
            nbytes = allocated_bytes(size(val.untyped_storage().nbytes()), val.device)
            if key in owner_of_storage:
                alias_of, nbytes = owner_of_storage[key], 0
            else:
                owner_of_storage[key] = i
                parent = n.args[0] if n.target is operator.getitem else None
                if isinstance(parent, fx.Node) and isinstance(parent.meta.get("val"), tuple | list):
                    carved_from = ids[parent]
        else:
            nbytes = _fresh_bytes(val, owner_of_storage, size)
            # A tuple of views (split, unbind) keeps the storage they view alive.
            aliased = _aliased_owners(val, owner_of_storage)
            if nbytes == 0 and aliased:
                alias_of = aliased[0]
        nodes.append(
            Node(
                id=i,
                name=n.name,
                op=str(n.target) if n.op != "placeholder" else "placeholder",
                inputs=inputs,
                bytes=nbytes,
                kind=_kind(n),
                is_backward=n.op == "call_function" and n not in forward,
                alias_of=alias_of,
                carved_from=carved_from,
                recomputable=can_recompute(n, mutated) and not n.meta.get(KEPT_COPY),
                offloadable=isinstance(val, torch.Tensor)
                and alias_of is None
                and nbytes >= offload_threshold,
                checkpointed=_checkpointed(n, forward),
            )
        )
    graph_outputs = tuple(dict.fromkeys(ids[o] for o in outputs if isinstance(o, fx.Node)))
    graph = Graph(nodes=tuple(nodes), outputs=graph_outputs, name=name)
    return Lowered(
        graph=graph, joint=joint, fx_nodes=tuple(fx_nodes), num_fwd_outputs=num_fwd_outputs
    )


def _ancestors(roots: list[fx.Node]) -> set[fx.Node]:
    seen: set[fx.Node] = set()
    stack = list(roots)
    while stack:
        n = stack.pop()
        if n in seen or n.op != "call_function":
            continue
        seen.add(n)
        stack.extend(n.all_input_nodes)
    return seen


def _checkpointed(n: fx.Node, forward: set[fx.Node]) -> bool:
    """Whether the model's activation checkpointing recomputes forward node `n`: traced in
    a checkpointed region, and read in the forward only inside that region. A region's
    output that a later region (or code outside any) reads is that one's input, which
    torch.utils.checkpoint saves."""
    region = _checkpoint_region(n)
    if n not in forward or region is None:
        return False
    return all(_checkpoint_region(user) == region for user in n.users if user in forward)


def _checkpoint_region(n: fx.Node) -> tuple[str, object] | None:
    """The checkpointed region whose recomputation `n` is part of, if any: under
    torch.compile, Dynamo's (a node tagged recompute, by its `ac_graph_id`; a node of the
    region tagged to be saved is in none); under memplan.optimize, capture's mark."""
    if n.meta.get("recompute") in CHECKPOINT_RECOMPUTES:
        return "dynamo", n.meta.get("ac_graph_id")
    mark = (n.meta.get("custom") or {}).get(CHECKPOINT_REGION)
    return None if mark is None else ("traced", mark)


def _kind(n: fx.Node) -> NodeKind:
    if n.op == "get_attr":
        return NodeKind.PARAM
    if n.op != "placeholder":
        return NodeKind.COMPUTE
    if n.name.startswith("tangents"):
        return NodeKind.TANGENT
    desc = type(n.meta.get("desc")).__name__
    return NodeKind.PARAM if desc in ("ParamAOTInput", "BufferAOTInput") else NodeKind.INPUT


def _fresh_bytes(
    val: object, owner_of_storage: dict[StorageWeakRef, int], size: Callable[[object], int]
) -> int:
    """Bytes a multi-output op allocates: its outputs' storages not seen before."""
    seen: set[StorageWeakRef] = set()
    total = 0
    for item in compat.tree_leaves(val):
        if isinstance(item, torch.Tensor):
            key = StorageWeakRef(item.untyped_storage())
            if key not in owner_of_storage and key not in seen:
                seen.add(key)
                total += allocated_bytes(size(item.untyped_storage().nbytes()), item.device)
    return total


def _aliased_owners(val: object, owner_of_storage: dict[StorageWeakRef, int]) -> list[int]:
    """Owners of the existing storages a multi-output op's outputs view."""
    owners = [
        owner_of_storage[StorageWeakRef(item.untyped_storage())]
        for item in compat.tree_leaves(val)
        if isinstance(item, torch.Tensor)
        and StorageWeakRef(item.untyped_storage()) in owner_of_storage
    ]
    return list(dict.fromkeys(owners))


def _mutated_inputs(joint: fx.GraphModule) -> set[fx.Node]:
    """Placeholders the step mutates: from AOTAutograd's output descriptors (a mutation it
    applies after the graph) and the graph's own writes into them."""
    output = next(iter(joint.graph.find_nodes(op="output")))
    targets = [
        d.mutated_input
        for d in output.meta.get("desc") or ()
        if type(d).__name__ == "InputMutationAOTOutput"
    ]
    written = {n.args[0] for n in joint.graph.nodes if is_input_mutation(n)}
    return {
        n
        for n in joint.graph.find_nodes(op="placeholder")
        if n.meta.get("desc") in targets or n in written
    }


def _forward_mutations(joint: fx.GraphModule, reading: set[fx.Node]) -> list[fx.Node]:
    """The input mutations the forward makes: those not in `reading` (the nodes that read
    a gradient, _reading_gradients)."""
    return [n for n in joint.graph.nodes if is_input_mutation(n) and n not in reading]


def write_inputs_early(joint: fx.GraphModule) -> None:
    """Move each of the forward's writes into an input (BatchNorm's running statistics) to
    just after the last forward op it must follow: what it writes, and every forward op
    that reads the input. AOTAutograd writes them all after the forward's last op, so each
    new value would be held to the end of the forward, and every layer's BatchNorm read
    there: an edge from each block to the forward's end, which the chain solvers cannot
    cut (ResNet at 70% had linear and chain_dp find no schedule within the budget)."""
    reading = _reading_gradients(joint)
    order = {n: i for i, n in enumerate(joint.graph.nodes)}
    for write in _forward_mutations(joint, reading):
        if write.users:
            continue
        target = write.args[0]
        readers = [u for u in target.users if u is not write and u not in reading]
        last = max([*write.all_input_nodes, *readers], key=order.__getitem__)
        last.append(write)


def _reading_gradients(joint: fx.GraphModule) -> set[fx.Node]:
    """The nodes that read a gradient (a tangent), directly or through other nodes."""
    reading: set[fx.Node] = set()
    for n in joint.graph.nodes:  # in topological order
        is_tangent = n.op == "placeholder" and _kind(n) is NodeKind.TANGENT
        if is_tangent or any(a in reading for a in n.all_input_nodes):
            reading.add(n)
    return reading
