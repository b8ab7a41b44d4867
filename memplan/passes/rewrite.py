"""Rewrite: a Schedule applied to the joint graph -> forward and backward GraphModules.

A Lowered (what planner/lower.py makes of a joint graph: the Graph and the fx nodes its
ids stand for) is what the rewrite reads the joint graph through.

The forward runs the schedule's forward steps and returns the forward outputs followed by
the values the backward reads (kept tensors and host copies). The backward takes those
and the tangents, and runs the backward steps in order: a forward op computed again is a
copy named `recompute_*`, a transfer is `offload_*` and `release_*` (forward), `prefetch_*`
and `wait_*` (backward).
"""

from __future__ import annotations

import hashlib
import operator
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import sympy
import torch
import torch.fx as fx
from torch.fx.experimental.symbolic_shapes import find_symbol_binding_fx_nodes, free_symbols

from memplan import compat
from memplan.core.errors import InvalidSchedule
from memplan.core.graph import (
    Compute,
    Free,
    Graph,
    NodeKind,
    Offload,
    Prefetch,
    Schedule,
    Step,
    Wait,
)
from memplan.passes.offload import OFFLOAD, PREFETCH, RELEASE, WAIT
from memplan.passes.recompute import SUBSTITUTES, is_input_mutation, substitute


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
        """Identifies the graph a plan was made for: names, ops, edges, bytes and the
        model's own checkpointing (its step as written, the plan's reference)."""
        digest = hashlib.sha256()
        for node in self.graph:
            checkpointed = "|checkpointed" if node.checkpointed else ""
            digest.update(
                f"{node.name}|{node.op}|{node.inputs}|{node.bytes}{checkpointed};".encode()
            )
        return digest.hexdigest()[:16]


def rewrite(
    lowered: Lowered, schedule: Schedule, *, stamp: dict[str, object] | None = None
) -> tuple[fx.GraphModule, fx.GraphModule]:
    """Forward and backward modules that carry out `schedule` on `lowered.joint`."""
    started = time.perf_counter()
    forward_steps = schedule.steps[: schedule.split]
    backward_steps = schedule.steps[schedule.split :]
    joint_outputs = compat.arg_tree_leaves(
        *next(iter(lowered.joint.graph.find_nodes(op="output"))).args
    )

    fw, fw_values, host_copies = _forward_graph(lowered, forward_steps)
    handed_over = _handed_over(lowered, backward_steps, fw_values, host_copies)
    handed_over += _size_bindings(lowered, handed_over, fw_values)
    # AOTAutograd's calling convention: the forward returns its outputs, then the tensors
    # and then the sizes (SymInts) the backward reads; the backward takes the sizes first.
    sizes = [item for item in handed_over if compat.is_sym_node(item[1])]
    tensors = [item for item in handed_over if not compat.is_sym_node(item[1])]
    forward_outputs = [_lookup(fw_values, o) for o in joint_outputs[: lowered.num_fwd_outputs]]
    returned = forward_outputs + [value for _, value in tensors + sizes]
    freed = {step.node for step in forward_steps if isinstance(step, Free)}
    _release_the_dropped(fw, lowered, fw_values, host_copies, freed, returned)
    fw.output(tuple(returned))
    handed_over = sizes + tensors

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
    written: set[fx.Node] = set()  # inputs the forward has written in place
    for step in steps:
        joint_node = fx_nodes[step.node]
        if isinstance(step, Compute):
            # A write into an input (BatchNorm's running statistics) follows every forward
            # op that reads the input (planner/lower.write_inputs_early): an op run after
            # it would read the new value.
            stale = written.intersection(joint_node.all_input_nodes)
            if stale:
                raise InvalidSchedule(
                    f"{joint_node.name} reads {min(n.name for n in stale)} after the "
                    "forward wrote it in place"
                )
            if is_input_mutation(joint_node):
                written.add(joint_node.args[0])
            values[joint_node] = _copy(fw, joint_node, values)
        elif isinstance(step, Offload):
            host_copies[step.node] = _call_op(
                fw, OFFLOAD, (values[joint_node],), f"offload_{joint_node.name}"
            )
        elif isinstance(step, Free):
            if step.node in host_copies:  # its buffer is free once the copy has read it
                args = (values[joint_node], host_copies[step.node])
                _call_op(fw, RELEASE, args, f"release_{joint_node.name}")
        else:
            raise ValueError(f"a {type(step).__name__} step cannot run in the forward")
    return fw, values, host_copies


