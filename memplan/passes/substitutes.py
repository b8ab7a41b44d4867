"""Recompute substitutes: how to run again an op whose inputs the step mutates.

AOTAutograd applies input mutations (BatchNorm's running statistics) after the forward,
so a recomputation in the backward must not read those inputs. A substitute computes the
same outputs the backward reads without them; ops without one are never recomputed.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.fx as fx

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


def has_substitute(node: fx.Node) -> bool:
    """Whether the node can be recomputed without reading the inputs the step mutates."""
    if node.target is aten._native_batch_norm_legit_functional.default:
        return bool(node.args[5])  # only the training-mode call ignores running stats
    return node.target in SUBSTITUTES


def substitute(
    node: fx.Node, args: tuple[Any, ...], kwargs: dict[str, Any]
) -> tuple[Any, tuple[Any, ...], dict[str, Any]]:
    """The (target, args, kwargs) that recompute `node`, given its mapped arguments."""
    return SUBSTITUTES[node.target](args, kwargs)
