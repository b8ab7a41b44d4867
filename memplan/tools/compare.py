"""The training steps memplan is measured against: eager, torch.utils.checkpoint around
every block, and PyTorch's own min-cut partitioner at an activation memory budget.

PyTorch's partitioner is what torch.compile's "aot_eager_decomp_partition" backend runs:
inductor's decompositions, then min_cut_rematerialization_partition under
torch._functorch.config.activation_memory_budget. Here it is compiled through memplan's
capture and run as the same generated code as memplan's plans, so that one instrument (the
live-storage tracker, which cannot see inside a Dynamo frame) measures every method, and
only the partition decisions differ.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Sequence
from typing import Any

from torch import nn
from torch.utils.checkpoint import checkpoint

from memplan import compat
from memplan.core.errors import MemplanError
from memplan.planner.capture import compile_training_step
from memplan.planner.module import CompiledStep

# The activation memory budgets the head-to-head benchmark gives PyTorch's partitioner:
# 1.0 is its default (min-cut without a memory target), 0.0 recomputes all it can.
PYTORCH_BUDGETS = (1.0, 0.8, 0.6, 0.4, 0.2, 0.0)


def checkpoint_blocks(model: nn.Module, block: type[nn.Module]) -> nn.Module:
    """A copy of `model` whose every `block` module runs under torch.utils.checkpoint
    (non-reentrant): only its inputs are saved, and its forward runs again in the backward.
    MemplanError if the model has no such block."""
    copied = copy.deepcopy(model)
    blocks = [m for m in copied.modules() if isinstance(m, block)]
    if not blocks:
        raise MemplanError(f"{type(model).__name__} has no {block.__name__} to checkpoint")
    for module in blocks:
        # An instance attribute: nn.Module.__call__ (and its hooks) still wraps it.
        module.forward = functools.partial(checkpoint, module.forward, use_reentrant=False)
    return copied


def pytorch_partitioned(
    model: nn.Module, example_inputs: Sequence[Any], activation_memory_budget: float
) -> CompiledStep:
    """`model`'s training step partitioned by PyTorch's min-cut partitioner at
    `activation_memory_budget` (0.0 to 1.0), with inductor's decompositions."""
    if not 0.0 <= activation_memory_budget <= 1.0:
        raise MemplanError(
            f"activation_memory_budget must be within [0, 1], got {activation_memory_budget}"
        )
    with compat.activation_memory_budget(activation_memory_budget):
        compiled = compile_training_step(
            model,
            example_inputs,
            functools.partial(compat.min_cut_partitioner(), compiler="inductor"),
            decompositions=compat.inductor_decompositions(),
        )
    return CompiledStep(model, compiled, example_inputs)
