"""What memplan's torch.compile backend (backends.py) takes from Inductor: its
decomposition table, its joint-graph passes run before planning (as torch.compile's own
partition step runs them), and its compile of one planned graph.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.utils._pytree as pytree

from memplan.planner.plan import Partitioner


def inductor_decompositions() -> dict[Any, Callable[..., Any]]:
    """The decomposition table Inductor lowers with, as torch.compile's default backend
    traces with it."""
    from torch._inductor.compile_fx import select_decomp_table

    return select_decomp_table()


def after_joint_passes(partitioner: Partitioner) -> Callable[..., Any]:
    """`partitioner` given the joint graph as Inductor's joint-graph passes leave it (no-op
    views and clones removed, uniform constants folded, its pattern rewrites, its seeded
    random ops), as torch.compile's own partition step gives it to torch's partitioner:
    memplan plans the graph Inductor compiles, under the names torch.compile's graphs
    have."""

    def partition(
        joint: torch.fx.GraphModule, joint_inputs: Sequence[Any], **kwargs: Any
    ) -> tuple[torch.fx.GraphModule, torch.fx.GraphModule]:
        from torch._guards import detect_fake_mode
        from torch._inductor.fx_passes.joint_graph import joint_graph_passes
        from torch._inductor.virtualized import V

        inputs = pytree.tree_leaves(joint_inputs)
        devices = (t.device for t in inputs if torch.is_tensor(t))
        # Inductor sets its pattern rewrites up for the device of the first graph it sees.
        device = next((d for d in devices if d.type != "meta"), None)
        # Inductor's own compile runs the passes under the trace's fake mode, and its
        # rewrite of seeded random ops (dropout) makes fake values with it.
        with V.set_fake_mode(detect_fake_mode(inputs)):
            passed = joint_graph_passes(joint, device)
        _traced_again(passed, inputs)
        return partitioner(passed, joint_inputs, **kwargs)

    return partition


def _traced_again(gm: torch.fx.GraphModule, joint_inputs: Sequence[Any]) -> None:
    """Each node's value traced again, on the fake inputs the graph was traced with (a
    placeholder's own, or where the passes left it none, a symbolic size's, the joint
    input in its place). Inductor's rewrites can leave a node the value it had before
    them: on BERT, a view that now reads another tensor kept a value viewing the one it
    read before, so lowering took it for a storage of its own, and a second view of it
    for a view of the first."""
    from torch._guards import detect_fake_mode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    placeholders = gm.graph.find_nodes(op="placeholder")
    inputs = [n.meta.get("val", given) for n, given in zip(placeholders, joint_inputs, strict=True)]
    FakeTensorProp(gm, detect_fake_mode(inputs)).propagate_dont_convert_inputs(*inputs)


def inductor_compile(settings: dict[str, Any]) -> Callable[..., Any]:
    """Inductor's compile of one planned graph, under `settings` (torch._inductor.config)."""

    def compile_graph(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]) -> Any:
        from torch._inductor import config
        from torch._inductor.compile_fx import compile_fx_inner

        with config.patch(settings):
            return compile_fx_inner(gm, list(example_inputs))

    return compile_graph
