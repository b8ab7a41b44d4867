"""Which ops the rewrite may run again (memplan/passes/recompute.py): attention without
dropout is recomputed, as torch.compile's partitioner recomputes it, and trains with
eager's gradients; attention with dropout never runs twice."""

from __future__ import annotations

import contextlib
import dataclasses

import torch
from torch import nn
from torch._functorch.aot_autograd import aot_export_joint_with_descriptors

import memplan
from memplan.planner.lower import lower
from memplan.tools.verify import verify

SEEDED = torch.Tag.nondeterministic_seeded


class Attention(nn.Module):
    """One causal self-attention over a projection, as a transformer block has it."""

    def __init__(self, dropout: float) -> None:
        super().__init__()
        self.qkv = nn.Linear(16, 48)
        self.dropout = dropout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        q, k, v = self.qkv(x).view(batch, seq, 3, 2, 8).permute(2, 0, 3, 1, 4)
        out = nn.functional.scaled_dot_product_attention(
            q, k, v, dropout_p=self.dropout, is_causal=True
        )
        return out.tanh().sum()


def _seeded_ops(dropout: float) -> dict[str, bool]:
    """Each seeded op of the training graph, by name: whether the rewrite may rerun it."""
    with contextlib.ExitStack() as stack:
        example = (torch.randn(2, 8, 16),)
        module = Attention(dropout).train()
        joint = aot_export_joint_with_descriptors(stack, module, example).graph_module
        graph = lower(joint, 1).graph
    seeded = {
        n.name
        for n in joint.graph.nodes
        if isinstance(n.target, torch._ops.OpOverload) and SEEDED in n.target.tags
    }
    return {node.name: node.recomputable for node in graph if node.name in seeded}


def test_attention_without_dropout_can_be_recomputed() -> None:
    seeded = _seeded_ops(dropout=0.0)
    assert seeded, "the attention is a seeded op"
    assert all(seeded.values())


def test_attention_with_dropout_is_never_recomputed() -> None:
    seeded = _seeded_ops(dropout=0.5)
    assert seeded
    assert not any(seeded.values())


def test_a_recomputed_attention_trains_with_eager_s_gradients() -> None:
    """Every saved tensor recomputed, the attention's outputs among them (a schedule that
    recomputes an op that cannot be rerun is refused before the step)."""
    torch.manual_seed(0)
    model, inputs = Attention(dropout=0.0), (torch.randn(4, 64, 16),)
    plan = memplan.plan(model, inputs, budget="100%", progress=False)
    recomputed = {name: "recompute" for name in plan.decisions}
    edited = dataclasses.replace(plan, decisions=recomputed)
    check = verify(model, inputs, edited)
    assert check.grads_match, check.max_grad_error


def test_batch_norm_writes_its_statistics_in_the_forward_and_never_again() -> None:
    """With AOTAutograd keeping the step's input mutations in the graph (as memplan's
    torch.compile backend has it, like torch.compile's Inductor backend): each `copy_` into
    a running statistic is a forward node though no output reads it, and never recomputed;
    BatchNorm's output, mean and inverse std may be recomputed (through its substitute),
    the updated statistics it returns may not."""
    module = nn.Sequential(nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU()).train()
    with contextlib.ExitStack() as stack:
        joint = aot_export_joint_with_descriptors(
            stack, module, (torch.randn(2, 3, 8, 8),), keep_inference_input_mutations=True
        ).graph_module
        graph = lower(joint, 1).graph
    by_name = {node.name: node for node in graph}
    writes = [n for n in joint.graph.nodes if n.target is torch.ops.aten.copy_.default]
    assert len(writes) == 3  # running mean, running variance, batches counted
    for write in writes:
        assert not by_name[write.name].is_backward
        assert not by_name[write.name].recomputable
    (norm,) = joint.graph.find_nodes(
        op="call_function", target=torch.ops.aten._native_batch_norm_legit_functional.default
    )
    outputs = {user.args[1]: by_name[user.name].recomputable for user in norm.users}
    assert outputs == {0: True, 1: True, 2: True, 3: False, 4: False}
