"""Which ops the rewrite can run again, and how: `can_recompute` is what lowering asks.

Random ops (no RNG replay), side effects and non-ATen calls never run twice. The step's
input mutations (BatchNorm's running statistics) are written in the forward, in the graph
(after the last forward op that reads them) or by AOTAutograd after it, so a recomputation
in the backward must not read those inputs either: a substitute computes the same
outputs the backward reads without them (not the updated statistics, which only the
forward writes), and ops without one are never recomputed.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from typing import Any

import torch
import torch.fx as fx

from memplan import compat

aten = torch.ops.aten

# (args, kwargs) of the original call -> (target, args, kwargs) of the recomputation
Substitute = Callable[
    [tuple[Any, ...], dict[str, Any]], tuple[Any, tuple[Any, ...], dict[str, Any]]
]


def _batch_norm_without_stats(
    args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    # Outputs 0-2 (output, saved mean, saved inverse std) are the same in training mode;
    # outputs 3-4 (updated running stats) are forward outputs and never recomputed.
    x, weight, bias, _running_mean, _running_var, training, momentum, eps = args
    return aten._native_batch_norm_legit.no_stats, (x, weight, bias, training, momentum, eps), {}


SUBSTITUTES: dict[Any, Substitute] = {
    aten._native_batch_norm_legit_functional.default: _batch_norm_without_stats,
}
# How many of the op's outputs, first to last, its substitute computes: the others (the
# updated running statistics) are the forward's alone.
SUBSTITUTE_OUTPUTS = {aten._native_batch_norm_legit_functional.default: 3}


def _has_substitute(node: fx.Node) -> bool:
    """Whether the node can be recomputed without reading the inputs the step mutates."""
    if node.target is aten._native_batch_norm_legit_functional.default:
        return bool(node.args[5])  # only the training-mode call ignores running stats
    return node.target in SUBSTITUTES


def substitute(
    node: fx.Node, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    """The (target, args, kwargs) that recompute `node`, given its mapped arguments."""
    return SUBSTITUTES[node.target](args, kwargs)


def can_recompute(n: fx.Node, mutated: set[fx.Node]) -> bool:
    """Whether the rewrite can run `n` again, `mutated` being the inputs the step mutates
    (see the module)."""
    if n.op != "call_function":
        return False
    if any(a in mutated for a in n.all_input_nodes) and not _has_substitute(n):
        return False
    if n.target is operator.getitem:  # runs again only with its producer
        parent, index = n.args
        return (
            isinstance(parent, fx.Node)
            and can_recompute(parent, mutated)
            and index < SUBSTITUTE_OUTPUTS.get(parent.target, math.inf)
        )
    if not compat.is_op_overload(n.target):
        return False
    if torch.Tag.nondeterministic_seeded in n.target.tags and not _without_dropout(n):
        return False
    # Randomness was judged above: fx counts every seeded op as impure, attention without
    # dropout too, which torch.compile's partitioner recomputes.
    return not n.is_impure(impure_random=False) and not n.target._schema.is_mutable


def _without_dropout(n: fx.Node) -> bool:
    """A seeded op whose dropout probability is 0 draws no random numbers."""
    assert isinstance(n.target, compat.OpOverload)
    for index, argument in enumerate(n.target._schema.arguments):
        if argument.name in ("dropout_p", "p"):
            value = n.args[index] if index < len(n.args) else n.kwargs.get(argument.name)
            if value is None:
                value = argument.default_value
            return value == 0
    return False


def is_input_mutation(n: fx.Node) -> bool:
    """Whether `n` writes a graph input in place: the `copy_` AOTAutograd leaves in the
    graph for a mutation it keeps there (keep_inference_input_mutations)."""
    return (
        n.op == "call_function"
        and n.target is torch.ops.aten.copy_.default
        and isinstance(n.args[0], fx.Node)
        and n.args[0].op == "placeholder"
    )
