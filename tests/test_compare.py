"""The methods memplan is compared with (memplan/compare.py): checkpointing every block and
PyTorch's min-cut partitioner keep eager's gradients and save memory the way they should."""

from __future__ import annotations

import copy

import pytest
import torch

from memplan.core.errors import MemplanError
from memplan.tools.compare import checkpoint_blocks, pytorch_partitioned
from memplan.tools.verify import compare_grads, steady_step_peak, training_step
from memplan.tools.zoo import ResidualBlock, cnn, gpt2

CPU = torch.device("cpu")


def eager_grads(model: torch.nn.Module, inputs: tuple) -> dict[str, torch.Tensor | None]:
    reference = copy.deepcopy(model)
    training_step(reference, inputs)()
    return {n: p.grad for n, p in reference.named_parameters()}


def test_checkpointing_every_block_keeps_gradients_and_lowers_the_peak():
    example = cnn()
    expected = eager_grads(example.model, example.inputs)
    eager_peak = steady_step_peak(example.model, example.model, example.inputs)
    checkpointed = checkpoint_blocks(example.model, ResidualBlock)
    assert checkpointed is not example.model  # a copy: the model itself is untouched
    assert example.model.blocks[0].forward.__name__ == "forward"
    peak = steady_step_peak(checkpointed, checkpointed, example.inputs)
    assert compare_grads(checkpointed, expected)[1]
    assert peak < eager_peak


def test_checkpointing_needs_the_block_class_in_the_model():
    with pytest.raises(MemplanError, match="no LayerNorm"):
        checkpoint_blocks(cnn().model, torch.nn.LayerNorm)


def test_pytorch_partitioner_budget_trades_memory_for_recomputation():
    """GPT-2: at activation budget 0.4 PyTorch's partitioner saves less than at 1.0 (its
    default), and both give eager's gradients."""
    example = gpt2(batch=4, seq=64)
    expected = eager_grads(example.model, example.inputs)
    peaks = {}
    for budget in (1.0, 0.4):
        module = pytorch_partitioned(example.model, example.inputs, budget)
        peaks[budget] = steady_step_peak(module, example.model, example.inputs)
        error, match = compare_grads(example.model, expected)
        assert match, (budget, error)
    assert peaks[0.4] < peaks[1.0]


def test_pytorch_partitioner_budget_must_be_a_fraction():
    example = cnn()
    with pytest.raises(MemplanError, match="within"):
        pytorch_partitioned(example.model, example.inputs, 1.5)
