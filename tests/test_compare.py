"""The methods memplan is compared with (memplan/compare.py): checkpointing every block and
PyTorch's min-cut partitioner keep eager's gradients and save memory the way they should."""

from __future__ import annotations

import copy

import pytest
import torch

from memplan.errors import MemplanError
from memplan.planner.measure import measure_peak
from memplan.tools.compare import checkpoint_blocks, pytorch_partitioned
from memplan.tools.verify import compare_grads, resident_tensors, training_step
from memplan.tools.zoo import ResidualBlock, cnn, gpt2

CPU = torch.device("cpu")


def peak_and_grads(module: torch.nn.Module, owner: torch.nn.Module, inputs: tuple) -> int:
    for p in owner.parameters():
        p.grad = None
    step = training_step(module, inputs)
    step()  # warm-up
    for p in owner.parameters():
        p.grad = None
    return measure_peak(step, resident=resident_tensors(owner, inputs), device=CPU).peak_bytes


def eager_grads(model: torch.nn.Module, inputs: tuple) -> dict[str, torch.Tensor | None]:
    reference = copy.deepcopy(model)
    training_step(reference, inputs)()
    return {n: p.grad for n, p in reference.named_parameters()}


def test_checkpointing_every_block_keeps_gradients_and_lowers_the_peak():
    example = cnn()
    expected = eager_grads(example.model, example.inputs)
    eager_peak = peak_and_grads(example.model, example.model, example.inputs)
    checkpointed = checkpoint_blocks(example.model, ResidualBlock)
    assert checkpointed is not example.model  # a copy: the model itself is untouched
    assert example.model.blocks[0].forward.__name__ == "forward"
    peak = peak_and_grads(checkpointed, checkpointed, example.inputs)
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
        peaks[budget] = peak_and_grads(module, example.model, example.inputs)
        error, match = compare_grads(example.model, expected)
        assert match, (budget, error)
    assert peaks[0.4] < peaks[1.0]


def test_pytorch_partitioner_budget_must_be_a_fraction():
    example = cnn()
    with pytest.raises(MemplanError, match="within"):
        pytorch_partitioned(example.model, example.inputs, 1.5)
