"""Rewrite: a Schedule applied to the joint graph -> forward and backward GraphModules.

A Lowered (what planner/lower.py makes of a joint graph: the Graph and the fx nodes its
ids stand for) is what the rewrite reads the joint graph through.

The forward runs the schedule's forward steps and returns the forward outputs followed by
the values the backward reads (kept tensors and host copies). The backward takes those
and the tangents, and runs the backward steps in order: a forward op computed again is a
copy named `recompute_*`, a transfer is `offload_*` (forward), `prefetch_*` and `wait_*`.
"""

from __future__ import annotations

import hashlib
import operator
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.fx as fx
import torch.utils._pytree as pytree

from memplan.graph import Compute, Free, Graph, NodeKind, Offload, Prefetch, Schedule, Step, Wait
from memplan.passes import offload as offload_ops
from memplan.passes.recompute import SUBSTITUTES, substitute


@dataclass(frozen=True)
class Lowered:
    """A Graph and the fx nodes its ids stand for (fx_nodes[i] is node i)."""

    graph: Graph
    joint: fx.GraphModule
    fx_nodes: tuple[fx.Node, ...]
    num_fwd_outputs: int

    @property
    def device(self) -> torch.device:
        """The device the traced tensors live on."""
        for n in self.fx_nodes:
            val = n.meta.get("val")
            if isinstance(val, torch.Tensor):
                return val.device
        return torch.device("cpu")

    @property
    def fingerprint(self) -> str:
        """Identifies the graph a plan was made for: names, ops, edges and bytes."""
        digest = hashlib.sha256()
        for node in self.graph:
            digest.update(f"{node.name}|{node.op}|{node.inputs}|{node.bytes};".encode())
        return digest.hexdigest()[:16]


def rewrite(
    lowered: Lowered, schedule: Schedule, *, stamp: dict[str, object] | None = None
) -> tuple[fx.GraphModule, fx.GraphModule]:
    """Forward and backward modules that carry out `schedule` on `lowered.joint`."""
    started = time.perf_counter()
    forward_steps = schedule.steps[: schedule.split]
    backward_steps = schedule.steps[schedule.split :]
    joint_outputs = pytree.arg_tree_leaves(
        *next(iter(lowered.joint.graph.find_nodes(op="output"))).args
    )

    fw, fw_values, host_copies = _forward_graph(lowered, forward_steps)
    handed_over = _handed_over(lowered, backward_steps, fw_values, host_copies)
    forward_outputs = [_lookup(fw_values, o) for o in joint_outputs[: lowered.num_fwd_outputs]]
    fw.output(tuple(forward_outputs + [value for _, value in handed_over]))

    bw, bw_values = _backward_graph(lowered, backward_steps, handed_over)
    bw.output(tuple(_lookup(bw_values, o) for o in joint_outputs[lowered.num_fwd_outputs :]))

    modules = []
    elapsed = time.perf_counter() - started
    for part, graph in (("forward", fw), ("backward", bw)):
        _drop_unused_outputs(graph)
        graph.lint()
        module = fx.GraphModule(lowered.joint, graph, class_name=f"Memplan{part.title()}")
        module.recompile()
        module.meta["memplan"] = {**(stamp or {}), "part": part, "rewrite_seconds": elapsed}
        modules.append(module)
    return modules[0], modules[1]


def _drop_unused_outputs(graph: fx.Graph) -> None:
    """Erase outputs taken from a multi-output op that nothing reads.

    The schedule takes every output of such an op at once, so that its result dies at once;
    one that nobody reads would be a dead line in the generated code (and a runner such as
    fx's Interpreter would keep its tensor alive until the graph returns).
    """
    for node in reversed(graph.nodes):
        if node.op == "call_function" and node.target is operator.getitem and not node.users:
            graph.erase_node(node)


def _forward_graph(
    lowered: Lowered, steps: Sequence[Step]
) -> tuple[fx.Graph, dict[fx.Node, fx.Node], dict[int, fx.Node]]:
    """The forward graph without its output, its values by joint node, and host copies."""
    graph, fx_nodes = lowered.graph, lowered.fx_nodes
    fw = fx.Graph()
    values: dict[fx.Node, fx.Node] = {}
    host_copies: dict[int, fx.Node] = {}
    for node in graph:
        if node.kind is not NodeKind.COMPUTE and node.kind is not NodeKind.TANGENT:
            values[fx_nodes[node.id]] = _copy(fw, fx_nodes[node.id], values)
    for step in steps:
        joint_node = fx_nodes[step.node]
        if isinstance(step, Compute):
            values[joint_node] = _copy(fw, joint_node, values)
        elif isinstance(step, Offload):
            host_copies[step.node] = fw.create_node(
                "call_function",
                offload_ops.offload,
                (values[joint_node],),
                name=f"offload_{joint_node.name}",
            )
            if "val" in joint_node.meta:
                host_copies[step.node].meta["val"] = joint_node.meta["val"].to("cpu")
        elif not isinstance(step, Free):
            raise ValueError(f"a {type(step).__name__} step cannot run in the forward")
    return fw, values, host_copies


