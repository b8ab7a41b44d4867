"""The rewrite pass: golden code of a forward and backward with recompute and offload."""

from __future__ import annotations

import contextlib
import re

import torch
from torch import nn
from torch._functorch.aot_autograd import aot_export_joint_with_descriptors

from memplan.core.graph import Decision, Free, Schedule
from memplan.core.simulate import simulate
from memplan.passes.rewrite import rewrite
from memplan.planner.lower import lower
from memplan.solvers.training import build_schedule


class Tiny(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.ones(4, 4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(torch.relu(x @ self.w) @ self.w).sum()


FORWARD = """
def forward(self, primals_1, primals_2):
    mm = torch.ops.aten.mm.default(primals_2, primals_1)
    relu = torch.ops.aten.relu.default(mm);  mm = None
    mm_1 = torch.ops.aten.mm.default(relu, primals_1);  relu = None
    tanh = torch.ops.aten.tanh.default(mm_1);  mm_1 = None
    offload_tanh = torch.ops.memplan.offload.default(tanh)
    sum_1 = torch.ops.aten.sum.default(tanh)
    release_tanh = torch.ops.memplan.release.default(tanh, offload_tanh);  tanh = release_tanh = None
    return (sum_1, offload_tanh, primals_2, primals_1)
"""

BACKWARD = """
def forward(self, offload_tanh, primals_2, primals_1, tangents_1):
    prefetch_tanh = torch.ops.memplan.prefetch.default(offload_tanh, device(type='cpu'), []);  offload_tanh = None
    expand = torch.ops.aten.expand.default(tangents_1, [2, 4]);  tangents_1 = None
    wait_tanh = torch.ops.memplan.wait.default(prefetch_tanh, []);  wait_tanh = None
    detach_1 = torch.ops.aten.detach.default(prefetch_tanh);  prefetch_tanh = None
    detach_2 = torch.ops.aten.detach.default(detach_1);  detach_1 = None
    tanh_backward = torch.ops.aten.tanh_backward.default(expand, detach_2);  expand = detach_2 = None
    recompute_mm = torch.ops.aten.mm.default(primals_2, primals_1)
    recompute_relu = torch.ops.aten.relu.default(recompute_mm);  recompute_mm = None
    t = torch.ops.aten.t.default(recompute_relu)
    mm_2 = torch.ops.aten.mm.default(t, tanh_backward);  t = None
    t_1 = torch.ops.aten.t.default(primals_1);  primals_1 = None
    mm_3 = torch.ops.aten.mm.default(tanh_backward, t_1);  tanh_backward = t_1 = None
    detach = torch.ops.aten.detach.default(recompute_relu);  recompute_relu = None
    detach_3 = torch.ops.aten.detach.default(detach);  detach = None
    threshold_backward = torch.ops.aten.threshold_backward.default(mm_3, detach_3, 0);  mm_3 = detach_3 = None
    t_2 = torch.ops.aten.t.default(primals_2);  primals_2 = None
    mm_4 = torch.ops.aten.mm.default(t_2, threshold_backward);  t_2 = threshold_backward = None
    add = torch.ops.aten.add.Tensor(mm_2, mm_4);  mm_2 = mm_4 = None
    return (add, None)
"""


def _code(module: torch.fx.GraphModule) -> str:
    return "\n".join(line.rstrip() for line in module.code.strip().splitlines() if line.strip())


def test_recompute_and_offload_code_is_pinned() -> None:
    with contextlib.ExitStack() as stack:
        joint = aot_export_joint_with_descriptors(stack, Tiny(), (torch.ones(2, 4),)).graph_module
        lowered = lower(joint, 1, offload_threshold=0)
        graph = lowered.graph
        assert [graph[v].name for v in graph.saved_candidates] == ["relu", "tanh"]
        # relu is recomputed from the parameter and input; tanh goes to the host and back.
        decisions = {
            graph.by_name["relu"]: Decision.RECOMPUTE,
            graph.by_name["tanh"]: Decision.OFFLOAD,
        }
        forward, backward = rewrite(lowered, build_schedule(graph, decisions, bandwidth=1e9))
    assert _code(forward) == FORWARD.strip()
    assert _code(backward) == BACKWARD.strip()
    assert forward.meta["memplan"]["part"] == "forward"


def test_an_offloaded_tensor_freed_only_in_the_backward_is_released_as_the_forward_ends() -> None:
    """A schedule may free an offloaded node only in the backward (before its prefetch),
    where the backward reads its host copy alone: the forward does not return it and drops
    it on return, so it is released there, after every other forward step, and not left for
    Inductor to reuse while the copy may still read it."""
    with contextlib.ExitStack() as stack:
        joint = aot_export_joint_with_descriptors(stack, Tiny(), (torch.ones(2, 4),)).graph_module
        lowered = lower(joint, 1, offload_threshold=0)
        graph = lowered.graph
        tanh = graph.by_name["tanh"]
        schedule = build_schedule(graph, {tanh: Decision.OFFLOAD}, bandwidth=1e9)
        forward_steps = [s for s in schedule.steps[: schedule.split] if s != Free(tanh)]
        moved = Schedule(
            (*forward_steps, Free(tanh), *schedule.steps[schedule.split :]),
            len(forward_steps),
        )
        simulate(graph, moved, bandwidth=1e9)  # a valid schedule
        forward, _ = rewrite(lowered, moved)
    lines = _code(forward).splitlines()
    assert lines[-2].strip().startswith("release_tanh = torch.ops.memplan.release.default(tanh,")
    assert not re.search(r"\btanh\b", lines[-1])  # the forward returns no device copy