def _release_the_dropped(
    fw: fx.Graph,
    lowered: Lowered,
    fw_values: dict[fx.Node, fx.Node],
    host_copies: dict[int, fx.Node],
    freed: set[int],
    returned: Sequence[object],
) -> None:
    """Release, at the end of the forward, each offloaded tensor that the schedule frees
    only in the backward and that the forward does not return (the backward reads its host
    copy, not it). The forward drops it when it returns, earlier than the schedule does, and
    Inductor may hand its buffer to a later kernel as soon as the offload call returns: the
    release keeps it until the copy has read it (passes/offload.py)."""
    for node, host in host_copies.items():
        value = fw_values[lowered.fx_nodes[node]]
        if node not in freed and not any(value is r for r in returned):
            _call_op(fw, RELEASE, (value, host), f"release_{lowered.fx_nodes[node].name}")


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


def _size_bindings(
    lowered: Lowered,
    handed_over: list[tuple[tuple[str, int], fx.Node]],
    fw_values: dict[fx.Node, fx.Node],
) -> list[tuple[tuple[str, int], fx.Node]]:
    """The size symbols (dynamic shapes) that the sizes of the backward's inputs are made
    of and that no input binds: the forward hands over the sizes that bind them, as
    inductor must know each symbol from an input (a tensor of s0*s1 rows binds neither)."""
    joint = lowered.joint.graph
    tangents = [n for n in joint.find_nodes(op="placeholder") if n.name.startswith("tangents")]
    values = [value for _, value in handed_over] + tangents
    bound = {v.meta["val"].node.expr for v in values if compat.is_sym_node(v) and "val" in v.meta}
    needed: set[sympy.Symbol] = set()
    for value in values:
        if "val" in value.meta:
            needed |= free_symbols(value.meta["val"])
    bindings = find_symbol_binding_fx_nodes(joint)
    ids = {n: i for i, n in enumerate(lowered.fx_nodes)}
    return [
        (("value", ids[bindings[symbol]]), fw_values[bindings[symbol]])
        for symbol in sorted(needed - bound, key=lambda s: s.name)
        if symbol in bindings and bindings[symbol] in fw_values
    ]


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
    # The storages the backward has made and the plan has not freed: a transfer reads them
    # so that Inductor keeps it after everything the plan runs before it (offload.py).
    unfreed: dict[int, fx.Node] = {}
    for step in steps:
        joint_node = fx_nodes[step.node]
        if isinstance(step, Compute):
            if graph[step.node].kind is NodeKind.TANGENT:
                continue
            if graph[step.node].is_backward:
                values[joint_node] = _copy(bw, joint_node, values)
            else:
                values[joint_node] = _recompute(bw, joint_node, values)
            if graph[step.node].bytes and graph[step.node].alias_of is None:
                unfreed[step.node] = values[joint_node]
        elif isinstance(step, Prefetch):
            in_transit[step.node] = _call_op(
                bw,
                PREFETCH,
                (in_transit[step.node], device, list(unfreed.values())),
                f"prefetch_{joint_node.name}",
            )
        elif isinstance(step, Wait):
            # The wait writes nothing but is declared to, which orders the reads after it.
            landed = in_transit[step.node]
            _call_op(bw, WAIT, (landed, list(unfreed.values())), f"wait_{joint_node.name}")
            values[joint_node] = landed
        elif isinstance(step, Free):
            unfreed.pop(step.node, None)
        else:
            raise ValueError(f"a {type(step).__name__} step cannot run in the backward")
    return bw, values


def _call_op(target: fx.Graph, op: compat.OpOverload, args: tuple[Any, ...], name: str) -> fx.Node:
    """A call of one of memplan's transfer ops, with the value its fake implementation
    gives for the inputs' values (what inductor and the measurement read)."""
    node = target.create_node("call_function", op, args, name=name)
    values = fx.map_arg(args, lambda n: n.meta.get("val"))
    tensors = [v for v in compat.tree_leaves(values) if not isinstance(v, torch.device)]
    # Fake inputs dispatch to the ops' fake implementations: nothing runs or allocates.
    if all(compat.is_fake(v) for v in tensors):
        node.meta["val"] = op(*values)
    return node


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