def _handed_over(
    lowered: Lowered,
    steps: Sequence[Step],
    fw_values: dict[fx.Node, fx.Node],
    host_copies: dict[int, fx.Node],
) -> list[tuple[tuple[str, int], fx.Node]]:
    """What the backward reads from the forward, in order of first need: ("value", id) for
    a device value, ("host", id) for a host copy, each with the forward node that holds it."""
    graph = lowered.graph
    needed: dict[tuple[str, int], fx.Node] = {}
    made: set[int] = set()
    ids = {n: i for i, n in enumerate(lowered.fx_nodes)}
    for step in steps:
        if isinstance(step, Compute):
            _, args, kwargs = _call(lowered.fx_nodes[step.node], graph[step.node].is_backward)
            for source_node in _input_nodes(args, kwargs):
                source = ids[source_node]
                if source not in made and graph[source].kind is not NodeKind.TANGENT:
                    needed.setdefault(("value", source), fw_values[source_node])
            made.add(step.node)
        elif isinstance(step, Prefetch):
            needed.setdefault(("host", step.node), host_copies[step.node])
        elif isinstance(step, Wait):
            made.add(step.node)
    return list(needed.items())


def _backward_graph(
    lowered: Lowered,
    steps: Sequence[Step],
    handed_over: list[tuple[tuple[str, int], fx.Node]],
) -> tuple[fx.Graph, dict[fx.Node, fx.Node]]:
    """The backward graph without its output, and its values by joint node."""
    graph, fx_nodes = lowered.graph, lowered.fx_nodes
    device = lowered.device
    bw = fx.Graph()
    values: dict[fx.Node, fx.Node] = {}
    in_transit: dict[int, fx.Node] = {}  # host copies, then the prefetches of them
    for (what, v), forward_value in handed_over:
        placeholder = bw.placeholder(forward_value.name)
        placeholder.meta = dict(forward_value.meta)
        if what == "host":
            in_transit[v] = placeholder
        else:
            values[fx_nodes[v]] = placeholder
    for node in graph:
        if node.kind is NodeKind.TANGENT:
            values[fx_nodes[node.id]] = _copy(bw, fx_nodes[node.id], values)
    for step in steps:
        joint_node = fx_nodes[step.node]
        if isinstance(step, Compute):
            if graph[step.node].kind is NodeKind.TANGENT:
                continue
            if graph[step.node].is_backward:
                values[joint_node] = _copy(bw, joint_node, values)
            else:
                values[joint_node] = _recompute(bw, joint_node, values)
        elif isinstance(step, Prefetch):
            in_transit[step.node] = bw.create_node(
                "call_function",
                offload_ops.prefetch,
                (in_transit[step.node], device),
                name=f"prefetch_{joint_node.name}",
            )
        elif isinstance(step, Wait):
            values[joint_node] = bw.create_node(
                "call_function",
                offload_ops.wait,
                (in_transit[step.node],),
                name=f"wait_{joint_node.name}",
            )
        elif not isinstance(step, Free):
            raise ValueError(f"a {type(step).__name__} step cannot run in the backward")
    return bw, values


def _copy(target: fx.Graph, node: fx.Node, values: dict[fx.Node, fx.Node]) -> fx.Node:
    """Copy a joint node into `target`, reading its inputs from `values`."""
    copied = target.create_node(
        node.op,
        node.target,
        fx.map_arg(node.args, values.__getitem__),
        fx.map_arg(node.kwargs, values.__getitem__),
        name=node.name,
    )
    copied.meta = dict(node.meta)
    return copied


def _recompute(target: fx.Graph, node: fx.Node, values: dict[fx.Node, fx.Node]) -> fx.Node:
    """A `recompute_*` copy of a forward node, through its substitute if it has one."""
    function, args, kwargs = _call(node, is_backward=False)
    copied = target.create_node(
        node.op,
        function,
        fx.map_arg(args, values.__getitem__),
        fx.map_arg(kwargs, values.__getitem__),
        name=f"recompute_{node.name}",
    )
    copied.meta = dict(node.meta)
    return copied


def _call(node: fx.Node, is_backward: bool) -> tuple[Any, Any, Any]:
    """(target, args, kwargs) of the node as the backward runs it: a recomputation of a
    forward node goes through its substitute, if it has one."""
    if not is_backward and node.target in SUBSTITUTES:
        return substitute(node, node.args, dict(node.kwargs))
    return node.target, node.args, node.kwargs


def _input_nodes(args: Any, kwargs: Any) -> list[fx.Node]:
    found: list[fx.Node] = []
    fx.map_arg((args, kwargs), found.append)
    return found


def _lookup(values: dict[fx.Node, fx.Node], item: Any) -> Any:
    return values[item] if isinstance(item, fx.Node) else item
