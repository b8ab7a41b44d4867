"""benchmarks.replay: what torch.compile saves, and its decisions made memplan's."""

from __future__ import annotations

import copy
import dataclasses

import torch
from test_e2e import train_step
from test_plan_file import hand_made_plan

from benchmarks.replay import Saved, torch_decisions, watched_partitioner
from memplan.tools.zoo import ZOO


def test_a_tensor_is_kept_where_torch_compile_saves_its_storage() -> None:
    """A view of a saved value is kept (its storage is saved), a value torch.compile does
    not save is recomputed, and one its graph lacks is recomputed and named."""
    saved = Saved(
        names={"convolution", "getitem_1"},
        roots={"convolution": "convolution", "getitem_1": "getitem_1", "squeeze": "getitem_1"}
        | {"relu": "relu"},
    )
    plan = dataclasses.replace(
        hand_made_plan(),
        decisions={"convolution": "keep", "squeeze": "recompute", "relu": "keep", "copy": "keep"},
    )
    decisions, unknown = torch_decisions(plan, saved)
    assert decisions == {
        "convolution": "keep",
        "squeeze": "keep",
        "relu": "recompute",
        "copy": "recompute",
    }
    assert unknown == ["copy"]


def test_the_partitioner_is_watched_on_a_compile_of_torch_compile() -> None:
    """What the backward receives, tangents aside, each a value of the joint graph; the
    caches that would skip the partitioner are as they were afterwards."""
    caches = (torch._inductor.config.fx_graph_cache, torch._functorch.config.enable_autograd_cache)
    example = ZOO["mlp"](batch=64)
    torch._dynamo.reset()
    with watched_partitioner() as saved:
        train_step(torch.compile(copy.deepcopy(example.model)), example.inputs)()
    assert saved.names
    assert not any(name.startswith("tangents") for name in saved.names)
    assert saved.names <= saved.roots.keys()
    assert any(name.startswith("primals") for name in saved.names)  # the weights of a mm
    after = (torch._inductor.config.fx_graph_cache, torch._functorch.config.enable_autograd_cache)
    assert after == caches
